"""The session's load runs: the run in progress, the runs measured so far and the comparison.

A :class:`RunsPart` is owned by an ``engine.session.Session``. It runs the chosen workload
against the session's server (``engine.runs.measure.measure``, the pipeline of `vtui bench`,
sweep and tune) on a thread with its own event loop, keeps the runs this session measured,
the baseline, the stored runs picked for the comparison and the history they are written
to, and builds the snapshot's run views. What it needs of the session comes in explicitly:
the session's state when a run starts (a :class:`RunGround`) and a few callables.

Threads: a load run's thread calls :meth:`RunsPart.on_window` and :meth:`RunsPart.on_request`;
both only assign or count (atomic under the GIL). The comparison's intervals bootstrap each
compared run's requests (0.1-0.5 s a run) on a thread of their own, once a run: the snapshot,
built on the screen's thread four times a second, only reads what is done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from engine.errors import SessionError
from engine.events import CHANGED, Emit, Notice
from engine.flags import SECRET_FLAGS, FlagSet, recordable_values
from engine.presets import Preset
from engine.runs.compare import LoadPoint, RunPoint, load_points, run_points
from engine.runs.flagchange import changes_text, flag_changes_of, when_text
from engine.runs.history import History, NoiseFloor, Recording, RunInfo
from engine.runs.measure import MeasuredRun, RunHandle, RunPlan, Target, box_bound_why, local_tokenizer, measure
from engine.runs.noise import FloorReader, RunNoise, run_noise
from engine.runs.rows import RequestColumns, StoredRequest
from engine.runs.series import Slot, run_series
from engine.runs.status import RunStatus
from engine.runs.view import ComparisonView, RunProgress, RunRecord, StoredRun, compare_view, run_info
from engine.telemetry.host import release_free_memory

if TYPE_CHECKING:
    from engine.server.supervisor import Supervisor
    from engine.telemetry.store import SeriesStore
    from loadgen.records import RequestResult
    from loadgen.run import RunResult
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec
    from loadgen.stats import StatsWindow

# The Runs tab's lists: the stored runs, the compared runs by load, the stored runs' plane.
StoredViews = tuple[tuple[StoredRun, ...], tuple[LoadPoint, ...], tuple[RunPoint, ...]]
RUN_SERIES = ("req_s", "tok_s", "ttft_p50", "tpot_p50")  # a new run starts these afresh
FLOOR_READ_S = 10.0  # the box's noise floor is read again this often (one measured elsewhere shows up)
KEPT_NOISES = 32  # bootstrapped runs kept after they left the comparison
# What a finished run keeps of its load result: a session of twenty long runs held
# 2 GB when each kept its per-request records (50,000 of them, ~1.3 kB each with their gaps).
# A run stored in the history keeps none (the trace export and the advisor read them back from
# there); a run not stored keeps its first UNSTORED_REQUESTS for its trace. Its windows (the
# result file's series, one a second, 1-2 kB each) are thinned to FINISHED_WINDOWS, the last kept.
UNSTORED_REQUESTS = 2_000
FINISHED_WINDOWS = 720


def finished_result(result: RunResult, *, stored: bool) -> RunResult:
    """``result`` as a finished run keeps it (see UNSTORED_REQUESTS): its figures whole, its
    per-request records only where the history does not have them, its windows thinned."""
    windows = result.windows
    if len(windows) > FINISHED_WINDOWS:
        step = -(-len(windows) // FINISHED_WINDOWS)  # ceil
        windows = (*windows[:-1:step], windows[-1])
    requests = () if stored else result.requests[:UNSTORED_REQUESTS]
    return dataclasses.replace(result, windows=windows, requests=requests)


# Where a server listens, and how it logs: not what a run measures, never in its name.
UNNAMED_FLAGS = frozenset({
    "host", "port", "uds", "root-path", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "ssl-cert-reqs",
    "allowed-origins", "allowed-methods", "allowed-headers", "allow-credentials", "uvicorn-log-level",
    "disable-uvicorn-access-log", "disable-log-requests", "enable-log-requests", "disable-log-stats",
    "disable-fastapi-docs", "middleware", "served-model-name",
})
# A run's name before its number fits in this much, so ``run <name> (12): slo-missed`` (the notice
# line when it ends) stays within 80 columns.
NAME_WIDTH = 56
VALUE_WIDTH = 14  # a longer value (a JSON config) is cut, ending in "~"


def _short_flag(name: str) -> str:
    """max-num-batched-tokens -> mnbt: the initials of a flag, as run names use them."""
    return "".join(part[:1] for part in name.split("-") if part) or name


def _value_text(value: object) -> str:
    text = ("on" if value else "off") if isinstance(value, bool) else str(value)
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 1] + "~"


def run_name(base: str, loaded: FlagSet | None, flags: FlagSet | None, taken: Sequence[str]) -> str:
    """A run named by what differs from its preset: the preset (or workload) and each flag the
    server runs with another value than the preset's (``online-chat mnbt=512``), numbered when
    the name was taken (``... (2)``).

    Where the server leaves a flag the preset sets to vLLM's default, the name says so once for
    all of them (``vllm-default:ecp,mnbt``); where it listens (host, port) and how it logs are
    not named, nor secrets (recordable_values gives their references, and they are skipped).
    Past :data:`NAME_WIDTH` columns the rest are counted (``+3 flags``): the comparison's flag
    rows list them all."""
    now = recordable_values(flags) if flags is not None else {}
    before = recordable_values(loaded) if loaded is not None else {}
    keys = [k for k in sorted(set(now) | set(before))
            if k not in SECRET_FLAGS and k not in UNNAMED_FLAGS and now.get(k) != before.get(k)]
    # Initials, unless two of the named flags share them (then their names in full).
    short = {k: _short_flag(k) for k in keys}
    clash = {a for a in short.values() if list(short.values()).count(a) > 1}
    short = {k: k if a in clash else a for k, a in short.items()}
    parts = [f"{short[k]}={_value_text(now[k])}" for k in keys if k in now]
    unset = [short[k] for k in keys if k not in now]
    if unset:
        parts.append("vllm-default:" + ",".join(unset))
    name = base
    for i, part in enumerate(parts):
        left = len(parts) - i - 1  # parts after this one
        if len(name) + 1 + len(part) + (len(f" +{left} flags") if left else 0) > NAME_WIDTH:
            name += f" +{left + 1} flag" + ("s" if left else "")
            break
        name += " " + part
    if name not in taken:
        return name
    n = 2
    while f"{name} ({n})" in taken:
        n += 1
    return f"{name} ({n})"


@dataclasses.dataclass(frozen=True)
class RunGround:
    """What the session holds when a load run is asked for: its server and its workload."""

    base_url: str | None
    ready: bool  # the server is READY (started here) or ATTACHED
    workload: WorkloadSpec | None
    arrivals: ArrivalSpec | None
    slo: SLO | None
    preset_name: str | None
    flags: FlagSet  # what the server runs, else the edited flags
    supervisor: Supervisor | None  # the server started here, or None (attached)
    model: str | None  # the served model's name
    pid: int | None
    version: str | None  # vLLM's
    name_base: str  # the workload's label, else "run"
    preset_flags: FlagSet  # what run names compare against


def _ends_repeats(record: RunRecord) -> bool:
    """A repeat after which no more are run: cancelled, the server gone, or nothing measured."""
    return record.status in (RunStatus.CANCELLED, RunStatus.SERVER_DIED, RunStatus.FAILED)


class RunsPart:
    """The session's load run in progress, its runs, the baseline, the comparison and the history."""

    def __init__(
        self,
        *,
        emit: Emit,
        clock: Callable[[], float],
        store: SeriesStore,
        push: Callable[[str, float], None],
        clear_series: Callable[[tuple[str, ...]], None],
        record_history: bool,
    ) -> None:
        """The session's side: ``emit`` reports to it (engine.events.SessionEvent: Changed, a
        Notice); ``clock`` its clock; ``store`` every telemetry sample of the session (the runs'
        summaries read it); ``push`` and ``clear_series`` extend and reset its sparklines.
        ``record_history``: False never writes (or reads) the run history."""
        self._emit = emit
        self._clock = clock
        self._store = store
        self._push = push
        self._clear_series = clear_series
        self.record_history = record_history
        self.history: History | None = None  # opened on first use (get_history)
        self.thread: threading.Thread | None = None  # the run in progress's
        self.label = ""
        self.started = 0.0
        self.completed = 0  # requests finished in the run in progress
        self.runs: list[RunRecord] = []
        self.baseline: int | None = None
        self.sweeping = False
        self.window: StatsWindow | None = None  # the latest stats window
        self._handle: RunHandle | None = None
        self._pinned: tuple[RunInfo, ...] = ()  # the stored runs in the comparison
        self._stored_epoch = 0  # grows when the stored runs must be read again
        self._stored_cache: tuple[tuple[object, ...], StoredViews] | None = None
        # ((runs, baseline, stored ids, floor id, runs bootstrapped), the view)
        self._comparison_cache: tuple[tuple[object, ...], ComparisonView | None] | None = None
        # History run id -> its requests bootstrapped (engine.runs.noise), by the noise thread; kept
        # while compared and for up to KEPT_NOISES runs since, so a run taken out and put back is not
        # bootstrapped again.
        self._noises: dict[int, RunNoise] = {}
        self._noise_lock = threading.Lock()
        self._noise_thread: threading.Thread | None = None
        self.floor: NoiseFloor | None = None  # the box's noise floor (noise.box_floor), as last read
        self._floors = FloorReader()  # learns a floor again only when the history's runs changed
        self.floor_checked: float | None = None  # when (time.monotonic()) it was read; None: read at next use

    def _changed(self) -> None:
        self._emit(CHANGED)

    def _notify(self, text: str) -> None:
        self._emit(Notice(text))

    @property
    def active(self) -> bool:
        """True while a load run's thread is alive."""
        return self.thread is not None and self.thread.is_alive()

    @property
    def recording(self) -> Recording | None:
        """The history recording of the run in progress, or None."""
        handle = self._handle
        return None if handle is None else handle.recording

    def get_history(self) -> History | None:
        """The run history (opened now on first use), or None when it is not written."""
        if not self.record_history:
            return None
        if self.history is None:
            try:
                self.history = History()
            except Exception:  # noqa: BLE001 - history is optional for the live view
                self.record_history = False
                return None
        return self.history

    # ------------------------------------------------------------------ the run

    def on_window(self, window: StatsWindow) -> None:
        """Load-run thread callback: keep the latest window, extend the sparklines."""
        self.window = window
        self._push("req_s", window.req_s or 0.0)
        self._push("tok_s", window.output_tok_s or 0.0)
        self._push("ttft_p50", window.ttft.p50)
        self._push("tpot_p50", window.tpot.p50)
        self._changed()

    def on_request(self, result: RequestResult) -> None:
        """Load-run thread callback, once per finished request: count and record it."""
        self.completed += 1

    def limits_moved(self, moved: Sequence[tuple[str, object, object]]) -> None:
        """Live limits moved on the server (engine.events.LimitsSetLive's (flag, old, new)): the run
        going on measured two configurations, and stores each change (engine.runs.flagchange)."""
        handle = self._handle
        if handle is None or not moved:
            return
        for flag, old, new in moved:
            handle.note_change(flag, old, new)
        self._changed()

    def next_label(self, ground: RunGround) -> str:
        """The next run's name: the preset and the flags changed since it (see run_name)."""
        return run_name(ground.name_base, ground.preset_flags, ground.flags, [r.label for r in self.runs])

    async def run(self, ground: RunGround, label: str | None = None, *, group: int | None = None) -> RunRecord:
        """Run ``ground``'s workload against its server; returns the recorded run (see
        ``engine.session.Session.run_workload``). ``group``: the index of the first run of the
        repeats this one belongs to (one column of the comparison)."""
        base_url = ground.base_url
        if base_url is None or not ground.ready:
            raise SessionError("no server is ready", "start one (s) or attach to a URL (t)")
        if ground.workload is None or ground.arrivals is None:
            raise SessionError("no workload chosen", "load a preset first")
        if self.active:
            raise SessionError("a run is already going", "stop it first (c)")
        label = label or self.next_label(ground)
        flags = ground.flags
        api_key: str | None = None  # an attached server's key is not known (AttachedServer keeps none)
        if ground.supervisor is not None:
            # A server started here with --api-key wants it on every request.
            api_key = flags.secret_env().get("VLLM_API_KEY")
        target = Target(base_url, ground.model, api_key=api_key or None,
                        tokenizer=local_tokenizer(flags.model),
                        supervisor=ground.supervisor, root_pid=ground.pid,
                        flags=recordable_values(flags), model_label=str(flags.model), vllm_version=ground.version)
        # 120 s without a byte means a hung server (SIGSTOP, a stuck engine), not a long
        # prefill: the run shows those requests as timeouts instead of waiting 10 minutes.
        plan = RunPlan(label, ground.workload, ground.arrivals, ground.slo, preset=ground.preset_name,
                       read_timeout_s=120.0)
        handle = RunHandle()
        self._handle = handle
        self.label = label
        self.started = self._clock()
        self.completed = 0
        self.window = None
        self._clear_series(RUN_SERIES)
        self._notify(f"running {label}")
        self._changed()

        loop = asyncio.get_running_loop()
        done: asyncio.Future[MeasuredRun] = loop.create_future()

        def finish(outcome: MeasuredRun | BaseException) -> None:
            if done.done():
                return
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)

        def thread_main() -> None:
            # The run's parent side (merging the worker's batches, history writes) on a loop of
            # its own, so the screen's loop never waits for it; the streams are read in the
            # worker process (engine.runs.measure -> loadgen.LoadRun).
            run_loop = asyncio.new_event_loop()
            try:
                outcome = run_loop.run_until_complete(measure(
                    target, plan, history=self.get_history(), store=self._store, handle=handle,
                    on_window=self.on_window, on_request=self.on_request))
                loop.call_soon_threadsafe(finish, outcome)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                loop.call_soon_threadsafe(finish, exc)
            finally:
                run_loop.close()

        thread = threading.Thread(target=thread_main, name="vtui-loadrun", daemon=True)
        self.thread = thread
        thread.start()
        try:
            run = await done
        finally:
            await asyncio.to_thread(thread.join)
            self.thread = None
            self._handle = None
        ended = self._clock()
        result = run.result
        windows = result.windows if result is not None else ()
        if windows:
            self.window = windows[-1]  # the run's last published window stays on screen
        if result is None and run.status is RunStatus.FAILED:
            # Refused before any load was sent (unreachable, lengths too long): not a run.
            self._notify(f"run refused: {run.error}")
            self._changed()
            raise SessionError(run.error or "the run failed", run.hint or "")
        record = RunRecord(
            index=len(self.runs) + 1,
            label=label,
            flags=flags,
            started_t=self.started,
            status=run.status,
            summary=run.summary,
            result=None if result is None else finished_result(result, stored=run.history_id is not None),
            history_id=run.history_id,
            error=run.error,
            ended_t=ended,
            group=group,
        )
        self.runs.append(record)
        if self.baseline is None:
            self.baseline = record.index
        why = box_bound_why(run)
        notice = f"run {label}: {run.status}" + (f" ({record.error})" if record.error else "") + (
            f" ({why})" if why else "")  # within the header's 80 columns; history show says more
        if run.history_error is not None:
            # Disk full or a read-only file mid-run: the run is kept in memory; say so.
            notice += f"; history not written: {run.history_error}"
        self._notify(notice)
        self._changed()
        return record

    def stop(self, reason: str = "cancelled") -> None:
        """Cancel the run in progress; what was measured so far is kept."""
        handle = self._handle
        if handle is None:
            return
        handle.cancel(reason)
        self._notify("stopping the run")
        self._changed()

    async def close(self) -> None:
        """Stop the run in progress and wait (30 s at most) for its thread."""
        if self.active:
            self.stop()
            thread = self.thread
            if thread is not None:
                await asyncio.to_thread(thread.join, 30)

    def set_baseline(self, index: int | None = None) -> None:
        """Mark a run (default: the last one) as the baseline of the comparison."""
        if not self.runs:
            raise SessionError("no run yet", "run a workload first (r)")
        index = index if index is not None else self.runs[-1].index
        self.baseline = index
        record = self.runs[index - 1]
        history = self.get_history()
        if history is not None and record.history_id is not None:
            try:
                history.set_baseline(record.history_id)
            except Exception:  # noqa: BLE001 - the marker in this session still holds
                pass
        self._notify(f"baseline: {record.label}")
        self._changed()

    async def repeat(self, ground: Callable[[], RunGround], repeats: int) -> list[RunRecord]:
        """The workload ``repeats`` times in a row (engine.runs.series), one column of the
        comparison; each repeat is stored as what it was (a spoiled one is not measured again:
        the comparison reads the repeats' statuses). A cancelled or failed run ends the repeats."""
        if repeats == 1:
            return [await self.run(ground())]
        base = self.next_label(ground())
        group = len(self.runs) + 1

        async def step(slot: Slot[str]) -> RunRecord:
            return await self.run(ground(), f"{base} ({slot.repeat}/{slot.repeats})", group=group)

        done = await run_series([base], step, repeats=repeats, retry_spoiled=False, stop=_ends_repeats)
        return [record for _, record in done]

    async def sweep(self, presets: Sequence[Preset], *, load: Callable[[Preset], object],
                    needs_apply: Callable[[], bool], apply: Callable[[], Awaitable[object]],
                    run: Callable[[str | None, int | None], Awaitable[RunRecord]],
                    repeats: int = 1) -> list[RunRecord]:
        """For each of ``presets`` (``repeats`` rounds over them, engine.runs.series): ``load``
        it, ``apply`` (restart) when ``needs_apply`` says the flags differ from the running ones,
        and ``run`` the workload; a run the box spoiled is measured again (the spoiled try stays
        in the runs, out of the comparison). With repeats, each preset's runs are one column."""
        if self.sweeping:
            raise SessionError("a sweep is already going", "wait for it to end")
        groups: dict[int, int] = {}  # preset's place in the sweep -> the index of its first run
        spoiled: dict[int, int] = {}  # slot of the series -> its last try's index, spoiled

        async def step(slot: Slot[tuple[int, Preset]]) -> RunRecord:
            place, preset = slot.config
            tried = spoiled.pop(slot.index, None)
            if tried is not None:
                # measured again: the spoiled try is kept as what it was, out of the comparison
                self.runs[tried - 1] = dataclasses.replace(self.runs[tried - 1], superseded=True)
                if groups.get(place) == tried:
                    del groups[place]
            load(preset)
            if needs_apply():
                await apply()
            group = groups.setdefault(place, len(self.runs) + 1) if repeats > 1 else None
            label = f"{preset.name} ({slot.repeat}/{slot.repeats})" if repeats > 1 else None
            record = await run(label, group)
            if record.status.spoiled:
                spoiled[slot.index] = record.index
            return record

        self.sweeping = True
        try:
            done = await run_series(list(enumerate(presets)), step, repeats=repeats, say=self._notify,
                                    name=lambda config: config[1].name)
        finally:
            self.sweeping = False
        return [record for _, record in done]

    # ------------------------------------------------------------------ views

    def progress(self, arrivals: ArrivalSpec | None) -> RunProgress | None:
        """The run in progress's view (``arrivals``: the session's, they say when it stops);
        it lasts until the run is recorded (its thread may end a moment before), so Live never
        shows the run before as the last one."""
        if not self.active and self._handle is None:
            return None
        now = self._clock()
        elapsed = now - self.started
        # The arrivals say when a run stops (0: not on that); the workload has no say in it.
        planned = float(arrivals.num_requests) if arrivals is not None else None
        duration = float(arrivals.duration_s) if arrivals is not None else None
        fraction = None
        if planned:
            fraction = min(1.0, self.completed / planned)
        elif duration:
            fraction = min(1.0, elapsed / duration)
        handle = self._handle
        changes = handle.flag_changes() if handle is not None else ()
        return RunProgress(
            label=self.label,
            started_t=self.started,
            elapsed_s=elapsed,
            completed=self.completed,
            planned=int(planned) if planned else None,
            duration_s=duration,
            fraction=fraction,
            changes=changes_text(changes) or None,
        )

    def comparison(self) -> ComparisonView | None:
        """This session's runs and the stored runs picked in the Runs tab, side by side. Built
        again only when what is compared changes (the runs, the baseline, the stored runs picked,
        the box's floor, a run's bootstrap done); a compared run's intervals are bootstrapped on
        the noise thread, once (noise_settled waits for it), its verdicts said pending until then."""
        pinned = tuple(self._pinned)
        records = [r for r in self.runs if not r.summary.empty and not r.superseded]
        if not records and not pinned:
            return None
        # run id -> its stored workload (whose SLO judges goodput; a session run's is not at hand)
        wanted: dict[int, object] = {r.history_id: None for r in records if r.history_id is not None}
        wanted.update((i.id, i.workload) for i in pinned)
        floor = self._box_floor()
        with self._noise_lock:
            noises = {run_id: self._noises[run_id] for run_id in wanted if run_id in self._noises}
        key = (len(self.runs), sum(r.superseded for r in self.runs), self.baseline, tuple(i.id for i in pinned),
               None if floor is None else (floor.id, floor.runs, floor.groups, floor.measured),  # a learned one has no id
               tuple(sorted(noises)))
        if self._comparison_cache is not None and self._comparison_cache[0] == key:
            return self._comparison_cache[1]
        missing = {run_id: w for run_id, w in wanted.items() if run_id not in noises}
        if missing:
            self._bootstrap(missing)
        view = compare_view(records, self.baseline, pinned, noises=noises, floor=floor, pending=len(missing))
        self._comparison_cache = (key, view)
        self._forget_noises(set(wanted))
        return view

    def _box_floor(self) -> NoiseFloor | None:
        """The box's noise floor (engine.runs.noise.box_floor: the newest measured, else learned
        from the history's repeats), read again every FLOOR_READ_S."""
        now = time.monotonic()
        if self.floor_checked is None or now - self.floor_checked >= FLOOR_READ_S:
            self.floor_checked = now
            history = self.get_history()
            try:
                self.floor = self._floors.read(history) if history is not None else None
            except Exception:  # noqa: BLE001 - a floor that cannot be read: single runs not judged, said so
                self.floor = None
        return self.floor

    def _bootstrap(self, missing: dict[int, object]) -> None:
        """Read and bootstrap ``missing`` runs' requests (run id -> its stored workload) on the
        noise thread, then mark the session changed; one thread at a time (the snapshot after it
        asks for what is still missing)."""
        thread = self._noise_thread
        history = self.get_history()
        if (thread is not None and thread.is_alive()) or history is None:
            return
        path = history.path

        def work() -> None:
            try:
                store: History | None = History(path, read_only=True)
            except Exception:  # noqa: BLE001 - unreadable: the runs are compared without their noise
                store = None
            try:
                for run_id, workload in missing.items():
                    # Read back as machine-number columns, not an object per request: 18,000 of those
                    # per run fragmented the allocator, +5-8 MB of RSS a run
                    requests: Sequence[StoredRequest] | RequestColumns
                    try:
                        requests = store.request_columns(run_id) if store is not None else []
                    except Exception:  # noqa: BLE001 - a run whose requests cannot be read has no noise
                        requests = []
                    # the requests cut into blocks and let go, then the bootstrap (every figure's
                    # resamples at once)
                    noise = run_noise(requests, workload if isinstance(workload, Mapping) else None, key=run_id)
                    del requests
                    noise.settle()
                    with self._noise_lock:
                        self._noises[run_id] = noise
            finally:
                if store is not None:
                    store.close()
                # The run's requests (read back here, and its own records before) were the session's
                # largest allocations since the run: their free pages go back to the system.
                release_free_memory()
                self._changed()

        self._noise_thread = threading.Thread(target=work, name="vtui-noise", daemon=True)
        self._noise_thread.start()

    def _forget_noises(self, compared: set[int]) -> None:
        with self._noise_lock:
            others = [run_id for run_id in self._noises if run_id not in compared]
            for run_id in others[:max(0, len(others) - KEPT_NOISES)]:  # the oldest first (insertion order)
                del self._noises[run_id]

    def noise_settled(self, timeout: float | None = None) -> bool:
        """Wait for the noise thread (tests, scripts); True when no bootstrap is left running."""
        thread = self._noise_thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def stored_runs(self, text: str = "", limit: int = 200) -> tuple[StoredRun, ...]:
        """The run history, newest first, for the Runs tab (see ``Session.stored_runs``)."""
        history = self.get_history()
        if history is None:
            return ()
        try:
            infos = history.list_runs(limit=limit)
        except Exception:  # noqa: BLE001 - a history that cannot be read lists nothing
            return ()
        words = text.lower().split()
        compared = {i.id for i in self._pinned}
        out = []
        for info in infos:
            day = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.started))
            hay = " ".join(str(x) for x in (info.name, info.preset, info.model, day, info.status)).lower()
            if any(w not in hay for w in words):
                continue
            # a flat (trace) summary has no "load" key: no figures listed, as before
            figure = (lambda name: None) if info.summary.flat else info.summary.figure
            out.append(StoredRun(info.id, info.name, info.preset, info.model, info.started, info.status,
                                 figure("request_throughput"), figure("median_ttft_ms"), info.id in compared,
                                 changed=when_text(flag_changes_of(info.summary)) or None))
        return tuple(out)

    def load_points(self) -> tuple[LoadPoint, ...]:
        """The compared runs (this session's and the stored ones picked) on the latency-against-
        load plane, by load (engine.runs.compare.load_points): a sweep of loads read as a curve."""
        infos = [run_info(r) for r in self.runs if not r.summary.empty] + list(self._pinned)
        return tuple(load_points(infos))

    def run_points(self, limit: int = 200) -> tuple[RunPoint, ...]:
        """The stored runs on the throughput-latency plane, frontier marked (engine.runs.compare.run_points)."""
        history = self.get_history()
        if history is None:
            return ()
        try:
            return tuple(run_points(history.list_runs(limit=limit)))
        except Exception:  # noqa: BLE001 - a history that cannot be read plots nothing
            return ()

    def stored_views(self, text: str) -> StoredViews:
        """The Runs tab's lists (stored runs filtered by ``text``, load points, run points), read
        again only when what they show can have changed: a run ended or was set aside, the
        filter, a stored run compared, or :meth:`refresh_stored` asked."""
        key = (len(self.runs), sum(r.superseded for r in self.runs), text, self._stored_epoch)
        if self._stored_cache is None or self._stored_cache[0] != key:
            self._stored_cache = (key, (self.stored_runs(text), self.load_points(), self.run_points()))
        return self._stored_cache[1]

    def refresh_stored(self) -> None:
        """Read the history again at the next :meth:`stored_views` (runs written by another process)."""
        self._stored_epoch += 1

    def toggle_stored(self, run_id: int) -> bool:
        """Put a stored run into the comparison, or take it out; True when it is in now."""
        self._stored_epoch += 1
        if any(i.id == run_id for i in self._pinned):
            self._pinned = tuple(i for i in self._pinned if i.id != run_id)
            self._changed()
            return False
        history = self.get_history()
        if history is None:
            raise SessionError("no run history here", "runs are stored when the history can be written")
        try:
            info = history.get_run(run_id)
        except Exception as exc:  # noqa: BLE001 - named in the error
            raise SessionError(f"stored run {run_id}: {exc}", "pick a run from the list") from None
        if info.summary.load is None or info.summary.flat:
            raise SessionError(f"stored run {run_id} ({info.name}) measured nothing", "pick a run with results")
        self._pinned = (*self._pinned, info)
        self._changed()
        return True
