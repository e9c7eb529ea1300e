"""A long session's memory: several load runs back to back in one session, RSS as they go.

Drives the TUI's own session (``engine.session.Session.run_workload``, the code the ``r`` key
calls, with its 4 Hz snapshot publisher, telemetry sampler and run history on, as in the
TUI) against loadgen's model-less stand-in server, started here as its own process::

    python -m loadgen.testserver --first-delay-ms 20 --gap-ms 10

Each run is an open loop at ``--rate`` requests/s (constant gaps), ``--input-len`` in /
``--output-len`` out, for ``--seconds``. The process's resident size (``VmRSS``) is printed
every minute and after each run (5 s after its end, once the comparison's bootstrap of it is
done), then a table. The history goes to a
temporary ``VTUI_HOME`` unless one is set.

    .venv/bin/python tests/perf/soak.py --rate 150 --seconds 600 --runs 3

``--tui`` starts each run in the real app instead (headless, ``--size`` columns x rows), by its
``r`` key, and looks at the Runs tab after each: what the TUI renders and keeps is paid too.
``--tracemalloc N`` prints, after each run from the second, where the Python memory the last
run left grew most (N frames deep); the C heap (glibc's mallinfo2) and the thread count are
printed beside each run's RSS.

    .venv/bin/python tests/perf/soak.py --tui --rate 150 --seconds 120 --runs 6

Targets: RSS after the last run within 30 MB of RSS after the first (issue 35); from the second
run on, RSS flat within 10 MB over six runs (issue 44).
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
import tracemalloc
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def rss_mb(pid: int | str = "self") -> float:
    """The process's resident set (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def c_heap_mb() -> tuple[float, float, float] | None:
    """glibc's heap (all threads' arenas): MB in use, MB free but kept, and MB in blocks of their
    own mapping (mallinfo2: uordblks, fordblks, hblkhd), or None."""
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
    return m.uordblks / 1e6, m.fordblks / 1e6, m.hblkhd / 1e6


def print_grown(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, frames: int, top: int = 12) -> None:
    """What a finished run left, by where it was allocated: the biggest growths between two
    snapshots taken after consecutive runs (each ``frames`` deep, the allocating line last)."""
    stats = after.compare_to(before, "traceback" if frames > 1 else "lineno")
    grown = sum(s.size_diff for s in stats)
    print(f"  tracemalloc: {grown / 1e6:+.2f} MB traced since the last run; largest growths:", flush=True)
    for stat in stats[:top]:
        if stat.size_diff <= 0:
            break
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(stat.traceback))
        print(f"    {stat.size_diff / 1e6:+8.3f} MB {stat.count_diff:+7d} blocks  {where}", flush=True)


def pymalloc_mb() -> tuple[float, float] | None:
    """Python's small-object allocator: MB of its arenas (1 MiB each, mapped apart from the C
    heap) and MB in blocks in use (sys._debugmallocstats, which writes to the C stderr), or None.
    Arenas far above the blocks in use: a few live objects hold otherwise empty arenas."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found = {}
    for line in text.splitlines():
        for key in ("arenas allocated current", "bytes in allocated blocks"):
            if line.startswith(f"# {key}"):
                found[key] = int(line.split("=")[1].replace(",", ""))
    if len(found) < 2:
        return None
    return found["arenas allocated current"] * 1048576 / 1e6, found["bytes in allocated blocks"] / 1e6


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

    snaps: list[tracemalloc.Snapshot] = []

    async def per_minute() -> None:
        minute = 0
        while True:
            await asyncio.sleep(60.0)
            minute += 1
            mark(f"minute {minute}", "run going" if session.run_active else "idle")

    async def runs(run_once: Callable[[], Awaitable[Any]]) -> None:
        await session.attach(url)
        await asyncio.sleep(2.0)
        mark("idle, before any run")
        for i in range(1, args.runs + 1):
            record = await run_once()
            load = record.summary.load
            figures = "" if load is None else (
                f"{load.completed} req, {load.request_throughput:.1f} req/s, "
                f"TTFT p50 {load.get('median_ttft_ms') or 0:.1f} ms, TPOT p50 {load.get('median_tpot_ms') or 0:.1f} ms")
            await asyncio.sleep(5.0)
            # The comparison's bootstrap of the run (the noise thread, asked for by the snapshot)
            # reads its requests back: measured once it is done, not in the middle of it.
            await asyncio.to_thread(session._runs_part.noise_settled, 120.0)
            await asyncio.sleep(1.0)
            if args.tracemalloc:
                gc.collect()
                snap = tracemalloc.take_snapshot().filter_traces(
                    (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")))
                if snaps:
                    print_grown(snaps[-1], snap, args.tracemalloc)
                snaps.append(snap)
            heap = c_heap_mb()
            where = "" if heap is None else (f"; C heap {heap[0]:.1f} MB in use, {heap[1]:.1f} free, "
                                             f"{heap[2]:.1f} mapped")
            py = pymalloc_mb()
            if py is not None:
                where += f"; pymalloc {py[0]:.1f} MB of arenas, {py[1]:.1f} in use"
            where += f"; {len(os.listdir('/proc/self/task'))} threads"
            mark(f"after run {i}", f"{record.status}: {figures}{where}")
        gc.collect()
        mark("after the runs, gc.collect()")

    ticker = asyncio.create_task(per_minute())
    frames = 0
    try:
        if args.tui:
            await in_the_tui(session, runs, args)
        else:
            def on_snapshot(snap: object) -> None:
                nonlocal frames
                frames += 1  # the TUI renders each; here only its building is paid

            session.subscribe(on_snapshot)
            publisher = asyncio.create_task(session.publish_forever(hz=4.0))
            try:
                await runs(session.run_workload)
            finally:
                publisher.cancel()
    finally:
        ticker.cancel()
        await session.close()
    if not args.tui:
        print(f"({frames} snapshots published)")
    return rows


async def in_the_tui(session: Any, runs: Callable[[Callable[[], Awaitable[Any]]], Awaitable[None]],
                     args: argparse.Namespace) -> None:
    """``runs`` with each run started as the user does, by the ``r`` key of the real app (headless,
    ``args.size`` columns x rows; it publishes, renders and compares as it does in a terminal)."""
    from tui.app import VtuiApp

    cols, rows_ = (int(v) for v in args.size.split("x"))
    app = VtuiApp(session, cursor_blink=False)
    async with app.run_test(size=(cols, rows_)) as pilot:
        async def run_once() -> Any:
            before = len(session.runs)
            await pilot.press("r")
            while len(session.runs) == before or session.run_active:
                await asyncio.sleep(0.5)
            await pilot.press("5")  # the Runs tab, where the user looks at the runs side by side
            await asyncio.sleep(1.0)
            await pilot.press("1")
            return session.runs[-1]

        await runs(run_once)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=150.0, help="requests/s, constant gaps (default 150)")
    ap.add_argument("--seconds", type=float, default=600.0, help="length of each run (default 600)")
    ap.add_argument("--runs", type=int, default=3, help="runs back to back in the one session (default 3)")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--tui", action="store_true",
                    help="start each run by the r key of the real app (headless), as in a terminal")
    ap.add_argument("--size", default="100x36", help="the headless app's columns x rows (default 100x36)")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                    help="trace Python allocations FRAMES deep and print, after each run from the second, "
                         "where the memory the previous run left grew most (slows the session)")
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
    if a.tracemalloc:
        tracemalloc.start(a.tracemalloc)
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
    if len(after) >= 3:
        later = [r for _, r in after[1:]]
        print(f"RSS after runs 2..{len(after)}: {min(later):.1f} to {max(later):.1f} MB, "
              f"spread {max(later) - min(later):.1f} MB (target: within 10)")


if __name__ == "__main__":
    main()
