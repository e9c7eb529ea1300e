"""What the advisor says: a :class:`Finding` (symptom, cause, the flag :class:`Change`, the
:class:`Expectation` checked on the next run, the trade-off), most severe first by ``SEVERITIES``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations
    from engine.flags import FlagSet


SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class Change:
    """One setting change. ``scope`` "server" is a vLLM flag; "load" a load generator
    setting (workers, concurrency), which the user changes in the workload instead."""

    flag: str
    old: object
    new: object
    scope: str = "server"
    old_is_default: bool = False
    """True when ``old`` is vLLM's default because the flag was not set."""

    def describe(self) -> str:
        dash = "--" if self.scope == "server" else ""

        def show(v: object) -> str:
            if v is None:
                return "(unset)"
            if isinstance(v, bool):
                return "on" if v else "off"
            if isinstance(v, float):
                return f"{v:g}"
            return f"{v:,}" if isinstance(v, int) else str(v)

        if self.old is None and self.old_is_default:
            old = "(default)"
        else:
            old = show(self.old) + (" (default)" if self.old_is_default else "")
        where = "" if self.scope == "server" else " (load generator)"
        return f"{dash}{self.flag} {old} -> {show(self.new)}{where}"

    def to_dict(self) -> dict[str, object]:
        return {"flag": self.flag, "old": self.old, "new": self.new, "scope": self.scope,
                "old_is_default": self.old_is_default}


@dataclass(frozen=True)
class Expectation:
    """One measurable effect: ``metric`` (a key of :func:`measure`) should go ``direction``
    ("down"/"up"/"same") by at least ``min_change`` (relative; 0.1 = 10 %)."""

    metric: str
    direction: str
    min_change: float = 0.1


@dataclass(frozen=True)
class Finding:
    """One piece of advice, with the evidence it rests on."""

    rule: str
    severity: str  # "high" | "medium" | "low"
    symptom: str
    cause: str
    changes: tuple[Change, ...]
    """The suggestion: applied together (usually one flag)."""
    expected: str
    tradeoff: str
    evidence: Mapping[str, object]
    alternatives: tuple[tuple[Change, ...], ...] = ()
    expect: tuple[Expectation, ...] = ()
    window: tuple[float, float] | None = None
    """Seconds into the run where the symptom was seen."""

    @property
    def flag_changes(self) -> dict[str, tuple[object, object]]:
        """``{flag: (old, new)}`` of the server flags, as ``FlagSet.diff`` gives them."""
        return {c.flag: (None if c.old_is_default else c.old, c.new) for c in self.changes if c.scope == "server"}

    def apply(self, flags: FlagSet) -> FlagSet:
        """A new FlagSet with the suggestion applied (the given one is unchanged).

        The advisor never launches anything: the TUI loads this into the editor and
        the user restarts.
        """
        out = flags
        for c in self.changes:
            if c.scope == "server":
                out = out.set(c.flag, c.new) if c.new is not None else out.unset(c.flag)
        return out

    def suggestion(self) -> str:
        text = ", ".join(c.describe() for c in self.changes)
        for alt in self.alternatives:
            text += " or " + ", ".join(c.describe() for c in alt)
        return text

    def text(self) -> str:
        """A short paragraph for a terminal."""
        return (f"[{self.severity}] {self.rule}: {self.symptom}\n"
                f"  cause: {self.cause}\n"
                f"  change: {self.suggestion()}\n"
                f"  expect: {self.expected}\n"
                f"  trade-off: {self.tradeoff}")

    def to_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule, "severity": self.severity, "symptom": self.symptom, "cause": self.cause,
            "changes": [c.to_dict() for c in self.changes],
            "alternatives": [[c.to_dict() for c in alt] for alt in self.alternatives],
            "expected": self.expected, "tradeoff": self.tradeoff,
            "expect": [{"metric": e.metric, "direction": e.direction, "min_change": e.min_change} for e in self.expect],
            "window": list(self.window) if self.window else None,
            "evidence": _jsonable(self.evidence),
        }


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
