"""Does the advisor see vLLM's API server set the pace? A real server, `vtui bench`, `vtui advise`.

Starts a model through engine.server.supervisor (the tiny model by default; ``--model
qwen2.5-7b`` for a shipped architecture with dummy weights on a GPU host), with the flags
after ``--`` read as `vtui serve` reads them, drives it with ``vtui bench --url`` at ``--concurrency`` (the run is stored in
the history, as every headless run is), then asks ``vtui advise last``. Prints the run's
TPOT beside the engine's own inter-token mean, the API server's CPU (mean and p90 of one
core, engine.telemetry.host) and the advisor's findings.

    # on the H200 (vLLM staged per ../shared/gpu/):
    python3 tests/perf/frontend_probe.py --concurrency 200 --num-requests 600 -- --enforce-eager \\
        --gpu-memory-utilization 0.3 --max-model-len 2048
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


async def main(a: argparse.Namespace, server_flags: list[str]) -> None:
    from engine.flags import parse_argv
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import resolve_model

    # As `vtui serve --model MODEL -- FLAGS` reads them: the model's own flags, the user's over them.
    resolved = resolve_model(a.model)
    tok = Path(resolved.path)
    flags = parse_argv(resolved.serve_argv(server_flags)).set("enable-prefix-caching", False)
    sup = Supervisor(flags)
    await sup.start(timeout=600)
    try:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "run.json"
            cmd = [sys.executable, "-m", "tui.cli", "bench", "--url", sup.base_url, "--model", sup.model,
                   "--tokenizer", str(tok), "--input-len", str(a.input_len), "--output-len", str(a.output_len),
                   "--concurrency", str(a.concurrency), "--num-requests", str(a.num_requests), "--warmup", "8",
                   "-q", "--result-file", str(out), "--name", "frontend-probe"]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
            print(proc.stdout[-3000:], proc.stderr[-3000:] if proc.returncode else "", flush=True)
            r = json.loads(out.read_text())
            tel = (r.get("telemetry") or {}).get("summary") or {}
            itl = tel.get("server_itl") or {}
            print(f"c={a.concurrency}: TPOT mean {r.get('mean_tpot_ms'):.2f} ms, p50 {r.get('median_tpot_ms'):.2f}; "
                  f"engine inter-token mean {itl.get('mean_ms')} ms; API server CPU mean "
                  f"{tel.get('server_front_cpu_pct')} %, p90 {tel.get('server_front_cpu_p90')} % of a core; "
                  f"server tree CPU mean {tel.get('server_mean_cpu_pct')} %", flush=True)
            adv = subprocess.run([sys.executable, "-m", "tui.cli", "advise", "last"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            print(adv.stdout[-4000:], adv.stderr[-2000:], flush=True)
    finally:
        await sup.stop()


if __name__ == "__main__":
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--num-requests", type=int, default=600)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    asyncio.run(main(p.parse_args(argv), rest))
