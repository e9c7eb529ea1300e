"""What stops a flag search: a bad tuning input (:class:`TuneError`) or the budget (:class:`BudgetExhausted`)."""

from __future__ import annotations


class TuneError(ValueError):
    """A bad tuning input (space, settings, state file), naming what was wrong."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class BudgetExhausted(Exception):
    """Raised inside the search when the next start or step would not fit the budget."""
