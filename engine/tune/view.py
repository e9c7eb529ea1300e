"""The flag search as the screen reads it: what a search is asked for (TuneRequest), what it
shows while it goes and after (TuneView, a running trial with its devices: TrialView) and the
pure functions that word its parts. Frozen data; engine.tune.part keeps the state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # For the annotations only.
    from engine.flags import FlagSet
    from engine.telemetry.view import DeviceView
    from engine.tune.search import ConfigResult, ParetoPoint, RunningTrial, SearchSpace, StepPoint
    from loadgen.spec import SLO


@dataclass(frozen=True)
class TuneRequest:
    """What a flag search is asked for: SLO limits, the space, the budget, the load axis."""

    slo: SLO  # at least one limit
    space: SearchSpace
    budget_s: float
    mode: str = "rate"  # "rate" (open loop, req/s) or "concurrency" (closed loop)
    start_load: float | None = None  # first load probed; None: a saturation step decides
    # Where the trials run, as `vtui tune --gpus --parallel` says it (engine.tune.slots):
    gpus: str | None = None  # "0,1,2,3" or "0-3"; None: every GPU the session sees
    parallel: int | None = None  # at most this many trials at once; None: one per slot
    # The Ray cluster the trials run on as actors, as `vtui tune --ray` says it (engine.tune.ray):
    ray: str | None = None  # "local", "auto" or an address such as HEAD:6379; None: no Ray


@dataclass(frozen=True)
class TrialView:
    """A configuration being measured now (engine.tune.search.RunningTrial) with its slot's
    devices as the resource table shows them: its GPUs, or the host where there are none.
    A trial on a Ray actor has no devices here (they are its node's, not the ones this
    session samples) and says where it runs in ``where``."""

    trial: RunningTrial
    devices: tuple[DeviceView, ...]
    # A Ray trial's slot and its actor's node and GPUs ("trial slot 0 on node GPU 2",
    # engine.tune.ray.RayMeasurer.where); empty for a trial on this machine.
    where: str = ""


@dataclass(frozen=True)
class TuneView:
    """What the Tune screen shows: the search's progress and what it found so far."""

    id: str
    status: str  # "running" | "done" | "budget" | "interrupted" | "failed"
    mode: str
    slo_label: str  # "p99 TTFT <= 500 ms, p99 TPOT <= 50 ms"
    elapsed_s: float
    budget_s: float
    starts: int
    steps: int
    configs_total: int  # configurations in the space
    lines: tuple[str, ...]  # the latest progress lines, oldest first
    rows: tuple[ConfigResult, ...]  # in the order tried
    best_key: str | None = None
    best_goodput: float | None = None  # req/s meeting every limit at the best's limit load
    best_limit: float | None = None  # req/s or concurrency; inf: met with all requests at once
    best_flags: FlagSet | None = None  # the winner's
    best_serve_line: str | None = None
    best_docker_line: str | None = None  # on one line (the export has the multi-line form)
    pareto: tuple[ParetoPoint, ...] = ()  # the points on the frontier
    # Latency against load, per configuration: (key, ((load, TTFT pX ms, TPOT pX ms, met), ...)),
    # finite loads in increasing order (the capacity probe at "all at once" has no place on the axis).
    step_series: tuple[tuple[str, tuple[StepPoint, ...]], ...] = ()  # engine.tune.search.step_series
    state_path: str | None = None
    resume_command: str = ""  # how to carry on headless: "vtui tune --resume ID"
    running: tuple[TrialView, ...] = ()  # what each slot measures now, with its devices
    error: str | None = None  # why it failed (status "failed")


def space_lines(space: SearchSpace) -> str:
    """A search space as the editable text ``SearchSpace.parse`` reads back, one flag a line."""
    return "\n".join(space.lines())


def frontier_points(points: Sequence[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """The Pareto points on the frontier, once each (a limit measured twice gives twins)."""
    seen: set[tuple[str, float, float, float]] = set()
    out = []
    for p in points:
        twin = (p.key, p.load, round(p.tokens_per_user, 6), round(p.tokens_per_gpu, 6))
        if p.frontier and twin not in seen:
            seen.add(twin)
            out.append(p)
    return tuple(out)


def slo_label(slo: SLO) -> str:
    """``p99 TTFT <= 500 ms, p99 TPOT <= 50 ms``."""
    parts = []
    for key, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2el", slo.e2el_ms)):
        if limit is not None:
            parts.append(f"p{slo.percentile:g} {key.upper()} <= {limit:g} ms")
    return ", ".join(parts)
