"""App-level pipeline messages (widget messages live nested in their widgets)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from engine.views import SessionSnapshot


@dataclass
class SessionUpdated(Message):
    """The session published a new snapshot (a few times a second at most)."""

    snapshot: SessionSnapshot
