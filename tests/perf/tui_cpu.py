"""CPU used by the vtui process while a load run at 100+ req/s updates the screen live.

The app runs for real in a pseudo-terminal of 120x40 (so every frame is rendered and
written, as over SSH), attached to loadgen's stand-in SSE server (no model; its own
process, pinned away from the app where there are cores to spare). The app starts the
run itself and quits when it ends; it measures its own CPU time over the run, per
thread: the UI (main thread: Textual, rendering), the load generator (its own thread
and loop), telemetry (sampler thread). The same run without any UI gives the baseline.

    .venv/bin/python tests/perf/tui_cpu.py [--seconds 20] [--concurrency 32]

Target (issue 6): the TUI process under 25% of a core besides the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _session(url: str, seconds: float, concurrency: int) -> Any:
    from engine.flags import FlagSet
    from engine.server.attach import AttachedServer
    from engine.server.tinymodel import ensure_tiny_model
    from engine.session import Session
    from loadgen import ArrivalSpec, WorkloadSpec

    tok = ensure_tiny_model()
    session = Session(
        FlagSet(model=str(tok), values={}),
        workload=WorkloadSpec(input_len=64, output_len=16),
        arrivals=ArrivalSpec(concurrency=concurrency, duration_s=seconds),
        workload_label="perf",
        record_history=False,
    )
    return session, AttachedServer(url=url, version="stand-in", models=("test-model",), max_model_len=4096)


class ThreadCpu:
    """CPU seconds per thread kind (ui, loadgen, telemetry, other) of this process, read
    from /proc every 0.2 s so threads that end before the measurement (the load run's)
    are still counted."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="perf-probe", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def _read(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid_s in os.listdir("/proc/self/task"):
            try:
                stat = Path(f"/proc/self/task/{tid_s}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / self._tick
            tid = int(tid_s)
            name = names.get(tid) or self._seen.get(tid, ("other", 0.0))[0]
            kind = {"MainThread": "ui", "vtui-loadrun": "loadgen", "vtui-telemetry": "telemetry",
                    "perf-probe": "probe"}.get(name, "other" if name != "other" else "other")
            self._seen[tid] = (kind if kind != "other" else name, cpu)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._read()

    def start(self) -> dict[str, float]:
        self._read()
        self._thread.start()
        return self.totals()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._read()
        return self.totals()

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for kind, cpu in self._seen.values():
            key = kind if kind in ("ui", "loadgen", "telemetry", "probe") else "other"
            out[key] = out.get(key, 0.0) + cpu
        return out


def child_ui(url: str, seconds: float, concurrency: int, out: str) -> None:
    """Run the real app (in the pty the parent gave us), start the run, quit at its end."""
    from tui.app import VtuiApp

    session, server = _session(url, seconds, concurrency)
    result: dict[str, Any] = {}

    class BenchApp(VtuiApp):
        def on_mount(self) -> None:
            # Textual calls VtuiApp.on_mount as well (handlers run along the MRO): no super().
            session.attach_server(server)
            # A worker, not the timer callback itself: awaiting in a handler would hold the
            # app's message queue, and no snapshot would be drawn during the run.
            self.set_timer(1.0, lambda: self.run_worker(self._go(), group="bench"))

        async def _go(self) -> None:
            probe = ThreadCpu()
            t0, w0, th0 = time.process_time(), time.perf_counter(), probe.start()
            frames0 = self._frames
            worker = self._run()
            await worker.wait()
            t1, w1, th1 = time.process_time(), time.perf_counter(), probe.stop()
            rec = session.runs[-1]
            result.update(
                cpu_s=t1 - t0, wall_s=w1 - w0, threads={k: th1.get(k, 0) - th0.get(k, 0) for k in th1},
                req_s=rec.summary.figure("request_throughput"), completed=rec.summary.figure("completed"),
                frames=self._frames - frames0,
            )
            Path(out).write_text(json.dumps(result))
            await session.close()
            self.exit(0)

        _frames = 0

        def show_snapshot(self, snap: Any) -> None:
            self._frames += 1
            super().show_snapshot(snap)

    BenchApp(session).run()


def child_headless(url: str, seconds: float, concurrency: int, out: str) -> None:
    """The same run with no UI at all: what the session and load generator cost alone."""
    session, server = _session(url, seconds, concurrency)

    async def main() -> None:
        session.attach_server(server)
        probe = ThreadCpu()
        t0, w0, th0 = time.process_time(), time.perf_counter(), probe.start()
        rec = await session.run_workload()
        t1, w1, th1 = time.process_time(), time.perf_counter(), probe.stop()
        Path(out).write_text(json.dumps(dict(
            cpu_s=t1 - t0, wall_s=w1 - w0, threads={k: th1.get(k, 0) - th0.get(k, 0) for k in th1},
            req_s=rec.summary.figure("request_throughput"), completed=rec.summary.figure("completed"), frames=0)))
        await session.close()

    asyncio.run(main())


def run_in_pty(args: list[str], cols: int = 120, rows: int = 40) -> int:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                            start_new_session=True)
    os.close(slave)
    written = 0
    tail = b""
    while True:
        try:
            data = os.read(master, 65536)  # drain like a terminal would
        except OSError:
            break
        if not data:
            break
        written += len(data)
        tail = (tail + data)[-4000:]
    proc.wait()
    if proc.returncode:
        print(tail.decode(errors="replace"))
    os.close(master)
    print(f"  (app wrote {written / 1e6:.1f} MB of terminal output)")
    return proc.returncode


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--child-ui", "--child-headless"):
        fn = child_ui if sys.argv[1] == "--child-ui" else child_headless
        fn(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=32)
    a = ap.parse_args()
    from loadgen.testserver import ServerConfig, serve_in_processes

    cores = sorted(os.sched_getaffinity(0))
    server_cpus = cores[1:] or cores
    rows = []
    # A 2 ms gap per chunk: 16 chunks ~ 35 ms per request, so 32 streams give ~600 req/s max.
    with serve_in_processes(ServerConfig(gap_s=0.002), 1, cpus=server_cpus) as h:
        for mode in ("headless", "ui"):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                out = f.name
            argv = [sys.executable, __file__, f"--child-{mode}", h.url, str(a.seconds), str(a.concurrency), out]
            print(f"{mode}: running {a.seconds:.0f} s at concurrency {a.concurrency} ...")
            if mode == "ui":
                run_in_pty(argv)
            else:
                subprocess.run(argv, check=True)
            rows.append((mode, json.loads(Path(out).read_text())))
            os.unlink(out)
    print(f"\nmachine: {len(cores)} cores; stand-in server on {server_cpus}\n")
    print(f"{'mode':<9} {'req/s':>7} {'done':>6} {'process %core':>13} {'ui thread':>9} {'loadgen':>8} "
          f"{'telemetry':>9} {'other':>6} {'frames':>6}")
    for mode, r in rows:
        th = r["threads"]
        pct = lambda s: 100 * s / r["wall_s"]  # noqa: E731 - tiny local formatter
        print(f"{mode:<9} {r['req_s']:>7.1f} {r['completed']:>6} {pct(r['cpu_s']):>12.1f}% "
              f"{pct(th.get('ui', 0)):>8.1f}% {pct(th.get('loadgen', 0)):>7.1f}% "
              f"{pct(th.get('telemetry', 0)):>8.1f}% {pct(th.get('other', 0)):>5.1f}% {r['frames']:>6}")
    print("(probe = this benchmark's own /proc reader; other = httpx/asyncio helper threads)")
    ui, head = rows[1][1], rows[0][1]
    ui_pct = 100 * ui["threads"].get("ui", 0) / ui["wall_s"]
    print(f"\nUI thread (Textual: snapshots, layout, rendering, terminal writes): {ui_pct:.1f}% of a core "
          f"at {ui['req_s']:.0f} req/s, {ui['frames'] / ui['wall_s']:.1f} snapshots/s drawn (target < 25%)")
    print(f"load generator throughput with the UI vs headless: {ui['req_s']:.0f} vs {head['req_s']:.0f} req/s "
          f"(the two share one GIL; the stand-in server and other processes share the cores)")


if __name__ == "__main__":
    main()
