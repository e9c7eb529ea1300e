"""Busy processes outside the caller's process tree, as another user's job is: vtui counts its own
tree and the measured server's as ours (engine.telemetry.host.BoxShare), so a stranger must not
be our child. The shell that starts each ends at once; the caller ends them by their pids.
Used by tests (test_box_bound, test_telemetry_host) and by tests/perf (noise.py, agreement.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def spawn_stranger(code: str) -> int:
    """Run ``code`` in a Python process that is not this one's descendant; its pid."""
    out = subprocess.run(["sh", "-c", '"$0" -c "$1" >/dev/null 2>&1 & echo $!', sys.executable, code],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def end_strangers(pids: list[int]) -> None:
    """End the strangers this caller started, by their pids (one already gone is fine)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
