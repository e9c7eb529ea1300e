"""A sentinel API key through the TUI's screens and `vtui bench` (issue 17, item 4): it reaches
the server (which refuses requests without it) and shows up in no screen, output, result file,
history, log or process argv. Serve, the session's exports and the history are checked in
tests/engine/server/test_safety.py; the servers here are the stand-ins (tests/fakevllm.py, loadgen.testserver),
which demand the key as vLLM does."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.flags import FlagSet, builtin_schema
from engine.presets import list_presets
from engine.session import Session
from loadgen import ArrivalSpec, WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_thread
from tests import fakevllm
from tests.engine.server.test_safety import _grep_tree
from tui.app import VtuiApp

ROOT = Path(__file__).resolve().parents[2]


def argv_holding(needle: str) -> list[int]:
    """Pids of every process on the box whose command line holds ``needle``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(needle in part for part in proc.info.get("cmdline") or ()):
            found.append(proc.pid)
    return found


def test_vtui_bench_takes_the_key_from_the_environment_and_shows_it_nowhere(tmp_path: Path) -> None:
    key = "sk-sentinel-" + secrets.token_hex(8)
    with serve_in_thread(ServerConfig(first_delay_s=0.002, max_model_len=600, api_key=key)) as url:
        argv = [sys.executable, "-m", "tui.cli", "bench", "--url", url, "--input-len", "16", "--output-len", "4",
                "--num-requests", "4", "--allow-box-bound", "--result-file", str(tmp_path / "r.json")]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        refused = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr  # the server demands it
        ok = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**env, "VLLM_API_KEY": key})
    assert ok.returncode == 0, ok.stderr[-2000:]
    result = (tmp_path / "r.json").read_text()
    assert json.loads(result)["completed"] == 4  # every request carried the key
    for text in (ok.stdout, ok.stderr, result):
        assert key not in text
    assert _grep_tree(Path(os.environ["VTUI_HOME"]), key.encode()) == []


async def test_the_tuis_screens_never_show_the_key(tiny_model: Path) -> None:
    key = "sk-sentinel-" + secrets.token_hex(8)
    flags = FlagSet(model=str(tiny_model), values={}).set("api-key", [key])
    session = Session(flags, workload=WorkloadSpec(input_len=16, output_len=4),
                      arrivals=ArrivalSpec(concurrency=2, num_requests=4), launcher=fakevllm.command(),
                      telemetry=False, record_history=False, workload_label="sentinel")
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)
    screens: dict[str, str] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        await session.start_server(timeout=30)
        record = await session.run_workload()
        assert record.summary.figure("completed") == 4  # the stand-in refuses requests without the key
        assert argv_holding(key) == []  # no process on the box carries it in argv
        for tab in ("1", "2", "3", "4", "5"):  # Live, Flags, Presets, Server (its log), Runs
            await pilot.press(tab)
            await pilot.pause()
            screens[f"tab {tab}"] = app.export_screenshot()
        await pilot.press("e")  # the export dialog: docker run line
        await pilot.pause()
        screens["export"] = app.export_screenshot()
        await pilot.press("escape")
        session.set_flag_text("max-num-seqs", "8")
        await pilot.press("a")  # the apply preview: the command line that would launch
        await pilot.pause()
        screens["apply preview"] = app.export_screenshot()
        await pilot.press("escape")
        await pilot.pause()
    await session.close()
    for name, svg in screens.items():
        assert key not in svg, name
    assert "VLLM_API_KEY" in screens["export"].replace("&#160;", " ")  # shown by reference
    assert _grep_tree(Path(os.environ["VTUI_HOME"]), key.encode()) == []


@pytest.fixture(autouse=True)
def _no_stray_key() -> None:
    """Nothing in this module may leave the key in the environment of later tests."""
    os.environ.pop("VLLM_API_KEY", None)
