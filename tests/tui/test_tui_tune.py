"""The Tune screen (issue 7, live in the TUI): u opens it, the form refuses bad input in
place (keeping what was typed), g starts the search in a worker, the table and the best
fill in from the session's snapshots, x stops it (interrupted, resumable), l loads the
winner into the editor and e exports it.

The session measures with ``RecordedMeasurer`` (tests/engine/tune/test_session_tune.py): it stands in
for measurement (vLLM and the load), not for a GPU; the search and the session are real.
Update the snapshot after an intended change with
``pytest tests/tui/test_tui_tune.py --snapshot-update``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tui_data
from textual.widgets import DataTable, Input, Static, TextArea

from engine.flags import builtin_schema
from engine.presets import list_presets
from engine.session import Session
from tests.engine.tune.test_session_tune import LIMITS, TIED, TIED_BEST, RecordedMeasurer
from tui.app import VtuiApp
from tui.widgets.modals import ExportScreen
from tui.widgets.tune import TuneScreen

SPACE = "max-num-seqs=64,128\nmax-num-batched-tokens=512,2048"
BEST = "max-num-seqs=128,max-num-batched-tokens=2048"


def make_app(measurer: RecordedMeasurer, *, publish: bool = True) -> tuple[VtuiApp, Session]:
    session = tui_data.make_session()
    session._tune_measurer = measurer.factory
    session.load_preset("online-chat")
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), publish=publish,
                  cursor_blink=False)
    return app, session


async def wait_group(app: VtuiApp, group: str) -> None:
    for worker in list(app.workers):
        if worker.group == group and not worker.is_finished:
            await worker.wait()


def text_of(screen: TuneScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


async def test_the_estimate_is_on_screen_at_80x24() -> None:
    """Over SSH at 80x24 the form's foot is cut off: the estimate sits under the screen's head."""
    app, _ = make_app(RecordedMeasurer(LIMITS))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("u")
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        screen.query_one("#tune-space", TextArea).text = SPACE
        await pilot.pause(0.5)
        line = screen.query_one("#tune-estimate")
        said = text_of(screen, "#tune-estimate")
        assert said.startswith("the form's search: about") and "4 configurations" in said, said
        assert line.region.height >= 1 and line.region.bottom <= 23, line.region  # above the footer


async def test_the_form_says_what_the_search_will_cost_and_what_to_cut_before_it_starts() -> None:
    app, _ = make_app(RecordedMeasurer(LIMITS))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("u")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        screen.query_one("#tune-space", TextArea).text = SPACE
        screen.query_one("#tune-budget_min", Input).value = "30"
        await pilot.pause(0.5)
        said = text_of(screen, "#tune-estimate")
        assert "4 configurations" in said and "over the" not in said, said
        screen.query_one("#tune-budget_min", Input).value = "1"
        await pilot.pause(0.5)
        said = text_of(screen, "#tune-estimate")
        assert "over the 1 min budget: cut max-num-seqs (2 values) or raise the budget" in said, said
        screen.query_one("#tune-space", TextArea).text = "max-num-seqs=64,lots"
        await pilot.pause(0.5)
        assert text_of(screen, "#tune-estimate") == ""  # a form that does not read has no estimate


async def test_form_refuses_bad_input_then_runs_shows_rows_and_best_and_stops() -> None:
    m = RecordedMeasurer(LIMITS, hold=True)
    app, session = make_app(m)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("u")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)

        # A limit that is not a number: said in place, the field marked, the text kept.
        ttft = screen.query_one("#tune-ttft_ms", Input)
        await pilot.click(ttft)
        await pilot.press("ctrl+a", "ctrl+k", *"5OO", "enter")
        await pilot.pause()
        assert "p99 TTFT limit (ms): '5OO' is not a number" in text_of(screen, "#tune-error")
        assert ttft.has_class("-invalid") and ttft.value == "5OO"
        assert session.snapshot().tune is None and m.starts == []

        # A bad space line: SearchSpace.parse's reason, naming the line.
        await pilot.press("ctrl+a", "ctrl+k", *"500", "escape")
        space = screen.query_one("#tune-space", TextArea)
        space.text = "max-num-seqs=64,lots"
        await pilot.press("g")
        await pilot.pause()
        error = text_of(screen, "#tune-error")
        assert "search space: --space 'max-num-seqs=64,lots': value 'lots'" in error and "Traceback" not in error
        assert space.has_class("-invalid") and not ttft.has_class("-invalid")
        assert space.text == "max-num-seqs=64,lots" and session.snapshot().tune is None

        # Good input: the search starts in a worker; the screen renders its snapshots.
        space.text = SPACE
        await pilot.press("g")
        await pilot.pause()
        gate = await m.next_step(_tune_task(session))
        assert gate is not None and text_of(screen, "#tune-error") == ""
        for _ in range(8):  # eight steps: the first configuration is done by then
            gate.set_result(None)
            gate = await m.next_step(_tune_task(session))
            assert gate is not None
        app.refresh_now()
        await pilot.pause()
        assert "running" in text_of(screen, "#tune-head")
        table = screen.query_one("#tune-table", DataTable)
        assert table.row_count >= 1
        assert "(so far)" in text_of(screen, "#tune-best")
        assert screen.query_one("#tune-stop").disabled is False

        await pilot.press("x")  # cancels the step in flight; the search saves itself as interrupted
        await wait_group(app, "tune")
        # The screen shows the end at the app's next publish tick (a busy 2-core CI box drew
        # "running" right after one pause): wait for that tick, up to 5 s.
        for _ in range(50):
            await pilot.pause(0.1)
            if "interrupted" in text_of(screen, "#tune-head"):
                break
        head = text_of(screen, "#tune-head")
        view = session.snapshot().tune
        assert view is not None and view.status == "interrupted"
        assert "interrupted" in head and f"resume: vtui tune --resume {view.id}" in head
        assert screen.query_one("#tune-start").disabled is False


def _tune_task(session: Session) -> Any:
    task = session._tune_task
    assert task is not None, "the tune did not start"
    return task


async def test_finished_tune_loads_the_winner_and_exports_it() -> None:
    m = RecordedMeasurer(LIMITS)
    app, session = make_app(m)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("u")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        screen.query_one("#tune-space", TextArea).text = SPACE
        await pilot.press("g")
        await pilot.pause()
        await wait_group(app, "tune")
        await pilot.pause()
        best = text_of(screen, "#tune-best")
        assert best.startswith(f"best: {BEST}: goodput") and "vllm serve" in best and "docker run" in best
        assert screen.query_one("#tune-table", DataTable).row_count == 4
        assert "Pareto frontier" in text_of(screen, "#tune-pareto")
        starts = list(m.starts)

        await pilot.press("l")
        await pilot.pause()
        assert session.flags.get("max-num-batched-tokens") == 2048 and session.dirty
        assert m.starts == starts  # nothing restarted
        assert any("a applies" in n.message for n in app._notifications)

        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, ExportScreen)
        assert app.screen.text == session.export_tune("docker") and "--max-num-batched-tokens 2048" in app.screen.text
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen
        await pilot.press("escape")  # back to the main screen; the form stays as typed
        await pilot.pause()
        assert not isinstance(app.screen, TuneScreen)
        await pilot.press("u")
        await pilot.pause()
        assert app.screen is screen and screen.query_one("#tune-space", TextArea).text == SPACE


async def test_the_best_line_says_a_tie_within_the_noise() -> None:
    # Issue 34, item 4: the screen lays out the core's words (the best row's ``tie``) under the best.
    app, _ = make_app(RecordedMeasurer(TIED))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("u")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        screen.query_one("#tune-space", TextArea).text = SPACE
        await pilot.press("g")
        await pilot.pause()
        await wait_group(app, "tune")
        await pilot.pause()
        best = text_of(screen, "#tune-best").splitlines()
        assert best[0].startswith(f"best: {TIED_BEST}: goodput")
        assert best[1].startswith(f"tied with {BEST} (within noise: goodput ") and "fewer max-num-seqs" in best[1]
        assert best[2].startswith("vllm serve")
        table = screen.query_one("#tune-table", DataTable)
        tied = table.get_row(BEST)
        assert str(tied[0]) == "=" and str(tied[-1]).startswith(f"tied with the best {TIED_BEST} (within noise")
        assert str(table.get_row(TIED_BEST)[0]) == "★"


def test_finished_tune_snapshot(snap_compare: Callable[..., bool], monkeypatch: pytest.MonkeyPatch,
                                tmp_path: Path) -> None:
    """A finished search on recorded measurements, with the id and the clock fixed (and a data
    folder of its own: the form's estimate reads this box's last start of the flags)."""
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    app, session = make_app(RecordedMeasurer(LIMITS), publish=False)

    async def before(pilot: object) -> None:
        from engine.session import parse_tune_form

        form = {**session.tune_form_defaults(), "space": SPACE, "budget_min": "10"}
        await session.tune(parse_tune_form(form, schema=builtin_schema()))
        snap = session.snapshot()
        view = snap.tune
        assert view is not None
        fixed = "20261129-120000-abcd"
        lines = tuple(re.sub(r"\d+\.\d min left", "9.9 min left", line.replace(view.id, fixed))
                      for line in view.lines)
        view = dataclasses.replace(view, id=fixed, elapsed_s=95.0, lines=lines,
                                   resume_command=f"vtui tune --resume {fixed}")
        app.action_tune()
        await pilot.pause()  # type: ignore[attr-defined]
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        screen.query_one("#tune-space", TextArea).text = SPACE
        screen.query_one("#tune-budget_min", Input).value = "10"
        app.show_snapshot(dataclasses.replace(snap, tune=view))
        await pilot.pause()  # type: ignore[attr-defined]
        await pilot.pause(0.5)  # type: ignore[attr-defined]  # the estimate redraws 0.3 s after the last edit: wait for it
        await pilot.pause()  # type: ignore[attr-defined]

    assert snap_compare(app, terminal_size=(120, 40), run_before=before)


async def test_the_tune_screen_charts_ttft_against_load_per_configuration() -> None:
    from textual_plotext import PlotextPlot

    from engine.session import parse_tune_form

    app, session = make_app(RecordedMeasurer(LIMITS), publish=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_tune()
        await pilot.pause()
        chart = app.screen.query_one("#tune-chart", PlotextPlot)
        assert not chart.display  # no step yet: no empty axes
        form = {**session.tune_form_defaults(), "space": SPACE, "budget_min": "10"}
        await session.tune(parse_tune_form(form, schema=builtin_schema()))
        view = session.snapshot().tune
        assert view is not None and view.step_series
        for key, pts in view.step_series:  # the core's series: finite loads, in increasing order
            loads = [p[0] for p in pts]
            assert loads == sorted(loads) and key in {r.key for r in view.rows}
        # The recorded measurer gives no latencies: draw a series as a real measurer gives them.
        series = ((BEST, ((1.0, 80.0, 9.0, True), (2.0, 150.0, 11.0, True), (4.0, 900.0, 30.0, False))),
                  ("max-num-seqs=64,max-num-batched-tokens=512", ((1.0, 120.0, None, True),)))
        snap = session.snapshot()
        app.show_snapshot(dataclasses.replace(snap, tune=dataclasses.replace(view, step_series=series)))
        await pilot.pause()
        assert chart.display
        chart.scroll_visible(animate=False)
        await pilot.pause()
        text = app.export_screenshot().replace("&#160;", " ")
        assert "TTFT against load" in text and "TTFT ms" in text


async def test_the_tune_screen_lists_every_running_trial_with_its_gpus() -> None:
    """Issue 19, item 5: what each slot measures now, beside the table of finished ones."""
    from engine.session import parse_tune_form
    from engine.tune.search import Measurement, RunningTrial
    from engine.views import DeviceView, TrialView

    app, session = make_app(RecordedMeasurer(LIMITS), publish=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_tune()
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        assert not screen.query_one("#tune-running", Static).display  # nothing runs: no empty panel
        form = {**session.tune_form_defaults(), "space": SPACE, "budget_min": "10"}
        await session.tune(parse_tune_form(form, schema=builtin_schema()))
        snap = session.snapshot()
        assert snap.tune is not None and snap.tune.running == ()  # over: nothing running
        gpu = DeviceView("GPU2", 70.5, 141.0, 69.9, 97.0, index=2)
        last = Measurement(4.0, True, requests=50, completed=50, ttft_ms=412.0, tpot_ms=31.5)
        trials = (TrialView(RunningTrial(0, (0, 1), BEST, "starting", None), ()),
                  TrialView(RunningTrial(1, (2,), "max-num-seqs=64,max-num-batched-tokens=512", "measuring", 6.0,
                                      steps=3, last=last), (gpu,)))
        app.show_snapshot(dataclasses.replace(snap, tune=dataclasses.replace(snap.tune, status="running",
                                                                               running=trials)))
        await pilot.pause()
        panel = screen.query_one("#tune-running", Static)
        assert panel.display
        text = text_of(screen, "#tune-running")
        assert f"GPU 0,1 {BEST}: starting its server, 0 steps" in text
        assert ("GPU 2 max-num-seqs=64,max-num-batched-tokens=512: measuring at 6 req/s, 3 steps; last 4 req/s: "
                "p99 TTFT 412 ms, TPOT 31.5 ms, meets SLO  [GPU2 70.5/141 GiB 97%]") in text
