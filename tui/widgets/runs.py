"""Runs side by side: one column per run, the best value per row marked, deltas to the
baseline in percent (computed in the core; this only lays them out)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Static

from engine.session import SessionSnapshot


class RunsPanel(Vertical):
    """The comparison table of this session's runs."""

    BORDER_TITLE = "Runs"
    COMPONENT_CLASSES = {"runs--best", "runs--flag"}

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: object = None

    def compose(self) -> ComposeResult:
        yield Static("no runs yet: r runs the workload, b marks the last run as baseline", id="runs-help")
        yield DataTable(id="runs-table", zebra_stripes=True, cursor_type="column")

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        comp = snap.comparison
        if comp is self._shown:
            return  # the comparison only changes when a run ends or the baseline moves
        self._shown = comp
        table = self.query_one(DataTable)
        table.clear(columns=True)
        help_ = self.query_one("#runs-help", Static)
        if comp is None:
            help_.display = True
            return
        help_.display = False
        best = self.get_component_rich_style("runs--best")
        flag = self.get_component_rich_style("runs--flag")
        table.add_column("", key="label")
        for i, name in enumerate(comp.columns):
            mark = " (baseline)" if comp.baseline == i else ""
            status = snap.runs[i].status if i < len(snap.runs) else ""
            status = "" if status == "ok" else f" [{status}]"
            table.add_column(f"{name}{mark}{status}", key=f"run{i}")
        for n, (label, cells, best_cols) in enumerate(comp.rows):
            is_flag = n < comp.flag_rows
            row = [Text(label, style=flag if is_flag else "")]
            for i, cell in enumerate(cells):
                if i in best_cols:
                    row.append(Text(f"★ {cell}", style=best))
                else:
                    row.append(Text(cell))
            table.add_row(*row)
