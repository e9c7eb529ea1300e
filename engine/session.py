"""The headless controller that the TUI drives.

A :class:`Session` holds what one vtui window is about: the flags being edited, the
chosen workload, the vLLM server (started here or attached), the load run in
progress, the telemetry sampler and the runs measured so far. Every action is an
async method; the state is published as ONE immutable :class:`SessionSnapshot`
a few times a second (:mod:`engine.views` defines it, its parts and the functions
that build them). Nothing here imports Textual, so the same object can be
driven from a script or a test. The session is a thin facade: what it does is in objects
of their own that it owns and hands what they need: the flags being edited and their checks
(:class:`engine.flags.edited.EditedFlags`), the server started here or attached
and its log (:class:`engine.server.part.ServerPart`), the load runs, the comparison and the
history (:class:`engine.runs.part.RunsPart`), the live telemetry and its sparklines
(:class:`engine.telemetry.part.TelemetryPart`) and the flag search run from the Tune screen
(:class:`engine.tune.part.TunePart`); the presets and the exports are functions of
:mod:`engine.presets` and :mod:`engine.runs.export`. The session keeps the workload
and the notice line.

Threads: the telemetry sampler is a thread of its own (NVML and psutil block), and
a load run gets a thread with its own event loop, so that hundreds of requests per
second never share the UI's loop. Both only hand frozen objects over (an attribute
assignment, atomic under the GIL); the snapshot is built on the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.advise.advisor import RunData, advise, not_advised
from engine.errors import SessionError
from engine.flags import FlagSet, FlagValue
from engine.flags.edited import EditedFlags, flags_differ
from engine.presets import Preset, PresetError, check_repeats, find_preset, list_presets, load_for_session, save_from_session
from engine.runs.export import EXPORT_KINDS, export_text, write_export
from engine.runs.history import HistoryError
from engine.runs.part import RUN_SERIES, RunGround, RunsPart, run_name
from engine.server.livehook import LIVE
from engine.server.part import LOG_LINES, POLL_LINES, ServerPart
from engine.server.tinymodel import resolve_model
from engine.telemetry.configinfo import server_values
from engine.telemetry.metrics import CACHE_CONFIG
from engine.telemetry.nvml import NvmlReader
from engine.telemetry.part import TelemetryPart
from engine.tune.part import (
    TUNE_FIELDS,
    TUNE_PERCENTILES,
    TuneFormError,
    TuneGround,
    TunePart,
    parse_tune_form,
)
from engine.views import (
    Changed,
    ComparisonView,
    FlagsRecovered,
    LimitsSetLive,
    Notice,
    RunRecord,
    ServerTookFlags,
    SessionEvent,
    SessionSnapshot,
    StoredRun,
    TuneEnded,
    TuneRequest,
    TuneTookFlags,
    devices_view,
    server_metrics_view,
)

if TYPE_CHECKING:
    # For the annotations only.
    from engine.advise.advisor import Finding
    from engine.flags import Schema
    from engine.runs.compare import LoadPoint, RunPoint
    from engine.runs.history import History
    from engine.server.attach import AttachedServer
    from engine.server.livelimits import LiveResult
    from engine.server.logparse import StartupFacts
    from engine.server.supervisor import RestartResult, Supervisor
    from engine.telemetry.sampler import TelemetrySnapshot
    from engine.telemetry.store import SeriesStore
    from engine.tune.search import Measurer, TuneResult, TuneSettings
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec
    from loadgen.stats import StatsWindow

# Re-exported: SessionError lives in engine.errors, the Tune form's parser and its constants
# with the tune (engine.tune.part), run_name and RUN_SERIES with the runs (engine.runs.part),
# EXPORT_KINDS with the exports (engine.runs.export), LOG_LINES and POLL_LINES with the server
# (engine.server.part); the TUI and the tests import them from here.
__all__ = ["EXPORT_KINDS", "LOG_LINES", "POLL_LINES", "RUN_SERIES", "TUNE_FIELDS", "TUNE_PERCENTILES",
           "Session", "SessionError", "TuneFormError", "parse_tune_form", "run_name"]

# The flags a server vtui started takes live, and how: what the Flags tab marks with "~".
LIVE_NOTES = {flag.name: flag.note for flag in LIVE}


# --------------------------------------------------------------------------- session


class Session:
    """Holds flags, workload, server, load run, telemetry and runs; see module doc."""

    @classmethod
    def open(cls, model: str | None = None, preset: str | None = None) -> Session:
        """The session ``vtui`` opens with: ``model`` read as ``--model`` is
        (engine.server.tinymodel.resolve_model; the tiny model when None), its needed flags
        (load-format dummy for a shipped architecture), the tiny model's CPU sizes where there
        is no GPU, and ``preset`` (online-chat when None; a preset that does not load is left
        out, the session still opens). Raises ``ModelError`` for a model that names nothing usable."""
        resolved = resolve_model(model)
        # Each preset's [tiny] table says what the tiny model runs with (as in vtui sweep):
        # its memory defaults are not added here.
        model_flags: dict[str, object] = dict(resolved.flags)
        no_gpu = NvmlReader().status() is not None
        session = cls(FlagSet(model=resolved.path, values=model_flags), tiny=resolved.tiny and no_gpu,
                      model_flags=model_flags)
        try:
            session.load_preset(preset or "online-chat")
        except SessionError:
            pass
        return session

    def __init__(
        self,
        flags: FlagSet,
        *,
        workload: WorkloadSpec | None = None,
        arrivals: ArrivalSpec | None = None,
        slo: SLO | None = None,
        workload_label: str = "",
        preset_name: str | None = None,
        launcher: Sequence[str] = (),
        port: int | None = None,
        record_history: bool = True,
        telemetry: bool = True,
        tiny: bool = False,
        schema: Schema | None = None,
        clock: Callable[[], float] = time.time,
        model_flags: Mapping[str, object] | None = None,
        tune_measurer: Callable[..., Measurer] | None = None,
    ) -> None:
        """``tune_measurer``: builds the flag search's measurer, called like
        ``engine.tune.search.ServerMeasurer(workload, slo, mode=, arrivals=, tokenizer=, supervisor=)``
        (the default); tests pass a stand-in answering from recorded measurements."""
        self._clock = clock
        # Flags that come with the model, kept under every preset's flags (a shipped
        # architecture needs load-format = dummy whatever the scenario).
        self._model_flags: dict[str, object] = dict(model_flags or {})
        self._workload = workload
        self._arrivals = arrivals
        self._slo = slo
        self._workload_label = workload_label
        self._preset_name = preset_name
        self._repeats = 1  # how many runs `r` makes of the workload (a preset's ``repeats``, or set_repeats)
        self._stored_filter = ""  # the Runs tab's filter of the stored runs

        # The flags being edited, checked as they change (engine.flags.edited).
        self._edited = EditedFlags(flags, schema=schema, max_request_len=self._max_request_len)
        self._seq = 0
        self._subscribers: list[Callable[[SessionSnapshot], None]] = []
        self._notice: str | None = None

        self._tiny = tiny
        # The sampler, the /metrics scrape and the sparkline series (engine.telemetry.part).
        self._telemetry_part = TelemetryPart(enabled=telemetry, emit=self._on_event,
                                             recording=lambda: self._runs_part.recording)

        # The load run in progress, the runs measured, the comparison and the history (engine.runs.part).
        self._runs_part = RunsPart(emit=self._on_event, clock=clock,
                                   store=self._telemetry_part.store, push=self._push,
                                   clear_series=self._clear_series, record_history=record_history)
        # The server started here or attached, its log lines and its view (engine.server.part).
        self._server_part = ServerPart(
            emit=self._on_event, clock=clock, launcher=launcher, port=port, edited=lambda: self._edited.flags,
            start_telemetry=self._start_telemetry, halt_telemetry=self._halt_telemetry,
            telemetry=lambda: self._telemetry_part.latest, tune_active=lambda: self.tune_active,
            run_active=lambda: self.run_active, stop_run=self.stop_workload)

        self._tune_measurer = tune_measurer  # read when a tune starts (tests set it after __init__)
        # The flag search, its progress and its result (engine.tune.part).
        self._tune_part = TunePart(emit=self._on_event, server=self._tune_server,
                                   telemetry=lambda: self._telemetry_part.latest, release=self._tune_release)

    # ------------------------------------------------------------------ state access

    @property
    def flags(self) -> FlagSet:
        """The edited FlagSet."""
        return self._edited.flags

    @property
    def store(self) -> SeriesStore:
        """Every telemetry and /metrics sample of this session, for the runs' summaries."""
        return self._telemetry_part.store

    @property
    def supervisor(self) -> Supervisor | None:
        """The Supervisor of the server started here, or None."""
        return self._server_part.supervisor

    @property
    def runs(self) -> tuple[RunRecord, ...]:
        return tuple(self._runs_part.runs)

    @property
    def server_started_here(self) -> bool:
        """True while a server this session launched may still be running."""
        return self._server_part.started_here

    @property
    def run_active(self) -> bool:
        return self._runs_part.active

    @property
    def tune_active(self) -> bool:
        """True while a flag search runs (it owns the server until it ends)."""
        return self._tune_part.active

    @property
    def _tune_task(self) -> asyncio.Task[TuneResult] | None:
        """The running search's task (the tests wait on it)."""
        return self._tune_part.task

    def _refuse_while_tuning(self, what: str) -> None:
        if self.tune_active:
            raise SessionError(
                f"a flag search (tune) is running: cannot {what} now",
                "stop the tune first (u opens the Tune screen, x there stops it)",
            )

    def changed(self) -> None:
        """Mark the state changed so the next publish sends a new snapshot."""
        self._seq += 1

    def subscribe(self, callback: Callable[[SessionSnapshot], None]) -> None:
        """Call ``callback(snapshot)`` on every publish that has something new."""
        self._subscribers.append(callback)

    async def publish_forever(self, hz: float = 4.0) -> None:
        """Build and hand out a snapshot ``hz`` times a second while something changes."""
        last = -1
        while True:
            if self._seq != last:
                last = self._seq
                snap = self.snapshot()
                for callback in list(self._subscribers):
                    callback(snap)
            await asyncio.sleep(1.0 / hz)

    # ------------------------------------------------------------------ flags

    def schema(self) -> Schema:
        """The flag schema the editor and the checks use: the installed vLLM's once read (in
        the background), the built-in one until then."""
        return self._edited.schema()

    def set_flag_text(self, name: str, text: str) -> str | None:
        """Set a flag from what the user typed; returns the reason it is invalid, or None.

        Text is parsed as vLLM would (engine.flags); empty text unsets the flag, so
        vLLM's default applies. Text that does not parse keeps the last good value and
        the reason is shown under the flag.
        """
        self.changed()
        return self._edited.set_text(name, text)

    def set_flag(self, name: str, value: object) -> str | None:
        """Set a typed flag value; returns the reason it is invalid, or None."""
        self.changed()
        return self._edited.set(name, value)

    def unset_flag(self, name: str) -> None:
        self.changed()
        self._edited.unset(name)

    def _max_request_len(self) -> int | None:
        """Longest prompt + output the workload asks for (synthetic kinds), for validate()."""
        wl = self._workload
        if wl is None or wl.kind in ("sharegpt", "jsonl", "trace"):
            return None
        return int(wl.max_request_len())

    def flag_errors(self) -> dict[str, str]:
        return dict(self._edited.errors)

    def launch_argv(self) -> list[str]:
        """The argv after the model that a start or apply would launch with, as it may be
        shown: secrets as ``$VLLM_API_KEY`` references (they reach vLLM by its environment)."""
        return list(self._edited.flags.display_argv())

    def flags_diff(self) -> list[tuple[str, object, object]]:
        """(flag, running value, edited value) for every flag an apply would change (values
        as FlagSet holds them: typed per flag, None when unset)."""
        return self._edited.diff(self._server_part.running_flags)

    def revert_flags(self) -> None:
        """Throw the edits away: back to the running server's flags or the loaded ones."""
        self.changed()
        self._edited.take(self._server_part.running_flags or self._edited.loaded)

    @property
    def dirty(self) -> bool:
        return self._edited.dirty

    # ------------------------------------------------------------------ presets

    def list_presets(self) -> list[Preset]:
        return list(list_presets())

    def load_preset(self, preset: Preset | str | Path) -> Preset:
        """Take a preset's flags (on this session's model) and its workload.

        On the tiny model the preset's explicit ``[tiny]`` scaling applies; what it
        changed is in the notice. Returns the preset as applied.
        """
        loaded = load_for_session(preset, model=self._edited.flags.model, model_flags=self._model_flags,
                                  tiny=self._tiny)
        self.changed()
        self._workload = loaded.workload
        self._arrivals = loaded.arrivals
        self._slo = loaded.preset.slo
        self._preset_name = loaded.preset.name
        self._workload_label = loaded.preset.name
        self._repeats = loaded.preset.repeats
        self._edited.take(loaded.flags, loaded=True, preset=True)  # checked against the new workload
        self._notice = loaded.notice
        return loaded.preset

    def save_preset(self, name: str, description: str = "") -> Path:
        """Save the edited flags and the workload as a user preset."""
        path = save_from_session(name, self._edited.flags, self._workload, self._arrivals, self._slo,
                                 description=description, repeats=self._repeats)
        self.changed()
        self._edited.saved()
        self._preset_name = name
        self._workload_label = name
        self._notice = f"saved preset {name} to {path}"
        return path

    # ------------------------------------------------------------------ server

    def _add_log(self, text: str, level: str | None = None) -> None:
        """One line of the server's output (or a note of vtui's own): see ServerPart.add_log."""
        self._server_part.add_log(text, level)

    async def start_server(self, timeout: float = 600.0, *, force: bool = False) -> StartupFacts:
        """Launch vLLM with the edited flags; refuses when a flag is invalid, or (unless
        ``force``) when the planner shows the launch cannot fit the GPU's memory budget.

        On a failed start the server view carries vLLM's own line and the hint.
        """
        self._refuse_while_tuning("start the server")
        self._refuse_flag_errors("fix the flag before starting the server")
        return await self._server_part.start(timeout, force=force)

    async def stop_server(self) -> None:
        """Stop the run (if any) and the server this session started."""
        self._refuse_while_tuning("stop the server")
        await self._server_part.stop()

    def set_live_headroom(self, factor: float) -> None:
        """Start the server with max-num-seqs and max-num-batched-tokens ``factor`` times the edited
        ones (those set), then set the edited ones live, so that later raises up to them stay live.
        1 turns it off (the default: headroom changes the KV cache, so every measurement)."""
        if not 1.0 <= factor <= 16.0:
            raise SessionError(f"live headroom {factor:g}: must be from 1 (off) to 16",
                               "e.g. --live-headroom 2 starts at twice the edited limits")
        self._server_part.headroom = float(factor)

    async def apply_flags(self, timeout: float = 600.0, *,
                          force: bool = False) -> StartupFacts | RestartResult | LiveResult:
        """Change the edited flags live where every one can (engine.server.part.ServerPart.apply),
        else restart the server with them (see :meth:`flags_diff` first).

        With no server running this is a start. The server keeps its port, so the URL and
        the telemetry stay (the supervisor's port check tolerates TIME_WAIT sockets).
        """
        self._refuse_while_tuning("apply flags")
        self._refuse_flag_errors("fix the flag before applying")
        return await self._server_part.apply(timeout, force=force)

    def _refuse_flag_errors(self, hint: str) -> None:
        first = self._edited.first_error()
        if first is not None:
            raise SessionError(f"--{first[0]}: {first[1]}", hint)

    def _on_event(self, event: SessionEvent) -> None:
        """What the session's parts report (engine.views.SessionEvent), acted on in one place."""
        match event:
            case Changed():
                pass
            case Notice(text):
                self._notice = text
            case ServerTookFlags(flags):
                # a start or an apply: "dirty" compares against what the server runs now
                self._edited.loaded = flags
            case FlagsRecovered(flags):
                # an attached server's flags read back from its command line: into the editor
                self._edited.take(flags, loaded=True)
            case TuneTookFlags(flags):
                # the tune's winner into the editor, the typed-text errors dropped
                self._edited.take(flags)
            case LimitsSetLive(words, moved):
                self._telemetry_part.mark(words)
                self._runs_part.limits_moved(moved)  # a run going on measured two configurations
            case TuneEnded():
                # the server runs the last configuration tried (or nothing): the view says so
                self._server_part.tune_ended()
        self.changed()

    async def attach(self, url: str) -> AttachedServer:
        """Watch and load a server that is already running (not started here)."""
        self._refuse_while_tuning("attach to another server")
        return await self._server_part.attach(url)

    def attach_server(self, server: AttachedServer) -> None:
        """Use an ``engine.server.attach.AttachedServer`` (already probed) as this session's server."""
        self._server_part.attach_server(server)

    # ------------------------------------------------------------------ telemetry
    # The sampler, the scrape and the series are engine.telemetry.part's; these hand it the server.

    def start_sampling(self) -> None:
        """Sample GPUs and host before any server runs (the Live panel shows them at once)."""
        self._telemetry_part.start_sampling()

    def _start_telemetry(self) -> None:
        """Start the sampler thread (GPU/host) and the /metrics scrape task for the server."""
        if self._telemetry_part.enabled:  # else the server's pid and URL are not asked for
            self._telemetry_part.start(self._server_part.pid(), self._server_part.base_url())

    async def _halt_telemetry(self) -> None:
        """Stop sampling and wait until the scraper's connection is closed."""
        await self._telemetry_part.halt()

    def inject_telemetry(self, snap: TelemetrySnapshot) -> None:
        """Feed a telemetry snapshot by hand (headless tests, replay)."""
        self._telemetry_part.on_telemetry(snap)

    def _clear_series(self, names: tuple[str, ...]) -> None:
        self._telemetry_part.clear(names)

    def _push(self, name: str, value: float) -> None:
        self._telemetry_part.push(name, value)

    # ------------------------------------------------------------------ load runs

    def inject_window(self, window: StatsWindow) -> None:
        """Feed a stats window by hand (headless tests, replay)."""
        self._runs_part.on_window(window)

    @property
    def repeats(self) -> int:
        """How many runs :meth:`run_repeats` (the TUI's ``r``) makes of the workload."""
        return self._repeats

    def set_repeats(self, value: object) -> int:
        """Set how many runs ``r`` makes (1 to engine.presets.MAX_REPEATS; text is read as a
        whole number); SessionError naming what was wrong."""
        if isinstance(value, str):
            text = value.strip()
            try:
                value = int(text)
            except ValueError:
                raise SessionError(f"repeats {text!r}: not a whole number", "e.g. 3") from None
        count = check_repeats(value, lambda reason: SessionError(f"repeats {reason}", "e.g. 3"))
        self.changed()
        self._repeats = count
        self._notice = (f"r runs the workload {count} times: one column of the comparison, an interval over the repeats"
                        if count > 1 else "r runs the workload once")
        return count

    async def run_repeats(self) -> list[RunRecord]:
        """The workload :attr:`repeats` times in a row (engine.runs.series): the TUI's ``r``.
        The repeats are one column of the comparison, each figure with an interval over them."""
        self._refuse_while_tuning("start a load run")
        return await self._runs_part.repeat(self._run_ground, self._repeats)

    async def run_workload(self, label: str | None = None, *, group: int | None = None) -> RunRecord:
        """Run the chosen workload against the server; returns the recorded run.

        The run is :func:`engine.runs.measure.measure`, the same pipeline as `vtui bench`, sweep
        and tune, driven from a thread with its own event loop; this coroutine only waits for
        it. The run is written to the history as it goes. A server that dies mid-run stops
        the run and the measured part is kept (status ``server-died``).
        """
        self._refuse_while_tuning("start a load run")
        return await self._runs_part.run(self._run_ground(), label, group=group)

    def _run_ground(self) -> RunGround:
        """What a load run starts from: the server and the workload, read now."""
        server = self._server_part
        return RunGround(
            base_url=server.base_url(), ready=server.state_name() in ("READY", "ATTACHED"), workload=self._workload,
            arrivals=self._arrivals, slo=self._slo, preset_name=self._preset_name,
            flags=server.running_flags or self._edited.flags, supervisor=server.supervisor,
            model=server.served_model(),
            pid=server.pid(), version=server.version(), name_base=self._workload_label or "run",
            preset_flags=self._edited.preset)

    def _next_run_label(self) -> str:
        """The next run's name: the preset and the flags changed since it (see run_name)."""
        return self._runs_part.next_label(self._run_ground())

    def stop_workload(self, reason: str = "cancelled") -> None:
        """Cancel the run in progress; what was measured so far is kept."""
        self._runs_part.stop(reason)

    def set_baseline(self, index: int | None = None) -> None:
        """Mark a run (default: the last one) as the baseline of the comparison."""
        self._runs_part.set_baseline(index)

    async def sweep(self, presets: Sequence[Preset | str | Path], *, repeats: int | None = None) -> list[RunRecord]:
        """Run several presets in a row, restarting only when the flags differ; ``repeats``
        rounds over them (default: the most any of them asks for, or :attr:`repeats` when more),
        each preset's repeats one column of the comparison."""
        self._refuse_while_tuning("start a sweep")
        found: list[Preset] = []
        for preset in presets:
            try:
                found.append(preset if isinstance(preset, Preset) else find_preset(str(preset)))
            except PresetError as exc:
                raise SessionError(str(exc), "see the Presets list") from None
        if not found:
            raise SessionError("no preset to sweep", "name one or more presets")
        if repeats is None:  # the most any preset asks for, or what n set
            repeats = max([p.repeats for p in found] + [self._repeats])

        async def run(label: str | None, group: int | None) -> RunRecord:
            return await self.run_workload(label, group=group)

        needs_apply = self._flags_to_apply
        if self._server_part.attached_only:
            # As `vtui sweep --url`: an attached server takes no flags, only the workloads run.
            self._notice = "attached server: the presets' flags are not applied; only their workloads run"
            needs_apply = _never
        return await self._runs_part.sweep(
            found, load=self.load_preset, apply=self.apply_flags, run=run,
            needs_apply=needs_apply, repeats=repeats)

    def _flags_to_apply(self) -> bool:
        """True when the server runs nothing known, or other flags than the edited ones."""
        running = self._server_part.running_flags
        return running is None or flags_differ(self._edited.flags, running)

    # ------------------------------------------------------------------ flag search (tune)
    # The search's state, progress and view are engine.tune.part's; these hand it the session.

    def tune_form_defaults(self) -> dict[str, str]:
        """The Tune form's starting text: the session's SLO (else TTFT 500 ms and TPOT
        50 ms), 30 minutes, the default space, rate mode."""
        return self._tune_part.form_defaults(self._slo)

    def tune_percentile(self) -> float:
        """The percentile the SLO is judged at (the session's SLO's, else 99)."""
        return self._tune_part.percentile(self._slo)

    def tune_estimate(self, request: TuneRequest) -> str:
        """What ``request`` is expected to cost on this box before it starts, and what to cut where
        it would not finish within its budget (engine.tune.part.TunePart.estimate)."""
        return self._tune_part.estimate(request, self._tune_ground())

    async def tune(self, request: TuneRequest, *, settings: TuneSettings | None = None) -> TuneResult:
        """Search the flags with the most goodput under ``request.slo`` on this session's
        server and workload (engine.tune.search.Tuner); returns the ``TuneResult``.

        The edited flags are the base every configuration starts from. The server is the
        one started here (one is made when there is none; an attached server is refused):
        the search restarts it with each configuration's flags and leaves it running with
        the last one tried. That is one slot on the GPUs the session sees; with several slots
        (the request's GPUs and parallel, engine.views.TuneRequest: as ``vtui tune
        --gpus --parallel``) or GPUs named, every trial gets a server of its own on its slot's
        GPUs, and the server started here is stopped first. The winner goes into the editor only with
        :meth:`load_tuned_flags`, and the server runs it only after an apply. Progress is in
        the snapshot's ``tune``; the state is saved in the history after every step (resumable headless
        with ``vtui tune --resume ID``). :meth:`stop_tune` ends it as "interrupted".
        ``settings``: an ``engine.tune.search.TuneSettings`` for the knobs the form does not have
        (requests per step, timeouts); the request's mode, budget and start load win.
        """
        return await self._tune_part.run(request, self._tune_ground(), settings=settings)

    def _tune_ground(self) -> TuneGround:
        """What the tune starts from and what may refuse it, read now."""
        snap = self._telemetry_part.latest
        return TuneGround(
            flags=self._edited.flags, flag_errors=dict(self._edited.errors), workload=self._workload,
            arrivals=self._arrivals,
            loading=self.run_active or self._runs_part.sweeping, busy=self._server_part.busy,
            attached=self._server_part.attached_only,
            max_request_len=self._max_request_len(), schema=self.schema(),
            gpus=tuple(g.index for g in snap.gpus) if snap is not None else (), measurer=self._tune_measurer)

    def _tune_server(self, base: FlagSet) -> Supervisor:
        """The server the search restarts: the one started here, else a new one on ``base``."""
        return self._server_part.for_tune(base)

    async def _tune_release(self) -> None:
        """Before a search on servers of its own (several slots, or GPUs named on the form):
        stop the server started here, which would hold a slot's GPUs and share its cores, and
        keep sampling the GPUs (the running trials' rows show theirs)."""
        await self._server_part.stop()
        self._telemetry_part.start(None, None)

    def stop_tune(self) -> bool:
        """Cancel the running search; it is saved as "interrupted" (resumable). False when
        none runs."""
        return self._tune_part.stop()

    def load_tuned_flags(self) -> list[tuple[str, object, object]]:
        """Put the search's winning values into the flag editor (the rest of the edits stay);
        nothing restarts until apply. Returns (flag, old, new) for what changed (values as
        FlagSet holds them: typed per flag, None when unset)."""
        return self._tune_part.load_flags(self._edited.flags)

    def export_tune(self, kind: str) -> str:
        """An export of the search's winner: "docker", "serve", or "results" (the whole
        result as JSON: every configuration, the Pareto points)."""
        return self._tune_part.export(kind)

    def save_tune_export(self, kind: str, path: Path | None = None) -> Path:
        """Write :meth:`export_tune` to ``path`` (default: the data folder's exports)."""
        return self._write_export(f"tune-{kind}", kind, self.export_tune(kind), path)

    # ------------------------------------------------------------------ history

    def _get_history(self) -> History | None:
        return self._runs_part.get_history()

    def advise_last_run(self) -> list[Finding]:
        """The advisor's findings (``engine.advise.advisor.Finding``) for this session's latest
        finished run, read back from the history; never changes a flag or the server.

        Raises SessionError when there is no run yet or the run was not stored.
        """
        runs = self._runs_part.runs
        if not runs:
            raise SessionError("no finished run to advise on", "run a workload first (r)")
        record = runs[-1]
        history = self._get_history()
        if history is None or record.history_id is None:
            raise SessionError(f"run {record.label} was not stored in the history", "the advisor reads runs from it")
        try:
            data = RunData.from_history(history, int(record.history_id))
        except (HistoryError, ValueError) as exc:  # ValueError covers advisor.RunDataError
            raise SessionError(f"cannot read run {record.label} back: {exc}") from exc
        skipped = not_advised(data)  # flags changed live during it: two configurations
        if skipped is not None:
            raise SessionError(f"run {record.label}: {skipped}", "r runs the workload again on the flags set now")
        return list(advise(data))

    # ------------------------------------------------------------------ export

    def export(self, kind: str, run_index: int | None = None) -> str:
        """Text for an export: "docker", "serve", "k8s" (Deployment + Service), "compose",
        "results" (JSON) or "perfetto" (JSON); see engine.runs.export.export_text."""
        return export_text(kind, self._edited.flags, name=self._workload_label, version=self._server_part.version(),
                           runs=self._runs_part.runs,
                           run_index=run_index, history=self._get_history)

    def save_export(self, kind: str, path: Path | None = None) -> Path:
        """Write an export to ``path`` (default: the data folder) and return the path."""
        return self._write_export(kind, kind, self.export(kind), path)

    def _write_export(self, name: str, kind: str, text: str, path: Path | None) -> Path:
        path = write_export(name, kind, text, path, now=self._clock())
        self._notice = f"saved {name} to {path}"
        self.changed()
        return path

    # ------------------------------------------------------------------ shutdown

    async def close(self, *, stop_server: bool = True) -> None:
        """Stop the tune and the run, the sampler and (unless told to leave it) the server started here."""
        # A search still joining its Ray cluster has no task yet: stopping it ends the join.
        task = self._tune_part.task
        if self._tune_part.active and self.stop_tune() and task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), 60)
        await self._runs_part.close()
        await self._halt_telemetry()
        await self._server_part.close(stop_server=stop_server)
        history = self._runs_part.history
        if history is not None:
            history.close()

    # ------------------------------------------------------------------ snapshot

    def comparison(self) -> ComparisonView | None:
        """This session's runs and the stored runs picked in the Runs tab, side by side."""
        return self._runs_part.comparison()

    def stored_runs(self, text: str = "", limit: int = 200) -> tuple[StoredRun, ...]:
        """The run history, newest first, for the Runs tab: runs of any path and session
        (vtui bench, sweep, earlier TUIs). ``text`` filters: every word must appear in the
        run's name, preset, model, date (YYYY-MM-DD) or status. Empty without a history."""
        return self._runs_part.stored_runs(text, limit)

    def load_points(self) -> tuple[LoadPoint, ...]:
        """The compared runs (this session's and the stored ones picked) on the latency-against-
        load plane, by load (engine.runs.compare.load_points): a sweep of loads read as a curve."""
        return self._runs_part.load_points()

    def run_points(self, limit: int = 200) -> tuple[RunPoint, ...]:
        """The stored runs on the throughput-latency plane, frontier marked (engine.runs.compare.run_points)."""
        return self._runs_part.run_points(limit)

    def toggle_stored(self, run_id: int) -> bool:
        """Put a stored run into the comparison, or take it out; True when it is in now."""
        return self._runs_part.toggle_stored(run_id)

    def set_stored_filter(self, text: str) -> None:
        """Filter the Runs tab's stored runs: every word must appear (see :meth:`stored_runs`)."""
        self._stored_filter = text
        self.changed()

    def refresh_stored(self) -> None:
        """Read the history again for the next snapshot (runs written by another process)."""
        self._runs_part.refresh_stored()
        self.changed()

    def snapshot(self) -> SessionSnapshot:
        """The current state, frozen."""
        devices, unavailable = devices_view(self._telemetry_part.latest)
        stored, load_pts, run_pts = self._runs_part.stored_views(self._stored_filter)
        return SessionSnapshot(
            t=self._clock(),
            seq=self._seq,
            model=str(self._edited.flags.model),
            flags=self._edited.flags,
            running_flags=self._server_part.running_flags,
            flag_errors=dict(self._edited.errors),
            flag_warnings=dict(self._edited.warnings),
            dirty=self.dirty,
            workload_label=self._workload_label,
            repeats=self._repeats,
            preset_name=self._preset_name,
            server=self._server_part.view(),
            window=self._runs_part.window,
            devices=devices,
            gpu_unavailable=unavailable,
            server_metrics=server_metrics_view(self._telemetry_part.server_sample, self._telemetry_part.latest),
            series=self._telemetry_part.series(),
            series_marks=self._telemetry_part.marks(),
            live_flags=LIVE_NOTES,
            logs=self._server_part.logs(),
            run=self._runs_part.progress(self._arrivals),
            runs=tuple(self._runs_part.runs),
            baseline=self._runs_part.baseline,
            comparison=self.comparison(),
            notice=self._notice,
            busy="tuning" if self.tune_active and not self._server_part.busy else self._server_part.busy,
            tune=self._tune_part.view(),
            server_config=self._server_config(),
            stored=stored,
            stored_filter=self._stored_filter,
            load_points=load_pts,
            run_points=run_pts,
        )

    def _server_config(self) -> dict[str, FlagValue]:
        """What the server reports of its flags (vllm:cache_config_info), while one is there."""
        sample, live = self._telemetry_part.server_sample, self._server_part
        labels = live.attached.cache_config if live.attached is not None else {}
        if sample is not None and not sample.stale and (live.attached is not None or live.running_flags is not None):
            labels = sample.cache_config or labels
        return server_values({CACHE_CONFIG: labels}, self.schema()) if labels else {}


def _never() -> bool:
    return False
