"""A flag search's setup, one for the TUI's Tune screen (engine.tune.part.TunePart) and `vtui tune`
(tui/commands/tune.py): how a trial's measurer is made and the :class:`Tuner` over the measurers,
saved in the run history after every start and step, where `vtui tune --list/--resume` look.

Where the trials run is the caller's choice: one slot per GPU group, each a server of its own
(engine.tune.slots.slot_measurers, which takes :func:`measurer_factory`'s maker), Ray actors
(engine.tune.ray, the same maker run on the actor's node), or the session's own server.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.tune.search import HistoryStore, Measurer, ServerMeasurer, Tuner, TuneResult, TuneSettings

if TYPE_CHECKING:
    from collections.abc import Sequence as Seq

    from engine.flags import FlagSet, Schema
    from engine.tune.halving import Estimate
    from engine.tune.search import Measurement, SearchSpace, StartOutcome, TuneState
    from engine.tune.windows import WindowResult
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec


def measurer_factory(workload: WorkloadSpec, slo: SLO, *, mode: str, arrivals: ArrivalSpec | None,
                     tokenizer: str | None, factory: Callable[..., Measurer] | None = None) -> Callable[..., Measurer]:
    """What makes one trial's measurer: ``factory`` (default ServerMeasurer, tests pass a
    stand-in) with the search's workload, SLO, mode, arrivals and tokenizer bound; called with
    where it runs (``supervisor=``, ``supervisor_factory=``, ``client_cpus=``)."""
    return functools.partial(factory or ServerMeasurer, workload, slo, mode=mode, arrivals=arrivals,
                             tokenizer=tokenizer)


def new_tuner(measurers: Sequence[Measurer], *, base: FlagSet, space: SearchSpace, slo: SLO,
              settings: TuneSettings, workload: WorkloadSpec, arrivals: ArrivalSpec | None,
              slot_gpus: Sequence[tuple[int, ...]], say: Callable[[str], None],
              max_request_len: int | None = None, state: TuneState | None = None, schema: Schema | None = None,
              on_update: Callable[[TuneResult], None] | None = None, live: bool = True) -> Tuner:
    """The search over ``measurers`` (the first the Tuner's own, the rest its slots, with the
    GPUs each holds); ``state`` resumes a saved search. Raises TuneError for what cannot start.
    ``live``: one trial at a time on a server vtui starts sets the live flags without a restart
    where it can (ServerMeasurer.live); False restarts for every configuration."""
    if live and len(measurers) == 1 and isinstance(measurers[0], ServerMeasurer):
        measurers[0].live = True
    return Tuner(
        measurers[0], base_flags=base, space=space, slo=slo, settings=settings,
        workload={"workload": workload.to_dict(), "arrivals": arrivals.to_dict() if arrivals is not None else {}},
        max_request_len=max_request_len, state=state, schema=schema, say=say, on_update=on_update,
        slots=measurers[1:], slot_gpus=slot_gpus, store=HistoryStore())


class _NotStarted:
    """The measurer of a search that is only estimated: what the Tune screen would run (a server
    vtui starts, one trial at a time, set live where it can). It measures nothing."""

    live = True

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        raise RuntimeError("an estimate starts no server")

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        raise RuntimeError("an estimate measures nothing")

    async def measure_windows(self, load: float, plan: Seq[tuple[str, FlagSet]], *, window_s: float,
                              timeout: float) -> list[WindowResult]:
        raise RuntimeError("an estimate measures nothing")

    async def close(self) -> None:
        return None


def estimate_search(*, base: FlagSet, space: SearchSpace, slo: SLO, settings: TuneSettings,
                    max_request_len: int | None = None, schema: Schema | None = None,
                    workload: WorkloadSpec | None = None) -> Estimate:
    """What a new search on one server vtui starts is expected to cost on this box, before it
    starts (Tuner.plan: this box's last start of each group's flags, else a minute; ``workload``'s
    output length for what a window waits for). Raises TuneError for what could not start."""
    return Tuner(_NotStarted(), base_flags=base, space=space, slo=slo, settings=settings,
                 workload={"workload": workload.to_dict()} if workload is not None else None,
                 max_request_len=max_request_len, schema=schema).plan()


__all__ = ["estimate_search", "measurer_factory", "new_tuner"]
