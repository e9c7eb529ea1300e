"""The server panel: state and phase, facts beside the planner's prediction, restart
downtime, vLLM's error line and hint after a failed start, and the log with a filter."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Input, Label, RichLog, Static

from engine.session import LogLine, SessionSnapshot


def _n(value: float | int | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


class ServerPanel(Vertical):
    """Facts and the log of the vLLM server."""

    BORDER_TITLE = "Server"
    COMPONENT_CLASSES = {"log--error", "log--warning"}

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._last_n = 0
        self._filter = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="server-facts")
        yield Static("", id="server-error")
        with Horizontal(id="log-tools"):
            yield Label("log", id="log-label")
            yield Input(placeholder="filter the log (e.g. ERROR, KV cache)", id="log-filter", compact=True)
        yield RichLog(id="server-log", max_lines=2000, wrap=False, markup=False, highlight=False)

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        self.query_one("#server-facts", Static).update(self._facts(snap))
        error = self.query_one("#server-error", Static)
        srv = snap.server
        if srv.error_line:
            text = Text()
            text.append("vLLM: ", style="bold")
            text.append(srv.error_line)
            if srv.error_hint:
                text.append("\nhint: ", style="bold")
                text.append(srv.error_hint)
            error.update(text)
            error.display = True
        else:
            error.display = False
        self._append(snap.logs)

    def _facts(self, snap: SessionSnapshot) -> Table:
        srv = snap.server
        table = Table(box=None, padding=(0, 1), show_header=False, show_edge=False)
        table.add_column(style="bold")
        table.add_column()
        table.add_column(style="bold")
        table.add_column()
        state = srv.state + (f" ({srv.phase})" if srv.phase and srv.state == "STARTING" else "")
        table.add_row("state", state, "vLLM", srv.version or "-")
        table.add_row(
            "KV tokens",
            f"{_n(srv.kv_tokens)} (plan {_n(srv.predicted_kv_tokens)})",
            "max conc.",
            f"{_n(srv.max_concurrency, '{:.2f}x')} (plan {_n(srv.predicted_concurrency, '{:.2f}x')})",
        )
        table.add_row(
            "url",
            srv.base_url or "-",
            "restart",
            "-" if srv.restart_downtime_s is None else f"{srv.restart_downtime_s:.1f} s down",
        )
        origin = "attached" if srv.attached else ("started by vtui" if srv.started_here else "-")
        table.add_row("pid", _n(srv.pid, "{}"), "origin", origin)
        return table

    def _style(self, line: LogLine) -> str:
        if line.level == "error":
            return str(self.get_component_rich_style("log--error"))
        if line.level == "warning":
            return str(self.get_component_rich_style("log--warning"))
        return ""

    def _matches(self, line: LogLine) -> bool:
        return not self._filter or self._filter.lower() in line.text.lower()

    def _append(self, logs: tuple[LogLine, ...]) -> None:
        log = self.query_one(RichLog)
        if logs and logs[0].n > self._last_n + 1 and self._last_n == 0:
            self._last_n = logs[0].n - 1
        for line in logs:
            if line.n <= self._last_n:
                continue
            self._last_n = line.n
            if self._matches(line):
                log.write(Text(line.text, style=self._style(line)))

    @on(Input.Changed, "#log-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._filter = event.value.strip()
        self.query_one(RichLog).clear()
        self._last_n = 0
        if self.snapshot is not None:
            self._append(self.snapshot.logs)
