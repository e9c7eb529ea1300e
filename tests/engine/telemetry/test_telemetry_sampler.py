"""Sampler thread (fake NVML: no NVIDIA GPU here; real psutil) and the async scrape loop."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from fake_nvml import FakeNvml, NVMLError_DriverNotLoaded

from engine.telemetry.host import HostSampler
from engine.telemetry.metrics import ServerSample
from engine.telemetry.nvml import NvmlReader
from engine.telemetry.sampler import Sampler, TelemetrySnapshot, scrape_loop
from engine.telemetry.store import SeriesStore


def collect(n: int, **kwargs: object) -> list[TelemetrySnapshot]:
    got: list[TelemetrySnapshot] = []
    done = threading.Event()

    def on(snap: TelemetrySnapshot) -> None:
        got.append(snap)
        if len(got) >= n:
            done.set()

    sampler = Sampler(on, interval_s=0.02, **kwargs)  # type: ignore[arg-type]
    sampler.start()
    sampler.start()  # idempotent: still one thread
    assert done.wait(10)
    sampler.stop()
    assert not sampler.running
    return got


def test_snapshots_carry_gpu_host_and_server_tree() -> None:
    fake = FakeNvml(device_count=2, server_pid=os.getpid(), auto_advance=True)
    fake.cursor = 299  # in the capture's loaded part
    snaps = collect(5, nvml=NvmlReader(fake, env={}), root_pid=os.getpid())
    assert [len(s.gpus) for s in snaps] == [2] * len(snaps)
    assert all(s.gpu_unavailable is None and s.host is not None for s in snaps)
    assert all(g.t == s.t for s in snaps for g in s.gpus)  # one clock per tick
    assert [s.t for s in snaps] == sorted(s.t for s in snaps)
    last = snaps[-1]
    assert last.host is not None and last.host.proc_root_pid == os.getpid() and last.host.proc_alive
    assert last.gpus[0].server_mem_bytes  # our pid is the fake's server process
    with pytest.raises(Exception):  # frozen
        last.t = 0  # type: ignore[misc]


def test_no_gpu_reports_unavailable_every_tick_and_host_still_sampled() -> None:
    snaps = collect(3, nvml=NvmlReader(FakeNvml(init_error=NVMLError_DriverNotLoaded), env={}))
    assert all(s.gpus == () and s.gpu_unavailable is not None for s in snaps)
    assert all(s.host is not None for s in snaps)


def test_a_failing_callback_does_not_kill_the_thread() -> None:
    calls: list[int] = []
    done = threading.Event()

    def on(snap: TelemetrySnapshot) -> None:
        calls.append(1)
        if len(calls) >= 3:
            done.set()
        raise RuntimeError("bad consumer")

    sampler = Sampler(on, interval_s=0.02, nvml=NvmlReader(FakeNvml(), env={}))
    sampler.start()
    assert done.wait(10)
    sampler.stop()
    assert len(calls) >= 3


def test_set_root_pid_applies_on_next_tick() -> None:
    host = HostSampler()
    sampler = Sampler(lambda s: None, nvml=NvmlReader(FakeNvml(), env={}), host=host)
    assert sampler.sample_once().host.proc_root_pid is None  # type: ignore[union-attr]
    sampler.set_root_pid(os.getpid())
    snap = sampler.sample_once()
    assert snap.host is not None and snap.host.proc_root_pid == os.getpid() and snap.host.proc_alive


def test_one_sample_in_flight() -> None:
    """A slow consumer delays ticks; samples are never taken concurrently."""
    active = 0
    peak = 0
    lock = threading.Lock()
    done = threading.Event()
    count = 0

    def on(snap: TelemetrySnapshot) -> None:
        nonlocal active, peak, count
        with lock:
            active += 1
            peak = max(peak, active)
        threading.Event().wait(0.05)  # slower than the 0.01 s interval
        with lock:
            active -= 1
            count += 1
            if count >= 4:
                done.set()

    sampler = Sampler(on, interval_s=0.01, nvml=NvmlReader(FakeNvml(), env={}))
    sampler.start()
    assert done.wait(10)
    sampler.stop()
    assert peak == 1


def test_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        Sampler(lambda s: None, interval_s=0)


def test_snapshots_into_store() -> None:
    store = SeriesStore(capacity=50)
    fake = FakeNvml(auto_advance=True)
    snaps = collect(4, nvml=NvmlReader(fake, env={}))
    for s in snaps:
        store.add_snapshot(s.gpus, s.host, s.gpu_unavailable)
    assert len(store.series("gpu0.mem_used_bytes")[0]) == len(snaps)
    assert len(store.series("host.cpu_percent")[0]) == len(snaps)


class ListScraper:
    """Stands in for MetricsScraper's interface; the real one is tested against HTTP servers."""

    def __init__(self) -> None:
        self.n = 0

    async def scrape(self) -> ServerSample:
        self.n += 1
        return ServerSample(t=float(self.n), running=float(self.n))


async def test_scrape_loop_sync_and_async_callbacks() -> None:
    stop = asyncio.Event()
    got: list[ServerSample] = []

    async def on(sample: ServerSample) -> None:
        got.append(sample)
        if len(got) == 3:
            stop.set()

    await asyncio.wait_for(scrape_loop(ListScraper(), on, interval_s=0.01, stop=stop), 10)  # type: ignore[arg-type]
    assert [s.running for s in got] == [1.0, 2.0, 3.0]

    plain: list[ServerSample] = []
    task = asyncio.ensure_future(scrape_loop(ListScraper(), plain.append, interval_s=0.01))  # type: ignore[arg-type]
    while len(plain) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
