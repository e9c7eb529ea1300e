"""What the session's parts report to the session: one typed stream of events.

The session's parts (engine.server.part, engine.runs.part, engine.tune.part, engine.telemetry.part)
are each handed ``emit`` and call it with one of these; engine.session.Session._on_event is the one
place that acts on them. What a part asks of the session (the edited flags, whether a run goes)
stays a plain query it is handed. Plain data below every room that reports, so none of them imports
the session's views (engine.views) to speak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from engine.flags import FlagSet


@dataclass(frozen=True)
class Changed:
    """Something a snapshot shows changed: the next publish sends a new one."""


@dataclass(frozen=True)
class Notice:
    """A line for the status bar's notice."""

    text: str


@dataclass(frozen=True)
class ServerTookFlags:
    """A start or an apply made the server run ``flags``: what "dirty" compares against moves."""

    flags: FlagSet


@dataclass(frozen=True)
class FlagsRecovered:
    """An attached server's flags were read back from its command line: they go into the editor."""

    flags: FlagSet


@dataclass(frozen=True)
class TuneTookFlags:
    """The search's winner (or a configuration the user picked) goes into the editor."""

    flags: FlagSet


@dataclass(frozen=True)
class TuneEnded:
    """The search ended, whatever the outcome: the server runs its last configuration, or nothing."""


@dataclass(frozen=True)
class LimitsSetLive:
    """Live limits changed on the running server: the Live tab's charts mark the moment,
    and a run going on stores the change (it measured two configurations)."""

    words: str  # "max-num-seqs 128->4"
    # each limit that moved, (flag, old, new): the run in progress stores them
    moved: tuple[tuple[str, object, object], ...] = ()


SessionEvent: TypeAlias = Changed | Notice | ServerTookFlags | FlagsRecovered | TuneTookFlags | TuneEnded | LimitsSetLive
Emit: TypeAlias = Callable[[SessionEvent], None]
CHANGED = Changed()
