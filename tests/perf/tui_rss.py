"""Resident memory of the TUI's process, idle and 30 s into its first run, and that run's time
to its first request (issue 33, item 8: a run loaded torch into the TUI, 106 -> 523 MB).

Each measurement is a fresh Python process that imports the app (``tui.app``, as ``vtui``
does) and drives the TUI's own session (``engine.session.Session.run_workload``, what the
``r`` key calls) with the tiny model as the tokenizer, attached to loadgen's stand-in server
(no model; started here). "Time to first request" runs from the call to the first request the
server answers: it holds the tokenizer's load and the prompts' building. Two cases:

- ``first``: the first run with this tokenizer (the export cache of loadgen.tokens emptied,
  where the code has one: its child process runs);
- ``cached``: the first run of a new process, the tokenizer's export already on disk.

    .venv/bin/python tests/perf/tui_rss.py [--seconds 35] [--at 30] [--repeat 1]

The tiny model and the flag schema come from the usual VTUI_HOME (or the user's folders).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    got = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            got[line.split(":")[0]] = int(line.split()[1]) / 1024
    return got["VmRSS"], got["VmHWM"]


HEAVY = ("torch", "transformers", "triton", "sentencepiece")


def child(url: str, seconds: float, at: float, case: str, out: str) -> None:
    import tui.app  # noqa: F401  (the TUI process has the app and Textual loaded)
    from engine.flags import FlagSet
    from engine.server.attach import AttachedServer
    from engine.server.tinymodel import ensure_tiny_model
    from engine.session import Session
    from loadgen import ArrivalSpec, WorkloadSpec, tokens

    if case == "first" and hasattr(tokens, "_export_cache_dir"):
        empty = Path(tempfile.mkdtemp(prefix="vtui-rss-cache-"))
        tokens._export_cache_dir = lambda: empty  # type: ignore[attr-defined]  # a perf probe's override

    model = ensure_tiny_model()
    session = Session(FlagSet(model=str(model), values={}), workload=WorkloadSpec(input_len=256, output_len=64),
                      arrivals=ArrivalSpec(concurrency=8, duration_s=seconds), workload_label="rss",
                      record_history=False)
    result: dict[str, Any] = {}

    async def main() -> None:
        session.attach_server(AttachedServer(url=url, version="stand-in", models=("test-model",), max_model_len=4096))
        await asyncio.sleep(5.0)  # idle, as the TUI sits before the first `r` (background schema read done)
        result["idle"] = _rss_mb()[0]
        Path(out + ".start").write_text(repr(time.time()))
        task = asyncio.create_task(session.run_workload())
        t0 = time.monotonic()
        while not task.done() and time.monotonic() - t0 < at:
            await asyncio.wait({task}, timeout=0.2)
        result["at"] = _rss_mb()[0]
        rec = await task
        result["peak"] = _rss_mb()[1]
        result["completed"] = rec.summary.figure("completed")
        result["heavy"] = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY})
        await session.close()

    asyncio.run(main())
    Path(out).write_text(json.dumps(result))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=35.0, help="length of the run")
    ap.add_argument("--at", type=float, default=30.0, help="seconds into the run of the RSS reading")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    from loadgen.testserver import ServerConfig, serve_in_processes

    rows = []
    with serve_in_processes(ServerConfig(gap_s=0.005), 1) as h:
        for _ in range(a.repeat):
            for case in ("first", "cached"):
                with tempfile.TemporaryDirectory() as tmp:
                    out = str(Path(tmp) / "out.json")
                    h.reset()
                    proc = subprocess.Popen([sys.executable, __file__, "--child", h.url, str(a.seconds), str(a.at),
                                             case, out], cwd=ROOT)
                    first_at = None
                    while proc.poll() is None:
                        if first_at is None and h.first_chunk_delays()[0] > 0:
                            first_at = time.time()
                        time.sleep(0.01)
                    if proc.returncode:
                        raise SystemExit(f"{case}: the child failed ({proc.returncode})")
                    r = json.loads(Path(out).read_text())
                    start = float(Path(out + ".start").read_text())
                    r["ttfr"] = (first_at - start) if first_at else float("nan")
                    rows.append((case, r))
    print(f"\ncode at {ROOT} ({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f})\n")
    print(f"{'case':<8} {'idle MB':>8} {f'{a.at:.0f} s in MB':>10} {'peak MB':>8} {'1st request s':>13} "
          f"{'done':>6}  heavy modules in the process")
    for case, r in rows:
        print(f"{case:<8} {r['idle']:>8.0f} {r['at']:>10.0f} {r['peak']:>8.0f} {r['ttfr']:>13.2f} "
              f"{r['completed']:>6}  {', '.join(r['heavy']) or '-'}")


if __name__ == "__main__":
    main()
