"""One line always on screen: server state and phase, model, URL, the last notice."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from engine.views import SessionSnapshot

_STATE_CLASSES = ("-ready", "-starting", "-failed", "-stopped")


def _state_class(state: str) -> str:
    if state in ("READY", "ATTACHED"):
        return "-ready"
    if state in ("STARTING", "STOPPING"):
        return "-starting"
    if state in ("FAILED", "DEAD"):
        return "-failed"
    return "-stopped"


def starting_text(elapsed: float | None, expected: float | None) -> str:
    """'23 s of ~57 s (last start)' while a server starts; the estimate is the last start of
    the same model and flags, when there was one."""
    if elapsed is None:
        return ""
    if expected is None:
        return f"{elapsed:.0f} s (first start of these flags: no estimate yet)"
    if elapsed > expected * 1.5 + 10:
        return f"{elapsed:.0f} s, longer than the last start ({expected:.0f} s)"
    return f"{elapsed:.0f} s of ~{expected:.0f} s (last start)"


class StatusBar(Static):
    """Server state, phase, URL and the last notice, on one line."""

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None:
            return
        srv = snap.server
        self.remove_class(*_STATE_CLASSES)
        self.add_class(_state_class(srv.state))
        text = Text()
        text.append(f" {srv.state} ", style="bold reverse")
        if snap.busy:
            text.append(f" {snap.busy}…")
        if srv.state == "STARTING":
            text.append(f" {srv.phase or 'launching'}")
            text.append(f" {starting_text(srv.starting_s, srv.expected_start_s)}")
        text.append(f"  {srv.model or Path(snap.model).name}")
        if srv.base_url:
            text.append(f"  {srv.base_url}")
        if srv.version:
            text.append(f"  vLLM {srv.version}")
        if snap.run is not None and snap.run.fraction is not None:
            text.append(f"  run {snap.run.fraction * 100:.0f}%")
        if srv.error_line and srv.state in ("FAILED", "DEAD", "STOPPED"):
            text.append(f"  {srv.error_line}", style="bold")
        elif snap.notice:
            text.append(f"  {snap.notice}", style="italic")
        elif srv.state == "STOPPED":
            text.append("  press s to start the server, t to attach to one", style="italic")
        self.update(text)
