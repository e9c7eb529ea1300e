"""How much CPU the telemetry sampler itself costs, at 2 Hz (target: under 2 % of one core).

GPU readings come from the FAKE NVML module (tests/fake_nvml.py: these machines have no
NVIDIA GPU; the real-NVML tick cost on an H200 is in tests/perf/nvml_h200_check.out.txt);
host readings are real psutil calls over a real 4-process tree, like a vLLM server
(API server, engine core, helpers). The process's CPU time is measured while the main
thread sleeps, so it is the sampler thread's cost (plus the idle interpreter).

Run: ``.venv/bin/python tests/perf/sampler_cost.py [seconds per row]`` (default 15).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_nvml
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from fake_nvml import FakeNvml  # noqa: E402

from engine.telemetry.nvml import NvmlReader  # noqa: E402
from engine.telemetry.sampler import Sampler, TelemetrySnapshot  # noqa: E402
from engine.telemetry.store import SeriesStore  # noqa: E402

TREE = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(3)]\n"
    "time.sleep(600)\n"
)


def measure(seconds: float, hz: float, gpus: int, root_pid: int) -> dict[str, float]:
    store = SeriesStore()
    costs: list[float] = []

    def on(snap: TelemetrySnapshot) -> None:
        costs.append(snap.sample_cost_s)
        store.add_snapshot(snap.gpus, snap.host, snap.gpu_unavailable)  # the TUI/bench consumer's work

    fake = FakeNvml(device_count=gpus, server_pid=root_pid, auto_advance=True)
    sampler = Sampler(on, interval_s=1.0 / hz, nvml=NvmlReader(fake, env={}), root_pid=root_pid)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    costs.sort()
    return {
        "hz": hz, "gpus": gpus, "ticks": len(costs), "wall_s": wall, "cpu_s": cpu,
        "core_pct": 100.0 * cpu / wall,
        "tick_p50_ms": 1000 * costs[len(costs) // 2], "tick_max_ms": 1000 * costs[-1],
    }


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    tree = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        time.sleep(1.0)  # let the tree spawn
        rows = [measure(seconds, hz, gpus, tree.pid) for hz, gpus in ((2, 1), (2, 8), (10, 8))]
    finally:
        import psutil

        for child in psutil.Process(tree.pid).children(recursive=True):
            child.kill()
        tree.kill()
        tree.wait()
    print(f"sampler CPU cost, fake NVML + real psutil over a 4-process tree, pid {os.getpid()}, {os.cpu_count()} cores")
    print(f"{'Hz':>4} {'GPUs':>4} {'ticks':>5} {'wall_s':>7} {'cpu_s':>6} {'% of a core':>11} {'tick p50 ms':>11} {'tick max ms':>11}")
    for r in rows:
        print(f"{r['hz']:>4g} {r['gpus']:>4} {r['ticks']:>5} {r['wall_s']:7.2f} {r['cpu_s']:6.3f} {r['core_pct']:11.2f} "
              f"{r['tick_p50_ms']:11.2f} {r['tick_max_ms']:11.2f}")
    at_2hz = max(r["core_pct"] for r in rows if r["hz"] == 2)
    print(f"target at 2 Hz: < 2 % of a core -> {'met' if at_2hz < 2.0 else 'NOT met'} ({at_2hz:.2f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
