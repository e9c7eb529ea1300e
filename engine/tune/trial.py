"""One trial of the search in words all its parts share: the settings (:class:`TuneSettings`, the
step rule, early stop), a step's :class:`Measurement` and the :class:`Measurer` that makes it, a
configuration's result (:class:`ConfigResult`, its status) and the objective it is ranked by."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.flags import FlagSet
from engine.tune.errors import TuneError
from engine.tune.space import _opt_number, _space_values
from engine.values import StoredFields, as_float, as_int
from loadgen.spec import allowed_failures, judge, percentile_word

if TYPE_CHECKING:
    from engine.tune.space import SpaceValue
    from loadgen.spec import SLO
    from loadgen.stats import LoadSummary


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
    then the earlier tried); None when none was measured at a limit. The raw figure, blind to
    the noise: the search's best is engine.tune.ranking.decide's (ties within the noise go to
    the cheaper configuration)."""
    done = [c for c in configs
            if config_score(c, objective) is not None and c.limit_load is not None and c.key != exclude]
    if not done:
        return None
    return max(done, key=lambda c: (config_score(c, objective) or 0.0, c.limit_load or 0.0, -c.order))


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


@dataclass(frozen=True)
class StartOutcome:
    """Whether a configuration's server started; vLLM's reason when not."""

    ok: bool
    reason: str = ""
    hint: str = ""
    seconds: float = 0.0
    restarted: bool = True
    """False when the running server already had these flags (no restart spent)."""
    live: bool = False
    """Its flags were set on a running server without a restart: ``started_with``
    holds the flag values that server was started with."""
    started_with: Mapping[str, object] | None = None


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
    """Arrivals per second that came back, on the axis a load is on (requests/s; over a session's mean
    turns where the workload has multi-turn sessions: engine.tune.measurer)."""
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
    changed_live: bool = False
    """A flag changed on the server while the step ran (engine.runs.flagchange: another ``vtui set``):
    it measured two configurations, so it is measured again and, still so, not met."""
    client_cpus: tuple[int, ...] = ()
    """The host cores the load generator ran on (read back in its workers; pinned to the
    slot's own with trials side by side, engine.tune.slots)."""

    @classmethod
    def of_summary(cls, load: float, s: LoadSummary, slo: SLO, *, requests: int, duration_s: float = 0.0,
                   unfinished: int = 0) -> Measurement:
        """A step's figures from its run's summary, judged against ``slo`` (loadgen.spec.judge): the
        latencies at the SLO's percentile, goodput, throughputs and tokens per user (mean output
        tokens per request / mean E2EL). ``unfinished``: requests of the step that had not come back
        when it was judged (a window whose tail ran out of time): counted as failed."""
        p = slo.percentile
        ok, reason = judge(slo, s)
        if unfinished and ok and s.failed + unfinished > allowed_failures(s.completed + s.failed + unfinished, p):
            ok, reason = False, f"{unfinished} of {requests} requests still running when it was judged"
        completed = s.completed
        mean_e2el_s = (s.get("mean_e2el_ms") or 0.0) / 1000
        per_user = (s.total_output_tokens / completed / mean_e2el_s) if completed and mean_e2el_s else 0.0
        return cls(load=load, ok=ok, reason=reason, requests=requests, completed=completed,
                   failed=s.failed + unfinished, goodput=s.request_goodput or 0.0,
                   request_throughput=s.request_throughput, output_throughput=s.output_throughput,
                   ttft_ms=s.at_percentile("ttft", p), tpot_ms=s.at_percentile("tpot", p),
                   e2el_ms=s.at_percentile("e2el", p), tokens_per_user=per_user, duration_s=duration_s)

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
            box_bound=f.flag("box_bound", False), changed_live=f.flag("changed_live", False),
            client_cpus=tuple(as_int(c) for c in cpus),
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
    window_s: float = 5.0
    """Seconds of each window when a restart group's configurations are measured under one load
    (engine.tune.windows)."""
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
        if not self.window_s > 0:
            raise TuneError("window", "must be > 0")

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
            window_s=f.number("window_s", base.window_s),
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
    runs: int = 0
    """Runs its figure at the limit rests on: its steps at the limit load that met the SLO
    (engine.tune.ranking.limit_runs; set in the search's result, 0 in a saved state before it)."""
    tie: str = ""
    """Where it is the best and tied with others, or tied with the best, what the search decided
    and why (engine.tune.ranking.Decision); set in the search's result."""
    live: bool = False
    """Measured with its flags set live on a server started with ``started_with``."""
    started_with: Mapping[str, object] | None = None
    start_check: str = ""
    """A live winner measured again on a server started with exactly its flags: what that found."""

    def status_words(self, *, how: bool = False) -> str:
        """Its status as tables show it: "(met twice)" where its limit was confirmed; with ``how``,
        ", live" where its flags were set live and ", start-checked" where it met again on its own start."""
        words = self.status + (" (met twice)" if self.confirmed else "")
        if how and self.live:
            words += ", live" + (", start-checked" if self.start_check and self.status != "unstable" else "")
        return words

    @classmethod
    def at_highest_met(cls, key: str, values: Mapping[str, SpaceValue], status: str, steps: Sequence[Measurement],
                       **kw: Any) -> ConfigResult:
        """A row from its steps: its limit and goodput those of the highest load that met the SLO
        (none where none met); ``kw``: the other fields."""
        top = max((m for m in steps if m.ok), key=lambda m: m.load, default=None)
        return cls(key, values, status, limit_load=top.load if top else None, goodput=top.goodput if top else None,
                   at=top, steps=len(steps), **kw)

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key, "values": dict(self.values), "status": self.status, "reason": self.reason,
            "hint": self.hint,
            "limit_load": "inf" if self.limit_load is not None and math.isinf(self.limit_load) else self.limit_load,
            "goodput": self.goodput, "at": self.at.to_dict() if self.at else None, "start_s": self.start_s,
            "steps": self.steps, "order": self.order, "confirmed": self.confirmed,
            "slot": self.slot, "side_by_side": list(self.side_by_side), "alone": self.alone,
            "runs": self.runs, "tie": self.tie, "live": self.live,
            "started_with": dict(self.started_with) if self.started_with is not None else None,
            "start_check": self.start_check,
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
            runs=as_int(d.get("runs", 0)), tie=str(d.get("tie", "")), live=bool(d.get("live", False)),
            started_with=_started_with(d.get("started_with")), start_check=str(d.get("start_check", "")),
        )


def _started_with(value: object) -> dict[str, object] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"started_with: expected an object, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


@dataclass(frozen=True)
class RunningTrial:
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
