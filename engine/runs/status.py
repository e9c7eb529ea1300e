"""The one vocabulary for how a measured run ended, used by every path and stored as is.

``ok``: measured to the end, the client kept up, the SLO (when one was set) was met.
``slo-missed``: measured to the end, the SLO was not met (the numbers are good, the config is not).
``client-bound``: measured to the end, but the client's own delay (not the server's) may be in the
numbers: see the run's client_* figures before trusting them.
``box-bound``: measured to the end, but the box held the run up: the client's loop waited for a
core (most often one the server held on a small box) long enough to add more than
``loadgen.run.BOX_DELAY_LIMIT_MS`` to its latencies, or other processes took cores the server or
the client wanted (``engine.telemetry.host.BoxShare.crowded``), which moves the server's own
figures. Measure it again on a quieter box (``engine.runs.measure.box_bound_why`` says which).
Sweep and tune measure such a step again before they take it.
``server-died``: the server stopped mid-run; what completed before is kept.
``failed``: nothing was measured (server refused the load, no request completed).
``cancelled``: stopped by the user (or a tune step stopped early); what completed is kept.
``running``: only while a run is being written to the history.

Older histories wrote ``complete``/``cut_short`` and the TUI said ``done``/``server died``:
:meth:`RunStatus.parse` reads those as their new names.
"""

from __future__ import annotations

import enum

# A run that came back client- or box-bound is measured again by sweep and tune, up to this
# many tries in all: a busy box's spoiled run usually passes within a try or two, and a box
# that stays busy should not triple a search's length (the last try is kept, and said).
SPOILED_TRIES = 3


class RunStatus(enum.StrEnum):
    OK = "ok"
    SLO_MISSED = "slo-missed"
    CLIENT_BOUND = "client-bound"
    BOX_BOUND = "box-bound"
    SERVER_DIED = "server-died"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RUNNING = "running"

    @property
    def measured(self) -> bool:
        """The run went to its end and its figures describe the whole workload."""
        return self in (RunStatus.OK, RunStatus.SLO_MISSED, RunStatus.CLIENT_BOUND, RunStatus.BOX_BOUND)

    @property
    def spoiled(self) -> bool:
        """Measured to the end, but the client's figures carry a delay not the server's: no
        verdict (best, winner, SLO) should rest on it alone."""
        return self in (RunStatus.CLIENT_BOUND, RunStatus.BOX_BOUND)

    @classmethod
    def parse(cls, text: str) -> RunStatus:
        """A stored or legacy status; a clear error for anything else."""
        key = str(text).strip().lower()
        legacy = {"complete": cls.OK, "done": cls.OK, "cut_short": cls.CANCELLED,
                  "server died": cls.SERVER_DIED, "server_died": cls.SERVER_DIED}
        if key in legacy:
            return legacy[key]
        try:
            return cls(key)
        except ValueError:
            raise ValueError(f"unknown run status {text!r}; one of {', '.join(s.value for s in cls)}") from None


def decide(*, server_died: bool, cancelled: bool, completed: int, client_bound: bool,
           slo_met: bool | None, box_bound: bool = False) -> RunStatus:
    """The status of a run from what happened, most telling first: a dead server explains a
    cancel, a user's cancel explains an empty run, an empty run has no SLO to miss."""
    if server_died:
        return RunStatus.SERVER_DIED
    if cancelled:
        return RunStatus.CANCELLED
    if completed == 0:
        return RunStatus.FAILED
    if client_bound:
        return RunStatus.CLIENT_BOUND
    if box_bound:
        return RunStatus.BOX_BOUND
    if slo_met is False:
        return RunStatus.SLO_MISSED
    return RunStatus.OK


__all__ = ["SPOILED_TRIES", "RunStatus", "decide"]
