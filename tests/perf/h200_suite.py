"""vtui on a real H200 (issue 9): serve a Qwen2.5-7B architecture with dummy weights,
compare the planner with vLLM's startup figures, then load it at concurrency 16, 64
and 256 with `vtui bench` while telemetry samples NVML and /metrics, and run
`vllm bench serve` on the same server and workload at 64 and 256.

Run on the GPU machine (vLLM staged per ../shared/gpu/README.md):
    PYTHONPATH=/tmp/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 tests/perf/h200_suite.py OUTDIR
Prints Markdown tables; writes every result JSON to OUTDIR.
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
from engine.server.planner import load_model_config, plan  # noqa: E402
from engine.server.supervisor import Supervisor  # noqa: E402
from engine.server.tinymodel import ensure_dummy_model  # noqa: E402
from engine.telemetry.recorder import TelemetryRecorder  # noqa: E402

IN_LEN, OUT_LEN = 512, 128


async def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    # Async, so the telemetry recorder's /metrics scrape loop keeps running meanwhile
    # (a blocking subprocess.run starved it in the first H200 run).
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


async def _vtui_bench(url: str, model: str, c: int, out: Path) -> dict:
    result = out / f"vtui-c{c}.json"
    cmd = [sys.executable, "-m", "tui.cli", "bench", "--url", url, "--model", model,
           "--input-len", str(IN_LEN), "--output-len", str(OUT_LEN), "--concurrency", str(c),
           "--num-requests", str(4 * c), "--seed", "0", "--result-file", str(result), "-q"]
    proc = await _run(cmd)
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    return json.loads(result.read_text()) if result.exists() else {}


async def _vllm_bench(url: str, model: str, c: int, out: Path) -> dict:
    name = f"vllm-c{c}.json"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
           "--base-url", url, "--model", model, "--dataset-name", "random",
           "--random-input-len", str(IN_LEN), "--random-output-len", str(OUT_LEN),
           "--max-concurrency", str(c), "--num-prompts", str(4 * c), "--seed", "0",
           "--save-result", "--result-dir", str(out), "--result-filename", name]
    proc = await _run(cmd)
    print(proc.stdout[-2500:], proc.stderr[-1500:], flush=True)
    path = out / name
    return json.loads(path.read_text()) if path.exists() else {}


def _gpu_total_gib() -> float | None:
    from engine.telemetry.nvml import NvmlReader

    reader = NvmlReader()
    samples = reader.sample((), time.time())
    reader.close()
    for g in samples:
        if g.mem_total_bytes:
            return g.mem_total_bytes / 2**30
    print("NVML samples:", samples, flush=True)
    return None


def _f(v: object, nd: int = 1) -> str:
    return "-" if v is None else (f"{v:,.{nd}f}" if isinstance(v, (int, float)) else str(v))


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = str(ensure_dummy_model("qwen2.5-7b"))
    flags = FlagSet(model=model, values={"load-format": "dummy", "max-model-len": 4096})
    sup = Supervisor(flags, port=8000)
    t = time.perf_counter()
    facts = await sup.start(timeout=500)
    print(f"ready in {time.perf_counter() - t:.1f} s", flush=True)
    print(json.dumps(facts.to_dict(), indent=1, default=str), flush=True)
    rows: list[tuple] = []
    try:
        async with TelemetryRecorder(sup.base_url, root_pid=sup.pid) as rec:
            await asyncio.sleep(2.0)
            s = rec.summary()
            print("telemetry at idle:", json.dumps(s.to_dict(), default=str)[:1500], flush=True)
            total_gib = _gpu_total_gib()
            cfg = load_model_config(model)
            util = facts.non_default_args.get("gpu_memory_utilization", 0.9) if facts.non_default_args else 0.9
            if total_gib:
                p = plan(cfg, gpu_memory=int(total_gib * 2**30), gpu_memory_utilization=util, max_model_len=4096)
                print("## Planner vs vLLM\n")
                print("| | planner | vLLM |\n|---|---|---|")
                print(f"| KV bytes/token | {p.kv_bytes_per_token:,} | |")
                print(f"| KV tokens | {p.kv_tokens:,} | {_f(facts.kv_cache_tokens, 0)} |")
                print(f"| max concurrency @4096 | {p.max_concurrency:.2f} | {_f(facts.max_concurrency, 2)} |")
                print(f"| KV memory GiB | {p.kv_memory_bytes / 2**30:.2f} | {_f(facts.kv_cache_memory_gib, 2)} |")
                print(f"| weights GiB | {p.weight_bytes_per_gpu / 2**30:.2f} | {_f(facts.model_load_gib, 2)} |", flush=True)
            else:
                print("no GPU total from NVML:", s.to_dict(), flush=True)
            for c in (16, 64, 256):
                t0 = time.time()
                r = await _vtui_bench(sup.base_url, model, c, out)
                t1 = time.time()
                summ = rec.summary(t0, t1).to_dict()
                (out / f"telemetry-c{c}.json").write_text(json.dumps(summ, default=str))
                rows.append(("vtui", c, r, summ))
            for c in (64, 256):
                r = await _vllm_bench(sup.base_url, model, c, out)
                rows.append(("vllm bench serve", c, r, None))
    finally:
        await sup.stop()
    print("\n## Load (random 512 in / 128 out, 4 requests per slot)\n")
    print("| client | c | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | ITL p50 | failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for who, c, r, _ in rows:
        print(f"| {who} | {c} | {_f(r.get('request_throughput'), 2)} | {_f(r.get('output_throughput'), 0)} | "
              f"{_f(r.get('median_ttft_ms'))} | {_f(r.get('p99_ttft_ms'))} | {_f(r.get('median_tpot_ms'), 2)} | "
              f"{_f(r.get('median_itl_ms'), 2)} | {r.get('failed')} |")
    print("\n## Telemetry during the vtui runs\n")
    for who, c, r, summ in rows:
        if summ:
            print(f"c={c}: client_bound={r.get('client_bound')}", json.dumps(summ, default=str)[:1500])


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h200")))
