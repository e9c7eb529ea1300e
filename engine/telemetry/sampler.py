"""The sampler thread (GPU + host) and the async server-scrape loop.

NVML and psutil calls block (1 to 5 ms each), so they run in one thread that takes
one sample per tick and hands a frozen :class:`TelemetrySnapshot` to a callback. The
thread is the only one sampling, so at most one sample is ever in flight; a tick
that overruns makes the next tick start late instead of piling samples up. From a
Textual app the callback must only ``post_message``.

The server's ``/metrics`` is async I/O, so it is scraped by :func:`scrape_loop` on
the caller's event loop (a Textual worker in the TUI, the bench command's loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.telemetry.host import HostSample, HostSampler
from engine.telemetry.nvml import GpuSample, GpuUnavailable, NvmlReader

if TYPE_CHECKING:
    # Only for annotations: the sampler thread itself needs neither httpx nor
    # prometheus_client, so GPU boxes can run it with psutil and NVML alone.
    from engine.telemetry.metrics import MetricsScraper, ServerSample

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5  # 2 Hz


@dataclass(frozen=True)
class TelemetrySnapshot:
    """One sampler tick: every visible GPU and the host, all stamped ``t`` (epoch s)."""

    t: float
    gpus: tuple[GpuSample, ...]
    host: HostSample | None
    gpu_unavailable: GpuUnavailable | None  # set when there are no GPU readings at all
    sample_cost_s: float  # wall time the tick itself took


class Sampler:
    """A daemon thread sampling GPUs and host at a fixed rate.

    ``callback`` runs in the sampler thread; an exception in it is logged and the
    thread keeps going. ``root_pid`` is the vLLM server's pid: its process tree gets
    RSS/CPU and per-GPU memory attributed to it. ``nvml`` and ``host`` are injectable
    (tests pass an ``NvmlReader`` over a fake NVML module).
    """

    def __init__(
        self,
        callback: Callable[[TelemetrySnapshot], None],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        root_pid: int | None = None,
        nvml: NvmlReader | None = None,
        host: HostSampler | None = None,
        devices: Sequence[int | str] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"sampler interval must be > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self._callback = callback
        self._nvml = nvml if nvml is not None else NvmlReader(devices=devices)
        self._host = host if host is not None else HostSampler(root_pid)
        if root_pid is not None:
            self._host.set_root(root_pid)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._root_lock = threading.Lock()
        self._pending_root: tuple[int | None] | None = None
        self.ticks = 0

    def set_root_pid(self, pid: int | None) -> None:
        """Follow a new server process tree (after a restart); applied on the next tick."""
        with self._root_lock:
            self._pending_root = (pid,)

    def sample_once(self) -> TelemetrySnapshot:
        """Take one snapshot in the calling thread (the loop does exactly this)."""
        start = time.perf_counter()
        with self._root_lock:
            pending, self._pending_root = self._pending_root, None
        if pending is not None:
            self._host.set_root(pending[0])
        t = time.time()
        host = self._host.sample(t)
        unavailable = self._nvml.status()
        gpus = self._nvml.sample(self._host.tree_pids(), t) if unavailable is None else ()
        return TelemetrySnapshot(t, gpus, host, unavailable, time.perf_counter() - start)

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vtui-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for the sample in flight to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                snap = self.sample_once()
                self.ticks += 1
                self._callback(snap)
            except Exception:  # noqa: BLE001 - the thread must outlive a bad callback
                log.exception("telemetry sampler tick failed")
            next_tick += self.interval_s
            now = time.monotonic()
            if next_tick < now:  # overran: skip the missed ticks rather than burst
                next_tick = now
            self._stop.wait(next_tick - now)


async def scrape_loop(
    scraper: MetricsScraper,
    on_sample: Callable[[ServerSample], object] | Callable[[ServerSample], Awaitable[object]],
    *,
    interval_s: float = 1.0,
    stop: asyncio.Event | None = None,
) -> None:
    """Scrape ``/metrics`` every ``interval_s`` until ``stop`` is set or the task is cancelled.

    ``on_sample`` may be a plain function or a coroutine function. Failed scrapes are
    delivered as stale samples, so the loop itself never dies on a server problem.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    next_tick = loop.time()
    while not stop.is_set():
        sample = await scraper.scrape()
        result = on_sample(sample)
        if asyncio.iscoroutine(result):
            await result
        next_tick = max(next_tick + interval_s, loop.time())
        try:
            await asyncio.wait_for(stop.wait(), timeout=next_tick - loop.time())
        except TimeoutError:
            pass
