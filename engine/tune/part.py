"""A flag search run from the TUI: the Tune form, the search's state and its view.

A :class:`TunePart` is owned by an ``engine.session.Session``. It reads the Tune form
(:func:`parse_tune_form`), runs ``engine.tune.search.Tuner`` on the session's workload,
keeps the progress lines and the latest result, and builds the snapshot's
:class:`~engine.tune.view.TuneView`. What it needs of the session comes in explicitly: the
session's state when a tune starts (a :class:`TuneGround`) and a few callables.

Where the trials run is ``vtui tune``'s plan (engine.tune.slots): the form's GPUs (empty:
every GPU the session sees) cut into slots, at most ``parallel`` of them. One slot on the
GPUs the session sees is the session's own server, restarted with each configuration (as
the Tune screen always ran). Any other plan (several slots, or GPUs named on the form) runs
every trial on a server of its own, built as ``vtui tune`` builds them
(:func:`engine.tune.slots.slot_measurers`), and the session's server is stopped first: it
would hold a slot's GPUs and share its cores.

The form's Ray field (empty: no Ray) runs every trial as a Ray actor instead, built as
``vtui tune --ray`` builds them (:func:`engine.tune.ray.ray_measurers`), the session's server
stopped first as for several slots (the request's ``ray``; each running trial's view names
its actor in ``where``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from engine.errors import SessionError
from engine.events import CHANGED, Emit, Notice, TuneEnded, TuneTookFlags
from engine.flags import FlagError
from engine.runs.measure import local_tokenizer
from engine.telemetry.nvml import visible_gpus
from engine.telemetry.view import devices_view
from engine.tune.ray import RayMeasurer, RayUnavailable, ray_installed, ray_measurers
from engine.tune.search import (
    MODES,
    SearchSpace,
    TuneError,
    TuneResult,
    TuneSettings,
    step_series,
)
from engine.tune.setup import estimate_search, measurer_factory, new_tuner
from engine.tune.slots import SlotError, parse_gpus, search_slots, slot_measurers, too_wide, trial_needs
from engine.tune.view import TrialView, TuneRequest, TuneView, frontier_points, slo_label, space_lines
from loadgen.spec import SLO, SpecError

if TYPE_CHECKING:
    # For the annotations only.
    from engine.flags import FlagSet, Schema
    from engine.server.supervisor import Supervisor
    from engine.telemetry.sampler import TelemetrySnapshot
    from engine.tune.search import Measurer, RunningTrial
    from engine.tune.slots import Slot
    from loadgen.spec import ArrivalSpec, WorkloadSpec

# Progress lines kept for the Tune screen (the state file has every step).
TUNE_LINES = 200
TUNE_FIELDS = ("percentile", "ttft_ms", "tpot_ms", "e2el_ms", "budget_min", "space", "mode", "start_load", "gpus",
               "parallel", "ray")
TUNE_PERCENTILES = (99.0, 90.0)  # as `vtui tune --slo-METRIC-p99-ms / -p90-ms`
RAY_HINT = "local (start one here), auto (the cluster this machine belongs to) or HEAD:6379; empty: no Ray"
# What ray.init takes: "local" and "auto" (vtui's words, as `vtui tune --ray`), HOST:PORT, ray://HOST:PORT.
RAY_ADDRESS = re.compile(r"local|auto|(?:ray://)?[\w.\-\[\]:]+:\d+")


class TuneFormError(SessionError):
    """A Tune form field that does not read; ``field`` is its key in :data:`TUNE_FIELDS`."""

    def __init__(self, field: str, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.field = field


def check_ray(ray: str, gpus: str | None, parallel: int | None) -> None:
    """TuneFormError naming the field for a Ray address that cannot run: Ray not installed, an
    address that does not read, GPUs named beside it (the cluster grants them, as ``vtui tune``
    refuses ``--gpus`` with ``--ray``), a parallel below 1."""
    if not RAY_ADDRESS.fullmatch(ray):
        raise TuneFormError("ray", f"Ray {ray!r}: not local, auto or an address such as HEAD:6379", RAY_HINT)
    if gpus:
        raise TuneFormError("gpus", f"GPUs {gpus!r} name this machine's GPUs; with Ray the cluster grants them",
                            "empty the GPUs field (parallel caps the trials at once), or the Ray field")
    if parallel is not None and parallel < 1:
        raise TuneFormError("parallel", f"parallel {parallel}: must be at least 1",
                            "the most trials at once, e.g. 2; empty: one per GPU block of the cluster")
    if not ray_installed():
        raise TuneFormError("ray", "Ray is not installed here", "pip install 'vtui[ray]'")


def parse_tune_form(fields: Mapping[str, str], *, schema: Schema | None = None,
                    percentile: float = 99.0) -> TuneRequest:
    """A :class:`~engine.tune.view.TuneRequest` from the Tune form's text (keys: :data:`TUNE_FIELDS`).

    Raises TuneFormError naming the field (and the space line) that is wrong; an empty
    limit is not judged, but one limit at least is needed. ``percentile``: used when the
    form has no ``percentile`` field ("99" or "90", "p" optional). Empty ``gpus`` and
    ``parallel``: every GPU the session sees, one trial per slot. Whether the GPUs are
    visible and wide enough is :meth:`TunePart.run`'s to say (it knows the session's).
    ``ray`` (empty: no Ray): the request's ``ray``, checked by :func:`check_ray`; whether
    a cluster answers there is :meth:`TunePart.run`'s to say.
    """
    ptext = str(fields.get("percentile", "") or "").strip().lower().removeprefix("p")
    if ptext:
        try:
            percentile = float(ptext)
        except ValueError:
            percentile = -1.0
        if percentile not in TUNE_PERCENTILES:
            raise TuneFormError("percentile", f"SLO percentile {fields.get('percentile')!r}: use p99 or p90",
                                "the limits are judged at one percentile")

    def number(key: str, label: str, *, required: bool = False) -> float | None:
        text = str(fields.get(key, "") or "").strip()
        if not text:
            if required:
                raise TuneFormError(key, f"{label}: give a number", "e.g. 10")
            return None
        try:
            value = float(text)
        except ValueError:
            raise TuneFormError(key, f"{label}: {text!r} is not a number", "digits only, e.g. 500") from None
        if not value > 0 or value != value or value == float("inf"):
            raise TuneFormError(key, f"{label}: {text!r} must be a positive number", "e.g. 500")
        return value

    word = f"p{percentile:g}"
    limits = {k: number(k, f"{word} {k[:-3].upper()} limit (ms)") for k in ("ttft_ms", "tpot_ms", "e2el_ms")}
    if all(v is None for v in limits.values()):
        raise TuneFormError("ttft_ms", "no SLO limit given", "give a TTFT, TPOT or E2EL limit in ms (e.g. TTFT 500)")
    try:
        slo = SLO(percentile=percentile, **limits)
    except SpecError as exc:
        raise TuneFormError("ttft_ms", str(exc), "limits are positive numbers of milliseconds") from None
    budget_min = number("budget_min", "budget (minutes)", required=True)
    assert budget_min is not None
    mode = str(fields.get("mode", "rate") or "rate").strip()
    if mode not in MODES:
        raise TuneFormError("mode", f"mode {mode!r}: not one of {', '.join(MODES)}", "rate or concurrency")
    start_load = number("start_load", "start load")
    lines = [ln.strip() for ln in str(fields.get("space", "") or "").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise TuneFormError("space", "search space: no flag to search", "one line per flag, e.g. max-num-seqs=64,128,256")
    try:
        space = SearchSpace.parse(lines, schema)
    except TuneError as exc:
        raise TuneFormError("space", f"search space: {exc}",
                           "one line per flag: NAME=V1,V2,... e.g. max-num-seqs=64,128,256") from None
    gpus = str(fields.get("gpus", "") or "").strip()
    if gpus:
        try:
            parse_gpus(gpus, label="GPUs")
        except SlotError as exc:
            raise TuneFormError("gpus", str(exc), "GPU indices such as 0,1,2,3 or 0-3; empty: every GPU the "
                                                  "session sees") from None
    ptext = str(fields.get("parallel", "") or "").strip()
    parallel: int | None = None
    if ptext:
        try:
            parallel = int(ptext)
        except ValueError:
            raise TuneFormError("parallel", f"parallel {ptext!r}: not a whole number",
                                "the most trials at once, e.g. 2; empty: one per slot") from None
        if parallel < 1:
            raise TuneFormError("parallel", f"parallel {ptext!r}: must be at least 1",
                                "the most trials at once, e.g. 2; empty: one per slot")
    ray = str(fields.get("ray", "") or "").strip()
    if ray:
        check_ray(ray, gpus or None, parallel)
    return TuneRequest(slo=slo, space=space, budget_s=budget_min * 60.0, mode=mode, start_load=start_load,
                       gpus=gpus or None, parallel=parallel, ray=ray or None)


@dataclasses.dataclass(frozen=True)
class TuneGround:
    """What the session holds when a tune is asked for: what it starts from, and what may refuse it."""

    flags: FlagSet  # the edited flags: every configuration starts from them
    flag_errors: Mapping[str, str]  # flag -> why it is invalid
    workload: WorkloadSpec | None
    arrivals: ArrivalSpec | None
    loading: bool  # a load run or a sweep is going
    busy: str | None  # the server is starting, stopping, ... (the session's busy word)
    attached: bool  # the server was attached, not started here (never restarted by vtui)
    max_request_len: int | None
    schema: Schema
    gpus: tuple[int, ...]  # the GPUs the telemetry sees (empty before its first sample: NVML is asked)
    # Builds the measurer, called like engine.tune.search.ServerMeasurer (None: that one).
    measurer: Callable[..., Measurer] | None


class TunePart:
    """The session's flag search: the running task, its progress and its latest result."""

    def __init__(
        self,
        *,
        emit: Emit,
        server: Callable[[FlagSet], Supervisor],
        telemetry: Callable[[], TelemetrySnapshot | None],
        release: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """The session's side: ``emit`` reports to it (engine.events.SessionEvent: Changed, a
        Notice, TuneEnded when the search ends whatever the outcome, TuneTookFlags to put flags
        into its editor); ``server(base)`` gives the server the search restarts (the one
        started here, made with ``base`` when there is none); ``telemetry`` gives its latest
        telemetry sample (the running trials' GPUs); ``release`` stops its server before a
        search on servers of its own (and keeps the GPUs sampled)."""
        self._emit = emit
        self._server = server
        self._telemetry = telemetry
        self._release = release
        self._task: asyncio.Task[TuneResult] | None = None
        self._result: TuneResult | None = None  # the latest
        self._request: TuneRequest | None = None
        self._status = ""
        self._error: str | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=TUNE_LINES)
        self._t0 = 0.0  # monotonic start of this session's part of the search
        self._elapsed0 = 0.0
        self._total = 0
        self._stop_requested = False
        self._ray: tuple[RayMeasurer, ...] = ()  # the running search's Ray trials (their labels)
        # Joining the Ray cluster (before the search exists): the join's task, its request and start.
        self._joining: tuple[asyncio.Task[tuple[list[RayMeasurer], list[str]]], TuneRequest, float] | None = None

    def _changed(self) -> None:
        self._emit(CHANGED)

    def _notify(self, text: str) -> None:
        self._emit(Notice(text))

    @property
    def task(self) -> asyncio.Task[TuneResult] | None:
        """The running search's task, or None."""
        return self._task

    @property
    def active(self) -> bool:
        """True while a flag search runs (it owns the server until it ends), or joins its Ray
        cluster before it starts."""
        return self._joining is not None or (self._task is not None and not self._task.done())

    # ------------------------------------------------------------------ the form

    def form_defaults(self, slo: SLO | None) -> dict[str, str]:
        """The Tune form's starting text: ``slo``'s limits (else TTFT 500 ms and TPOT
        50 ms), 30 minutes, the default space, rate mode, every GPU the session sees, one
        trial per slot, no Ray."""
        limits: dict[str, float | None] = {"ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
        if slo is not None:
            limits = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2el_ms": slo.e2el_ms}
        if all(v is None for v in limits.values()):
            limits = {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2el_ms": None}
        out = {k: "" if v is None else f"{v:g}" for k, v in limits.items()}
        out.update(budget_min="30", space=space_lines(SearchSpace.default()), mode="rate", start_load="",
                   percentile=f"{self.percentile(slo):g}", gpus="", parallel="", ray="")
        return out

    @staticmethod
    def percentile(slo: SLO | None) -> float:
        """The percentile the SLO is judged at (``slo``'s, else 99)."""
        return float(slo.percentile or 99.0) if slo is not None else 99.0

    # ------------------------------------------------------------------ running

    def check_can_start(self, ground: TuneGround) -> WorkloadSpec:
        """Refuse a tune that cannot start now; returns the workload it runs."""
        if self.active:
            raise SessionError("a tune is already running", "stop it first (x on the Tune screen)")
        if ground.loading:
            raise SessionError("a load run is going: the tune restarts the server", "stop the run first (c)")
        if ground.busy:
            raise SessionError(f"the server is {ground.busy}", "wait for it, then start the tune")
        if ground.attached:
            raise SessionError(
                "this server was attached, not started by vtui: a tune restarts the server with each "
                "configuration, and vtui never restarts a server it did not start",
                "stop that server yourself and tune here (a server is started for the tune), or run `vtui tune`",
            )
        if ground.flag_errors:
            name, reason = next(iter(ground.flag_errors.items()))
            raise SessionError(f"--{name}: {reason}", "fix the flag: every configuration starts from these flags")
        if ground.workload is None:
            raise SessionError("no workload chosen", "load a preset first")
        return ground.workload

    def estimate(self, request: TuneRequest, ground: TuneGround) -> str:
        """What the search ``request`` asks for is expected to cost here, in words (engine.tune.setup.
        estimate_search, on the session's own server), and what to cut where it does not fit the
        budget. Raises SessionError for a form that could not start."""
        try:
            settings = dataclasses.replace(TuneSettings(), mode=request.mode, budget_s=request.budget_s,
                                           start_load=request.start_load)
            est = estimate_search(base=ground.flags, space=request.space, slo=request.slo, settings=settings,
                                  max_request_len=ground.max_request_len, schema=ground.schema,
                                  workload=ground.workload)
        except TuneError as exc:
            raise SessionError(str(exc), "check the Tune form") from None
        words = est.short_words(request.budget_s)
        if est.seconds > request.budget_s:
            widest = max(request.space.dims, key=lambda d: len(d[1]), default=None)
            if widest is not None and len(widest[1]) > 1:
                words += f": cut {widest[0]} ({len(widest[1])} values) or raise the budget"
        return words

    async def run(self, request: TuneRequest, ground: TuneGround, *,
                  settings: TuneSettings | None = None) -> TuneResult:
        """Search the flags (engine.tune.search.Tuner) from ``ground``; see ``Session.tune``."""
        workload = self.check_can_start(ground)
        try:
            settings = dataclasses.replace(settings or TuneSettings(), mode=request.mode, budget_s=request.budget_s,
                                           start_load=request.start_load)
        except TuneError as exc:
            raise SessionError(str(exc), "check the Tune form") from None
        base = ground.flags
        ray = request.ray
        slots = self.plan(request, ground) if ray is None else []
        # GPUs named on the form, several slots, or Ray: every trial on a server of its own.
        named = request.gpus is not None
        own_servers = len(slots) > 1 or named or ray is not None
        tokenizer = local_tokenizer(base.model)
        measurers: list[Measurer]
        ray_trials: list[RayMeasurer] = []
        ray_lines: list[str] = []
        if ray is not None:
            # As `vtui tune --ray`: each actor runs the measurer built by this factory on its node.
            inner = measurer_factory(workload, request.slo, mode=settings.mode, arrivals=ground.arrivals,
                                     tokenizer=tokenizer, factory=ground.measurer)
            joining = asyncio.ensure_future(self._ray_trials(ray, request, ground, inner))
            self._joining = (joining, request, time.monotonic())
            self._stop_requested = False
            self._changed()
            try:
                ray_trials, ray_lines = await joining
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not self._stop_requested or (current is not None and current.cancelling()):
                    raise  # the caller was cancelled (the app is closing): pass it on
                return self._stopped_joining(ray, request)
            finally:
                self._joining = None
                self._changed()
            measurers = list(ray_trials)
            slot_gpus: list[tuple[int, ...]] = []  # granted on the actors' nodes: not this session's GPUs
        elif not own_servers:
            # One slot on the GPUs the session sees: its own server, restarted with each configuration.
            supervisor = self._server(base)
            measurers = [measurer_factory(workload, request.slo, mode=settings.mode, arrivals=ground.arrivals,
                                          tokenizer=tokenizer, factory=ground.measurer)(supervisor=supervisor)]
            # The view shows every GPU the telemetry sees beside it (where the session's server runs).
            slot_gpus = [ground.gpus]
        else:
            # Servers of the search's own, one per slot, as `vtui tune` runs them.
            measurers = slot_measurers(slots, workload, request.slo, mode=settings.mode, arrivals=ground.arrivals,
                                       tokenizer=tokenizer, factory=ground.measurer)
            slot_gpus = [s.gpus for s in slots]
        try:
            tuner = new_tuner(measurers, base=base, space=request.space, slo=request.slo, settings=settings,
                              workload=workload, arrivals=ground.arrivals, slot_gpus=slot_gpus, say=self.say,
                              max_request_len=ground.max_request_len, schema=ground.schema, on_update=self.update)
        except TuneError as exc:
            raise SessionError(str(exc), "check the Tune form") from None
        if own_servers and self._release is not None:
            await self._release()  # the session's server would hold a slot's GPUs and share its cores
        self._request = request
        self._ray = tuple(ray_trials)
        self._lines.clear()
        self._status = "running"
        self._error = None
        self._stop_requested = False
        self._total = len(request.space.configs())
        self._elapsed0 = tuner.state.elapsed_s
        self._t0 = time.monotonic()
        self._result = tuner.result()
        self.say(f"tune {tuner.state.id}: {self._total} configurations, budget "
                 f"{settings.budget_s / 60:.1f} min, {slo_label(request.slo)}")
        if ray is not None:
            for line in ray_lines:
                self.say(line)
            self.say(f"{len(ray_trials)} trial{'s' if len(ray_trials) > 1 else ''} at once, each a Ray actor "
                     f"({ray}) with a server of its own; the session's server is stopped (l loads the winner, "
                     "a starts it)")
        elif own_servers:
            self.say(f"{len(slots)} trial{'s' if len(slots) > 1 else ''} at once, each on a server of its own: "
                     + "; ".join(s.label() for s in slots) + "; the session's server is stopped "
                     "(l loads the winner, a starts it)")
        self._notify(f"tuning ({tuner.state.id})")
        task = asyncio.ensure_future(tuner.run())
        self._task = task
        self._changed()
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            self._status = "interrupted"
            result = self._result = tuner.result()
            if not self._stop_requested or (current is not None and current.cancelling()):
                raise  # the caller was cancelled (the app is closing): pass it on
        except Exception as exc:  # noqa: BLE001 - shown on the Tune screen, the state file keeps the steps
            self._status = "failed"
            self._error = f"{type(exc).__name__}: {exc}"
            self._result = tuner.result()
            self._notify(f"tune failed: {exc}")
            raise SessionError(f"the tune failed: {exc}", f"what it measured is saved: vtui tune --resume "
                                                           f"{tuner.state.id}") from exc
        finally:
            self._task = None
            self._after()
        self._result = result
        self._status = result.status
        self._notify(self._notice(result))
        self._changed()
        return result

    async def _ray_trials(self, ray: str, request: TuneRequest, ground: TuneGround,
                          factory: Callable[[], Measurer]) -> tuple[list[RayMeasurer], list[str]]:
        """The search's Ray actors (engine.tune.ray.ray_measurers, as ``vtui tune --ray`` builds
        them), the cluster joined in a thread (ray.init takes seconds: the screen stays live),
        and the line that says what the cluster gave. TuneFormError naming the field when the
        request cannot run on Ray, or no cluster answers."""
        check_ray(ray, request.gpus, request.parallel)
        lines: list[str] = []
        try:
            trials = await asyncio.to_thread(ray_measurers, ray, trial_needs(ground.flags, request.space.configs()),
                                             factory, parallel=request.parallel, say=lines.append)
        except RayUnavailable as exc:
            hint = ("start one with `ray start --head`, or type local (a session joins one cluster)" if ray_installed()
                    else "pip install 'vtui[ray]'")
            raise TuneFormError("ray", str(exc), hint) from None
        for trial in trials:
            trial.say = self.say  # an actor lost mid-search: said on the Tune screen
        return trials, lines

    def _stopped_joining(self, ray: str, request: TuneRequest) -> TuneResult:
        """The search stopped (x) while it joined the Ray cluster at ``ray``: nothing was
        measured nor saved (no search existed yet) and nothing was stopped (the session's
        server is stopped only once the cluster gave its actors), so it ends as "stopped",
        its view saying so; ray.init goes on in its thread until it joins or fails (a thread
        cannot be stopped), and engine.tune.ray.connect refuses a second join meanwhile."""
        joining = self._joining
        elapsed = time.monotonic() - joining[2] if joining is not None else 0.0
        result = TuneResult(id="", status="stopped", mode=request.mode, best=None, best_flags=None, configs=(),
                            pareto=(), elapsed_s=elapsed, budget_s=request.budget_s, starts=0, steps=0,
                            state_path=None)
        self._request = request
        self._result = result
        self._status = "stopped"
        self._error = None
        self._ray = ()
        self._lines.clear()
        self._total = len(request.space.configs())
        self._elapsed0, self._t0 = elapsed, 0.0
        self.say(f"stopped while joining the Ray cluster at {ray}: nothing was measured, and the session's "
                 "server was not stopped")
        self._emit(TuneEnded())
        self._notify(f"tune stopped while joining the Ray cluster at {ray}")
        self._changed()
        return result

    def plan(self, request: TuneRequest, ground: TuneGround) -> list[Slot]:
        """The search's slots (engine.tune.slots.search_slots, as ``vtui tune`` plans them): the
        request's GPUs (default every GPU the session's telemetry sees, else NVML's) cut into
        slots of the most GPUs a configuration needs, at most ``parallel``. TuneFormError naming
        the field for GPUs that are not visible, a parallel below 1, or a configuration that
        needs more GPUs than there are (``vtui tune`` lets the search mark it invalid; the form
        says so before anything stops or starts)."""
        gpus, parallel = request.gpus, request.parallel
        seen = tuple(ground.gpus) or visible_gpus()
        configs = request.space.configs()
        try:
            slots = search_slots(gpus, trial_needs(ground.flags, configs), parallel=parallel, visible=seen,
                                 label="GPUs")
        except SlotError as exc:
            field = "parallel" if str(exc).startswith("--parallel") else "gpus"
            hint = ("the most trials at once, e.g. 2; empty: one per slot" if field == "parallel" else
                    f"GPUs the session sees: {','.join(map(str, seen)) or 'none'}; empty: all of them")
            raise TuneFormError(field, str(exc).replace("--parallel", "parallel"), hint) from None
        given = parse_gpus(gpus) if gpus else seen
        wide = too_wide(ground.flags, configs, len(given)) if given else []
        if wide:
            values, need = wide[0]
            more = f" (and {len(wide) - 1} more)" if len(wide) > 1 else ""
            where = f"the GPUs field gives {len(given)}" if gpus else f"the session sees {len(given)}"
            raise TuneFormError(
                "gpus" if gpus else "space",
                f"{request.space.key(values)} needs {need} GPUs (tensor x pipeline x data parallel), and {where} "
                f"({','.join(map(str, given))}){more}",
                "name more GPUs, or take the values that need more out of the space" if gpus
                else "take the values that need more GPUs out of the space")
        return slots

    def _after(self) -> None:
        """The server runs the last configuration tried (or nothing): the session says so."""
        self._emit(TuneEnded())
        self._elapsed0 += time.monotonic() - self._t0
        self._t0 = 0.0
        self._changed()

    def _notice(self, result: TuneResult) -> str:
        if result.best is None:
            return f"tune {result.id}: {result.status}; {result.outcome()}"
        return (f"tune {result.id}: {result.status}; {result.outcome()} "
                f"({result.best.goodput or 0:.3g} req/s); l on the Tune screen loads it into the editor")

    def say(self, line: str) -> None:
        """A progress line for the Tune screen."""
        self._lines.append(line)
        self._changed()

    def update(self, result: TuneResult) -> None:
        """The search's result after a step."""
        self._result = result
        self._changed()

    def stop(self) -> bool:
        """Cancel the running search; it is saved as "interrupted" (resumable). False when
        none runs."""
        # Still joining the Ray cluster: the search ends before it starts.
        task = self._joining[0] if self._joining is not None else self._task
        if task is None or task.done():
            return False
        self._stop_requested = True
        task.cancel()
        self._notify("stopping the tune")
        self._changed()
        return True

    # ------------------------------------------------------------------ the winner

    def load_flags(self, flags: FlagSet) -> list[tuple[str, object, object]]:
        """Put the search's winning values over ``flags`` (the editor's) and hand them to the
        session's editor; returns (flag, old, new) for what changed."""
        if self.active:
            raise SessionError("the tune is still running", "wait for it to end, or stop it (x)")
        result = self._result
        best = result.best if result is not None else None
        if best is None:
            raise SessionError("no tuned flags to load", "run a tune that finds a configuration meeting the SLO")
        old = flags
        try:
            for name, value in best.values.items():
                flags = flags.set(name, value)
        except FlagError as exc:
            raise SessionError(str(exc), "set the flag by hand in the editor") from None
        self._changed()
        self._emit(TuneTookFlags(flags))
        changes = [(str(n), old.get(n), flags.get(n)) for n in best.values if old.get(n) != flags.get(n)]
        self._notify(f"loaded the tuned flags ({best.key}) into the editor: a applies (restarts the server)")
        return changes

    def export(self, kind: str) -> str:
        """An export of the search's winner: "docker", "serve", or "results" (the whole
        result as JSON: every configuration, the Pareto points)."""
        result = self._result
        if result is None:
            raise SessionError("no tune yet", "start one on the Tune screen (u)")
        if kind == "results":
            return json.dumps(result.to_json(), indent=2, default=str)
        if kind not in ("docker", "serve"):
            raise SessionError(f"a tune has no {kind} export", "docker, serve or results")
        if result.best_flags is None:
            raise SessionError("no configuration met the SLO: nothing to export", "loosen the SLO or the space")
        return str(result.best_flags.to_docker_line() if kind == "docker" else result.best_flags.to_serve_line())

    # ------------------------------------------------------------------ view

    def view(self) -> TuneView | None:
        """The Tune screen's view of the search, or None before the first tune."""
        if self._joining is not None:
            return self._joining_view(*self._joining[1:])
        result = self._result
        if result is None:
            return None
        request = self._request
        running = self.active
        elapsed = self._elapsed0 + (time.monotonic() - self._t0 if running and self._t0 else 0.0)
        best = result.best
        flags = result.best_flags
        status = "running" if running else (self._status or result.status)
        return TuneView(
            id=result.id,
            status=status,
            mode=result.mode,
            slo_label=slo_label(request.slo) if request is not None else "",
            elapsed_s=elapsed if running else max(elapsed, float(result.elapsed_s)),
            budget_s=float(result.budget_s),
            starts=int(result.starts),
            steps=int(result.steps),
            configs_total=self._total,
            lines=tuple(self._lines),
            rows=tuple(result.configs),
            best_key=best.key if best is not None else None,
            best_goodput=best.goodput if best is not None else None,
            best_limit=best.limit_load if best is not None else None,
            best_flags=flags,
            best_serve_line=str(flags.to_serve_line()) if flags is not None else None,
            best_docker_line=str(flags.to_docker_line(multiline=False)) if flags is not None else None,
            pareto=frontier_points(result.pareto),
            step_series=step_series(result.measurements),
            state_path=str(result.state_path) if result.state_path else None,
            resume_command=f"vtui tune --resume {result.id}",
            error=self._error,
            running=self._trial_views(result.running) if running else (),
        )

    def _joining_view(self, request: TuneRequest, t0: float) -> TuneView:
        """A search joining its Ray cluster: status "joining", no id yet (the search is made
        once the cluster gives its actors), x stops it."""
        return TuneView(id="", status="joining", mode=request.mode, slo_label=slo_label(request.slo),
                        elapsed_s=time.monotonic() - t0, budget_s=request.budget_s, starts=0, steps=0,
                        configs_total=len(request.space.configs()),
                        lines=(f"joining the Ray cluster at {request.ray} (x stops)",), rows=())

    def _trial_views(self, trials: tuple[RunningTrial, ...]) -> tuple[TrialView, ...]:
        if self._ray:
            # On the cluster's nodes: each row says its actor, not this session's GPUs.
            return tuple(TrialView(t, (), where=self._ray[t.slot].where() if t.slot < len(self._ray) else "Ray actor")
                         for t in trials)
        devices, _ = devices_view(self._telemetry())
        out: list[TrialView] = []
        for t in trials:
            # Unknown GPUs (a single slot started before the first telemetry sample): every row.
            mine = tuple(d for d in devices if d.index is not None and d.index in t.gpus) if t.gpus else devices
            out.append(TrialView(t, mine))
        return tuple(out)
