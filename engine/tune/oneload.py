"""The search's one-load path (engine.tune.halving) as the Tuner runs it: which configurations go
under one load, one restart group's server started once and its rounds, what the tune will cost.

:class:`OneLoad` is a part of engine.tune.search.Tuner (its methods take the Tuner as ``self``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from engine.server.launch import last_start_seconds, start_key
from engine.server.livehook import LIVE_FLAGS
from engine.tune.errors import BudgetExhausted
from engine.tune.halving import (
    FINALISTS,
    FIRST_SHARE,
    STEPS_FROM_NONE,
    Estimate,
    Screen,
    estimate,
    halve,
    restart_groups,
    slo_lifetime,
    window_words,
)
from engine.tune.trial import CUT_SHORT, DOMINATED, DONE, NOT_TRIED, SKIPPED, UNSTABLE, ConfigResult
from loadgen.spec import SpecError, WorkloadSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.flags import FlagSet
    from engine.tune.halving import TimeSplit
    from engine.tune.schedule import Costs
    from engine.tune.space import SearchSpace, SpaceValue
    from engine.tune.state import TuneState
    from engine.tune.trial import Measurement, Measurer, StartOutcome, TuneSettings
    from loadgen.spec import SLO


class OneLoad:
    """A restart group's configurations measured under one load, as a part of the Tuner."""

    if TYPE_CHECKING:  # what it uses of the Tuner (engine.tune.search) it is a part of
        state: TuneState
        settings: TuneSettings
        slo: SLO
        space: SearchSpace
        base: FlagSet
        measurer: Measurer
        clock: Callable[[], float]
        say: Callable[[str], None]
        _costs: Costs
        _split: TimeSplit
        _last_group: tuple[object, ...] | None

        def remaining(self) -> float: ...
        def _step_s(self) -> float: ...
        def best(self, exclude: str | None = None) -> ConfigResult | None: ...
        def _persist(self) -> None: ...
        def _report(self, c: ConfigResult) -> None: ...
        def _live_measuring(self) -> bool: ...
        def _restart_group(self, values: Mapping[str, object]) -> tuple[object, ...]: ...
        def _group_launch(self, flags: FlagSet) -> FlagSet: ...
        def _flags(self, values: Mapping[str, object]) -> FlagSet: ...
        def _set_live(self, measurer: Measurer, key: str, phase: str, load: float | None = None,
                      last: Measurement | None = None, *, notify: bool = False) -> None: ...
        def _end_live(self, measurer: Measurer) -> None: ...
        async def _one_step(self, key: str, phase: str, load: float, n: int) -> Measurement: ...
        async def _tune_config(self, key: str, values: Mapping[str, SpaceValue], best: ConfigResult | None,
                               order: int, measurer: Measurer | None = None,
                               start_load: float | None = None) -> ConfigResult: ...

    def _one_load(self) -> bool:
        """A restart group's configurations measured under one load (engine.tune.halving): one trial
        at a time, live, pruning (--no-prune measures every one to its limit), by goodput (the energy
        objectives need a power reading per step, which a window has not)."""
        s = self.settings
        return (self._live_measuring() and s.prune and s.objective == "goodput"
                and callable(getattr(self.measurer, "measure_windows", None)))

    def _workload(self) -> WorkloadSpec | None:
        """The search's workload, as its inputs keep it (None where it was given none or does not read)."""
        w = self.state.inputs.get("workload")
        spec = w.get("workload") if isinstance(w, Mapping) else None
        if not isinstance(spec, Mapping) or not spec:
            return None
        try:
            return WorkloadSpec.from_dict(spec)
        except SpecError:
            return None

    def _groups(self, by_key: Mapping[str, Mapping[str, SpaceValue]], seed: Mapping[str, SpaceValue]) -> list[list[str]]:
        """The configurations still to measure by restart group, the seed's group first."""
        todo = [k for k in by_key if k not in self.state.configs or self.state.configs[k].status in (NOT_TRIED, CUT_SHORT)]
        return restart_groups(todo, lambda k: self._restart_group(by_key[k]), self._restart_group(seed))

    def _estimate(self, groups: Sequence[Sequence[str]], by_key: Mapping[str, Mapping[str, SpaceValue]]) -> Estimate:
        """engine.tune.halving.estimate with this box's last start of each group's flags (else a minute)."""
        seen = [last_start_seconds(start_key(self._group_launch(self._flags(by_key[g[0]])))) for g in groups]
        sizes = [min(len(g), len(self._screen(g, by_key).first) + 1) if self._one_load() and len(g) > FINALISTS
                 else len(g) for g in groups]
        est = estimate(sizes, start_s=max((x for x in seen if x), default=self._costs.start()),
                       step_s=self._step_s(), window_s=self.settings.window_s, one_load=self._one_load(),
                       live=self._live_measuring(), lifetime_s=self._slo_lifetime(), at_slo=True)
        total = sum(len(g) for g in groups)
        return dataclasses.replace(est, configs=total, held=total - sum(sizes))

    def _slo_lifetime(self) -> float | None:
        """A request's lifetime at the SLO's edge (engine.tune.halving.slo_lifetime) for the
        workload's output length (synthetic lengths only: a dataset's or trace's is not read here)."""
        spec = self._workload()
        return slo_lifetime(self.slo, spec.output_len if spec is not None and spec.kind == "random" else None)

    def _screen(self, keys: Sequence[str], by_key: Mapping[str, Mapping[str, SpaceValue]]) -> Screen:
        """The group's lines through its configuration nearest the seed (every one with --exhaustive)."""
        seed = self.space.seed(self.base.values)
        anchor = min(keys, key=lambda k: self.space.distance(by_key[k], seed))
        return Screen({k: by_key[k] for k in keys}, anchor, self.settings.exhaustive)

    def _count_start(self, outcome: StartOutcome, seconds: float) -> None:
        """A start counted (a restart, or one that was not set live) and its time split."""
        if outcome.restarted or not outcome.live:
            self.state.starts += 1
        if outcome.restarted:
            self._costs.starts.append(seconds)
            self._split.starts_s += seconds
        else:
            self._split.settling_s += seconds  # set live once the step before drained

    async def _halve_group(self, keys: Sequence[str], by_key: Mapping[str, Mapping[str, SpaceValue]], order: int,
                           later: Sequence[int]) -> int:
        """One restart group under one load: its server started once (at the group's maxima), rounds of
        interleaved windows (engine.tune.halving.halve) from half the burst's throughput (or
        --start-load), those beyond the noise below the best dropped, the last ones' limits found by
        bisection from the load they met. ``later``: the sizes of the groups after it. Returns ``order``."""
        st, s, first = self.state, self.settings, keys[0]
        name = ", ".join(f"{n}={by_key[first][n]}" for n, _ in self.space.dims if n not in LIVE_FLAGS) or "live flags"
        self._set_live(self.measurer, first, "starting", notify=True)
        t = self.clock()
        outcome = await self.measurer.start(self._flags(by_key[first]), timeout=min(s.start_timeout_s,
                                                                                    max(1.0, self.remaining())))
        self._count_start(outcome, self.clock() - t)
        self._end_live(self.measurer)
        self._last_group = self._restart_group(by_key[first])
        if not outcome.ok or not outcome.live:
            return order  # one at a time instead: the per-configuration path records what happened
        load = s.start_load or (8.0 if s.mode == "concurrency" else None)
        lifetime: float | None = None
        if load is None:
            t = self.clock()
            m = await self._one_step(first, "measuring", math.inf, s.step.min_requests)
            self._split.measuring_s += self.clock() - t
            load = max(s.min_load, FIRST_SHARE * m.request_throughput) if m.request_throughput > 0 else 1.0
            lifetime = m.e2el_ms / 1000 if m.e2el_ms else None
        at_slo = lifetime is None
        if at_slo:  # no burst (or no lifetime from it): the SLO's edge
            lifetime = self._slo_lifetime()
        screen = self._screen(keys, by_key)
        how = "under one load, set live between windows" if len(keys) > FINALISTS else "set live, each to its limit"
        lines = "" if not screen.held else (f" ({len(screen.first)} on the lines through {screen.anchor} first,"
                                            f" {len(screen.held)} held back)")
        self.say(f"{name}: {len(keys)} configurations {how}{lines}")

        def progress(left: int, round_s: float = 0.0) -> str:
            eta = estimate([left, *later], start_s=self._costs.start(), step_s=self._costs.step(1.0, 1),
                           window_s=s.window_s, one_load=True, lifetime_s=lifetime,
                           at_slo=at_slo).seconds - self._costs.start()
            return (f"{left + sum(later)} configurations left, about {max(0.0, eta) / 60:.1f} min"
                    f" ({self.remaining() / 60:.1f} min of budget left)")

        if lifetime is not None:  # what a window costs on this server, now that a request's life is known
            self.say(f"  {name}: {window_words(s.window_s, lifetime, at_slo=at_slo)}; {progress(len(screen.first))}")

        h = await halve(self.measurer, {k: self._flags(by_key[k]) for k in keys}, load,  # type: ignore[arg-type]
                        settings=s, group=name, split=self._split, remaining=self.remaining, say=self.say,
                        progress=progress, lifetime_s=lifetime, screen=screen,
                        bisect_s=STEPS_FROM_NONE * self._costs.step(load, s.step.min_requests))
        for k, reason in h.skipped.items():
            order += 1
            st.configs[k] = ConfigResult(k, by_key[k], SKIPPED, reason=reason, order=order)
        for k, ms in h.steps.items():
            st.measurements.setdefault(k, []).extend(ms)
        for k, reason in h.dropped.items():
            order += 1
            st.configs[k] = ConfigResult(k, by_key[k], DOMINATED, reason=reason, order=order, live=True,
                                         started_with=outcome.started_with, steps=len(st.measurements.get(k, ())))
            self._report(st.configs[k])
        self._persist()
        finalists = sorted(h.left, key=lambda k: -(h.steps[k][-1].goodput if h.steps.get(k) else 0.0))
        for i, k in enumerate(finalists):
            order += 1
            result = await self._tune_config(k, by_key[k], self.best(exclude=k), order, start_load=h.left[k] or load)
            self._end_live(self.measurer)
            st.configs[k] = result
            self._persist()
            self._report(result)
            if result.status == CUT_SHORT:
                for rest in finalists[i + 1:]:  # what their windows met stands, cut short as this one
                    order += 1
                    st.configs[rest] = self._windows_only(rest, by_key[rest], order, outcome)
                    self._report(st.configs[rest])
                self._persist()
                raise BudgetExhausted
        if finalists and all(st.configs[k].limit_load is None for k in finalists):
            # No finalist's limit in steps held when measured again (UNSTABLE each, on a noisy box): what
            # their windows met under one load stands for them, and the check on their own start says
            # whether it holds, rather than a tune that ends with no configuration at all.
            for k in finalists:
                if st.configs[k].status == UNSTABLE and any(m.ok for m in h.steps.get(k, ())):
                    c = st.configs[k]
                    st.configs[k] = ConfigResult.at_highest_met(
                        k, by_key[k], DONE, h.steps[k], order=c.order, live=True, started_with=c.started_with,
                        reason=f"{c.reason}; its figure is the highest load it met in a window under one load")
                    self.say(f"{k}: {st.configs[k].reason}")
            self._persist()
        return order

    def _windows_only(self, key: str, values: Mapping[str, SpaceValue], order: int,
                      outcome: StartOutcome) -> ConfigResult:
        """A finalist the budget reached before its bisection: CUT_SHORT, its limit the highest load it
        met in a window (None where it met none)."""
        steps = self.state.measurements.get(key, [])
        return ConfigResult.at_highest_met(
            key, values, CUT_SHORT, steps, order=order, live=True, started_with=outcome.started_with,
            reason="budget reached before its bisection; " + ("measured in windows under one load only" if steps
                                                              else "not measured (the rounds had no budget)"))
