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
    from engine.flags import FlagSet, Schema
    from engine.tune.search import SearchSpace, TuneState
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


__all__ = ["measurer_factory", "new_tuner"]
