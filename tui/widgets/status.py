"""One line always on screen: server state and phase, model, URL, the last notice."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from engine.session import SessionSnapshot

_STATE_CLASSES = ("-ready", "-starting", "-failed", "-stopped")


def _state_class(state: str) -> str:
    if state in ("READY", "ATTACHED"):
        return "-ready"
    if state in ("STARTING", "STOPPING"):
        return "-starting"
    if state in ("FAILED", "DEAD"):
        return "-failed"
    return "-stopped"


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
        if srv.phase and srv.state == "STARTING":
            text.append(f" {srv.phase}")
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
