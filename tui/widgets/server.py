"""The server panel: state and phase, facts beside the planner's prediction, restart
downtime, vLLM's error line and hint after a failed start, and the log with a filter.

The log hides vtui's own polling (uvicorn's access lines for the /health and /metrics
requests vtui sends every second) unless asked, and can show only warnings and errors;
which line is which is decided once, by the session, with ``engine.server.logparse.classify_line``.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Input, Label, RichLog, Static

from engine.server.logparse import level_rank
from engine.views import LogLine, SessionSnapshot

# The level filter's steps, in the order its key cycles through them.
LEVEL_STEPS = ("debug", "warning", "error")
_LEVEL_NAMES = {"debug": "all", "warning": "warnings+", "error": "errors"}


def _n(value: float | int | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


class ServerPanel(Vertical):
    """Facts and the log of the vLLM server."""

    BORDER_TITLE = "Server"
    COMPONENT_CLASSES = {"log--error", "log--warning"}

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    show_polls: reactive[bool] = reactive(False)
    """Whether vtui's own polling lines (GET /health, /metrics) are shown in the log."""

    min_level: reactive[str] = reactive("debug")
    """The least severe level the log shows (one of LEVEL_STEPS)."""

    def __init__(self, *, keep: dict[str, object] | None = None, id: str | None = None) -> None:
        """``keep``: where the filters are kept, so a panel rebuilt for a new width keeps them."""
        super().__init__(id=id)
        self._keep = keep if keep is not None else {}
        self.set_reactive(ServerPanel.show_polls, bool(self._keep.get("show_polls", False)))
        self.set_reactive(ServerPanel.min_level, str(self._keep.get("min_level", "debug")))
        self._last_n = 0
        self._filter = str(self._keep.get("filter", ""))
        self._hidden_polls = 0
        self.shown: list[int] = []
        """The LogLine.n of every line in the log view now, in order."""

    def compose(self) -> ComposeResult:
        yield Static("", id="server-facts")
        yield Static("", id="server-error")
        with Horizontal(id="log-tools"):
            yield Label("log", id="log-label")
            yield Input(self._filter, placeholder="filter text", id="log-filter", compact=True)
            yield Label("", id="log-polls")
            yield Label("", id="log-level")
        # min_width: RichLog renders at least 78 columns by default, one more than an 80-column
        # terminal leaves it, which drew a horizontal scrollbar under the log.
        yield RichLog(id="server-log", max_lines=2000, wrap=True, min_width=20, markup=False, highlight=False)

    def on_mount(self) -> None:
        self._show_tools()

    def toggle_polls(self) -> None:
        """Show or hide vtui's own polling lines."""
        self.show_polls = not self.show_polls

    def next_level(self) -> None:
        """The next step of the level filter: all, warnings and errors, errors only."""
        self.min_level = LEVEL_STEPS[(LEVEL_STEPS.index(self.min_level) + 1) % len(LEVEL_STEPS)]

    def watch_show_polls(self, show: bool) -> None:
        self._keep["show_polls"] = show
        self._redraw()

    def watch_min_level(self, level: str) -> None:
        self._keep["min_level"] = level
        self._redraw()

    def _composed(self) -> bool:
        # During on_mount is_mounted is still False, but the children are there.
        return bool(self.query("#server-log"))

    def _show_tools(self) -> None:
        if not self._composed():
            return
        polls = "polls shown (h)" if self.show_polls else f"{self._hidden_polls} polls hidden (h)"
        self.query_one("#log-polls", Label).update(polls)
        level = self.query_one("#log-level", Label)
        level.update(f"level: {_LEVEL_NAMES[self.min_level]} (f)")
        level.set_class(self.min_level != "debug", "-active")

    def on_click(self, event: events.Click) -> None:
        widget_id = event.widget.id if event.widget is not None else None
        if widget_id == "log-polls":
            self.toggle_polls()
        elif widget_id == "log-level":
            self.next_level()

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

    def _style(self, level: str) -> str:
        if level == "error":
            return str(self.get_component_rich_style("log--error"))
        if level == "warning":
            return str(self.get_component_rich_style("log--warning"))
        return ""


    def _append(self, logs: tuple[LogLine, ...]) -> None:
        if not self._composed():
            return
        log = self.query_one(RichLog)
        if logs and logs[0].n > self._last_n + 1 and self._last_n == 0:
            self._last_n = logs[0].n - 1
        hidden = self._hidden_polls
        for line in logs:
            if line.n <= self._last_n:
                continue
            self._last_n = line.n
            if line.poll and not self.show_polls:  # classified once, by the session (engine.server.logparse)
                self._hidden_polls += 1
                continue
            level = line.level
            if level_rank(level) < level_rank(self.min_level):
                continue
            if self._filter and self._filter.lower() not in line.text.lower():
                continue
            log.write(Text(line.text, style=self._style(level)))
            self.shown.append(line.n)
        if len(self.shown) > 4000:
            self.shown = self.shown[-2000:]  # as many as the RichLog keeps
        if self._hidden_polls != hidden:
            self._show_tools()

    def _redraw(self) -> None:
        """Write the log again under the current filters."""
        if not self._composed():
            return
        self.query_one(RichLog).clear()
        self.shown.clear()
        self._last_n = 0
        self._hidden_polls = 0
        if self.snapshot is not None:
            self._append(self.snapshot.logs)
        self._show_tools()

    @on(Input.Changed, "#log-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._filter = self._keep["filter"] = event.value.strip()
        self._redraw()
