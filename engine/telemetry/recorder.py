"""Sampler thread + /metrics scrape loop + store, wired together for one run.

For headless callers (``vtui bench``) and the TUI alike::

    async with TelemetryRecorder(server.base_url, root_pid=server.pid) as rec:
        t0 = time.time()
        await load_run.run(...)
        t1 = time.time()
    result["telemetry"] = {"summary": rec.summary(t0, t1).to_dict(), "series": rec.store.to_dict(t0, t1)}

The server is scraped once when the recorder starts and once when it stops, so the
whole-run server-side percentiles (first to last histogram) cover the entire run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from types import TracebackType

from engine.telemetry.metrics import MetricsScraper, ServerSample
from engine.telemetry.nvml import NvmlReader
from engine.telemetry.sampler import DEFAULT_INTERVAL_S, Sampler, TelemetrySnapshot, scrape_loop
from engine.telemetry.store import SeriesStore
from engine.telemetry.summary import TelemetrySummary, summarize


class TelemetryRecorder:
    """Records GPU, host and (when ``base_url`` is given) server samples into one store.

    ``on_snapshot`` runs in the sampler thread (from Textual: only ``post_message``);
    ``on_server`` runs on the event loop that started the recorder.
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        root_pid: int | None = None,
        devices: Sequence[int | str] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        scrape_interval_s: float = 1.0,
        store: SeriesStore | None = None,
        nvml: NvmlReader | None = None,
        scraper: MetricsScraper | None = None,
        on_snapshot: Callable[[TelemetrySnapshot], None] | None = None,
        on_server: Callable[[ServerSample], None] | None = None,
    ) -> None:
        self.store = store if store is not None else SeriesStore()
        self._on_snapshot = on_snapshot
        self._on_server = on_server
        self.sampler = Sampler(self._snapshot, interval_s=interval_s, root_pid=root_pid, nvml=nvml, devices=devices)
        self.scraper = scraper if scraper is not None or base_url is None else MetricsScraper(base_url)
        self._scrape_interval_s = scrape_interval_s
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _snapshot(self, snap: TelemetrySnapshot) -> None:
        self.store.add_snapshot(snap.gpus, snap.host, snap.gpu_unavailable)
        if self._on_snapshot is not None:
            self._on_snapshot(snap)

    def _server(self, sample: ServerSample) -> None:
        self.store.add_server(sample)
        if self._on_server is not None:
            self._on_server(sample)

    def set_root_pid(self, pid: int | None) -> None:
        """Follow the server's new process tree after a restart."""
        self.sampler.set_root_pid(pid)

    async def start(self) -> None:
        """Take the first server scrape (the run's baseline), then start both loops."""
        self.sampler.start()
        if self.scraper is not None:
            self._server(await self.scraper.scrape())
            self._stop.clear()
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        assert self.scraper is not None
        await asyncio.sleep(self._scrape_interval_s)
        await scrape_loop(self.scraper, self._server, interval_s=self._scrape_interval_s, stop=self._stop)

    async def stop(self) -> None:
        """Stop both loops, take a last scrape, close the HTTP client (idempotent)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            if self.scraper is not None:
                self._server(await self.scraper.scrape())
        # Joining the thread blocks for at most one tick's sample (a few ms).
        await asyncio.to_thread(self.sampler.stop)
        if self.scraper is not None:
            await self.scraper.aclose()

    def summary(self, t0: float | None = None, t1: float | None = None) -> TelemetrySummary:
        """The run summary over [t0, t1]."""
        return summarize(self.store, t0, t1)

    async def __aenter__(self) -> TelemetryRecorder:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
