"""Host CPU and memory, and the vLLM server's process tree, through psutil.

On the CPU backend the "GPU" is the host, so these are the numbers that matter there.
psutil's cpu_percent is a delta since the previous call on the same object, so the
Process objects are kept between samples; the first reading of a new process is 0.0
and is reported as None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

# How long a server's process tree is reused before its descendants are looked up again.
TREE_REFRESH_S = 5.0


@dataclass(frozen=True, slots=True)
class HostSample:
    """The host and (optionally) one process tree at one instant."""

    t: float
    cpu_percent: float  # whole machine, 0..100 (mean over cores)
    cpu_count: int
    mem_used_bytes: int
    mem_total_bytes: int
    mem_available_bytes: int
    proc_root_pid: int | None = None
    proc_alive: bool = False
    proc_count: int = 0  # processes in the tree (root + descendants)
    proc_rss_bytes: int | None = None  # summed resident set size of the tree
    proc_cpu_percent: float | None = None  # summed, of one core (a busy tree on 2 cores reads up to 200)
    # The busiest of the server's API server processes, of one core (:func:`is_front`): the
    # frontend that turns every sequence's tokens into text and server-sent events. At a high
    # concurrency this one Python process, not the GPU, can set the streams' pace.
    proc_front_cpu_percent: float | None = None
    # How many API server processes the tree has: those titled ``VLLM::APIServer_N`` (vLLM's
    # --api-server-count N), or 1 for a tree with none of those titles (one API server, the
    # interpreter's name). None without a tree.
    proc_front_procs: int | None = None


def is_front(name: str) -> bool:
    """Whether a process of a vLLM server's tree, by its name, may be an API server: vLLM
    titles its other processes ``VLLM::EngineCore``, ``VLLM::Worker...`` (and several API
    servers ``VLLM::APIServer_N``); the single API server keeps the interpreter's name (so
    does an idle helper, such as vtui's reaper, whose CPU is nil beside it)."""
    return is_api_server(name) or not name.startswith("VLLM::")


def is_api_server(name: str) -> bool:
    """Whether a process is one of several API servers vLLM titled ``VLLM::APIServer_N`` (its comm
    keeps 15 characters: ``VLLM::APIServer``)."""
    return name.startswith("VLLM::APIServer")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``); False where
    there is no such call. Python frees an object's memory to the C heap, which keeps it resident:
    a run's requests read back from the history (the noise bootstrap) and the run's own per-request
    records come and go on several threads' heaps, and a session held ~40 MB of such free pages
    after three 1-minute runs at 150 req/s (issue 35; /proc VmRSS against malloc_trim). A few ms."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class HostSampler:
    """Takes :class:`HostSample` readings; keeps psutil.Process objects between calls."""

    def __init__(self, root_pid: int | None = None) -> None:
        self._root_pid = root_pid
        self._procs: dict[int, psutil.Process] = {}
        self._tree_t = 0.0
        self._pids: frozenset[int] = frozenset()
        self._cpu_count = psutil.cpu_count() or 1
        # Our own baseline rather than psutil.cpu_percent(interval=None), whose baseline
        # is module-global: two samplers (TUI and a bench) would steal each other's deltas.
        self._cpu_times = psutil.cpu_times()

    @property
    def root_pid(self) -> int | None:
        """The process tree being watched (the vLLM server's pid), or None."""
        return self._root_pid

    def set_root(self, pid: int | None) -> None:
        """Watch another process tree (after a server restart), or none."""
        if pid != self._root_pid:
            self._root_pid = pid
            self._procs = {}
            self._pids = frozenset()

    def tree_pids(self) -> frozenset[int]:
        """Pids of the tree seen at the last sample (for NVML's per-process memory)."""
        return self._pids

    def sample(self, t: float | None = None) -> HostSample:
        """One reading; never raises for a vanished process."""
        now = time.time() if t is None else t
        vm = psutil.virtual_memory()
        base = HostSample(
            t=now,
            cpu_percent=self._machine_cpu_percent(),
            cpu_count=self._cpu_count,
            mem_used_bytes=int(vm.total - vm.available),
            mem_total_bytes=int(vm.total),
            mem_available_bytes=int(vm.available),
            proc_root_pid=self._root_pid,
        )
        if self._root_pid is None:
            return base
        tree = self._tree()
        if tree is None:
            self._procs, self._pids = {}, frozenset()
            return base
        rss = 0
        cpu = 0.0
        front: float | None = None
        api_servers = 0
        alive: dict[int, psutil.Process] = {}
        for proc in tree:
            cached = self._procs.get(proc.pid)
            # Process equality includes create time, so a reused pid is a new process.
            if cached is not None and cached == proc:
                proc = cached
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    pct = proc.cpu_percent(interval=None)
                    name = proc.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            cpu += pct
            api_servers += is_api_server(name)
            if is_front(name) and proc.pid in self._procs:  # a new process has no CPU baseline yet
                front = max(front or 0.0, pct)
            alive[proc.pid] = proc
        root_fresh = self._root_pid not in self._procs
        self._procs = alive
        self._pids = frozenset(alive)
        if not alive:
            return base
        return HostSample(
            t=base.t,
            cpu_percent=base.cpu_percent,
            cpu_count=base.cpu_count,
            mem_used_bytes=base.mem_used_bytes,
            mem_total_bytes=base.mem_total_bytes,
            mem_available_bytes=base.mem_available_bytes,
            proc_root_pid=self._root_pid,
            proc_alive=self._root_pid in alive,
            proc_count=len(alive),
            proc_rss_bytes=rss,
            # A process seen for the first time has no CPU baseline yet; a tree whose
            # root is new reads as unknown rather than a misleading 0 %.
            proc_cpu_percent=None if root_fresh else cpu,
            proc_front_cpu_percent=None if root_fresh else front,
            proc_front_procs=api_servers or 1,
        )

    def _machine_cpu_percent(self) -> float:
        prev, cur = self._cpu_times, psutil.cpu_times()
        self._cpu_times = cur

        def idle(t: object) -> float:
            return float(getattr(t, "idle", 0.0)) + float(getattr(t, "iowait", 0.0))

        def total(t: object) -> float:
            # guest time is already counted in user time on Linux (psutil does the same)
            return float(sum(t)) - float(getattr(t, "guest", 0.0)) - float(getattr(t, "guest_nice", 0.0))  # type: ignore[call-overload]  # a psutil namedtuple

        all_delta = total(cur) - total(prev)
        if all_delta <= 0:
            return 0.0
        busy = all_delta - (idle(cur) - idle(prev))
        return min(max(100.0 * busy / all_delta, 0.0), 100.0)

    def _tree(self) -> list[psutil.Process] | None:
        """The root and its descendants. Finding descendants reads every process's stat file
        (psutil's ppid map): on a busy 2-core box that was a third of `vtui bench`'s own CPU,
        taken from the server it measures. A server's tree is set once it runs, so the last
        one is reused for TREE_REFRESH_S while all its processes live."""
        assert self._root_pid is not None
        now = time.monotonic()
        cached = list(self._procs.values())
        if (cached and now - self._tree_t < TREE_REFRESH_S and self._root_pid in self._procs
                and all(p.is_running() for p in cached)):
            return cached
        try:
            root = psutil.Process(self._root_pid)
            tree = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        self._tree_t = now
        return tree
