"""Which configuration a search calls the best, knowing how far each limit moves by chance.

A configuration's figure (its objective at its SLO limit: goodput, or goodput per watt, or
tokens per joule) comes from the steps the bisection ended on. What it rests on, its *runs*: the
objective of every step at its limit load that met the SLO. One run where the bisection found it;
two where the limit was measured again to confirm it (``TuneSettings.confirm``: every would-be best
and every configuration within ``confirm_margin`` of the best); one more for the winner and the
runner-up of a search that ran trials side by side, measured again alone at the end. Those re-
measures count as repeats: two configurations each resting on two runs or more are compared by
``engine.runs.noise.difference`` over repeats (Welch's interval of the difference, widened by
``noise.REPEATS_FLOOR_PCT`` of the better one's figure on each side). Where either rests on one
run, the tuner has no requests at hand for a within-run interval (a step keeps its figures, not
its requests), so the difference is judged by the run-to-run floor alone: ``noise.RUN_TO_RUN_FLOOR_PCT``
of the better one's figure either side, as ``noise.difference`` widens a single-run interval.
A limit is known only to within the bisection's ``tolerance`` too, so neither floor is taken
below it (at the defaults, 5%, it is not the larger).

The rule (:func:`decide`): a configuration is out of the running when another one's figure is
better beyond the noise (the interval of the difference excludes zero). Those left are within
each other's noise (a pair is compared once, the better one as the base), so they are tied, and
the cheaper wins by :data:`TIE_RULE`: fewer GPUs, then less memory (the KV cache's bytes where
set, then the fraction of GPU memory), then fewer ``max-num-seqs``; equal by the rule, the
higher figure, then the earlier tried. So a configuration displaces the best only when its limit
is beyond the noise, or when it is tied with it and cheaper. One exception, for a search measured
live: where some of the tied held their figure on a server started with exactly their flags
(``start_check``) and others were not checked (the budget ended first), the checked ones come first:
an unchecked limit does not take the place of one that held.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.flags import devices_needed
from engine.runs.noise import (
    REPEATS_FLOOR_PCT,
    RUN_TO_RUN_FLOOR_PCT,
    WITHIN_NOISE,
    Configuration,
    Difference,
    Interval,
    difference,
)
from engine.tune.trial import ConfigResult, Measurement, config_score, objective_value

# In words (the order: GPUs, then the KV cache's bytes, then the fraction of GPU memory, then
# max-num-seqs; see cost()).
TIE_RULE = "fewer GPUs, then less memory, then fewer max-num-seqs"
# The kind of a difference judged by the run-to-run floor alone (a limit resting on one run).
FLOOR_ONLY = "one run: run-to-run floor"
# vLLM's parser default for --gpu-memory-utilization (engine/flags/schema.py), where a
# configuration leaves it out.
GPU_MEMORY_DEFAULT = 0.92
# The figure's name for each objective, as the comparison says it.
FIGURES = {"goodput": "goodput", "goodput-per-watt": "goodput per watt", "tokens-per-joule": "tokens per joule"}

Cost = tuple[float, float, float, float]


def cost(values: Mapping[str, object]) -> Cost:
    """A configuration's cost by :data:`TIE_RULE` (``values``: the base flags with the
    configuration's values over them), smaller is cheaper: GPUs (tensor x pipeline x data
    parallel), the KV cache's bytes, the fraction of GPU memory, max-num-seqs. A size left out
    (vLLM picks it at start) counts as more than any given: within one search the base flags are
    the same, so that compares only a space that sets it for some configurations and not others."""

    def number(name: str, unset: float) -> float:
        v = values.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else unset

    fraction = number("gpu-memory-utilization", number("device-memory-utilization", GPU_MEMORY_DEFAULT))
    return (float(devices_needed(values)), number("kv-cache-memory-bytes", math.inf), fraction,
            number("max-num-seqs", math.inf))


_COST_WORDS = ("fewer GPUs", "less memory (kv-cache-memory-bytes)", "less memory (gpu-memory-utilization)",
               "fewer max-num-seqs")


def _cost_word(value: float) -> str:
    return "unset" if math.isinf(value) else f"{value:g}"


def cheaper_by(a: Cost, b: Cost) -> str:
    """Why ``a`` is cheaper than ``b`` by the rule, in words ("fewer max-num-seqs (64 against
    128)"); "" when the rule finds them equal."""
    for word, x, y in zip(_COST_WORDS, a, b, strict=True):
        if x != y:
            return f"{word} ({_cost_word(x)} against {_cost_word(y)})"
    return ""


def _same_load(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-9 * max(1.0, abs(b)))


def limit_runs(c: ConfigResult, steps: Sequence[Measurement], objective: str) -> tuple[float, ...]:
    """What ``c``'s figure rests on: the objective of every step at its limit load that met the
    SLO, in the order measured (empty when it has no limit). A saved state whose steps do not
    hold its limit step gives that one figure alone."""
    score = config_score(c, objective)
    if c.at is None or c.limit_load is None or score is None:
        return ()
    load = c.at.load
    runs = tuple(v for v in (objective_value(m, objective) for m in steps if m.ok and _same_load(m.load, load))
                 if v is not None)
    return runs or (score,)


@functools.lru_cache(maxsize=4096)
def limit_difference(objective: str, better: tuple[float, ...], other: tuple[float, ...],
                     tolerance: float = 0.0) -> Difference:
    """``other - better`` for two configurations' runs (``better``: the one with the higher
    median): over repeats where both rest on two runs or more, else by the run-to-run floor
    alone; neither floor below the bisection's ``tolerance`` (see the module's doc)."""
    figure = FIGURES.get(objective, objective)
    tol_pct = 100.0 * tolerance
    if len(better) >= 2 and len(other) >= 2:
        d = difference(figure, Configuration(better), Configuration(other),
                       floor_pct=max(REPEATS_FLOOR_PCT, tol_pct))
        if d is not None:
            return d
    base = statistics.median(better)
    value = statistics.median(other) - base
    half = abs(base) * tie_floor_pct(tolerance) / 100
    return Difference(figure, value, Interval(value - half, value + half, FLOOR_ONLY, len(better) + len(other)))


def tie_floor_pct(tolerance: float) -> float:
    """The widest floor a comparison of two limits takes (one run each), in percent: two
    figures closer than this are within the noise whatever else they rest on."""
    return max(RUN_TO_RUN_FLOOR_PCT, 100.0 * tolerance)


def tie_load(limit: float, tolerance: float, *, integer: bool = False) -> float:
    """The lower edge of the noise of a limit load (:func:`tie_floor_pct` below it, as
    :func:`limit_difference` widens a difference by that share of the better figure): a
    configuration that misses the SLO there is beyond the noise below that limit (its goodput,
    about its limit, cannot tie). ``integer``: a concurrency, rounded down (at least 1)."""
    if not math.isfinite(limit):
        return limit
    low = limit * (1 - tie_floor_pct(tolerance) / 100)
    return float(max(1, math.floor(low))) if integer else low


@dataclass(frozen=True)
class Rival:
    """Another configuration as the best sees it: ``difference`` is its figure minus the
    best's (the better one the base), ``runs`` what each limit rests on (the best's, its)."""

    key: str
    difference: Difference
    runs: tuple[int, int]
    cheaper: str = ""
    """For a tied rival: why the best is cheaper by the rule ("" when equal by it)."""
    unchecked: bool = False
    """For a tied rival: measured live and not checked on its own start, where the best held there
    (the best then, whatever the rule says of their costs)."""

    @property
    def within_noise(self) -> bool:
        return self.difference.within_noise

    def words(self, base: float) -> str:
        """``goodput -2.0%, interval -9.5% to +5.5% (repeats, 2 runs each)``: the difference in
        percent of ``base`` (the best's figure), its interval, its kind and the runs each side
        rests on (the best's first)."""
        d, iv = self.difference, self.difference.interval

        def pct(x: float) -> str:
            shown = f"{100 * x / base:+.1f}%" if base else f"{x:+.3g}"
            return shown.replace("-0.0%", "+0.0%")

        a, b = self.runs
        runs = f"{a} run{'s' if a > 1 else ''} each" if a == b else f"{a} run{'s' if a > 1 else ''} against {b}"
        return f"{d.figure} {pct(d.value)}, interval {pct(iv.low)} to {pct(iv.high)} ({iv.kind}, {runs})"


@dataclass(frozen=True)
class Decision:
    """Which configuration is the best, and what that rests on."""

    best: str
    value: float
    """The best's figure: the median of its runs."""
    runs: int
    """Runs the best's limit rests on."""
    tied: tuple[Rival, ...] = ()
    """Configurations within the noise of the best (it won them by :data:`TIE_RULE`)."""
    runner_up: Rival | None = None
    """With none tied: the next best figure, beyond the noise."""

    def tie_words(self) -> str:
        """The best's line where it is tied: "tied with X (within noise: ...); the cheaper by the
        rule (...): fewer max-num-seqs (64 against 128)"; "" where it is not tied."""
        if not self.tied:
            return ""
        parts = [f"{r.key} ({WITHIN_NOISE}: {r.words(self.value)})" for r in self.tied]
        why = "; ".join(f"held on its own start, {r.key} was not checked there" if r.unchecked else
                        f"{r.cheaper} than {r.key}" if r.cheaper else
                        f"equal to {r.key} by it, so the higher figure" for r in self.tied)
        return f"tied with {', '.join(parts)}; chosen by the rule ({TIE_RULE}): {why}"

    def rival_words(self, key: str) -> str:
        """A tied configuration's line: "tied with the best X (within noise: ...); X is cheaper: ..."."""
        r = next((r for r in self.tied if r.key == key), None)
        if r is None:
            return ""
        why = (f"{self.best} held on a server started with exactly its flags, this was not checked there"
               if r.unchecked else f"{self.best} is the cheaper: {r.cheaper}" if r.cheaper
               else f"equal by the rule ({TIE_RULE}), {self.best} has the higher figure")
        return f"tied with the best {self.best} ({WITHIN_NOISE}: {r.words(self.value)}); {why}"

    def words(self) -> str:
        """What the best rests on, in a line: its tie, or the runner-up beyond the noise."""
        if self.tied:
            return f"{self.best}: {self.tie_words()}"
        if self.runner_up is not None:
            return (f"{self.best} ({self.runs} run{'s' if self.runs > 1 else ''}) is beyond the noise of the"
                    f" runner-up {self.runner_up.key}: {self.runner_up.words(self.value)}")
        return (f"{self.best} ({self.runs} run{'s' if self.runs > 1 else ''}): no other configuration was measured"
                " to a limit")


def decide(configs: Iterable[ConfigResult], runs_of: Callable[[ConfigResult], tuple[float, ...]], objective: str, *,
           cost_of: Callable[[ConfigResult], Cost], tolerance: float = 0.0,
           exclude: str | None = None) -> tuple[ConfigResult, Decision] | None:
    """The best of ``configs`` by the module's rule, and the decision; None when none has a
    figure at a limit. ``runs_of``: a configuration's runs (:func:`limit_runs`); ``cost_of``:
    its :func:`cost`; ``exclude``: a key left out (a trial's rivals)."""
    done = [c for c in configs if c.key != exclude and c.limit_load is not None and config_score(c, objective) is not None]
    runs = {c.key: runs_of(c) for c in done}
    done = [c for c in done if runs[c.key]]
    if not done:
        return None
    median = {c.key: statistics.median(runs[c.key]) for c in done}

    def diff(a: ConfigResult, b: ConfigResult) -> Difference:
        """``b - a`` with ``a`` the better (the base of the floors): the same for either order."""
        return limit_difference(objective, runs[a.key], runs[b.key], tolerance)

    def ranked(c: ConfigResult) -> tuple[float, float, int]:
        return (median[c.key], c.limit_load or 0.0, -c.order)

    order = sorted(done, key=ranked, reverse=True)
    # Out of the running: beaten beyond the noise by a better one.
    left = [c for i, c in enumerate(order)
            if not any(not diff(d, c).within_noise and median[d.key] > median[c.key] for d in order[:i])]
    costs = {c.key: cost_of(c) for c in left} if len(left) > 1 else {}
    held = {c.key for c in left if c.start_check.startswith("met")}  # checked on its own start, and held
    unchecked = {c.key for c in left if c.live and not c.start_check} if held else set()
    best = min(left, key=lambda c: (c.key in unchecked, costs.get(c.key, ()), -median[c.key],
                                    -(c.limit_load or 0.0), c.order))

    def rival(c: ConfigResult) -> Rival:
        better, worse = (best, c) if ranked(best) >= ranked(c) else (c, best)
        d = diff(better, worse)
        if better is not best:  # said as the rival's figure minus the best's
            d = dataclasses.replace(d, value=-d.value, interval=dataclasses.replace(
                d.interval, low=-d.interval.high, high=-d.interval.low))
        passed = c.key in unchecked and best.key not in unchecked
        why = cheaper_by(costs[best.key], costs[c.key]) if c.key in costs and not passed else ""
        return Rival(c.key, d, (len(runs[best.key]), len(runs[c.key])), why, unchecked=passed)

    tied = tuple(rival(c) for c in left if c is not best)
    runner = next((c for c in order if c is not best), None)
    decision = Decision(best.key, median[best.key], len(runs[best.key]), tied,
                        rival(runner) if runner is not None and not tied else None)
    return best, decision
