"""Check the NVML path of the telemetry sampler on a real NVIDIA GPU (an H200).

Starts the Sampler with the real NVML, then in this process allocates GPU memory in
steps and runs bf16 matrix products for about 20 s with PyTorch, printing each sample
as a table row. Expect: the device name, memory rising step by step and attributed to
this process, utilisation near 100 % while the matmuls run, power and SM clock up.

Needs only torch, psutil and NVML (nvidia-ml-py): run from the repository root with
``PYTHONPATH=. python tests/perf/nvml_h200_check.py [seconds]``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch

from engine.telemetry.sampler import Sampler, TelemetrySnapshot

GIB = 1024**3


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')} pid={os.getpid()}")
    rows: list[TelemetrySnapshot] = []
    lock = threading.Lock()
    t_start = time.time()
    header = f"{'t_s':>6} {'gpu':>3} {'name':<22} {'mem_GiB':>8} {'ours_GiB':>8} {'util%':>5} {'mem%':>4} {'power_W':>7} {'temp':>4} {'sm_MHz':>6} {'procs':>5} {'host_cpu%':>9} {'rss_GiB':>7} {'cost_ms':>7}"

    def on_snapshot(snap: TelemetrySnapshot) -> None:
        with lock:
            rows.append(snap)
        if snap.gpu_unavailable is not None:
            print(f"GPU unavailable: {snap.gpu_unavailable.reason}")
            return
        host = snap.host
        for g in snap.gpus:
            def f(v: float | None, scale: float = 1.0, fmt: str = ".1f") -> str:
                return "n/a" if v is None else format(v / scale, fmt)
            print(
                f"{snap.t - t_start:6.1f} {g.index:>3} {str(g.name)[:22]:<22} {f(g.mem_used_bytes, GIB, '.2f'):>8} "
                f"{f(g.server_mem_bytes, GIB, '.2f'):>8} {f(g.util_gpu_pct, 1, '.0f'):>5} {f(g.util_mem_pct, 1, '.0f'):>4} "
                f"{f(g.power_w):>7} {f(g.temp_c, 1, '.0f'):>4} {f(g.sm_clock_mhz, 1, '.0f'):>6} {g.nprocs!s:>5} "
                f"{f(host.cpu_percent if host else None):>9} {f(host.proc_rss_bytes if host else None, GIB, '.2f'):>7} "
                f"{snap.sample_cost_s * 1000:7.1f}",
                flush=True,
            )

    sampler = Sampler(on_snapshot, interval_s=0.5, root_pid=os.getpid())
    print(header)
    sampler.start()
    time.sleep(2.0)  # idle baseline
    dev = torch.device("cuda:0")
    held = []
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    end = time.time() + seconds
    next_alloc = time.time()
    while time.time() < end:
        if time.time() >= next_alloc and len(held) < 8:
            held.append(torch.empty(4 * GIB, dtype=torch.uint8, device=dev).fill_(1))  # 4 GiB a step
            next_alloc = time.time() + 2.0
        for _ in range(20):
            a = (a @ b) * 1e-4  # scaled so values stay finite
        torch.cuda.synchronize()
    del held, a, b
    torch.cuda.empty_cache()
    time.sleep(2.0)  # memory released
    sampler.stop()

    gpus = [g for s in rows for g in s.gpus if g.index == rows[-1].gpus[0].index] if rows and rows[-1].gpus else []
    if not gpus:
        print("no GPU samples")
        return 1
    mems = [g.mem_used_bytes or 0 for g in gpus]
    utils = [g.util_gpu_pct or 0 for g in gpus]
    costs = sorted(s.sample_cost_s for s in rows)
    print(
        f"\nsummary: device={gpus[0].name!r} samples={len(gpus)} mem_first={mems[0] / GIB:.2f} GiB "
        f"mem_peak={max(mems) / GIB:.2f} GiB mem_last={mems[-1] / GIB:.2f} GiB util_peak={max(utils):.0f}% "
        f"util_ge_90_samples={sum(u >= 90 for u in utils)} ours_peak="
        f"{max((g.server_mem_bytes or 0) for g in gpus) / GIB:.2f} GiB "
        f"tick_cost_median={costs[len(costs) // 2] * 1000:.1f} ms tick_cost_max={costs[-1] * 1000:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
