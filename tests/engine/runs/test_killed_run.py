"""A run whose vtui is killed (kill -9) mid-run: every reader sees it cut short at once, with the
requests it completed (issue 32, item 6).

A real ``vtui bench`` process (the console script, as typed) drives ``loadgen.testserver`` at a low
rate and is SIGKILLed a few seconds in; a fresh ``vtui history`` (read-only: no writer opens the
store in between) must list the run as cut short, not ``running``, with its requests kept up to
about the last second. The bench runs in a session of its own so that its load-generator worker is
ended with it, by the group this test made.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.runs.history import History, HistoryError
from loadgen.testserver import ServerConfig, serve_in_processes

ROOT = Path(__file__).resolve().parents[3]
VTUI = Path(sys.executable).parent / "vtui"
RATE = 10.0  # requests/s: about 50 in the 5 s before the kill
CAP = 4  # requests in flight at most: what a kill may lose beyond the last second


def _vtui(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VTUI), *args], cwd=ROOT, env={**os.environ, "VTUI_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)


def _stored(home: Path) -> int:
    """Requests stored so far for the newest run (read-only, as another reader would)."""
    try:
        with History(home / "data" / "history.sqlite", read_only=True) as store:
            runs = store.list_runs(limit=1)
            return runs[0].requests if runs else 0
    except HistoryError:
        return 0


def test_kill_9_mid_bench_reads_cut_short_with_its_requests(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cfg = ServerConfig(first_delay_s=0.01, gap_s=0.02)
    with serve_in_processes(cfg, processes=1) as server:
        bench = subprocess.Popen(
            [str(VTUI), "bench", "--url", server.url, "--input-len", "16", "--output-len", "5",
             "--rate", str(RATE), "--concurrency", str(CAP), "--duration", "120", "--warmup", "0",
             "--name", "killed-bench", "-q"],
            cwd=ROOT, env={**os.environ, "VTUI_HOME": str(home)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while _stored(home) < 5:  # the run is measuring (imports and the worker's spawn done)
                assert bench.poll() is None, f"vtui bench ended early: {bench.stderr.read() if bench.stderr else ''}"
                assert time.monotonic() < deadline, "vtui bench stored no request in 90 s"
                time.sleep(0.2)
            time.sleep(4.0)
            os.kill(bench.pid, signal.SIGKILL)
            bench.wait(10)
            served, _, _ = server.first_chunk_delays()  # requests the server began to answer
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(bench.pid, signal.SIGKILL)  # the group this test started: its worker
            bench.wait(10)

    listed = _vtui(home, "history", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    (run,) = [r for r in json.loads(listed.stdout) if r["name"] == "killed-bench"]
    assert run["status"] == "cancelled", run
    assert run["duration_s"] is not None and run["duration_s"] > 3.0
    # Kept up to about the last second before the kill: at most a second of arrivals and the
    # requests then in flight are missing (and a margin for a busy 2-core box).
    assert 0 < run["requests"] <= served
    assert run["requests"] >= served - (1.5 * RATE + CAP), (run["requests"], served)
    print(f"killed run: {run['requests']} requests stored, {served} begun by the server, {run['duration_s']:.1f} s")

    shown = _vtui(home, "history", "show", str(run["id"]))
    assert shown.returncode == 0, shown.stderr
    assert "status    cancelled" in shown.stdout and "cut short:" in shown.stdout
    assert f"requests  {run['requests']} stored" in shown.stdout
    table = _vtui(home, "history")
    assert "running" not in table.stdout and "cancelled" in table.stdout
