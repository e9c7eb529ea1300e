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
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import DataTable, Input, Static

from engine.runs.compare import fmt_runs
from engine.views import SessionSnapshot
from tui.widgets.charts import LatencyLoadChart, ParetoChart


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
        self._stored_shown: object = None  # the snapshot's lists last drawn (by identity)
        self._pareto_shown: object = None
        self._load_shown: object = None

    def compose(self) -> ComposeResult:
        yield Static("no runs yet: r runs the workload, b marks the last run as baseline", id="runs-help")
        yield DataTable(id="runs-table", zebra_stripes=True, cursor_type="column")
        yield Static("", id="runs-notes")
        yield Static("stored runs (every path): Enter adds one to the comparison or takes it out",
                     id="stored-help")
        yield Input(placeholder="filter: model, preset, date, status", id="stored-filter", compact=True)
        yield DataTable(id="stored-table", zebra_stripes=True, cursor_type="row")
        yield LatencyLoadChart(id="runs-load")
        yield ParetoChart(id="runs-pareto")

    class FilterChanged(Message):
        """The stored runs' filter was edited: the app hands it to the session."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class Toggled(Message):
        """Enter on a stored run: the app puts it into the comparison or takes it out."""

        def __init__(self, run_id: int) -> None:
            super().__init__()
            self.run_id = run_id

    def on_mount(self) -> None:
        table = self.query_one("#stored-table", DataTable)
        for key, label in (("id", "id"), ("name", "name"), ("preset", "preset"), ("model", "model"),
                           ("started", "started"), ("status", "status"), ("req_s", "req/s"),
                           ("ttft", "TTFT p50 ms"), ("in", "compared")):
            table.add_column(label, key=key)
        self._draw_lists(self.snapshot)

    def _draw_lists(self, snap: SessionSnapshot | None) -> None:
        """The stored runs and the two charts, from the snapshot, when they changed."""
        if snap is None:
            return
        if snap.stored is not self._stored_shown:
            self._stored_shown = snap.stored
            table = self.query_one("#stored-table", DataTable)
            table.clear()
            for r in snap.stored:
                table.add_row(str(r.id), r.name, r.preset or "-", (r.model or "-").rsplit("/", 1)[-1],
                              time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)),
                              # flags changed live during it: two configurations
                              r.status + (" changed live" if r.changed else ""),
                              _n(r.req_s, "{:.2f}"), _n(r.ttft_p50_ms, "{:.1f}"), "yes" if r.compared else "",
                              key=str(r.id))
        if snap.run_points is not self._pareto_shown:
            self._pareto_shown = snap.run_points
            self.query_one("#runs-pareto", ParetoChart).show(snap.run_points)
        if snap.load_points is not self._load_shown:
            self._load_shown = snap.load_points
            self.query_one("#runs-load", LatencyLoadChart).show(snap.load_points)

    @on(Input.Changed, "#stored-filter")
    def _filter(self, event: Input.Changed) -> None:
        self.post_message(self.FilterChanged(event.value))

    @on(DataTable.RowSelected, "#stored-table")
    def _toggle(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.Toggled(int(event.row_key.value)))

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        self._draw_lists(snap)
        comp = snap.comparison
        if comp is self._shown:
            return  # the comparison only changes when a run ends or the baseline moves
        self._shown = comp
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
            status = comp.statuses[i] if i < len(comp.statuses) else ""
            status = "" if status in ("", "ok") or (status.startswith("ok x") and "," not in status) else f" [{status}]"
            count = f" [{fmt_runs(comp.counts[i])}]" if i < len(comp.counts) else ""
            # Text, not markup: a status in brackets ("[box-bound]") would read as a style tag and vanish
            table.add_column(Text(f"{name}{mark}{status}{count}"), key=f"run{i}")
        for n, (label, cells, best_cols) in enumerate(comp.rows):
            is_flag = n < comp.flag_rows
            row = [Text(label, style=flag if is_flag else "")]
            for i, cell in enumerate(cells):
                if i in best_cols:
                    row.append(Text(f"★ {cell}", style=best))
                else:
                    row.append(Text(cell))
            table.add_row(*row)
