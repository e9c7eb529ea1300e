"""Find the flags that give the most goodput under an SLO, within a time budget.

Which ``max-num-batched-tokens``, ``max-num-seqs``, chunked prefill (...) give the most goodput on
this model, box and traffic while the p99 (or p90) TTFT/TPOT/E2EL stay under their limits?

The search (:class:`Tuner`) is tested on recorded measurement tables with no server;
:class:`ServerMeasurer` measures a real one. How the budget is spent (vLLM's ``auto_tune.sh``
runs the whole grid and steps the rate down 1 req/s at a time from the saturated throughput):

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
- A restart group of several configurations that differ only in live flags is measured under one
  load (engine.tune.halving: rounds of interleaved windows, the beyond-noise losers dropped); its
  last two, and every configuration otherwise, get their limit one at a time:
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

Requests per step: ``max(min_requests, ceil(load x min_step_s))`` up to ``max_requests`` (defaults
100, 10 s, 2000): a p99 from 100 samples rests on the two largest, the least that means anything.

This module is the loop; its parts live beside it in ``engine.tune``: ``space``, ``schedule``
(costs, what comes next), ``bracket`` (one limit), ``halving`` (one load), ``trial``, ``state``,
``report``, ``measurer``. Every name is importable from here as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.flags import FlagError, FlagSet, devices_needed, validate
from engine.server.livehook import LIVE, LIVE_FLAGS
from engine.tune import report
from engine.tune.bracket import ConfigBudget, Fatal, bracket, confirm
from engine.tune.errors import BudgetExhausted, TuneError
from engine.tune.halving import Estimate, TimeSplit
from engine.tune.measurer import ServerMeasurer
from engine.tune.oneload import OneLoad
from engine.tune.ranking import TIE_RULE, Cost, Decision, cost, decide, limit_runs, tie_floor_pct, tie_load
from engine.tune.report import ParetoPoint, StepPoint, TuneResult, format_pareto, format_table, pareto_points, step_series
from engine.tune.schedule import Costs, bound_reason, flags_changed, nearest_first, neighbour_pass, off_line_reason
from engine.tune.space import DEFAULT_SPACE, SearchSpace
from engine.tune.state import FileStore, HistoryStore, TuneState, TuneStore, list_states, load_state, new_id, state_path, tune_dir
from engine.tune.trial import (
    CUT_SHORT,
    DIED,
    DOMINATED,
    DONE,
    INVALID,
    MODES,
    NO_LOAD,
    NOT_TRIED,
    OBJECTIVE_UNITS,
    OBJECTIVES,
    SKIPPED,
    START_FAILED,
    UNSTABLE,
    ConfigResult,
    EarlyStop,
    Measurement,
    Measurer,
    RunningTrial,
    StartOutcome,
    StepRule,
    TuneSettings,
    best_config,
    config_score,
    objective_value,
    violation_count,
)

# allowed_failures, judge: the SLO's own test; re-exported
from loadgen.spec import allowed_failures, judge

if TYPE_CHECKING:
    from engine.flags import Schema
    from engine.tune.space import SpaceValue
    from loadgen.spec import SLO

# Rivals tied with a winner measured live that are checked on their own start too (each check is a start).
TIE_CHECKS = 1
# Checks of the best that run even past the budget while none has held (the best, and the next best
# where the first fell): a winner measured live is not left unchecked for the seconds a check overruns.
PAST_BUDGET_CHECKS = 2


class Tuner(OneLoad):
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
        self._live: dict[int, RunningTrial] = {}
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
        self._check_held = True  # the winner's check on its own start is kept out of the search's budget
        self._costs = Costs()  # what starts and steps cost here: the estimates for the next ones
        self._last_group: tuple[object, ...] | None = None  # restart group of the server last started (slot 0)
        self._split = TimeSplit()  # where this run's wall time went (a resumed search counts anew)
        self.estimate: Estimate | None = None
        for m in self.measurers:
            # Live measurers start each restart group's server at the group's maxima.
            if isinstance(m, ServerMeasurer) and m.live and m.launch_flags is None:
                m.launch_flags = self._group_launch

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
        """Budget seconds left. A search measured live keeps back what checking its winner on a
        server started with exactly its flags costs (a start and a step, as measured here) until
        that check begins, so the budget ends with the winner checked, not measured live only."""
        return self.settings.budget_s - self.elapsed() - self._held_for_check()

    def _held_for_check(self) -> float:
        if not (self._check_held and self._live_measuring()):
            return 0.0
        return self._costs.start() + self._step_s()

    def _step_s(self) -> float:
        """What a step of the shortest kind costs here (the estimates' step)."""
        return self._costs.step(1.0, math.ceil(self.settings.step.min_step_s))

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

    def plan(self) -> Estimate:
        """What this search is expected to cost before it starts (nothing measured or saved): the
        configurations that pass the static checks and are not done yet, by restart group."""
        by_key = {self.space.key(v): v for v in self.space.configs()}
        valid = {k: v for k, v in by_key.items() if not self._static_problems(v)}
        return self._estimate(self._groups(valid, self.space.seed(self.base.values)), valid)

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
            groups = self._groups(by_key, seed)
            self.estimate = self._estimate(groups, by_key)
            self.say(self.estimate.words(self.settings.budget_s - self.elapsed()))  # it counts the checks too
            if self._one_load():
                for i, keys in enumerate(groups):
                    if len(keys) > 1:
                        order = await self._halve_group(keys, by_key, order, [len(g) for g in groups[i + 1:]])
            s_exhaustive = self.settings.exhaustive or not self.settings.prune
            await self._run_slots(by_key, seed, s_exhaustive, order)
            await self._checks()
        except BudgetExhausted:
            status = "budget"
            held = self._held_for_check()
            self.say(f"budget of {self.settings.budget_s / 60:.1f} min reached after {self.elapsed() / 60:.1f} min"
                     + (f" ({held / 60:.1f} min of it kept for checking the winner on its own start)" if held else ""))
            await self._checks()  # in the time kept back for them
            best = self.best()
            if best is not None and best.live and not best.start_check:
                self.say(f"{best.key}: measured live only, not checked on a server started with exactly its flags"
                         " (no budget left): start it and measure it before you take it")
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
                        on_line = [k for k in pending if flags_changed(self.space, by_key[k], best.values) <= 1]
                        if not on_line:
                            if running:
                                break  # a trial still running may become the best, with lines of its own
                            self._skip_off_line(pending, by_key, best, order)
                            order += len(pending)
                            break
                        pending = on_line
                    nearest_first(pending, by_key, st.configs, self.space, anchor)
                    if self._live_measuring():
                        # Fewest restarts: the running server's restart group first (stable sort).
                        pending.sort(key=lambda k: self._restart_group(by_key[k]) != self._last_group)
                    key = pending[0]
                    if self.remaining() < self._costs.start() + self._costs.step(1.0, 1):
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
            t = self.clock()
            try:
                await self._measure_alone()
            finally:
                self._split.checks_s += self.clock() - t

    # -- live limits ----------------------------------------------------------

    def _live_measuring(self) -> bool:
        """One trial at a time, by a measurer that sets flags live (ServerMeasurer(live=True))."""
        return getattr(self.measurer, "live", False) is True and not self._slots

    def _restart_group(self, values: Mapping[str, object]) -> tuple[object, ...]:
        """The values of the flags that need a restart: configurations alike in them share a server."""
        return tuple((n, values[n]) for n, _ in self.space.dims if n not in LIVE_FLAGS and n in values)

    def _group_launch(self, flags: FlagSet) -> FlagSet:
        """The flags a restart for ``flags`` starts with: its restart group's maxima of the live
        flags (so the group's other configurations are set live, never above what was started),
        or ``flags`` itself where those maxima would not start (vLLM's own rules)."""
        values = {n: flags.get(n) for n, _ in self.space.dims}
        group = self._restart_group(values)
        members = [c for c in self.space.configs() if self._restart_group(c) == group]
        launch = flags
        for flag in LIVE:  # counts at the group's largest, switches on where any member has them on
            seen = [c[flag.name] is True if flag.switch else int(str(c[flag.name])) for c in members
                    if c.get(flag.name) is not None]
            if seen and (not flag.switch or any(seen)):
                launch = launch.set(flag.name, max(seen))
        if launch is not flags and self._static_problems({n: launch.get(n) for n, _ in self.space.dims}):
            return flags
        return launch

    async def _checks(self) -> None:
        """The winners measured live checked on their own start (the time kept back is theirs now)."""
        self._check_held = False
        t = self.clock()
        try:
            await self._check_live_winners()
        finally:
            self._split.checks_s += self.clock() - t

    async def _check_live_winners(self) -> None:
        """A winner measured live, and the first :data:`TIE_CHECKS` rivals tied with it, measured once
        more on a server started with exactly its flags (the KV cache and CUDA graphs were sized for
        the started maxima): met there, it stands (``start_check`` says so); missed, it is UNSTABLE and the search decides
        again, checking the next best, until a best holds on its own start or the budget ends."""
        if not self._live_measuring():
            return
        checked: set[str] = set()
        demoted: list[str] = []
        overruns = PAST_BUDGET_CHECKS
        while True:
            decided = self.decide()
            if decided is None:
                return
            best, decision = decided
            rivals = [r.key for r in decision.tied]
            if len(rivals) > TIE_CHECKS and best.key not in checked:
                self.say(f"{', '.join(rivals[TIE_CHECKS:])}: tied with {best.key} too; measured live only (a check"
                         f" is a start: the best and {TIE_CHECKS} tied with it are checked)")
            keys = [k for k in (best.key, *rivals[:TIE_CHECKS]) if k not in checked]
            todo = [c for c in (self.state.configs.get(k) for k in keys)
                    if c is not None and c.live and c.limit_load is not None and math.isfinite(c.limit_load)]
            if not todo:
                break
            # Until the best and its first tie have been checked: a check's step joins the figures, so
            # a check that holds can still move the decision (a tie won by a cheaper configuration).
            for c in todo:
                checked.add(c.key)
                overrun = c.key == best.key and overruns > 0
                overruns -= overrun
                held = await self._check_on_its_start(c, overrun=overrun)
                if held is None:
                    return  # no budget left: said, its figures stand as measured live
                if held and c.key == best.key:
                    overruns = 0  # a winner holds: the ties are checked within the budget only
                if not held:
                    demoted.append(c.key)
                    if c.key == best.key:
                        break  # the best fell: decide again before checking its ties
        if demoted and not (self.settings.exhaustive or not self.settings.prune):
            self.say(f"{', '.join(demoted)} did not hold on a server started with exactly its flags; configurations "
                     "skipped as losing to it were not measured (--exhaustive measures every one)")

    async def _check_on_its_start(self, c: ConfigResult, *, overrun: bool = False) -> bool | None:
        """``c``'s limit measured on a server started with exactly its flags; False when it missed
        (the row is UNSTABLE then), None when no budget is left for it (said). With ``overrun`` it
        runs even where the budget falls short (the time kept back was for a step of the shortest
        kind, the search's last step can overrun, and a best can fall), and says by how much; its
        start and step are then not cut by the budget (a start cut short would read as one that failed)."""
        s = self.settings
        load = c.limit_load
        assert load is not None
        n = s.step.requests(load, s.mode)
        need = self._costs.start() + self._costs.step(load, n)
        over = need - self.remaining()
        if over > 0 and not overrun:
            self.say(f"{c.key}: no budget left to check it on a server started with exactly its flags;"
                     " its figures were measured live")
            return None
        self.say(f"{c.key}: measured live; checking {load:.3g} on a server started with exactly its flags"
                 + (f" (~{over:.0f} s past the budget)" if over > 0 else ""))
        self._set_live(self.measurer, c.key, "starting", notify=True)
        timeout = min(s.start_timeout_s, max(self.remaining(), 2 * self._costs.start()) if overrun else self.remaining())
        outcome = await self.measurer.start(self._flags(c.values), timeout=timeout, exact=True)  # type: ignore[call-arg]
        self.state.starts += 1
        held = False
        if not outcome.ok:
            self._end_live(self.measurer)
            new = dataclasses.replace(c, status=UNSTABLE, reason=f"measured live; does not start with exactly "
                                      f"its flags: {outcome.reason}")
        else:
            m = await self._one_step(c.key, "measuring", load, n, in_budget=not overrun)
            held = m.ok
            if m.ok:
                new = dataclasses.replace(c, start_check=f"met {load:.3g} again started with exactly its flags "
                                          f"(goodput {m.goodput:.3g} req/s; live {c.goodput or 0:.3g})")
            else:
                new = dataclasses.replace(c, status=UNSTABLE, limit_load=None, goodput=None, at=None,
                                          start_check=f"missed {load:.3g} started with exactly its flags ({m.reason})",
                                          reason=f"met {load:.3g} live, missed it on a server started with "
                                          f"exactly its flags ({m.reason})")
        self.say(f"{c.key}: {new.start_check or new.reason}")
        self.state.configs[c.key] = new
        self._persist()
        return held

    async def _one_step(self, key: str, phase: str, load: float, n: int, *, in_budget: bool = True) -> Measurement:
        """One step of ``key`` at ``load`` by the first slot's measurer (its server already runs the
        configuration), shown live as ``phase``, counted and kept with the configuration's steps;
        its timeout cut to the budget left unless not ``in_budget``."""
        s = self.settings
        self._set_live(self.measurer, key, phase, load, notify=True)
        timeout = min(s.step_timeout_s, max(5.0, self.remaining())) if in_budget else s.step_timeout_s
        m = await self.measurer.measure(load, requests=n, timeout=timeout, warmup=s.step.warmup)
        self._end_live(self.measurer)
        self.state.steps += 1
        self.state.measurements.setdefault(key, []).append(m)
        return m

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
            if self.remaining() < self._costs.start() + self._costs.step(load, n):
                self.say(f"{c.key}: no budget left to measure its limit alone; its figures ran beside others")
                break
            self._set_live(self.measurer, c.key, "alone", notify=True)
            outcome = await self.measurer.start(self._flags(c.values), timeout=min(s.start_timeout_s, self.remaining()))
            self.state.starts += 1
            if not outcome.ok:
                self._end_live(self.measurer)
                self.say(f"{c.key}: could not start it alone: {outcome.reason}")
                continue
            m = await self._one_step(c.key, "alone", load, n)
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
        load a running neighbour had met once.

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
        """schedule.neighbour_pass over the trials running now."""
        running = (k for k, _ in self._running.values())
        return neighbour_pass(key, running, self.state.measurements, at_least, skip)

    def _skip_off_line(self, pending: list[str], by_key: Mapping[str, Mapping[str, SpaceValue]], best: ConfigResult,
                       order: int) -> None:
        for i, key in enumerate(pending):
            reason = off_line_reason(self.space, by_key[key], best)
            self.state.configs[key] = ConfigResult(key, by_key[key], SKIPPED, reason=reason, order=order + 1 + i)
        self._persist()
        if pending:
            self.say(f"{len(pending)} configurations skipped: every one-flag change from {best.key} lost to it"
                     " (--exhaustive measures them too)")

    def _bound_reason(self, values: Mapping[str, object], best: ConfigResult | None) -> str:
        """Why a config cannot beat ``best`` (nor, cheaper, tie it) without starting it, or ""
        (schedule.bound_reason)."""
        need = None
        if best is not None and best.goodput and cost({**self.base.values, **values}) < self._cost(best):
            need = best.goodput * (1 - tie_floor_pct(self.settings.tolerance) / 100)
        return bound_reason(values, best, self.settings, self.base, self.state.measurements, need)

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
        """The best configuration by engine.tune.ranking's rule: none other better beyond the
        noise of the limits, and of those within each other's noise the cheapest (TIE_RULE)."""
        decided = self.decide(exclude)
        return decided[0] if decided is not None else None

    def decide(self, exclude: str | None = None) -> tuple[ConfigResult, Decision] | None:
        """The best (leaving out ``exclude``) and what the decision rests on (ranking.decide)."""
        return decide(self.state.configs.values(), self._runs, self.settings.objective, cost_of=self._cost,
                      tolerance=self.settings.tolerance, exclude=exclude)

    def _runs(self, c: ConfigResult) -> tuple[float, ...]:
        """What ``c``'s figure at its limit rests on (ranking.limit_runs over its steps)."""
        return limit_runs(c, self.state.measurements.get(c.key, ()), self.settings.objective)

    def _cost(self, c: ConfigResult) -> Cost:
        """``c``'s cost by ranking.TIE_RULE, with the base flags under its values."""
        return cost({**self.base.values, **c.values})

    def _report(self, c: ConfigResult) -> None:
        self.say(report.config_words(c, self.settings.mode, self.settings.objective))

    # -- one configuration -------------------------------------------------------------

    async def _tune_config(self, key: str, values: Mapping[str, SpaceValue], best: ConfigResult | None,
                           order: int, measurer: Measurer | None = None, start_load: float | None = None) -> ConfigResult:
        """One configuration's limit (engine.tune.bracket); ``start_load``: a load it met under one
        load with others, where its bracket starts from what those windows met and missed (their
        steps are reused, not measured again)."""
        st = self.state
        s = self.settings if start_load is None else dataclasses.replace(self.settings, start_load=start_load)
        measurer = measurer or self.measurer
        flags = self._flags(values)
        self.say(f"{key}: starting ({order}; {self.remaining() / 60:.1f} min left)")
        self._set_live(measurer, key, "starting", notify=True)
        timeout = min(s.start_timeout_s, max(1.0, self.remaining()))
        t = self.clock()
        outcome = await measurer.start(flags, timeout=timeout)
        start_s = self.clock() - t
        self._count_start(outcome, start_s)
        if measurer is self.measurer:
            self._last_group = self._restart_group(values)
        if outcome.live:
            self.say(f"  {key}: set live in {start_s:.1f} s" + (" after a start at its group's maxima"
                                                               if outcome.restarted else ", no restart"))
        elif self._live_measuring() and getattr(measurer, "live_refusal", None):
            self.say(f"  {key}: restarted, not live: {getattr(measurer, 'live_refusal', '')}")
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
            est = self._costs.step(load, n)
            if self.remaining() < est:
                raise ConfigBudget
            warm = s.step.warmup if first_step[0] else 0
            tmo = min(s.step_timeout_s, max(5.0, self.remaining()))
            t0 = self.clock()
            self._set_live(measurer, key, "measuring", load, notify=True)
            m = await measurer.measure(load, requests=n, timeout=tmo, warmup=warm)
            self._set_live(measurer, key, "measuring", load, last=m)
            actual = self.clock() - t0
            self._split.measuring_s += actual
            first_step[0] = False
            self._costs.steps.append((n / load if math.isfinite(load) and load > 0 else actual, actual))
            st.steps += 1
            ms.append(m)
            self._persist()
            self.say(report.step_words(key, m, s.mode, n, actual, again=fresh))
            return m

        def finish(status: str, reason: str = "") -> ConfigResult:
            return ConfigResult.at_highest_met(key, values, status, ms, reason=reason, start_s=start_s, order=order,
                                               live=outcome.live, started_with=outcome.started_with)

        try:
            result = await bracket(
                probe, finish, settings=s, best=best, key=key, best_now=lambda: self.best(exclude=key),
                must_meet=lambda rival: self._must_meet(values, rival),
                neighbour_pass=lambda skip: self._neighbour_pass(key, skip=skip),
                measurements=self.state.measurements, lost_beside=self._lost_beside,
                known=tuple(ms) if start_load is not None else ())
            if (s.confirm and result.status == DONE and self.score(result) is not None and result.at is not None
                    and (best is None
                         or (self.score(result) or 0.0) >= (1 - s.confirm_margin) * (self.score(best) or 0.0))):
                result = await confirm(probe, result, ms, s)
            return result
        except ConfigBudget:
            return finish(CUT_SHORT, "budget reached while measuring")
        except Fatal as exc:
            return finish(DIED, str(exc))

    def _must_meet(self, values: Mapping[str, SpaceValue], rival: ConfigResult) -> float:
        """The load a configuration with ``values`` must meet to stay in the running against
        ``rival``'s limit: that limit, or, where it is cheaper by ranking.TIE_RULE (it wins a
        tie), the lower edge of that limit's noise (ranking.tie_load): missing it there, it is
        beyond the noise below, so it can neither beat nor tie it."""
        assert rival.limit_load is not None
        if cost({**self.base.values, **values}) >= self._cost(rival):
            return rival.limit_load
        return tie_load(rival.limit_load, self.settings.tolerance, integer=self.settings.mode == "concurrency")

    # -- results ------------------------------------------------------------------------

    def result(self) -> TuneResult:
        st = self.state
        decided = self.decide()
        best, decision = decided if decided is not None else (None, None)
        best_flags = self._flags(best.values) if best is not None else None

        def row(c: ConfigResult) -> ConfigResult:
            # What its figure rests on, and, for the best and the rows tied with it, the decision.
            tie = "" if decision is None else (decision.tie_words() if c.key == decision.best
                                                else decision.rival_words(c.key))
            return dataclasses.replace(c, runs=len(self._runs(c)), tie=tie)

        configs = [row(c) for c in sorted(st.configs.values(), key=lambda c: (c.order == 0, c.order, c.key))]
        if best is not None:
            best = next(c for c in configs if c.key == best.key)

        gpus = {k: devices_needed({**self.base.values, **c.values}) for k, c in st.configs.items()}
        return TuneResult(
            id=st.id, status=st.status, mode=self.settings.mode, best=best, best_flags=best_flags,
            configs=tuple(configs), pareto=tuple(pareto_points(st.measurements, gpus)),
            elapsed_s=st.elapsed_s, budget_s=self.settings.budget_s, starts=st.starts, steps=st.steps,
            state_path=self.state_file, objective=self.settings.objective,
            measurements={k: tuple(ms) for k, ms in st.measurements.items()},
            running=tuple(self._live[i] for i in sorted(self._live)), decision=decision,
            time_split=self._split.to_dict(self.clock() - self._t0 if self._t0 else 0.0),
            time_words=self._split.words(self.clock() - self._t0 if self._t0 else 0.0),
            round_words=tuple(r.words("req/s" if self.settings.mode == "rate" else "concurrent") for r in self._split.rounds),
            estimate=self.estimate.to_dict() if self.estimate is not None else None,
        )

    def _set_live(self, measurer: Measurer, key: str, phase: str, load: float | None = None,
                  last: Measurement | None = None, *, notify: bool = False) -> None:
        """Record what ``measurer``'s slot does now (the Tune screen's running trials);
        ``notify``: tell ``on_update`` at once (a start or a step can take minutes)."""
        slot = self._slot_of(measurer)
        old = self._live.get(slot)
        same = old is not None and old.key == key
        self._live[slot] = RunningTrial(
            slot=slot, gpus=self._slot_gpus[slot] if slot < len(self._slot_gpus) else (), key=key, phase=phase,
            load=load, steps=(old.steps if same and old else 0) + (last is not None),
            last=last if last is not None else (old.last if same and old else None))
        if notify and self.on_update is not None:
            self.on_update(self.result())

    def _end_live(self, measurer: Measurer) -> None:
        self._live.pop(self._slot_of(measurer), None)

    def _slot_of(self, measurer: Measurer) -> int:
        return next((i for i, m in enumerate(self.measurers) if m is measurer), 0)


# The search's names, each defined in the module of its part (space, trial, state, report,
# measurer) and named here too: callers import them from engine.tune.search.
__all__ = [
    "CUT_SHORT", "DEFAULT_SPACE", "DIED", "DOMINATED", "DONE", "INVALID", "MODES", "NOT_TRIED", "NO_LOAD",
    "OBJECTIVES", "OBJECTIVE_UNITS", "SKIPPED", "START_FAILED", "TIE_RULE", "UNSTABLE", "BudgetExhausted",
    "ConfigResult", "Decision", "EarlyStop", "FileStore", "HistoryStore", "Measurement", "Measurer", "ParetoPoint",
    "RunningTrial", "SearchSpace", "ServerMeasurer", "StartOutcome", "StepPoint", "StepRule", "TuneError",
    "TuneResult", "TuneSettings", "TuneState", "TuneStore", "Tuner", "allowed_failures", "best_config",
    "config_score", "format_pareto", "format_table", "judge", "list_states", "load_state", "new_id",
    "objective_value", "pareto_points", "state_path", "step_series", "tune_dir", "violation_count",
]
