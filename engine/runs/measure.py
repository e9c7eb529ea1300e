"""One measured run, the same on every path: the TUI's `r`, `vtui bench`, `vtui sweep`, a tune
step and the advisor's relaunch all call :func:`measure`, and
:func:`engine.server.ready.ensure_server` is the one policy that puts a server in the wanted flags.

:func:`measure`, in order:

1. opens the run's recording in the history (optional: trouble there never stops a run);
2. records GPU/host telemetry and the server's ``/metrics`` for the run, unless the caller
   records them already (the TUI's session passes its own store);
3. empties the server's prefix cache when vtui started the server (:func:`reset_prefix_cache`:
   a repeat then measures the same work as the first; the summary says whether it was reset);
   runs the load (``loadgen.LoadRun``: the measuring loop in its own process; the warm-up
   first, not measured, counted apart) and takes the server's ``/metrics`` exactly when the
   measured part starts and again when it ends, so the server's own figures cover the same
   requests as the client's, warm-up left out;
4. watches the server: the supervisor's death event (within 2 s) or a refused connection
   stops the run at once, and what completed is kept;
5. decides the status (:mod:`engine.runs.status`), cross-checks the client against the server
   (:mod:`engine.runs.crosscheck`), and stores one record whose summary is what every screen shows,
   with any flag that changed while it measured (:mod:`engine.runs.flagchange`: noted by the
   caller's handle, or seen in the server's live limits read at the run's start and end).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, SupportsFloat, SupportsIndex

import httpx

from engine.errors import EngineDied, StartupError
from engine.flags import FlagSet, recordable_values
from engine.runs.crosscheck import cross_check
from engine.runs.flagchange import ChangeLog, FlagChange, read_limits, seen_changes, with_flag_changes
from engine.runs.history import History, Recording, RunInfo, to_jsonable
from engine.runs.status import RunStatus, decide
from engine.runs.summary import STREAM_KEYS, EnergyFigures, RunSummary, ServerWindow, SloVerdict, StreamShape, TelemetryFigures
from engine.server.launch import server_api_key
from engine.server.speedoflight import for_run
from engine.server.supervisor import ServerState
from engine.telemetry.host import BoxLedger, BoxShare
from engine.telemetry.metrics import MetricsScraper
from engine.values import JSONValue
from loadgen import DatasetError, LoadRun, ServerError
from loadgen.spec import judge
from loadgen.stats import DEFAULT_PERCENTILES
from loadgen.tokens import TokenizerError

if TYPE_CHECKING:
    from engine.server.logparse import StartupFacts
    from engine.server.supervisor import FlagsLike, ServerEvent
    from engine.telemetry.metrics import ServerSample
    from engine.telemetry.sampler import TelemetrySnapshot
    from engine.telemetry.store import SeriesStore
    from engine.telemetry.summary import EnergySummary, TelemetrySummary
    from loadgen import RunResult
    from loadgen.records import RequestResult
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec
    from loadgen.stats import StatsWindow

SERVER_LOG_LINES = 10

# A run's stored document is a RunSummary (engine.runs.summary), built here from typed parts. What
# is only written out, or read here value by value, is `object`.


class MeasuredServer(Protocol):
    """What :func:`measure` needs of a server vtui started: ``engine.server.supervisor.Supervisor``
    (mypy checks that it is one), or a test's stand-in (tests/standins.py)."""

    @property
    def base_url(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def flags(self) -> FlagsLike: ...

    @property
    def pid(self) -> int | None: ...  # the server's root process (its telemetry's process tree)

    @property
    def facts(self) -> StartupFacts | None: ...  # what vLLM said at start

    @property
    def tail(self) -> Iterable[str]: ...  # its last log lines

    @property
    def state(self) -> ServerState: ...

    def subscribe(self, callback: Callable[[ServerEvent], object]) -> Callable[[], None]:
        """Call ``callback`` for every ServerEvent; returns the unsubscribe function."""
        ...


@dataclass(frozen=True)
class Target:
    """The server a run measures.

    ``supervisor``: the ``engine.server.supervisor.Supervisor`` (a :class:`MeasuredServer`) when
    vtui started the server (its death stops the run; its last log lines go into the record). ``flags``: the values to
    record, secrets as references (``engine.flags.recordable_values``). ``api_key`` is sent
    with each request and stored nowhere.
    """

    base_url: str
    model: str | None = None  # the served name; None asks the server
    tokenizer: str | None = None  # a local tokenizer folder; None uses the server's
    api_key: str | None = field(default=None, repr=False)
    supervisor: MeasuredServer | None = None
    root_pid: int | None = None
    flags: Mapping[str, object] = field(default_factory=dict)
    model_label: str | None = None  # what the history calls the model
    vllm_version: str | None = None
    # A server vtui started elsewhere (vtui serve) and measured by URL: the values it was started
    # with, read from its live limits, where ``flags`` holds the live ones
    started_flags: Mapping[str, object] | None = None

    @classmethod
    def of(cls, sup: MeasuredServer, *, api_key: str | None = None, tokenizer: str | os.PathLike[str] | None = None) -> Target:
        """The server a supervisor runs: its URL, served name, process tree and flags.
        ``api_key``: None takes the server's own (``launch.server_api_key``: its --api-key, else
        VLLM_API_KEY in its environment)."""
        flags = sup.flags
        if api_key is None:
            api_key = server_api_key(flags, getattr(sup, "extra_env", None) or {})
        return cls(
            base_url=sup.base_url, model=sup.model, api_key=api_key, supervisor=sup,
            tokenizer=str(tokenizer) if tokenizer else local_tokenizer(flags.model),
            root_pid=sup.pid, flags=recordable_values(flags), model_label=str(flags.model),
            vllm_version=sup.facts.vllm_version if sup.facts is not None else None)


def local_tokenizer(model: object) -> str | None:
    """The tokenizer a run's client counts with: the model's own folder when the model is one
    (a local folder holding config.json), else None (a Hugging Face id: the server's count)."""
    from pathlib import Path

    text = str(model or "")
    if not text:
        return None
    try:
        folder = Path(text).expanduser()
        return str(folder) if (folder / "config.json").is_file() else None
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunPlan:
    """What to run and how to file it."""

    name: str
    workload: WorkloadSpec
    arrivals: ArrivalSpec
    slo: SLO | None = None
    preset: str | None = None
    tags: tuple[str, ...] = ()
    read_timeout_s: float = 600.0
    requests_file: str | None = None
    transport: str = "fast"
    check_max_len: bool = True
    percentiles: tuple[float, ...] | None = None
    meta: Mapping[str, object] = field(default_factory=dict)  # extra workload facts to store (scaled, ...)
    peak_bw_tbs: float | None = None  # a GPU's peaks where engine.server.speedoflight's table lacks it
    peak_tflops: float | None = None
    client_cpus: tuple[int, ...] | None = None  # host cores to pin the load generator to (None: not pinned)


class RunHandle:
    """The caller's hold on a run in progress: :meth:`cancel` from any thread (a key, SIGINT,
    a tune step's early stop); ``recording`` takes samples the caller records itself."""

    def __init__(self) -> None:
        self.recording: Recording | None = None
        self.cancelled = False
        self.reason: str | None = None
        self.loadrun: LoadRun | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        # Flags changed live while the run goes (the session notes its own applies); set
        # by measure when the run begins (wall clock), so a change is stored seconds into the run
        self.changes = ChangeLog()
        self.started: float | None = None

    def note_change(self, flag: str, old: object, new: object) -> None:
        """A flag changed on the measured server now (from any thread): stored with the run."""
        self.changes.note(flag, old, new)

    def flag_changes(self) -> tuple[FlagChange, ...]:
        """The changes noted so far, seconds into the run."""
        return self.changes.since(self.started)

    def _attach(self, lr: LoadRun) -> None:
        with self._lock:
            self.loadrun, self._loop = lr, asyncio.get_running_loop()
            cancel_now = self.cancelled
        if cancel_now:
            lr.cancel()

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop sending; requests in flight are cancelled, what completed is kept."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled, self.reason = True, reason
            lr, loop = self.loadrun, self._loop
        if lr is None or loop is None:
            return
        try:
            if loop is asyncio.get_running_loop():
                lr.cancel()
                return
        except RuntimeError:
            pass  # called from a thread without a loop
        with contextlib.suppress(RuntimeError):  # the run's loop has just closed: it ended anyway
            loop.call_soon_threadsafe(lr.cancel)


@dataclass(frozen=True)
class MeasuredRun:
    """A run as stored: ``summary`` is the record every screen and file shows."""

    name: str
    status: RunStatus
    started: float
    ended: float
    summary: RunSummary  # what the history stores (to_json()) and every screen reads
    result: RunResult | None = None
    error: str | None = None
    hint: str | None = None
    info: RunInfo | None = None  # the stored row (id -1 when the history was not written)
    history_error: str | None = None
    server_log: tuple[str, ...] = ()
    store: SeriesStore | None = field(default=None, repr=False)  # the telemetry it recorded itself

    @property
    def history_id(self) -> int | None:
        return self.info.id if self.info is not None and self.info.id >= 0 else None

    @property
    def load(self) -> Mapping[str, object]:
        """The load figures as stored (vllm bench serve's keys); empty when the run measured none."""
        return self.summary.load_json()


def speed_of_light(target: Target, plan: RunPlan, telemetry: TelemetrySummary,
                   load: Mapping[str, object]) -> dict[str, object]:
    """The run against its GPU's limits (engine.server.speedoflight), or ``{"reason": ...}``.
    ``telemetry``: the run's telemetry over its window (the first GPU with a name, the mean
    running requests)."""
    name = next((g.name for g in telemetry.gpus if g.name), None)
    sol = for_run(target.model_label or target.model, target.flags, name, load,
                  mean_running=telemetry.mean_running, peak_bw_tbs=plan.peak_bw_tbs, peak_tflops=plan.peak_tflops)
    return {"reason": sol} if isinstance(sol, str) else {**sol.to_dict(), "line": sol.line(), "reason": None}


def _count(value: object) -> float:
    """``float(value or 0)`` for a figure of vllm bench serve's keys (a JSON number)."""
    if not value:
        return 0.0
    if isinstance(value, (str, bytes, SupportsFloat, SupportsIndex)):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


def _seconds(value: object) -> float | None:
    """A time the load run wrote into its result's extra keys (a number), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def energy_figures(e: EnergySummary | None, load: Mapping[str, object]) -> dict[str, object]:
    """The run's energy as every screen and file shows it: joules over the window, per
    output token and per completed request, mean and idle power (see EnergySummary)."""
    if e is None or e.joules is None:
        return {"joules": None, "reason": e.reason if e is not None else "no telemetry"}
    return {
        "joules": e.joules,
        "j_per_token": e.per(_count(load.get("total_output_tokens"))),
        "j_per_request": e.per(_count(load.get("completed"))),
        "mean_power_w": e.mean_power_w,
        "idle_power_w": e.idle_power_w,
        "estimated": e.estimated,
        "reason": None,
    }


def _server_sample_dict(sample: ServerSample) -> dict[str, object]:
    """A ServerSample without its raw histograms (large; the summary keeps their deltas)."""
    return {f.name: to_jsonable(getattr(sample, f.name)) for f in dataclasses.fields(sample)
            if f.name not in ("histograms", "cache_config")}


def server_window(first: ServerSample, last: ServerSample) -> dict[str, object]:
    """The server's own figures between two scrapes: histogram and counter deltas."""
    # here, not at the top: engine.telemetry.store and .summary import numpy, kept off `import engine.runs.measure`
    from engine.telemetry.store import SeriesStore
    from engine.telemetry.summary import summarize

    store = SeriesStore(capacity=4)
    store.add_server(first)
    store.add_server(last)
    d = summarize(store, first.t, last.t).to_dict()
    keep = ("server_ttft", "server_itl", "server_e2e", "prompt_tokens", "generation_tokens",
            "prefix_hit_rate", "preemptions")
    return ({k: d.get(k) for k in keep if k in d} | {"t0": first.t, "t1": last.t}
            | {"server_queue": d.get("server_queue")})


PREFIX_RESET_KEY = "prefix_cache_reset"
"""The run summary's key (kept in ``RunSummary.extra``) saying whether the prefix cache was reset."""
BOX_SHARE_KEY = "box_cpu"
STARTED_FLAGS_KEY = "started_flags"
"""Where the server ran flags set live: the values it was started with, beside the
run's own flags (the live ones, which export, compare and names read)."""
"""The run summary's key (kept in ``RunSummary.extra``) of the run's BoxShare: its window's cores, ours, the rest's, idle."""


@dataclass(frozen=True)
class PrefixReset:
    """Whether the server's prefix cache was emptied before the run's load (warm-up included),
    and why not when it was not."""

    reset: bool
    reason: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {"reset": self.reset, "reason": self.reason}

    @classmethod
    def of(cls, summary: RunSummary) -> PrefixReset | None:
        """What a stored summary says (None: a run stored before vtui reset the cache)."""
        d = summary.extra.get(PREFIX_RESET_KEY)
        if not isinstance(d, dict) or not isinstance(d.get("reset"), bool):
            return None
        reason = d.get("reason")
        return cls(bool(d["reset"]), reason if isinstance(reason, str) else None)


def box_share_of(summary: RunSummary) -> BoxShare | None:
    """Who had the box's cores over the run's window, as stored (None: an older run, or one
    measured too briefly to say); a stored part that does not read is None too."""
    d = summary.extra.get(BOX_SHARE_KEY)
    if not isinstance(d, Mapping):
        return None
    try:
        return BoxShare.from_json(d, "the run's box share")
    except (TypeError, ValueError):
        return None


def box_bound_why(run: MeasuredRun) -> str:
    """Why a run is box-bound, in words ("" when it is not): other processes crowded the box
    (BoxShare.crowded), the client's loop was held up (loadgen.run's client_delay_ms), or both."""
    if run.status is not RunStatus.BOX_BOUND:
        return ""
    why = []
    share = box_share_of(run.summary)
    if share is not None and share.crowded:
        why.append(f"other processes took {share.other_cores:.2f} of {share.cpus} cores")
    stream = run.summary.stream
    if stream is not None and stream.box_bound:
        why.append(f"the client's loop was held up, about {stream.client_delay_ms or 0:.0f} ms on each TTFT")
    return "; ".join(why)


async def reset_prefix_cache(target: Target, *, tries: int = 10, wait_s: float = 0.2) -> PrefixReset:
    """Empty the prefix cache of a server vtui started, through vtui's guarded door
    (``engine.server.livelimits.reset_prefix_cache``), so that a run repeated on the same server is
    served from the same (empty) cache as the first and not from what the first left. Where the
    server has no door, vLLM's own dev route (``/reset_prefix_cache``, open only where the user set
    ``VLLM_SERVER_DEV_MODE=1`` themselves) is tried. A server vtui did not start is left alone: its
    cache may be serving others. vLLM does not reset while blocks are held (requests still
    running): tried ``tries`` times ``wait_s`` apart. Never raises: a failure is the reason."""
    from engine.server.livelimits import LiveUnavailable
    from engine.server.livelimits import reset_prefix_cache as reset_through_door

    if target.supervisor is None:
        return PrefixReset(False, "a server vtui did not start: its prefix cache is left as it is "
                                  "(a repeated prompt may be served from it)")
    for _ in range(max(1, tries)):
        try:
            if await reset_through_door(target.base_url, target.api_key):
                return PrefixReset(True)
        except LiveUnavailable as exc:
            return await _reset_through_dev_route(target, str(exc))
        await asyncio.sleep(wait_s)
    return PrefixReset(False, f"vLLM kept declining the reset for {tries * wait_s:.0f} s "
                              "(blocks still held by running requests)")


async def _reset_through_dev_route(target: Target, why_no_door: str) -> PrefixReset:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            response = await client.post(target.base_url.rstrip("/") + "/reset_prefix_cache", headers=headers)
    except httpx.HTTPError as exc:
        return PrefixReset(False, f"{why_no_door}; /reset_prefix_cache failed: {exc or type(exc).__name__}")
    if response.status_code != 200:
        return PrefixReset(False, f"{why_no_door}; and vLLM's own /reset_prefix_cache answered HTTP "
                                  f"{response.status_code} (it is open only with VLLM_SERVER_DEV_MODE=1)")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("success") is False:
        return PrefixReset(False, "vLLM declined the reset (blocks held by running requests)")
    return PrefixReset(True)


# The requests a run keeps in memory while the history stores each as it completes (engine.runs
# .live keeps as many of a finished run that was not stored, for its trace).
KEPT_WHEN_STORED = 2_000


async def measure(
    target: Target,
    plan: RunPlan,
    *,
    history: History | None = None,
    store: SeriesStore | None = None,
    handle: RunHandle | None = None,
    on_window: Callable[[StatsWindow], None] | None = None,
    on_request: Callable[[RequestResult], None] | None = None,
    isolate: bool = True,
) -> MeasuredRun:
    """Run ``plan`` against ``target`` and store it (see the module's text).

    ``store``: the caller's telemetry store, already fed (the TUI session's); without it the
    run records its own. Raises nothing for the run's own failures (a refused load, a dead
    server): they come back as the status with the error and, when ours, the server's last
    log lines. ``asyncio.CancelledError`` and ``KeyboardInterrupt`` store the run as cancelled
    and propagate.
    """
    # here, not at the top: engine.telemetry.recorder and .summary import numpy, kept off `import engine.runs.measure`
    from engine.telemetry.recorder import TelemetryRecorder
    from engine.telemetry.summary import summarize

    handle = handle or RunHandle()
    # The seed this run uses, fixed before anything is stored, so the record can repeat it.
    plan = dataclasses.replace(plan, workload=plan.workload.with_run_seed())
    rec = Recording(history, plan.name, preset=plan.preset, flags=dict(target.flags),
                    model=target.model_label or target.model, vllm_version=target.vllm_version,
                    workload={"workload": plan.workload.to_dict(), "arrivals": plan.arrivals.to_dict(),
                              "slo": plan.slo.to_dict() if plan.slo else None, **plan.meta},
                    tags=plan.tags)
    handle.recording = rec
    gpus: dict[int, str | None] = {}

    def on_snapshot(snap: TelemetrySnapshot) -> None:
        for g in snap.gpus:
            gpus.setdefault(g.index, g.name)
        rec.add_sample("telemetry", snap.t, snap)

    recorder = None
    if store is None:
        recorder = TelemetryRecorder(
            target.base_url, root_pid=target.root_pid, on_snapshot=on_snapshot,
            on_server=lambda s: rec.add_sample("server", s.t, _server_sample_dict(s)))
        store = recorder.store
    scraper = MetricsScraper(target.base_url)
    marks: list[ServerSample] = []

    # Who had the box's cores over the measured window (BoxShare): our trees against the rest.
    ledger = BoxLedger((os.getpid(),) + ((target.root_pid,) if target.root_pid else ()),
                       server_counted=target.root_pid is not None)

    async def on_measured() -> None:
        ledger.mark()
        marks.append(await scraper.scrape())  # the server's baseline: warm-up done, nothing in flight

    died: list[str] = []
    sup = target.supervisor

    def on_server_event(event: ServerEvent) -> None:
        if event.kind == "state" and event.state is ServerState.DEAD:
            err = event.error
            line = err.vllm_line if isinstance(err, (StartupError, EngineDied)) else ""
            died.append(str(line or err or "the server process ended"))
            handle.cancel("server-died")

    unsubscribe = sup.subscribe(on_server_event) if sup is not None else None
    lr = LoadRun(target.base_url, target.model, plan.workload, plan.arrivals, plan.slo, target.api_key,
                 tokenizer=target.tokenizer, requests_file=plan.requests_file,
                 read_timeout_s=plan.read_timeout_s, transport=plan.transport,
                 check_max_len=plan.check_max_len, isolate=isolate, cpus=plan.client_cpus,
                 percentiles=plan.percentiles or DEFAULT_PERCENTILES,
                 # Written to the history as they complete: the run need not also hold them (up to
                 # 50,000 records, ~65 MB at 150 req/s for 10 min); a bounded part in case a write fails.
                 keep_requests=KEPT_WHEN_STORED if rec.recorder is not None else 50_000)
    handle._attach(lr)

    def window(w: StatsWindow) -> None:
        rec.add_window(w)
        if on_window is not None:
            on_window(w)

    def request(r: RequestResult) -> None:
        rec.add_request(r)
        if on_request is not None:
            on_request(r)

    t0 = time.time()
    handle.started = t0
    # the server's live limits at the run's start and end (None: it has none, or not read)
    start_limits: dict[str, JSONValue] | None = None
    end_limits: dict[str, JSONValue] | None = None
    result: RunResult | None = None
    prefix: PrefixReset | None = None
    box_share: BoxShare | None = None
    error: str | None = None
    hint: str | None = None
    try:
        if recorder is not None:
            await recorder.start()
        prefix = await reset_prefix_cache(target)
        # A flag changed by anyone (vtui set from another terminal) shows as limits that moved
        start_limits = await read_limits(target.base_url, target.api_key)
        try:
            result = await lr.run(on_window=window, on_request=request, on_measured=on_measured)
            box_share = ledger.share()
        except ServerError as exc:
            error, hint = str(exc), exc.hint or None
        except (DatasetError, TokenizerError) as exc:
            error = str(exc)
        if result is not None and marks and not died and not result.server_gone:
            marks.append(await scraper.scrape())
        if start_limits is not None and not died and not (result is not None and result.server_gone):
            end_limits = await read_limits(target.base_url, target.api_key)
    except BaseException:
        lr.cancel()
        rec.finish(history, RunStatus.CANCELLED, RunSummary(error="interrupted"))
        raise
    finally:
        if unsubscribe is not None:
            unsubscribe()
        if recorder is not None:
            with contextlib.suppress(Exception):
                await recorder.stop()
        with contextlib.suppress(Exception):
            await scraper.aclose()
    t1 = time.time()

    server_died = bool(died) or handle.reason == "server-died" or bool(result is not None and result.server_gone)
    if server_died and not died and sup is not None:
        # A refused connection may be seen before the supervisor's own check: give it its 2 s.
        for _ in range(20):
            if sup.state is ServerState.DEAD:
                break
            await asyncio.sleep(0.1)
    server_log = tuple(list(sup.tail)[-SERVER_LOG_LINES:]) if server_died and sup is not None else ()
    # The run's document (engine.runs.summary): its parts where the run measured them.
    measured = RunSummary()
    slo_met: bool | None = None
    completed = 0
    if result is not None:
        load = result.summary.to_dict()
        completed = result.summary.completed
        t_start = _seconds(result.extra.get("t_start")) or t0
        t_end = t_start + result.summary.duration
        # The GPUs' idle draw: before this run's warm-up (prompt building, a quiet server).
        warmup_s = _seconds(result.extra.get("warmup_s")) or 0.0
        warm_start = t_start - warmup_s - 0.5
        telemetry: dict[str, object] | None = None
        energy: EnergyFigures | None = None
        with contextlib.suppress(Exception):  # a run without telemetry still has its load figures
            tsum = summarize(store, t_start, t_end, idle=(min(t0, warm_start) - 10.0, warm_start))
            telemetry = tsum.to_dict()
            energy = EnergyFigures.from_json(energy_figures(tsum.energy, load), "the run's energy")
        if telemetry is not None:
            with contextlib.suppress(Exception):  # derived figures: never the run's undoing
                telemetry["speed_of_light"] = speed_of_light(target, plan, tsum, load)
        exact = len(marks) == 2 and not marks[0].stale and not marks[1].stale
        server = server_window(marks[0], marks[1]) if exact else {}
        if server and telemetry is not None:
            # The 1 Hz samples can miss a run's first or last wave (seen on the H200: 96 of 128
            # requests); the scrapes at the measured window's edges cannot. One figure per run.
            telemetry.update({k: v for k, v in server.items() if k not in ("t0", "t1")})
        # How long the run took to send its first request (warm-up or measured) once the server
        # was ready and the run was asked for: building prompts, starting the worker process.
        first = t_start - warmup_s
        result.extra["first_request_s"] = round(max(0.0, first - t0), 3)
        slo = None
        if plan.slo is not None and not plan.slo.empty:
            slo_met, why = judge(plan.slo, result.summary)
            slo = SloVerdict(slo_met, why or None)
        # The documents read once, as the history will read them back (engine.runs.summary).
        figures = TelemetryFigures.from_json(telemetry, "the run's telemetry") if telemetry is not None else None
        edges = ServerWindow.from_json(server, "the server's window")  # empty ({}) without exact scrapes
        measured = RunSummary(
            load=result.summary, telemetry=figures, energy=energy, server=edges,
            cross_check=cross_check(load, edges.figures(), shared_prefix=plan.workload.shares_prefixes,
                                    client_delay_ms=result.client_delay_ms),
            stream=StreamShape.from_json({k: result.extra.get(k) for k in STREAM_KEYS}, "the run's stream"),
            client_bound=result.client_bound, client_cpus=tuple(result.client_cpus),
            failures_by_reason=dict(result.failures_by_reason), slo=slo)
        if result.failed_run and error is None and not (server_died or handle.cancelled):
            example = next(iter(result.failure_examples.values()), "")
            reasons = ", ".join(f"{k}: {v}" for k, v in result.failures_by_reason.items())
            error = f"no request completed ({reasons or 'nothing sent'})" + (f"; first: {example}" if example else "")
    if server_died:
        error = error or (died[0] if died else "the server stopped accepting connections mid-run")
        hint = hint or "what completed before is kept"
    # The box held the run up: the client's loop (loadgen.run), or other processes took cores our
    # server or client wanted (BoxShare.crowded; judged only where the server's own tree is known).
    crowded = box_share is not None and box_share.crowded
    status = decide(server_died=server_died, cancelled=handle.cancelled and not server_died,
                    completed=completed,
                    client_bound=bool(result is not None and result.client_bound), slo_met=slo_met,
                    box_bound=bool(result is not None and result.box_bound) or crowded)
    facts = sup.facts if sup is not None else None
    # What vLLM said at start (KV tokens, captured CUDA graph sizes, versions): the advisor's
    # evidence about the server the run measured (engine.advise.advisor.RunData.startup).
    # vLLM's echo of its arguments stays out: it is the flags again, and where a server
    # was given a secret on its command line the echo would carry it into the history.
    startup = dataclasses.replace(facts, non_default_args=None) if facts is not None else None
    summary = dataclasses.replace(measured, error=error, hint=hint or None, server_log=server_log, startup=startup)
    if result is not None and prefix is not None:  # load was sent: whether it met an emptied prefix cache
        summary = dataclasses.replace(summary, extra={**summary.extra, PREFIX_RESET_KEY: prefix.to_json()})
    if box_share is not None:  # set only once the load ran
        summary = dataclasses.replace(summary, extra={**summary.extra, BOX_SHARE_KEY: box_share.to_json()})
    started_flags = _started_flags(target)
    if started_flags is not None:
        summary = dataclasses.replace(summary, extra={**summary.extra, STARTED_FLAGS_KEY: started_flags})
    # Flags changed during the run: it measured two configurations (engine.runs.flagchange)
    noted = handle.changes.since(t0)
    summary = with_flag_changes(summary, noted + seen_changes(start_limits, end_limits, noted))
    if recorder is None:  # the caller's store: the GPUs it saw
        gpus.update(store.gpu_names)
    gpu_list = [{"index": i, "name": name} for i, name in sorted(gpus.items())]
    info = rec.finish(history, status, summary, gpus=gpu_list or None)
    return MeasuredRun(
        name=plan.name, status=status, started=t0, ended=t1, summary=summary, result=result, error=error,
        hint=hint, info=info, history_error=None if rec.error is None else rec.error.reason,
        server_log=server_log, store=recorder.store if recorder is not None else None)


async def wait_for(coro: Awaitable[MeasuredRun], handle: RunHandle, timeout: float | None) -> MeasuredRun | None:
    """``coro`` (a :func:`measure`) bounded by ``timeout``: past it the run is cancelled and
    given 30 s to store itself; None when even that did not end."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        handle.cancel("timed out")
        done, _ = await asyncio.wait({task}, timeout=30.0)
    return task.result() if done else None


def _started_flags(target: Target) -> dict[str, JSONValue] | None:
    """The flags the measured server was started with, where they differ from the run's (live changes)."""
    sup = target.supervisor
    flags = getattr(sup, "flags", None)
    if target.started_flags is not None:
        started = dict(target.started_flags)
    elif isinstance(flags, FlagSet):
        started = recordable_values(flags)
    else:
        return None
    if started == dict(target.flags):
        return None
    return {str(k): to_jsonable(v) for k, v in started.items()}


def started_flags_of(summary: RunSummary) -> dict[str, object] | None:
    """A stored run's ``STARTED_FLAGS_KEY`` (None: started with the run's own flags, or unreadable)."""
    value = summary.extra.get(STARTED_FLAGS_KEY)
    return dict(value) if isinstance(value, dict) else None


async def with_live_limits(target: Target) -> Target:
    """A server vtui started (``vtui serve``), measured by URL: its live limits are what the run
    records as its flags, and the values it was started with beside them, so a run after
    ``vtui set`` is told from one before it. Other servers: unchanged (their flags are not known)."""
    from engine.server.livelimits import LiveUnavailable, read_live

    try:
        state = await read_live(target.base_url, target.api_key, timeout=5.0)
    except LiveUnavailable:
        return target
    return dataclasses.replace(target, flags={**target.flags, **state.live}, started_flags=dict(state.started))



__all__ = [
    "BOX_SHARE_KEY",
    "PREFIX_RESET_KEY",
    "STARTED_FLAGS_KEY",
    "MeasuredRun",
    "MeasuredServer",
    "PrefixReset",
    "RunHandle",
    "RunPlan",
    "Target",
    "box_bound_why",
    "box_share_of",
    "local_tokenizer",
    "measure",
    "reset_prefix_cache",
    "server_window",
    "started_flags_of",
    "wait_for",
    "with_live_limits",
]
