"""One configuration's limit: the highest load at which it meets the SLO, found by bracketing and
bisection (:func:`bracket`), then, for a would-be best, measured a second time (:func:`confirm`).

The search loop (``engine.tune.search.Tuner``) starts the server, hands these a ``probe`` (one step
at a load, reused where measured) and a ``finish`` (the configuration's result from the steps so
far), and decides with what they return; which configuration comes next, the slots side by side and
the budget stay there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Protocol

from engine.tune.ranking import tie_floor_pct
from engine.tune.trial import DOMINATED, DONE, NO_LOAD, UNSTABLE, ConfigResult, Measurement, TuneSettings, objective_value


class Probe(Protocol):
    """One step of a configuration at ``load`` (``fresh``: measure again, even if measured)."""

    async def __call__(self, load: float, fresh: bool = False) -> Measurement: ...


class Finish(Protocol):
    """The configuration's result with ``status``, from the steps measured so far."""

    def __call__(self, status: str, reason: str = "") -> ConfigResult: ...


class ConfigBudget(Exception):
    """The next step of this configuration does not fit the budget."""


class Fatal(Exception):
    """The server died under load: no later step on this configuration can succeed."""


async def bracket(probe: Probe, finish: Finish, *, settings: TuneSettings, best: ConfigResult | None, key: str,
                  best_now: Callable[[], ConfigResult | None], must_meet: Callable[[ConfigResult], float],
                  neighbour_pass: Callable[[Iterable[str]], tuple[float, str] | None],
                  measurements: Mapping[str, Sequence[Measurement]],
                  lost_beside: MutableMapping[str, tuple[str, float]],
                  known: Sequence[Measurement] = ()) -> ConfigResult:
    """The highest load at which configuration ``key`` meets the SLO: bracketing (multiply by
    ``growth`` until violated; from the loads met and missed in ``known``, where given), then
    bisection until the bracket is within ``tolerance``; the
    result through ``finish`` (DONE, DOMINATED, NO_LOAD). Each step through ``probe``; Fatal when
    the server died under load (ConfigBudget, from ``probe``, when the next step does not fit).

    What it asks of the search: ``best``, the best when it began; ``best_now()``, the best now
    (leaving ``key`` out; side by side a neighbour can finish better meanwhile); ``must_meet(rival)``,
    the load it must meet to stay in the running against ``rival`` (Tuner._must_meet);
    ``neighbour_pass(skip)``, the highest load a running neighbour (not in ``skip``) has met that this
    one has not (schedule.neighbour_pass); ``measurements``, the steps measured per configuration;
    ``lost_beside``, where ``key`` is entered with the neighbour and the load when it lost to a
    running neighbour's pass (the search holds it until that load is confirmed)."""
    s = settings
    integer = s.mode == "concurrency"
    lo: float | None = None  # highest load that met the SLO
    hi: float | None = None  # lowest load above lo that violated it
    ceiling: float | None = None  # capacity: no rate above it can meet the SLO

    async def step(load: float, fresh: bool = False) -> Measurement:
        nonlocal lo, hi
        m: Measurement = await probe(load, fresh)
        if m.fatal:
            raise Fatal(m.fatal)
        if m.ok:
            lo = load if lo is None else max(lo, load)
            if hi is not None and hi <= lo:
                hi = None  # noise: a lower load failed, a higher one passed; trust the pass
        else:
            hi = load if hi is None else min(hi, load)
        return m

    # What this configuration was measured at before (``known``: its windows under one load with the
    # others) starts the bracket: the highest load met there and the lowest above it missed, as if
    # bracketed so far by steps (a miss below a pass is noise: the pass is trusted).
    before = [m for m in known if math.isfinite(m.load) and not m.fatal]
    lo = max((m.load for m in before if m.ok), default=None)
    hi = min((m.load for m in before if not m.ok and (lo is None or m.load > lo)), default=None)

    prunes = s.prune and s.objective == "goodput"

    async def lost_to(rival: str, limit: float, at: float | None = None) -> ConfigResult | None:
        """One step at ``at`` (default ``limit``, the load ``rival`` meets the SLO at) says
        whether this can beat it, or tie it where ``at`` is the lower edge of the noise of that
        limit (_must_meet): the finished result when it cannot (or when it meets even "all at
        once"), None to go on."""
        load = limit if at is None else at
        where_met = f"where {rival} meets it"
        if load < limit:  # more than the noise below the rival's limit: no tie either
            where_met = f"{tie_floor_pct(s.tolerance):g}% below {limit:.3g} {where_met}: it cannot tie it"
        if hi is not None and hi <= load:
            return finish(DOMINATED, f"violates the SLO at {hi:.3g}, at or below {load:.3g} {where_met}")
        if lo is not None and lo >= load:
            return None  # met there already
        # A miss there is checked once more unless requests failed or the server died:
        # one slow burst on a shared box must not drop a config that could win.
        m = await step(load)
        if not m.ok and s.confirm and not m.fatal and not m.failed:
            m = await step(load, fresh=True)
        if not m.ok:
            where = "all at once" if math.isinf(load) else f"{load:.3g}"
            twice = " (twice)" if len([x for x in measurements.get(key, ())
                                       if x.load == load]) > 1 else ""
            return finish(DOMINATED, f"violates the SLO at {where}{twice}, {where_met} ({m.reason})")
        if math.isinf(load):
            return finish(DONE)
        return None

    # 1. Can it beat the best so far (or, cheaper, tie it)? One step at the best's limit load
    # (a cheaper one: at the lower edge of that limit's noise) says.
    if best is not None and prunes and best.limit_load is not None:
        lost = await lost_to(best.key, best.limit_load, must_meet(best))
        if lost is not None:
            return lost
    # 2. No anchor: a saturation step gives the capacity (rate mode); side by side, a load a
    # running neighbour has met is the anchor instead (step 3 starts there).
    elif s.start_load is None and not integer and not (prunes and neighbour_pass(())):
        m = await probe(math.inf)  # not step(): "violates at inf" says nothing about hi
        if m.fatal:
            raise Fatal(m.fatal)
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
        # against that one now, as one at a time would have been from its start.
        # One at a time, the best does not change meanwhile.
        rival = best_now()
        if (prunes and rival is not None and rival.limit_load is not None
                and (best is None or (rival.key, rival.limit_load) != (best.key, best.limit_load))):
            best = rival
            lost = await lost_to(rival.key, rival.limit_load, must_meet(rival))
            if lost is not None:
                return lost
        # Side by side, a running neighbour may already have met a load this one has not met:
        # one step there (checked once more on a miss), as at a best's limit. A pass moves the
        # bracket up at once; a miss (or one already at or below it) ends this trial, held by
        # _run_slots until that load is confirmed (a single pass may be luck): then it is
        # dropped, else measured again. Once per neighbour: its finished
        # limit, if better, is checked above as any new best is.
        near = neighbour_pass(checked) if prunes else None
        if near is not None and (lo is None or near[0] > lo):
            checked.add(near[1])  # once a neighbour: its later passes would only nibble at the bracket
            lost = await lost_to(near[1], near[0])
            if lost is not None:
                lost_beside[key] = (near[1], near[0])
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


async def confirm(probe: Probe, result: ConfigResult, ms: list[Measurement], settings: TuneSettings) -> ConfigResult:
    """Measure a would-be best's limit step again; the lower goodput counts.

    The best so far decides which configs are dropped after one step, so a limit that
    passed once by luck would cost the rest of the search. When the second step misses,
    one step just below (the highest load that passed before, if within two tolerances,
    else two tolerances down) gets the same check; a miss there too marks it unstable.
    """
    s = settings
    at = result.at
    assert at is not None and result.limit_load is not None
    m = await probe(at.load, True)
    if m.fatal:
        raise Fatal(m.fatal)
    if m.ok:
        worse = m if _value(m, s) < _value(at, s) else at
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
        return unstable(result, ms, f"limit {base:.3g} missed when measured again ({first_miss})")
    m2 = await probe(load, True)
    if m2.fatal:
        raise Fatal(m2.fatal)
    if not m2.ok:
        return unstable(result, ms, f"limit {base:.3g} missed when measured again ({first_miss}),"
                                          f" and {load:.3g} too ({m2.reason})")
    before = [x for x in ms if x.ok and x.load == load and x is not m2]
    worse = min([m2, *before], key=lambda x: _value(x, s))
    return dataclasses.replace(
        result, limit_load=load, goodput=worse.goodput, at=worse, confirmed=True, steps=len(ms),
        reason=f"limit {base:.3g} missed when measured again ({first_miss}); {load:.3g} held")


def _value(m: Measurement, settings: TuneSettings) -> float:
    """A step's objective figure, 0 without one (the lower of two steps counts)."""
    return objective_value(m, settings.objective) or 0.0


def unstable(result: ConfigResult, ms: list[Measurement], reason: str) -> ConfigResult:
    return dataclasses.replace(result, status=UNSTABLE, limit_load=None, goodput=None, at=None,
                               reason=reason, steps=len(ms))
