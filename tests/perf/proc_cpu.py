"""Per-process CPU of a vLLM server's tree while it runs (a diagnostic for the frontend_bound rule).

    python3 tests/perf/proc_cpu.py --every 5 --for 200   # prints, every 5 s, each vLLM process's CPU over 1 s

Reads every process whose name or command line holds 'vllm' / 'VLLM' (this script's and the probe's own
excluded) and all their descendants (vLLM's spawned API servers run as `python3 -c from multiprocessing...`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import psutil


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--for", dest="total", type=float, default=120.0)
    a = p.parse_args()
    end = time.monotonic() + a.total
    while time.monotonic() < end:
        procs = []
        for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
            if proc.pid == os.getpid():
                continue
            text = (proc.info["name"] or "") + " " + " ".join(proc.info["cmdline"] or [])
            if "vllm" in text.lower() and "proc_cpu" not in text and "frontend_probe" not in text:
                procs.append(proc)
        seen = {p.pid for p in procs}
        for proc in list(procs):
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    if child.pid not in seen:
                        seen.add(child.pid)
                        procs.append(child)
        for proc in procs:
            try:
                proc.cpu_percent(None)
            except psutil.Error:
                pass
        time.sleep(1.0)
        rows = []
        for proc in procs:
            try:
                rows.append(f"{proc.pid}<{proc.ppid()} {proc.name()[:24]} {proc.cpu_percent(None):.0f}% "
                            f"conns={len(proc.net_connections('tcp'))}")
            except psutil.Error:
                pass
        print(time.strftime("%H:%M:%S"), " | ".join(rows), flush=True)
        time.sleep(max(0.0, a.every - 1.0))


if __name__ == "__main__":
    main()
