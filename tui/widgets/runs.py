"""Runs side by side: one column per run (saying how many runs it holds), the best value per
row marked only beyond the noise, deltas to the baseline in percent and "within noise" where
the interval of a delta holds zero (computed in the core; this only lays them out), and the
notes saying what those verdicts rest on; below it the stored
history of every path (vtui bench, sweep, earlier sessions), any of which Enter adds to the
comparison."""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Input, Static
from textual_plotext import PlotextPlot

from engine.runs.compare import fmt_runs
from engine.session import SessionError
from engine.views import SessionSnapshot, StoredRun


def _n(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


class RunsPanel(Vertical):
    """The comparison table, and the stored runs to pick from."""

    BORDER_TITLE = "Runs"
    COMPONENT_CLASSES = {"runs--best", "runs--flag"}

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: object = None
        self._runs_seen = -1

    def compose(self) -> ComposeResult:
        yield Static("no runs yet: r runs the workload, b marks the last run as baseline", id="runs-help")
        yield DataTable(id="runs-table", zebra_stripes=True, cursor_type="column")
        yield Static("", id="runs-notes")
        yield Static("stored runs (every path): Enter adds one to the comparison or takes it out",
                     id="stored-help")
        yield Input(placeholder="filter: model, preset, date, status", id="stored-filter", compact=True)
        yield DataTable(id="stored-table", zebra_stripes=True, cursor_type="row")
        yield PlotextPlot(id="runs-load")
        yield PlotextPlot(id="runs-pareto")

    def on_mount(self) -> None:
        table = self.query_one("#stored-table", DataTable)
        for key, label in (("id", "id"), ("name", "name"), ("preset", "preset"), ("model", "model"),
                           ("started", "started"), ("status", "status"), ("req_s", "req/s"),
                           ("ttft", "TTFT p50 ms"), ("in", "compared")):
            table.add_column(label, key=key)
        self.refresh_stored()
        self._plot_load(self._session())  # then again whenever the comparison changes

    def _session(self) -> object | None:
        return getattr(self.app, "session", None)

    def refresh_stored(self) -> None:
        """List the history again (the core reads and filters it)."""
        session = self._session()
        stored: tuple[StoredRun, ...] = ()
        if session is not None and hasattr(session, "stored_runs"):
            stored = session.stored_runs(self.query_one("#stored-filter", Input).value)
        table = self.query_one("#stored-table", DataTable)
        table.clear()
        for r in stored:
            table.add_row(str(r.id), r.name, r.preset or "-", (r.model or "-").rsplit("/", 1)[-1],
                          time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)), r.status,
                          _n(r.req_s, "{:.2f}"), _n(r.ttft_p50_ms, "{:.1f}"), "yes" if r.compared else "",
                          key=str(r.id))
        self._plot_pareto(session)

    def _blank_plot(self, selector: str, points: int) -> PlotextPlot | None:
        """The chart cleared for drawing, or None (and hidden) under two points: no empty axes."""
        plot = self.query_one(selector, PlotextPlot)
        plot.display = points >= 2
        if not plot.display:
            return None
        plot.plt.clear_data()
        plot.plt.clear_figure()
        return plot

    def _plot_load(self, session: object | None) -> None:
        """The compared runs' p99 TTFT and TPOT against the requests/s each achieved (a sweep
        read as a curve; the core gives the points). Hidden under two runs."""
        points = session.load_points() if session is not None and hasattr(session, "load_points") else ()
        plot = self._blank_plot("#runs-load", len(points))
        if plot is None:
            return
        plt = plot.plt
        loads = [p.load for p in points]
        for label, values, side in (("TTFT p99 ms", [p.ttft_p99_ms for p in points], "left"),
                                    ("TPOT p99 ms (right)", [p.tpot_p99_ms for p in points], "right")):
            pairs = [(x, y) for x, y in zip(loads, values, strict=True) if y is not None]
            if pairs:
                plt.plot([x for x, _ in pairs], [y for _, y in pairs], label=label, marker="dot", yside=side)
        plt.title("compared runs: latency against load")
        plt.xlabel("requests/s")
        plot.refresh()

    def _plot_pareto(self, session: object | None) -> None:
        """The stored runs' tokens/s per user against tokens/s per GPU, frontier apart (the core
        computes the points and the frontier; this only draws them). Hidden under two runs."""
        points = session.run_points() if session is not None and hasattr(session, "run_points") else ()
        plot = self._blank_plot("#runs-pareto", len(points))
        if plot is None:
            return
        plt = plot.plt
        groups = (("Pareto frontier", [p for p in points if p.frontier]),
                  ("met the SLO or had none", [p for p in points if not p.frontier and p.slo_met is not False]),
                  ("missed the SLO", [p for p in points if p.slo_met is False]))
        for label, group in groups:
            if group:
                plt.scatter([p.tokens_per_gpu for p in group], [p.tokens_per_user for p in group], label=label)
        plt.title("stored runs: output tokens/s per user against per GPU")
        plt.xlabel("output tokens/s per GPU")
        plt.ylabel("tok/s per user")
        plot.refresh()

    @on(Input.Changed, "#stored-filter")
    def _filter(self) -> None:
        self.refresh_stored()

    @on(DataTable.RowSelected, "#stored-table")
    def _toggle(self, event: DataTable.RowSelected) -> None:
        session = self._session()
        if session is None or event.row_key.value is None:
            return
        try:
            session.toggle_stored(int(event.row_key.value))  # type: ignore[attr-defined]
        except SessionError as exc:
            self.notify(f"{exc}: {exc.hint}", severity="warning")
            return
        self.refresh_stored()
        refresh = getattr(self.app, "refresh_now", None)
        if refresh is not None:
            refresh()

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        if len(snap.runs) != self._runs_seen:  # a run ended (and was stored): list it
            self._runs_seen = len(snap.runs)
            self.refresh_stored()
        comp = snap.comparison
        if comp is self._shown:
            return  # the comparison only changes when a run ends or the baseline moves
        self._shown = comp
        self._plot_load(self._session())
        table = self.query_one("#runs-table", DataTable)
        table.clear(columns=True)
        help_ = self.query_one("#runs-help", Static)
        notes = self.query_one("#runs-notes", Static)
        notes.display = comp is not None and bool(comp.notes)
        if comp is None:
            help_.display = True
            return
        help_.display = False
        notes.update("\n".join(comp.notes))
        best = self.get_component_rich_style("runs--best")
        flag = self.get_component_rich_style("runs--flag")
        table.add_column("", key="label")
        for i, name in enumerate(comp.columns):
            mark = " (baseline)" if comp.baseline == i else ""
            status = str(snap.runs[i].status) if i < len(snap.runs) else ""
            status = "" if status in ("", "ok") else f" [{status}]"
            count = f" [{fmt_runs(comp.counts[i])}]" if i < len(comp.counts) else ""
            table.add_column(f"{name}{mark}{status}{count}", key=f"run{i}")
        for n, (label, cells, best_cols) in enumerate(comp.rows):
            is_flag = n < comp.flag_rows
            row = [Text(label, style=flag if is_flag else "")]
            for i, cell in enumerate(cells):
                if i in best_cols:
                    row.append(Text(f"★ {cell}", style=best))
                else:
                    row.append(Text(cell))
            table.add_row(*row)
