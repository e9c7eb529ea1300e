"""Process-tree helpers: find, signal and wait for exactly the processes vtui started.

vtui never matches processes by name. A process is identified by (pid, create_time), so a
recycled pid is never mistaken for ours, and a server's processes are found by its process
group (the server is started in its own session, so its group id is its pid) plus its
descendants (in case one of them moved to another group).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ProcRef:
    """One process, pinned by its start time so a recycled pid never matches."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcRef | None:
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    def process(self) -> psutil.Process | None:
        """The live process, or None when it is gone (or the pid now belongs to another one)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.05:
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
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                found.append(ProcRef(proc.info["pid"], proc.info["create_time"]))
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
            out.append(ProcRef(child.pid, child.create_time()))
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
