"""The Live tab marks where a live limit change (issue 41) falls on its TTFT chart, and what it
was; a change made while the Live tab was not laid out (another tab shown) draws once it is,
and never takes the screen down (an IndexError did, seen in tmux at 80x24 on 2026-12-06)."""

from __future__ import annotations

import pytest
import tui_data
from textual.widgets import Static

from engine.events import LimitsSetLive
from engine.flags.schema import builtin_schema
from engine.presets import list_presets
from tui.app import VtuiApp


def make_app() -> VtuiApp:
    return VtuiApp(tui_data.make_session(), schema=builtin_schema(), presets=list_presets(include_user=False),
                   cursor_blink=False)


def feed(app: VtuiApp, before: int, after: int) -> None:
    telemetry = app.session._telemetry_part
    for i in range(before):
        telemetry.push("ttft_p50", 50.0 + i)
    app.session._on_event(LimitsSetLive("max-num-seqs 128->4"))  # what ServerPart emits on a live apply
    for i in range(after):
        telemetry.push("ttft_p50", 20.0 + i)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
async def test_a_live_change_is_marked_under_the_ttft_chart(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        app.action_show("tab-flags")  # the Live tab is not laid out while the change comes
        await pilot.pause()
        feed(app, 30, 10)
        app.refresh_now()
        await pilot.pause()
        app.action_show("tab-live")
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        marks = app.screen.query_one("#live-marks", Static)
        text = str(marks.render())
        assert marks.display and "▲ set live: max-num-seqs 128->4" in text
        first = text.split("\n")[0]
        assert first.count("▲") == 1
        spark = app.screen.query_one("#spark-ttft_p50")
        column = first.index("▲") - (spark.region.x - marks.region.x)
        assert abs(column - 30 * spark.size.width // 40) <= 1  # at the 31st of 40 points


async def test_no_mark_without_a_change_and_old_ones_leave_with_their_points() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.session._telemetry_part.push("ttft_p50", 10.0)
        app.refresh_now()
        await pilot.pause()
        assert not app.screen.query_one("#live-marks", Static).display
        feed(app, 1, 200)  # the series keeps 120 points: the mark has left the chart
        app.refresh_now()
        await pilot.pause()
        assert not app.screen.query_one("#live-marks", Static).display
