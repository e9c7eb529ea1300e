"""The session's live telemetry: the sampler thread, the /metrics scrape and the sparklines.

A :class:`TelemetryPart` is owned by an ``engine.session.Session``. It starts and stops
the GPU/host sampler (a thread: NVML and psutil block) and the server's /metrics scrape
(a task on the session's loop), keeps the latest sample of each, feeds the session's
``SeriesStore`` and keeps the short series the Live panel draws as sparklines.

Threads: the sampler thread, a load run's thread and the UI loop push points while the
snapshot copies them, so every access to the series holds one lock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from engine.events import CHANGED, Emit
from engine.telemetry.metrics import MetricsScraper
from engine.telemetry.sampler import Sampler, scrape_loop
from engine.telemetry.view import devices_view

if TYPE_CHECKING:
    # For the annotations only (engine.telemetry.store, which imports numpy, is imported where it is used).
    from engine.telemetry.metrics import ServerSample
    from engine.telemetry.sampler import TelemetrySnapshot
    from engine.telemetry.store import SeriesStore



class SampleSink(Protocol):
    """Where a telemetry sample goes while a load run records (engine.runs.history.Recording:
    the runs room is above this one, so its recording is named by what it takes)."""

    def add_sample(self, kind: str, t: float, data: object) -> None: ...


# Sparklines show the last 120 points: one minute at the 2 Hz telemetry rate.
SERIES_POINTS = 120


MARKS_KEPT = 10  # live changes remembered for the charts' marks


class TelemetryPart:
    """The sampler, the scrape, their latest samples and the sparkline series of one session."""

    def __init__(self, *, enabled: bool, emit: Emit,
                 recording: Callable[[], SampleSink | None]) -> None:
        """``enabled``: False never starts a sampler or a scrape (tests, replay).
        ``emit``: reports to the session (engine.events.Changed). ``recording``: the history
        recording of the load run in progress, or None; it gets every telemetry sample."""
        # here, not at the top: engine.telemetry.store imports numpy, kept off `import engine.session`
        from engine.telemetry.store import SeriesStore

        self._enabled = enabled
        self._emit = emit
        self._recording = recording
        self.store: SeriesStore = SeriesStore()
        self.latest: TelemetrySnapshot | None = None  # the sampler's last snapshot
        self.server_sample: ServerSample | None = None  # the last /metrics scrape
        self._sampler: Sampler | None = None
        self._scrape_task: asyncio.Task[None] | None = None
        self._scrape_stop: asyncio.Event | None = None
        # Sparkline series, pushed from the sampler thread, the run's thread and the UI loop
        # while snapshot() copies them: every access holds the lock (a dict changed while
        # iterated raised RuntimeError and stopped the screen's updates without a word).
        self._series: dict[str, collections.deque[float]] = {}
        self._series_lock = threading.Lock()
        self._pushed: collections.Counter[str] = collections.Counter()  # points ever pushed, per series
        self._marks: collections.deque[tuple[dict[str, int], str]] = collections.deque(maxlen=MARKS_KEPT)

    @property
    def enabled(self) -> bool:
        """False when this session never samples (tests, replay)."""
        return self._enabled

    # ------------------------------------------------------------------ sampler and scrape

    def start_sampling(self) -> None:
        """Sample GPUs and host before any server runs (the Live panel shows them at once)."""
        if self._sampler is None and self._enabled:
            self._sampler = Sampler(self.on_telemetry, root_pid=None)
            self._sampler.start()

    def start(self, root_pid: int | None, base_url: str | None) -> None:
        """Start the sampler thread (GPU/host, following the process tree of ``root_pid``)
        and, with a ``base_url``, the /metrics scrape task."""
        if not self._enabled:
            return
        self.stop()

        self._sampler = Sampler(self.on_telemetry, root_pid=root_pid)
        self._sampler.start()
        if base_url:
            self._scrape_stop = asyncio.Event()
            # Kept referenced here and cancelled in stop().
            self._scrape_task = asyncio.get_running_loop().create_task(
                self._scrape(base_url, self._scrape_stop), name="vtui-metrics-scrape"
            )

    async def _scrape(self, base_url: str, stop: asyncio.Event) -> None:
        scraper = MetricsScraper(base_url)
        try:
            await scrape_loop(scraper, self.on_server_sample, interval_s=1.0, stop=stop)
        finally:
            # Close our keep-alive connection from this side before the server stops:
            # a server-side close leaves TIME_WAIT sockets on its port, and the
            # supervisor's restart on the same port then reads "port in use".
            await scraper.aclose()

    async def halt(self) -> None:
        """Stop sampling and wait until the scraper's connection is closed."""
        task = self._scrape_task
        self.stop()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def stop(self) -> None:
        """Stop the sampler and the scrape without waiting for them."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()
        task, self._scrape_task = self._scrape_task, None
        if self._scrape_stop is not None:
            self._scrape_stop.set()
        if task is not None:
            task.cancel()

    # ------------------------------------------------------------------ samples

    def on_telemetry(self, snap: TelemetrySnapshot) -> None:
        """Sampler thread callback: keep the latest snapshot and extend the sparklines."""
        self.latest = snap
        self.store.add_snapshot(snap.gpus, snap.host, snap.gpu_unavailable)
        recording = self._recording()
        if recording is not None:
            recording.add_sample("telemetry", snap.t, snap)
        devices, _ = devices_view(snap)
        if devices:
            if devices[0].util_pct is not None:
                self.push("util", devices[0].util_pct)
            if devices[0].mem_used_gib is not None:
                self.push("mem", devices[0].mem_used_gib)
        self._emit(CHANGED)

    def on_server_sample(self, sample: ServerSample) -> None:
        """A /metrics scrape (on the session's loop)."""
        self.server_sample = sample
        self.store.add_server(sample)
        if sample.kv_cache_usage is not None:
            self.push("kv", sample.kv_cache_usage * 100)
        if sample.running is not None:
            self.push("running", sample.running)
        self._emit(CHANGED)

    # ------------------------------------------------------------------ series

    def clear(self, names: tuple[str, ...]) -> None:
        """Drop the named series (a new run starts its own afresh)."""
        with self._series_lock:
            for name in names:
                self._series.pop(name, None)

    def series(self) -> dict[str, tuple[float, ...]]:
        """A copy of every series, for the snapshot."""
        with self._series_lock:
            return {k: tuple(v) for k, v in self._series.items()}

    def mark(self, words: str) -> None:
        """A moment to mark on the series (a live limit change), from any thread."""
        with self._series_lock:
            self._marks.append((dict(self._pushed), words))

    def marks(self) -> dict[str, tuple[tuple[int, str], ...]]:
        """Per series, the marks still within its points: (points since the mark, words), oldest first."""
        with self._series_lock:
            out: dict[str, tuple[tuple[int, str], ...]] = {}
            for name, series in self._series.items():
                seen = tuple((self._pushed[name] - at.get(name, 0), words) for at, words in self._marks
                             if self._pushed[name] - at.get(name, 0) < len(series))
                if seen:
                    out[name] = seen
            return out

    def push(self, name: str, value: float) -> None:
        """Append a point to a series (made on its first point), from any thread."""
        with self._series_lock:
            self._pushed[name] += 1
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = collections.deque(maxlen=SERIES_POINTS)
            series.append(float(value))
