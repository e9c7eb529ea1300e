"""Start, watch, restart and stop one vLLM server process.

The server leads a process group of its own (so vtui's signals reach all of it, and a
terminal's Ctrl-C does not reach it directly), bound to 127.0.0.1 on a free port unless
told otherwise. Every line it prints goes to subscribers and to one log file per launch.
Readiness is ``/health`` 200 plus ``/v1/models``; after that a watcher reports death (the
process gone, or ``/health`` answering non-200 / refusing connections) within 2 s.

Nothing is left behind: ``stop()`` signals the group and the process tree, then SIGKILLs
what remains; an atexit hook and SIGTERM/SIGHUP handlers do the same when the owning
process is interrupted, and the server's parent is a reaper (``engine.server.procs``) that ends its
group when vtui dies in any way, kill -9 included; unless the user chose to leave it
running (``leave_running``, which can be set at any time). A registry file per server in
``data_dir()/servers/`` lets a later vtui find a server left behind (``find_left_running``),
and ``start`` refuses a second server on its port or GPUs (``ServerAlreadyRunning``).
vtui never signals a process it did not start, and never matches processes by name.

Beside it: what a launch runs (program, argv, environment, port, bind safety) in
``engine.server.launch``, the registry of servers in ``engine.server.registry``, the log lines
read in ``engine.server.logparse``, the reaper and process trees in ``engine.server.procs``.
Their public names are importable from here too, as they were before the split.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import secrets
import shlex
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine import errors, paths
from engine.flags import FlagsLike, background_held
from engine.server import children, procs
from engine.server.children import Child, cleanup_all, install_cleanup_hooks
from engine.server.launch import (
    CLI_ENTRY,
    MODULE_ENTRY,
    STARTS_FILE,
    argv_without_secrets,
    bind_needs_confirmation,
    find_free_port,
    int_or_none,
    is_loopback,
    last_start_seconds,
    live_hook_refusal,
    looks_like_path,
    port_is_free,
    remember_start_seconds,
    runs_module_entry,
    server_api_key,
    server_argv,
    server_env,
    start_key,
    unique_path,
    vllm_program,
)
from engine.server.logparse import LogEvent, Phase, StartupFacts, classify_failure, parse_line, strip_prefix
from engine.server.registry import (
    RegisteredServer,
    ServerAlreadyRunning,
    conflicting_servers,
    devices_label,
    devices_overlap,
    find_left_running,
    list_registered,
    own_create_time,
    psutil_pid_exists,
    registry_dir,
    server_devices,
    write_record,
)

_TAIL_LINES = 400
_HEALTH_INTERVAL_S = 0.5  # with a 1 s timeout, death shows within 2 s
_HEALTH_TIMEOUT_S = 1.0


class ServerState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"  # did not start; ``Supervisor.error`` is a StartupError
    DEAD = "dead"  # was ready, then died; ``Supervisor.error`` is an EngineDied
    STOPPING = "stopping"


@dataclass(frozen=True)
class ServerEvent:
    """Something a server did. ``kind``: "log", "phase", "state", "facts" or "health".

    - log: ``line`` (raw text) and ``parsed`` (``LogEvent`` or None)
    - phase: ``phase``
    - state: ``state`` and, for FAILED/DEAD, ``error``
    - facts: ``facts`` (the accumulated ``StartupFacts``)
    - health: ``message`` (e.g. /health timed out: the server may be hung)
    """

    kind: str
    t: float = field(default_factory=time.time)
    line: str | None = None
    parsed: LogEvent | None = None
    phase: Phase | None = None
    state: ServerState | None = None
    facts: StartupFacts | None = None
    error: Exception | None = None
    message: str | None = None


@dataclass(frozen=True)
class RestartResult:
    downtime_s: float  # from the start of stop() to ready again
    facts: StartupFacts



# --------------------------------------------------------------------------------------------


class Supervisor:
    """One vLLM server: start, watch, restart, stop. Use from one asyncio event loop."""

    def __init__(
        self,
        flags: FlagsLike,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        launcher: Sequence[str] = (),
        log_dir: Path | None = None,
        program: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        leave_running: bool = False,
        allow_public: bool = False,
    ) -> None:
        """``launcher``: argv prefix (a venv's env wrapper, ``docker exec ...``); ``program``: what
        runs vLLM (default ``vllm_program()``); ``env``: extra environment for the server;
        ``allow_public``: the user confirmed binding a non-loopback address without --api-key
        (otherwise ``start`` refuses with ``errors.UnsafeBind``)."""
        self.flags = flags
        self.host = str(flags.get("host") or host)
        self._fixed_port = port if port is not None else int_or_none(flags.get("port"))
        self.port: int | None = self._fixed_port
        self.launcher = tuple(launcher)
        self.program = tuple(program) if program is not None else None
        self.log_dir = log_dir
        self.extra_env = dict(env or {})
        self.allow_public = allow_public
        self._ctl: int | None = None  # write end of the reaper's control pipe while a server runs
        self._registry_path: Path | None = None
        self._leave_running = leave_running
        # The live hook: why this server has none (None: it has one), and the per-launch key its
        # door asks for (in the server's environment and this user's registry file, never argv).
        self.live_refusal: str | None = None
        self.live_key: str | None = None

        self.state = ServerState.STOPPED
        self.phase: Phase | None = None
        self.facts = StartupFacts()
        self.error: Exception | None = None
        self.exit_code: int | None = None
        self.pid: int | None = None
        self.log_path: Path | None = None
        self.command: list[str] = []
        self.started_at: float | None = None  # epoch
        self.ready_at: float | None = None
        self.model_id: str | None = None  # the id /v1/models serves
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)

        self._proc: Child | None = None  # the reaper, the server's parent
        self._reaper: procs.ProcRef | None = None
        self._root: procs.ProcRef | None = None  # the server (vLLM's API process), its group's leader
        self._known: set[procs.ProcRef] = set()
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._subscribers: list[Callable[[ServerEvent], object]] = []
        self._stopping = False

    # ---------------------------------------------------------------- public

    @property
    def leave_running(self) -> bool:
        """Whether the server outlives vtui (exit, signals, kill -9). Can be changed at any time."""
        return self._leave_running

    @leave_running.setter
    def leave_running(self, value: bool) -> None:
        self._leave_running = bool(value)
        if self._ctl is not None:
            with contextlib.suppress(OSError):
                os.write(self._ctl, procs.LEAVE_RUNNING if value else procs.ARM)
        if self._registry_path is not None and self._root is not None:
            with contextlib.suppress(OSError):
                self._write_registry()

    @property
    def devices(self) -> str | None:
        """The GPUs the server sees (CUDA_VISIBLE_DEVICES), None for all of them."""
        return server_devices({**os.environ, **self.extra_env}, self.launcher)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def model(self) -> str:
        """The model name clients send (the served id once ready, else the flag's)."""
        if self.model_id:
            return self.model_id
        served = self.flags.get("served-model-name")
        if isinstance(served, (list, tuple)) and served:
            return str(served[0])
        return str(served) if served else self.flags.model

    def subscribe(self, callback: Callable[[ServerEvent], object]) -> Callable[[], None]:
        """Call ``callback(event)`` for every ``ServerEvent``; returns an unsubscribe function.

        Callbacks run in the event loop's thread and must be quick; an exception in one is
        swallowed so it never stops the log reader.
        """
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    @property
    def api_key(self) -> str | None:
        """The server's API key, wherever it was given (``launch.server_api_key``)."""
        return server_api_key(self.flags, self.extra_env)

    def build_command(self, port: int) -> list[str]:
        """The exact argv that will run (never a shell string); decides ``live_refusal``."""
        program = list(self.program) if self.program is not None else vllm_program()
        self.live_refusal = live_hook_refusal(program, {**os.environ, **self.extra_env})
        return server_argv(self.flags, program=program, launcher=self.launcher, host=self.host, port=port,
                           live_hook=self.live_refusal is None)

    async def start(self, timeout: float = 300.0) -> StartupFacts:
        """Launch and wait for ready. Raises a ``StartupError`` subclass when it does not start."""
        if self.state in (ServerState.STARTING, ServerState.READY, ServerState.STOPPING):
            raise RuntimeError(f"server is {self.state.value}; stop it first")
        await self._torn_down()  # a death's cleanup still running must not touch the new server
        self._reset()
        self._set_state(ServerState.STARTING)
        try:
            with background_held():  # no flag-schema read importing vLLM beside vLLM's own start
                self._precheck()
                await self._launch()
                return await self._wait_ready(timeout)
        except errors.StartupError as exc:
            await self._fail(exc)
            raise
        except BaseException:
            # Cancelled or an unexpected bug: never leave a half-started server behind.
            await self._teardown(timeout=10.0)
            self._set_state(ServerState.STOPPED)
            raise

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group and tree, wait ``timeout``, SIGKILL the rest; nothing remains after."""
        if self._proc is None and self._root is None:
            self._set_state(ServerState.STOPPED)
            return
        if self.state is not ServerState.DEAD and self.state is not ServerState.FAILED:
            self._set_state(ServerState.STOPPING)
        await self._teardown(timeout=timeout)
        self._set_state(ServerState.STOPPED)

    async def restart(self, flags: FlagsLike | None = None, timeout: float = 300.0) -> RestartResult:
        """Stop, then start with ``flags`` (or the same ones). Downtime: stop begin to ready."""
        t0 = time.monotonic()
        await self.stop()
        if flags is not None:
            self.flags = flags
            self._fixed_port = int_or_none(flags.get("port")) or self._fixed_port
        if self._fixed_port is None and self.port is not None:
            self._fixed_port = self.port  # keep the URL clients and scrapers already use
        facts = await self.start(timeout=timeout)
        return RestartResult(downtime_s=time.monotonic() - t0, facts=facts)

    def process_refs(self) -> list[procs.ProcRef]:
        """The live processes of this server (API server, engine core, workers)."""
        if self._root is None:
            return []
        return procs.tree_and_group(self._root, self._root.pid, self._known)

    # ---------------------------------------------------------------- internals

    def _reset(self) -> None:
        self.phase = None
        self.facts = StartupFacts()
        self.error = None
        self.exit_code = None
        self.pid = None
        self.model_id = None
        self.ready_at = None
        self.launched_at: float | None = None  # time.monotonic() of the launch
        self.expected_start_s: float | None = None  # the last start of the same command, to ready
        self.tail.clear()
        self._known.clear()
        self._root = None
        self._stopping = False
        self.port = self._fixed_port

    def _emit(self, event: ServerEvent) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:  # a broken subscriber must not stop the supervisor
                pass

    def _set_state(self, state: ServerState, error: Exception | None = None) -> None:
        if state is self.state and error is None:
            return
        self.state = state
        self._emit(ServerEvent("state", state=state, error=error))

    def _set_phase(self, phase: Phase) -> None:
        if self.phase is None or phase > self.phase:
            self.phase = phase
            self._emit(ServerEvent("phase", phase=phase))

    def _precheck(self) -> None:
        model = self.flags.model
        if looks_like_path(model) and not Path(model).expanduser().exists():
            raise errors.ModelNotFound(f"model folder not found: {model}")
        self._precheck_api_servers()
        if bind_needs_confirmation(self.host, has_api_key=bool(self._auth_headers())) and not self.allow_public:
            raise errors.UnsafeBind(
                f"--host {self.host} lets other machines reach the server, and it has no --api-key"
            )
        conflicts = conflicting_servers(self.host, self.port, self.devices)
        if conflicts:
            raise ServerAlreadyRunning(conflicts)
        if self.port is not None and not port_is_free(self.host, self.port):
            raise errors.PortInUse(f"port {self.port} on {self.host} is already in use")

    def _precheck_api_servers(self) -> None:
        """Refuse ``--api-server-count`` > 1 when vLLM would run through the legacy module entry
        (``python -m vllm.entrypoints.openai.api_server``): that entry starts one API server
        and ignores the flag, so the run would measure one where the flags say several."""
        count = int_or_none(self.flags.get("api-server-count"))
        if count is None or count <= 1:
            return
        if not runs_module_entry(list(self.program) if self.program is not None else vllm_program()):
            return
        raise errors.InvalidFlag(
            f"--api-server-count {count}: this vLLM starts only through python -m {MODULE_ENTRY[1]}, "
            "which runs one API server and ignores the flag",
            hint="Install vLLM so that `vllm serve` runs (the vllm distribution, whose CLI starts several "
            "API servers), or drop --api-server-count.",
        )

    async def _launch(self) -> None:
        if self.port is None:
            self.port = find_free_port(self.host)
        self.command = self.build_command(self.port)
        self.launched_at = time.monotonic()
        self.expected_start_s = last_start_seconds(self._start_key())
        log_dir = self.log_dir or paths.logs_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = unique_path(log_dir / f"vllm-{stamp}-port{self.port}.log")
        with open(self.log_path, "w", encoding="utf-8") as header:
            header.write(f"# vtui launched: {shlex.join(self.command)}\n")
        # Secrets (API key, HF token, the live key) travel in the environment, never in argv (ps, logs).
        self.live_key = secrets.token_urlsafe(32) if self.live_refusal is None else None
        env = server_env(self.flags, self.extra_env, self.live_key)
        install_cleanup_hooks()
        self.started_at = time.time()
        self._set_phase(Phase.LAUNCHING)
        # The server writes its log file itself and we follow the file. Through a pipe, a server
        # outliving vtui (--leave-running) would die on its next log line.
        log_out = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - handed to the child
        # The reaper runs the server and ends its group when vtui dies (engine.server.procs): it reads
        # the control pipe, whose write end only this process holds, and reports the server's pid.
        ctl_r, ctl_w = os.pipe()
        status_r, status_w = os.pipe()
        os.set_blocking(ctl_w, False)
        os.set_blocking(status_r, False)
        argv = procs.reaper_argv(
            self.command, ctl_fd=ctl_r, status_fd=status_w, owner_pid=os.getpid(), leave_running=self.leave_running
        )
        try:
            # subprocess, not asyncio's: an asyncio transport SIGKILLs its child when it is closed
            # or collected (its loop gone, a Supervisor dropped), which would orphan the server
            # from its reaper; a Popen never kills anything.
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # no terminal's Ctrl-C reaches it; vtui decides
                pass_fds=(ctl_r, status_w),
            )
            self._proc = Child(popen)
        except OSError as exc:
            os.close(ctl_w)
            raise errors.ProcessExited(
                f"cannot run the reaper {argv[0]!r}: {exc.strerror or exc}",
                hint="vtui runs its server under its own Python; check that it is still installed.",
            ) from exc
        finally:
            log_out.close()  # the child holds its own descriptor
            os.close(ctl_r)
            os.close(status_w)
        self._ctl = ctl_w
        self._reaper = procs.ProcRef.of(self._proc.pid)
        try:
            status = await self._reaper_status(status_r)
        finally:
            os.close(status_r)
        if not status.startswith("pid "):
            await self._proc.wait()
            self._proc = None
            self._close_ctl()
            reason = status.removeprefix("error ").strip() or "the reaper ended before it started the server"
            raise errors.ProcessExited(
                f"cannot run {self.command[0]!r}: {reason}",
                hint="Check the launcher prefix and that vLLM is installed for that Python.",
            )
        self.pid = int(status.split()[1])
        self._root = procs.ProcRef.of(self.pid) or procs.ProcRef(self.pid, time.time())
        children.OWNED.add(self)
        self._write_registry()
        self._reader = asyncio.create_task(self._follow_log(self._proc, self.log_path))

    async def _reaper_status(self, fd: int, timeout: float = 30.0) -> str:
        """The reaper's one status line ("pid N" or "error TEXT"); "" when it ended without one."""
        assert self._proc is not None
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n"):
            try:
                chunk = os.read(fd, 256)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    # Never started the server (a box too loaded to run Python for 30 s?).
                    with contextlib.suppress(ProcessLookupError):
                        self._proc.kill()
                    return ""
                await asyncio.sleep(0.01)
                continue
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace").strip()

    def _close_ctl(self) -> None:
        ctl, self._ctl = self._ctl, None
        if ctl is not None:
            with contextlib.suppress(OSError):
                os.close(ctl)

    async def _follow_log(self, proc: Child, path: Path) -> None:
        """Every line the server writes to its log file, as it comes (polled every 50 ms)."""
        with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
            handle.readline()  # our "# vtui launched" header
            partial = ""
            while True:
                chunk = handle.readline()
                if chunk:
                    partial += chunk
                    if partial.endswith("\n") or len(partial) > 1_000_000:
                        self._on_line(partial.rstrip("\n"))
                        partial = ""
                    continue
                if proc.returncode is not None:
                    # One more read: the exit can be seen before its last lines are.
                    rest = handle.read()
                    for line in (partial + rest).splitlines():
                        self._on_line(line)
                    return
                await asyncio.sleep(0.05)

    def _on_line(self, line: str) -> None:
        self.tail.append(line)
        parsed = parse_line(line)
        self._emit(ServerEvent("log", line=line, parsed=parsed))
        if parsed is None:
            return
        if parsed.phase is not None and self.state is ServerState.STARTING:
            self._set_phase(parsed.phase)
        if parsed.facts:
            self.facts = self.facts.merge(parsed.facts)
            self._emit(ServerEvent("facts", facts=self.facts))
        if parsed.pid is not None and parsed.process and parsed.process != "APIServer":
            ref = procs.ProcRef.of(parsed.pid)
            if ref is not None:
                self._known.add(ref)

    async def _wait_ready(self, timeout: float) -> StartupFacts:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        async with _client() as client:
            while True:
                if self._proc.returncode is not None:
                    await self._drain_reader()
                    self.exit_code = self._proc.returncode
                    raise classify_failure(list(self.tail), self.exit_code, log_path=str(self.log_path))
                if await self._probe_ready(client):
                    break
                if time.monotonic() > deadline:
                    phase = self.phase.label if self.phase is not None else "launching"
                    last = self.tail[-1] if self.tail else ""
                    raise errors.StartupTimeout(
                        f"not ready after {timeout:.0f} s, stuck in phase: {phase}",
                        vllm_line=last,
                        log_path=str(self.log_path),
                    )
                await asyncio.sleep(0.5)
        self.ready_at = time.time()
        if self.launched_at is not None:
            remember_start_seconds(self._start_key(), time.monotonic() - self.launched_at)
        self._set_phase(Phase.READY)
        self._set_state(ServerState.READY)
        self._watcher = asyncio.create_task(self._watch())
        return self.facts

    def _start_key(self) -> str:
        """The same model and flags (not the port vtui picks) start alike: one key."""
        return start_key(self.flags)

    async def _probe_ready(self, client: httpx.AsyncClient) -> bool:
        try:
            health = await client.get(self.base_url + "/health", timeout=2.0)
            if health.status_code != 200:
                return False
            # /health is open, but /v1/models needs the key when the server has --api-key
            # (a server started with a key never read as ready before).
            models = await client.get(self.base_url + "/v1/models", timeout=5.0, headers=self._auth_headers())
            if models.status_code != 200:
                return False
            data = models.json().get("data") or []
            if not data:
                return False
            self.model_id = str(data[0].get("id") or "") or None
            return True
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return False

    def _auth_headers(self) -> dict[str, str]:
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _watch(self) -> None:
        """After ready: report death (process exit at once; /health failing within 2 s)."""
        assert self._proc is not None
        proc = self._proc
        exit_task = asyncio.create_task(proc.wait())
        try:
            async with _client() as client:
                transport_failures = 0
                while not exit_task.done():
                    reason: str | None = None
                    try:
                        r = await client.get(self.base_url + "/health", timeout=_HEALTH_TIMEOUT_S)
                        transport_failures = 0
                        if r.status_code != 200:
                            reason = f"/health answered {r.status_code}"
                    except httpx.TimeoutException:
                        # Slow or hung (SIGSTOP, overload): not dead, but say so.
                        self._emit(ServerEvent("health", message="/health timed out (server busy or hung)"))
                    except httpx.HTTPError as exc:
                        # One dropped connection under load (RemoteProtocolError) happens to a
                        # healthy server on a busy 2-core box; two in a row while the process
                        # lives mean it stopped serving. Still inside the 2 s promise.
                        transport_failures += 1
                        if transport_failures >= 2:
                            reason = f"/health failed twice: {type(exc).__name__}"
                        else:
                            self._emit(ServerEvent("health", message=f"/health failed once: {type(exc).__name__}"))
                    if exit_task.done():
                        break
                    if reason is not None and not self._stopping:
                        await self._died(reason)
                        return
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(exit_task), _HEALTH_INTERVAL_S)
            if not self._stopping:
                await self._died(f"the server process exited with code {proc.returncode}")
        finally:
            if not exit_task.done():
                exit_task.cancel()

    async def _died(self, reason: str) -> None:
        if self._stopping or self.state is not ServerState.READY:
            return
        assert self._proc is not None
        if self._proc.returncode is not None:
            self.exit_code = self._proc.returncode
        last_error = next(
            (line for line in reversed(self.tail) if (p := parse_line(line)) is not None and p.is_error), ""
        )

        err = errors.EngineDied(
            f"the server died: {reason}", vllm_line=strip_prefix(last_error), exit_code=self.exit_code
        )
        self.error = err
        self._set_state(ServerState.DEAD, err)
        # Reap what is left (an orphaned engine core keeps memory); it is ours.
        self._watcher = None
        await self._teardown(timeout=2.0)
        # (No state change here: a stop() that ran during the teardown has set STOPPED,
        # and setting DEAD again after it left a stopped server reading DEAD.)

    async def _fail(self, exc: errors.StartupError) -> None:
        self.error = exc
        if exc.log_path is None and self.log_path is not None:
            exc.log_path = str(self.log_path)
        await self._teardown(timeout=5.0)
        self._set_state(ServerState.FAILED, exc)

    async def _drain_reader(self, timeout: float = 3.0) -> None:
        if self._reader is not None and not self._reader.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), timeout)

    _tearing: asyncio.Future[None] | None = None  # the teardown in progress, if any

    async def _torn_down(self) -> None:
        """Wait for a teardown in progress (the one a death starts runs in the watcher)."""
        tearing = self._tearing
        if tearing is not None and not tearing.done():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(tearing)

    async def _teardown(self, timeout: float) -> None:
        """Stop the process tree (if any), reap, close the log, drop the registry file.

        One at a time: a death's teardown (2 s grace) could still be closing the old reaper's
        control pipe and clearing the process fields when a quick restart had launched the
        new server, whose reaper then read EOF and ended it (exit -15 before ready)."""
        await self._torn_down()
        tearing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tearing = tearing
        try:
            await self._teardown_now(timeout)
        finally:
            tearing.set_result(None)

    async def _teardown_now(self, timeout: float) -> None:
        self._stopping = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        if self._root is not None:
            root, known = self._root, set(self._known)
            left = await asyncio.to_thread(procs.terminate_tree, root, root.pid, known=known, timeout=timeout)
            if left:
                self._emit(ServerEvent("health", message=f"processes survived SIGKILL: {left}"))
        if self._proc is not None:
            wait_s = 5.0
            if self._root is None:
                # Cancelled before the reaper said which pid the server has: closing the control
                # pipe makes the reaper end the server's group itself (its grace, then SIGKILL).
                self._close_ctl()
                wait_s = procs.REAPER_GRACE_S + 3.0
            # The reaper ends as soon as the server has; should it not, it is our own child.
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                await asyncio.wait_for(self._proc.wait(), wait_s)
            if self._proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._proc.wait(), 2.0)
            if self._proc.returncode is not None and self.exit_code is None:
                self.exit_code = self._proc.returncode
        self._close_ctl()
        await self._drain_reader(2.0)
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        self._reader = None
        self._remove_registry()
        self._proc = None
        self._root = None
        self._reaper = None
        children.OWNED.discard(self)

    def kill_sync(self) -> None:
        """Blocking stop for atexit / signal handlers (no event loop needed)."""
        if self.leave_running or self._root is None:
            return
        procs.terminate_tree(self._root, self._root.pid, known=set(self._known), timeout=5.0)
        self._remove_registry()

    def _write_registry(self) -> None:
        assert self._root is not None
        try:
            flag_dict = self.flags.to_dict()
            json.dumps(flag_dict)
        except (TypeError, ValueError):
            flag_dict = {"model": self.flags.model, "argv": argv_without_secrets(self.flags)}
        record = {
            "pid": self._root.pid,
            "pgid": self._root.pid,
            "create_time": self._root.create_time,
            "url": self.base_url,
            "host": self.host,
            "port": self.port,
            "devices": self.devices,
            "model": self.flags.model,
            "flags": flag_dict,
            "command": self.command,
            "started": self.started_at,
            "log_path": str(self.log_path),
            "owner_pid": os.getpid(),
            "owner_create_time": own_create_time(),
            "leave_running": self.leave_running,
            "reaper_pid": self._reaper.pid if self._reaper is not None else None,
            "reaper_create_time": self._reaper.create_time if self._reaper is not None else None,
            "live_key": self.live_key,  # the file is this user's alone (write_record)
            "live_off": self.live_refusal,
        }
        self._registry_path = write_record(record)

    def _remove_registry(self) -> None:
        if self._registry_path is not None:
            with contextlib.suppress(OSError):
                self._registry_path.unlink()
            self._registry_path = None


def _client() -> httpx.AsyncClient:
    # trust_env=False: a proxy from the environment must never see loopback traffic.
    return httpx.AsyncClient(trust_env=False)


# Names that live in engine.server.launch and engine.server.registry, imported from here by callers
# (and FlagsLike, which engine.flags defines).
__all__ = [
    "CLI_ENTRY",
    "MODULE_ENTRY",
    "STARTS_FILE",
    "FlagsLike",
    "RegisteredServer",
    "RestartResult",
    "ServerAlreadyRunning",
    "ServerEvent",
    "ServerState",
    "Supervisor",
    "bind_needs_confirmation",
    "cleanup_all",
    "conflicting_servers",
    "devices_label",
    "devices_overlap",
    "find_free_port",
    "find_left_running",
    "install_cleanup_hooks",
    "is_loopback",
    "last_start_seconds",
    "list_registered",
    "port_is_free",
    "psutil_pid_exists",
    "registry_dir",
    "remember_start_seconds",
    "runs_module_entry",
    "server_devices",
    "vllm_program",
]
