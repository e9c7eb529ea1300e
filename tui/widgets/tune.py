"""The Tune screen: search the flags with the most goodput under an SLO, live.

A form (SLO limits, budget, the search space as ``flag=v1,v2`` lines, rate or
concurrency, the GPUs and how many trials at once as ``vtui tune --gpus --parallel``, a
Ray cluster as ``vtui tune --ray``), one line per running trial with its slot's GPUs (or
its Ray actor), the table of configurations as the
search tries them, the progress lines, the winner's serve and docker lines and the Pareto frontier. The search itself runs in
the core (``Session.tune``) in an app worker; this screen only reads the form (through
``engine.session.parse_tune_form``) and renders the snapshot's ``TuneView``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Button, DataTable, Footer, Input, Label, Select, Static, TextArea

from engine.session import TUNE_PERCENTILES, SessionError, TuneFormError, parse_tune_form
from engine.views import TuneRequest, TuneView
from tui.widgets.charts import TuneLoadChart

if TYPE_CHECKING:
    from engine.flags.schema import Schema
    from engine.tune.trial import ConfigResult

# Progress lines shown under the table (the core keeps more; the history has every step).
SHOWN_LINES = 5
NUMBER_FIELDS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2EL"),
                 ("budget_min", "budget min"), ("start_load", "start load"))
# Where the trials run (engine.tune.slots): empty is every GPU the session sees, one trial per slot;
# a Ray address (local, auto, HEAD:6379) runs them as Ray actors on that cluster (engine.tune.ray).
SLOT_FIELDS = (("gpus", "GPUs"), ("parallel", "parallel"), ("ray", "Ray"))
PLACEHOLDERS = {"start_load": "auto", "gpus": "all seen", "parallel": "one per slot", "ray": "off"}
# A search going on: measuring, or joining its Ray cluster first (x stops either).
GOING = ("running", "joining")


def _load(value: float | None, mode: str) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "any"
    return f"{value:.3g}" + (" req/s" if mode == "rate" else "")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


class TuneScreen(Screen[None]):
    """The flag search's form and live results; see the module doc."""

    # No field takes the focus on entry, so g/x/l/e work at once; Tab enters the form.
    AUTO_FOCUS = ""
    COMPONENT_CLASSES = {"tune--best"}

    # Short words, so that with the app's ? and q they fit an 80-column footer.
    BINDINGS = [
        Binding("escape", "close", "Back", tooltip="Back to the main screen (from a field: leave the field)"),
        Binding("g", "start", "Start", tooltip="Start the tune the form describes"),
        Binding("x", "stop", "Stop", tooltip="Stop the tune (it is saved as interrupted)"),
        Binding("l", "load_best", "Load best", tooltip="Load the best flags into the editor (nothing restarts)"),
        Binding("e", "export", "Export", tooltip="Export the best flags (docker run, vllm serve, JSON)"),
        Binding("f", "toggle_form", "Form", tooltip="Hide or show the form (the results take the width)"),
    ]

    @dataclass
    class StartRequested(Message):
        """The form read well: start a search with this request."""

        request: TuneRequest

    class StopRequested(Message):
        """Stop the running search (it is saved as interrupted)."""

    class LoadRequested(Message):
        """Put the winner's flags into the editor (nothing restarts)."""

    class ExportRequested(Message):
        """Show the winner's export (docker run, vllm serve, the result JSON)."""

    view: reactive[TuneView | None] = reactive(None, always_update=True)
    """The latest TuneView from the session's snapshot (None before any search)."""

    def __init__(self, defaults: Mapping[str, str], *, schema: Schema | None = None, percentile: float = 99.0,
                 cursor_blink: bool = True, estimate: Callable[[TuneRequest], str] | None = None) -> None:
        """``estimate``: what a request is expected to cost here, in words (Session.tune_estimate),
        shown under the form as it is edited."""
        super().__init__()
        self.defaults = dict(defaults)
        self.estimate = estimate
        self._estimate_timer: Timer | None = None  # the estimate's redraw, 0.3 s after the last edit
        self._started: TuneRequest | None = None  # the search last started from this form
        self.schema = schema
        self.percentile = percentile
        self.cursor_blink = cursor_blink
        self._rows_shown: tuple[tuple[ConfigResult, ...], str | None] | None = None

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static("", id="tune-head")
        yield Static("", id="tune-estimate")  # under the head: seen at 80x24, where the form's foot is cut
        with Horizontal(id="tune-body"):
            with Vertical(id="tune-form"):
                yield Label("SLO limits, ms", classes="tune-section")
                with Horizontal(classes="tune-field"):
                    yield Label("percentile", classes="tune-label")
                    start = self.defaults.get("percentile") or f"{self.percentile:g}"
                    yield Select([(f"p{p:g}", f"{p:g}") for p in TUNE_PERCENTILES],
                                 value=start if start in {f"{p:g}" for p in TUNE_PERCENTILES} else "99",
                                 allow_blank=False, id="tune-percentile", compact=True)
                for key, label in NUMBER_FIELDS + SLOT_FIELDS:
                    if key == "budget_min":
                        yield Label("Search", classes="tune-section")
                    with Horizontal(classes="tune-field"):
                        yield Label(label, classes="tune-label")
                        yield Input(self.defaults.get(key, ""), id=f"tune-{key}", compact=True,
                                    placeholder=PLACEHOLDERS.get(key, ""), select_on_focus=False)
                    if key == "budget_min":
                        with Horizontal(classes="tune-field"):
                            yield Label("mode", classes="tune-label")
                            yield Select([("rate (req/s)", "rate"), ("concurrency", "concurrency")],
                                         value=self.defaults.get("mode", "rate"), allow_blank=False,
                                         id="tune-mode", compact=True)
                yield Label("Space: flag=v1,v2 a line", classes="tune-section")
                yield TextArea(self.defaults.get("space", ""), id="tune-space", compact=True, soft_wrap=False,
                               highlight_cursor_line=False)
                yield Static("", id="tune-error")
                with Horizontal(classes="tune-buttons"):
                    yield Button("Start (g)", id="tune-start", variant="primary", compact=True)
                    yield Button("Stop (x)", id="tune-stop", variant="error", compact=True, disabled=True)
                with Horizontal(classes="tune-buttons"):
                    yield Button("Load best (l)", id="tune-load", compact=True, disabled=True)
                    yield Button("Export (e)", id="tune-export", compact=True, disabled=True)
            with Vertical(id="tune-results"):
                yield Static("", id="tune-running")
                yield DataTable(id="tune-table", zebra_stripes=True, cursor_type="row")
                with VerticalScroll(id="tune-details"):
                    yield Static("", id="tune-best")
                    yield Static("", id="tune-pareto")
                    yield TuneLoadChart(id="tune-chart")
                    yield Static("", id="tune-log")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#tune-chart", TuneLoadChart).show(None)  # hidden until a step is measured
        self.call_after_refresh(self.show_estimate)
        if not self.cursor_blink:
            for widget in self.query(Input):
                widget.cursor_blink = False
            self.query_one(TextArea).cursor_blink = False
        table = self.query_one(DataTable)
        for key, label in (("mark", ""), ("key", "configuration"), ("status", "status"), ("limit", "limit"),
                           ("goodput", "goodput req/s"), ("steps", "steps"), ("reason", "reason")):
            table.add_column(label, key=key)
        self.watch_view(self.view)

    # ------------------------------------------------------------------ the form

    def form_fields(self) -> dict[str, str]:
        """What the user typed, as text (kept as typed whatever happens)."""
        fields = {key: self.query_one(f"#tune-{key}", Input).value for key, _ in NUMBER_FIELDS + SLOT_FIELDS}
        mode = self.query_one("#tune-mode", Select).value
        fields["mode"] = str(mode) if isinstance(mode, str) else "rate"
        pct = self.query_one("#tune-percentile", Select).value
        fields["percentile"] = str(pct) if isinstance(pct, str) else f"{self.percentile:g}"
        fields["space"] = self.query_one("#tune-space", TextArea).text
        return fields

    def show_error(self, message: str, hint: str = "", field: str | None = None) -> None:
        """Say in place what is wrong (the field turns red); the typed text stays."""
        error = self.query_one("#tune-error", Static)
        error.update(message + (f"\nhint: {hint}" if hint else ""))
        error.set_class(bool(message), "-error")
        for widget in self.query(".-invalid"):
            widget.remove_class("-invalid")
        if field:
            for widget in self.query(f"#tune-{field}"):
                widget.add_class("-invalid")

    @on(Input.Changed)
    @on(TextArea.Changed)
    @on(Select.Changed)
    def _edited(self) -> None:
        if self.estimate is not None and self.is_mounted:
            if self._estimate_timer is not None:
                self._estimate_timer.stop()
            self._estimate_timer = self.set_timer(0.3, self.show_estimate)

    def show_estimate(self) -> None:
        """What the form's search is expected to cost here (before it starts), or nothing while the
        form does not read, a search runs, or the form is the search last started (its own lines
        said it)."""
        line = self.query_one("#tune-estimate", Static)
        if self.estimate is None or (self.view is not None and self.view.status in GOING):
            line.update("")
            return
        try:
            request = parse_tune_form(self.form_fields(), schema=self.schema, percentile=self.percentile)
            line.update("" if request == self._started else f"the form's search: {self.estimate(request)}")
        except (TuneFormError, SessionError):
            line.update("")

    def read_form(self) -> TuneRequest | None:
        """The request the form describes, or None (the reason shown in place)."""
        try:
            request = parse_tune_form(self.form_fields(), schema=self.schema, percentile=self.percentile)
        except TuneFormError as exc:
            self.show_error(str(exc), exc.hint, exc.field)
            return None
        self.show_error("")
        return request

    # ------------------------------------------------------------------ actions

    def action_close(self) -> None:
        # Esc in a field leaves the field first; Esc again goes back to the main screen.
        if isinstance(self.focused, (Input, TextArea, Select)):
            self.set_focus(None)
            return
        self.app.pop_screen()

    def action_toggle_form(self) -> None:
        form = self.query_one("#tune-form")
        form.display = not form.display
        if not form.display and self.focused is not None and form in self.focused.ancestors:
            self.set_focus(None)

    def action_start(self) -> None:
        if self.view is not None and self.view.status in GOING:
            self.notify("a tune is already running: x stops it", severity="warning")
            return
        request = self.read_form()
        if request is not None:
            self._started = request  # its own lines say what it costs from here; a changed form shows it again
            self.query_one("#tune-estimate", Static).update("")
            self.post_message(self.StartRequested(request))

    def action_stop(self) -> None:
        self.post_message(self.StopRequested())

    def action_load_best(self) -> None:
        self.post_message(self.LoadRequested())

    def action_export(self) -> None:
        self.post_message(self.ExportRequested())

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_start()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        action = {"tune-start": self.action_start, "tune-stop": self.action_stop,
                  "tune-load": self.action_load_best, "tune-export": self.action_export}.get(event.button.id or "")
        if action is not None:
            action()

    # ------------------------------------------------------------------ rendering

    def watch_view(self, view: TuneView | None) -> None:
        if not self.is_mounted:
            return
        try:
            self._draw(view)
        except NoMatches:
            # Between mount and compose, or being torn down at exit: the next snapshot draws it.
            return

    def _draw(self, view: TuneView | None) -> None:
        with self.app.batch_update():
            self._render_head(view)
            self._render_running(view)
            self._render_table(view)
            self._render_results(view)
            running = view is not None and view.status in GOING
            has_best = view is not None and view.best_key is not None
            self.query_one("#tune-start", Button).disabled = running
            self.query_one("#tune-stop", Button).disabled = not running
            self.query_one("#tune-load", Button).disabled = running or not has_best
            self.query_one("#tune-export", Button).disabled = not has_best

    def _render_head(self, view: TuneView | None) -> None:
        head = self.query_one("#tune-head", Static)
        if view is None:
            head.update("Tune: the flags with the most goodput under the SLO. Fill the form, g starts; "
                        "live flags change on the running server, the others restart it.")
            head.set_classes("")
            return
        done = sum(1 for r in view.rows if r.status not in ("not_tried", "cut_short"))
        # No id yet while joining a Ray cluster, nor after a stop then (the search was not made).
        name = f"Tune {view.id}" if view.id else "Tune"
        text = (f"{name}: {view.status}  {_minutes(view.elapsed_s)}/{_minutes(view.budget_s)} min  "
                f"{done}/{view.configs_total} configs  {view.starts} starts  {view.steps} steps  "
                f"[{view.slo_label}]")
        if view.id and view.status in ("running", "interrupted", "budget", "failed"):
            text += f"  resume: {view.resume_command}"
        head.update(text)
        head.set_classes(f"-{view.status}")

    def _render_running(self, view: TuneView | None) -> None:
        """One line per slot measuring now: its GPUs, configuration, phase and load, its last
        step's latencies, and its devices' memory and utilization (the session joins them)."""
        running = self.query_one("#tune-running", Static)
        trials = view.running if view is not None else ()
        running.display = bool(trials)
        if not trials:
            return
        assert view is not None
        pct = self.percentile
        lines = []
        for tv in trials:
            t = tv.trial
            # A Ray trial says its actor (its node's GPUs are not this machine's); else its GPUs.
            where = tv.where or (f"GPU {','.join(map(str, t.gpus))}" if t.gpus else "slot")
            doing = {"starting": "starting its server", "alone": "measured alone"}.get(t.phase, "measuring")
            if t.load is not None:
                doing += f" at {_load(t.load, view.mode) or t.load}"
            line = f"▶ {where} {t.key}: {doing}, {t.steps} steps"
            if t.last is not None:
                m = t.last
                ttft = "-" if m.ttft_ms is None else f"{m.ttft_ms:.0f}"
                tpot = "-" if m.tpot_ms is None else f"{m.tpot_ms:.1f}"
                line += (f"; last {_load(m.load, view.mode)}: p{pct:g} TTFT {ttft} ms, TPOT {tpot} ms, "
                         + ("meets SLO" if m.ok else "misses"))
            dev = "  ".join(
                f"{d.name} {d.mem_used_gib or 0:.1f}/{d.mem_total_gib or 0:.0f} GiB {d.util_pct or 0:.0f}%"
                for d in tv.devices if d.mem_total_gib)
            lines.append(line + (f"  [{dev}]" if dev else ""))
        running.update("\n".join(lines))

    def _render_table(self, view: TuneView | None) -> None:
        rows = view.rows if view is not None else ()
        best = view.best_key if view is not None else None
        if (rows, best) == self._rows_shown:
            return  # rows change only after a start or a step
        self._rows_shown = (rows, best)
        table = self.query_one(DataTable)
        table.clear()
        style = self.get_component_rich_style("tune--best")
        mode = view.mode if view is not None else "rate"
        for r in rows:
            is_best = r.key == best
            status = r.status_words()
            # A row tied with the best within the noise (its ``tie`` from the core) is marked "=" and
            # says so where it has no other reason; the best's own words are under the table.
            tied = bool(r.tie) and not is_best
            cells = [Text("★" if is_best else "=" if tied else ""), Text(r.key, style=style if is_best else ""),
                     Text(status), Text(_load(r.limit_load, mode)),
                     Text("" if r.goodput is None else f"{r.goodput:.3g}"), Text(str(r.steps)),
                     Text(r.reason or (r.tie if tied else ""))]
            table.add_row(*cells, key=r.key)

    def _render_results(self, view: TuneView | None) -> None:
        self.query_one("#tune-chart", TuneLoadChart).show(view)
        best = self.query_one("#tune-best", Static)
        pareto = self.query_one("#tune-pareto", Static)
        log = self.query_one("#tune-log", Static)
        if view is None:
            best.update("")
            pareto.update("")
            log.update("")
            return
        if not view.id:
            # Joining a Ray cluster, or stopped then: no search yet, nothing measured (the lines say so).
            best.update("")
        elif view.error:
            best.update(f"failed: {view.error}")
        elif view.best_key is None:
            best.update("no configuration has met the SLO yet" if view.status == "running"
                        else "no configuration met the SLO")
        else:
            # Where the best is tied with others within the noise, the core's words for it.
            row = next((r for r in view.rows if r.key == view.best_key), None)
            tie = f"\n{row.tie}" if row is not None and row.tie else ""
            best.update(f"best: {view.best_key}: goodput {view.best_goodput or 0:.3g} req/s at "
                        f"{_load(view.best_limit, view.mode) or '-'}"
                        + (" (so far)" if view.status == "running" else "") + tie
                        + f"\n{view.best_serve_line}\n{view.best_docker_line}")
        if not view.id:
            pareto.update("")
        elif view.pareto:
            lines = ["Pareto frontier: tok/s per user | tok/s per GPU | configuration at load"]
            for p in view.pareto[:6]:
                load = "all at once" if math.isinf(p.load) else f"{p.load:.3g}"
                lines.append(f"  {p.tokens_per_user:8.1f} | {p.tokens_per_gpu:9.1f} | {p.key} at {load}")
            pareto.update("\n".join(lines))
        else:
            pareto.update("Pareto frontier: no step met the SLO yet")
        log.update("\n".join(view.lines[-SHOWN_LINES:]))
