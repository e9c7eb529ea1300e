"""Flags that changed on the server while a run measured it: when, which, from what, to what.

A run is stored with the flags its server ran when the run began. Where a live limit moved during
it (the TUI's apply, or ``vtui set`` from another terminal), the run measured two
configurations and its figures speak for neither. :func:`engine.runs.measure.measure` stores each
change in the run's summary (``RunSummary.extra[FLAG_CHANGES_KEY]``; a run stored before reads as
none), every screen says so, and every figure that speaks for one configuration leaves the run out
(compare's verdicts and best marks, the advisor, the Pareto frontier and the load curve, a noise
floor learned or measured from repeats): docs/MEASUREMENT.md.

Where the changes come from:

- the session's own apply: ``engine.server.part.ServerPart`` reports each limit that moved (flag,
  old, new: ``engine.events.LimitsSetLive``) and the session hands it to the run in progress
  (``RunHandle.note_change``, a :class:`ChangeLog`): its time is known;
- anything else (``vtui set`` from another terminal): the server's live limits, read at the run's
  start and at its end (:func:`read_limits`, where the server has live limits), differ where no
  change was noted (:func:`seen_changes`): seen at the end, time unknown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from engine.runs.summary import RunSummary
from engine.values import JSONValue

FLAG_CHANGES_KEY = "flag_changes"
"""The run summary's key (kept in ``RunSummary.extra``): a list of :meth:`FlagChange.to_json`."""
TWO_CONFIGURATIONS = "it measured two configurations"
READ_TIMEOUT_S = 3.0  # a live-limits read at a run's edge: a hung server must not hold the run's end


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "(default)" if value is None else str(value)


def _json_value(value: object) -> JSONValue:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


@dataclass(frozen=True)
class FlagChange:
    """One flag that moved during a run: ``at_s`` seconds into it (None: seen at its end, time unknown)."""

    flag: str
    old: JSONValue
    new: JSONValue
    at_s: float | None = None

    def words(self) -> str:
        """``max-num-seqs 128 -> 2``."""
        return f"{self.flag} {_text(self.old)} -> {_text(self.new)}"

    def to_json(self) -> dict[str, JSONValue]:
        return {"flag": self.flag, "from": self.old, "to": self.new, "at_s": self.at_s}

    @classmethod
    def from_json(cls, data: object) -> FlagChange | None:
        """A stored change; None where it does not read (a hand-edited row: the run still lists)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("flag"), str):
            return None
        at = data.get("at_s")
        at_s = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        return cls(str(data["flag"]), _json_value(data.get("from")), _json_value(data.get("to")), at_s)


def flag_changes_of(summary: RunSummary) -> tuple[FlagChange, ...]:
    """The flags that changed during a stored run (empty: none, or a run stored before vtui recorded them)."""
    stored = summary.extra.get(FLAG_CHANGES_KEY)
    if not isinstance(stored, (list, tuple)):
        return ()
    return tuple(c for c in (FlagChange.from_json(d) for d in stored) if c is not None)


def changed_during(summary: RunSummary) -> bool:
    """Whether some flag changed while the run measured (it measured two configurations)."""
    return bool(flag_changes_of(summary))


def with_flag_changes(summary: RunSummary, changes: Sequence[FlagChange]) -> RunSummary:
    """``summary`` with ``changes`` stored (unchanged when there are none)."""
    if not changes:
        return summary
    return replace(summary, extra={**summary.extra, FLAG_CHANGES_KEY: [c.to_json() for c in changes]})


def when_text(changes: Sequence[FlagChange]) -> str:
    """``at 12.3 s: max-num-seqs 128 -> 2``; changes seen only at the end: ``seen at its end
    (time unknown): max-num-seqs 128 -> 2``; several joined by ``; ``."""
    parts: list[str] = []
    groups: dict[float | None, list[str]] = {}
    for c in changes:
        groups.setdefault(None if c.at_s is None else round(c.at_s, 1), []).append(c.words())
    for at, words in groups.items():
        when = "seen at its end (time unknown)" if at is None else f"at {at:.1f} s"
        parts.append(f"{when}: {', '.join(words)}")
    return "; ".join(parts)


def changes_text(changes: Sequence[FlagChange]) -> str:
    """``flags changed live during this run at 12.3 s: max-num-seqs 128 -> 2`` ("" for none)."""
    if not changes:
        return ""
    if all(c.at_s is None for c in changes):
        return f"flags changed during this run (seen at its end, time unknown): {', '.join(c.words() for c in changes)}"
    return f"flags changed live during this run {when_text(changes)}"


class ChangeLog:
    """The changes noted while a run goes, from any thread (the session's loop notes, the run's
    thread reads at its end): wall-clock times, made seconds into the run by :meth:`since`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._noted: list[tuple[float, str, JSONValue, JSONValue]] = []

    def note(self, flag: str, old: object, new: object, t: float | None = None) -> None:
        with self._lock:
            self._noted.append((time.time() if t is None else t, str(flag), _json_value(old), _json_value(new)))

    def since(self, t0: float | None) -> tuple[FlagChange, ...]:
        """The changes noted, seconds after ``t0`` (None: the run has not begun: 0 s); one noted
        before the run began counts at 0 s (the run measured the new value from its start)."""
        with self._lock:
            noted = list(self._noted)
        return tuple(FlagChange(flag, old, new, 0.0 if t0 is None else round(max(0.0, t - t0), 3))
                     for t, flag, old, new in noted)


async def read_limits(url: str, api_key: str | None = None) -> dict[str, JSONValue] | None:
    """The server's live limits now (engine.server.livelimits.read_live), or None where it has
    none (not started by vtui, an old vLLM), cannot be reached or answers what is not understood."""
    from engine.server.livelimits import read_live

    try:
        state = await read_live(url, api_key, timeout=READ_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - no live limits to read is the common case, not the run's failure
        return None
    return {str(k): _json_value(v) for k, v in state.live.items()}


def seen_changes(start: Mapping[str, JSONValue] | None, end: Mapping[str, JSONValue] | None,
                 noted: Sequence[FlagChange] = ()) -> tuple[FlagChange, ...]:
    """The limits that differ between the run's start and its end and that no noted change
    explains (its last noted value is the end's): changed by someone else, time unknown."""
    if start is None or end is None:
        return ()
    out: list[FlagChange] = []
    for flag in [*start, *(k for k in end if k not in start)]:
        before, after = start.get(flag), end.get(flag)
        if before == after:
            continue
        mine = [c for c in noted if c.flag == flag]
        if mine and mine[-1].new == after:
            continue
        out.append(FlagChange(flag, before, after, None))
    return tuple(out)


__all__ = [
    "FLAG_CHANGES_KEY",
    "TWO_CONFIGURATIONS",
    "ChangeLog",
    "FlagChange",
    "changed_during",
    "changes_text",
    "flag_changes_of",
    "read_limits",
    "seen_changes",
    "when_text",
    "with_flag_changes",
]
