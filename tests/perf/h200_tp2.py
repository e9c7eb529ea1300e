"""Tensor parallel 2 on two H200s (issue 9): both GPUs in the telemetry, the vLLM share on each.

    PYTHONPATH=/tmp/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 tests/perf/h200_tp2.py OUTDIR
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.flags import FlagSet  # noqa: E402
from engine.server.supervisor import Supervisor  # noqa: E402
from engine.server.tinymodel import ensure_dummy_model  # noqa: E402
from engine.telemetry.recorder import TelemetryRecorder  # noqa: E402


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = str(ensure_dummy_model("qwen2.5-7b"))
    flags = FlagSet(model=model, values={"load-format": "dummy", "max-model-len": 4096,
                                         "tensor-parallel-size": 2, "enforce-eager": True})
    sup = Supervisor(flags, port=8000)
    t = time.perf_counter()
    facts = await sup.start(timeout=400)
    print(f"ready in {time.perf_counter() - t:.1f} s; KV tokens {facts.kv_cache_tokens}, "
          f"max concurrency {facts.max_concurrency}", flush=True)
    try:
        async with TelemetryRecorder(sup.base_url, root_pid=sup.pid) as rec:
            t0 = time.time()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tui.cli", "bench", "--url", sup.base_url, "--model", model,
                 "--input-len", "512", "--output-len", "128", "--concurrency", "64", "--num-requests", "256",
                 "--result-file", str(out / "tp2-c64.json"), "-q",
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            stdout, stderr = await proc.communicate()
            print(stdout.decode()[-1800:], stderr.decode()[-800:], flush=True)
            t1 = time.time()
            summary = rec.summary(t0, t1).to_dict()
    finally:
        await sup.stop()
    (out / "tp2-telemetry.json").write_text(json.dumps(summary, default=str))
    print("| GPU | name | peak mem GiB | vLLM share GiB | mean util % | mean power W |")
    print("|---|---|---|---|---|---|")
    for g in summary.get("gpus") or []:
        gib = lambda v: "-" if v is None else f"{v / 2**30:.1f}"  # noqa: E731
        print(f"| {g.get('index')} | {g.get('name')} | {gib(g.get('peak_mem_bytes'))} | "
              f"{gib(g.get('peak_server_mem_bytes'))} | {g.get('mean_util_pct')} | {g.get('mean_power_w')} |")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tp2")))
