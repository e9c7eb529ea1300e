"""A long session's memory: several load runs back to back in one session, RSS as they go.

Drives the TUI's own session (``engine.session.Session.run_workload``, the code the ``r`` key
calls, with its 4 Hz snapshot publisher, telemetry sampler and run history on, as in the
TUI) against loadgen's model-less stand-in server, started here as its own process::

    python -m loadgen.testserver --first-delay-ms 20 --gap-ms 10

Each run is an open loop at ``--rate`` requests/s (constant gaps), ``--input-len`` in /
``--output-len`` out, for ``--seconds``. The process's resident size (``VmRSS``) is printed
every minute and after each run (5 s after its end), then a table. The history goes to a
temporary ``VTUI_HOME`` unless one is set.

    .venv/bin/python tests/perf/soak.py --rate 150 --seconds 600 --runs 3

Target (issue 35): RSS after the last run within 30 MB of RSS after the first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def rss_mb(pid: int | str = "self") -> float:
    """The process's resident set (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def c_heap_mb() -> tuple[float, float] | None:
    """glibc's heap (all threads' arenas): MB in use and MB free but kept (mallinfo2), or None."""
    import ctypes
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        f = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    f.restype = MallInfo2
    m = f()
    return m.uordblks / 1e6, m.fordblks / 1e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"error: the test server at {url} did not answer /health in {timeout:.0f} s")


async def soak(url: str, args: argparse.Namespace) -> list[tuple[str, float, float, str]]:
    from engine.flags import FlagSet
    from engine.server.tinymodel import ensure_tiny_model
    from engine.session import Session
    from loadgen import ArrivalSpec, WorkloadSpec

    model = ensure_tiny_model()  # the prompts' tokenizer, as the TUI's tiny default has it
    session = Session(
        FlagSet(model=str(model), values={}),
        workload=WorkloadSpec(input_len=args.input_len, output_len=args.output_len),
        arrivals=ArrivalSpec(mode="constant", rate=args.rate, duration_s=args.seconds),
        workload_label="soak", record_history=True, telemetry=True,
    )
    rows: list[tuple[str, float, float, str]] = []  # (when, seconds since start, RSS MB, note)
    t0 = time.monotonic()

    def mark(when: str, note: str = "") -> None:
        rss = rss_mb()
        rows.append((when, time.monotonic() - t0, rss, note))
        print(f"{time.monotonic() - t0:7.0f} s  {rss:7.1f} MB  {when}{'  ' + note if note else ''}", flush=True)

    frames = 0

    def on_snapshot(snap: object) -> None:
        nonlocal frames
        frames += 1  # the TUI renders each; here only its building is paid

    session.subscribe(on_snapshot)
    publisher = asyncio.create_task(session.publish_forever(hz=4.0))

    async def per_minute() -> None:
        minute = 0
        while True:
            await asyncio.sleep(60.0)
            minute += 1
            mark(f"minute {minute}", "run going" if session.run_active else "idle")

    ticker = asyncio.create_task(per_minute())
    try:
        await session.attach(url)
        await asyncio.sleep(2.0)
        mark("idle, before any run")
        for i in range(1, args.runs + 1):
            record = await session.run_workload()
            load = record.summary.load
            figures = "" if load is None else (
                f"{load.completed} req, {load.request_throughput:.1f} req/s, "
                f"TTFT p50 {load.get('median_ttft_ms') or 0:.1f} ms, TPOT p50 {load.get('median_tpot_ms') or 0:.1f} ms")
            await asyncio.sleep(5.0)
            heap = c_heap_mb()
            where = "" if heap is None else f"; C heap {heap[0]:.1f} MB in use, {heap[1]:.1f} free"
            mark(f"after run {i}", f"{record.status}: {figures}{where}")
        gc.collect()
        mark("after the runs, gc.collect()")
    finally:
        ticker.cancel()
        publisher.cancel()
        await session.close()
    print(f"({frames} snapshots published)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=150.0, help="requests/s, constant gaps (default 150)")
    ap.add_argument("--seconds", type=float, default=600.0, help="length of each run (default 600)")
    ap.add_argument("--runs", type=int, default=3, help="runs back to back in the one session (default 3)")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args()
    if a.rate <= 0 or a.seconds <= 0 or a.runs < 1:
        ap.error("--rate and --seconds must be > 0, --runs at least 1")
    home = None
    if not os.environ.get("VTUI_HOME"):
        home = tempfile.TemporaryDirectory(prefix="vtui-soak-")
        os.environ["VTUI_HOME"] = home.name
        # the tiny model is built once per data folder: reuse the user's when there is one
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "loadgen.testserver", "--port", str(port),
                               "--first-delay-ms", "20", "--gap-ms", "10"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url)
        print(f"soak: {a.runs} runs of {a.seconds:.0f} s at {a.rate:g} req/s, {a.input_len} in / {a.output_len} out, "
              f"against {url} (first token 20 ms, 10 ms a token); pid {os.getpid()}", flush=True)
        rows = asyncio.run(soak(url, a))
    finally:
        server.terminate()  # our own child, by handle
        server.wait(10)
        if home is not None:
            home.cleanup()
    print()
    print(f"{'when':<30} {'t (s)':>7} {'RSS (MB)':>9}")
    for when, t, rss, _ in rows:
        print(f"{when:<30} {t:7.0f} {rss:9.1f}")
    after = [(w, r) for w, _, r, _ in rows if w.startswith("after run")]
    if len(after) >= 2:
        print(f"\nRSS after the last run - after the first: {after[-1][1] - after[0][1]:+.1f} MB (target: within 30)")


if __name__ == "__main__":
    main()
