"""SeriesStore: ring buffers, time queries, histograms, JSON form and its memory bound."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from engine.telemetry.host import HostSample
from engine.telemetry.metrics import Histogram, Quantiles, ServerSample
from engine.telemetry.nvml import GpuSample, GpuUnavailable
from engine.telemetry.store import DEFAULT_CAPACITY, SeriesStore


def gpu(t: float, index: int = 0, mem: int | None = 100, util: float | None = 50.0) -> GpuSample:
    return GpuSample(t=t, index=index, uuid=None, name="NVIDIA H200", available=mem is not None, reason=None,
                     mem_used_bytes=mem, util_gpu_pct=util)


def host(t: float, cpu: float = 10.0) -> HostSample:
    return HostSample(t=t, cpu_percent=cpu, cpu_count=2, mem_used_bytes=1, mem_total_bytes=2, mem_available_bytes=1)


def hist(n: float) -> Histogram:
    return Histogram((0.1, 1.0, math.inf), (n, 2 * n, 2 * n), n)


def test_ring_keeps_the_newest_rows_in_order() -> None:
    store = SeriesStore(capacity=5)
    for i in range(12):
        store.add_gpu(gpu(float(i), mem=i * 10))
    t, v = store.series("gpu0.mem_used_bytes")
    assert t.tolist() == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert v.tolist() == [70.0, 80.0, 90.0, 100.0, 110.0]


def test_time_range_query_and_unknowns() -> None:
    store = SeriesStore(capacity=100)
    for i in range(10):
        store.add_gpu(gpu(float(i), util=None if i == 4 else float(i)))
    t, v = store.series("gpu0.util_gpu_pct", 3.0, 5.0)
    assert t.tolist() == [3.0, 4.0, 5.0]
    assert v[0] == 3.0 and math.isnan(v[1]) and v[2] == 5.0  # None is stored as NaN
    assert store.series("gpu7.util_gpu_pct")[0].size == 0
    assert store.series("gpu0.nonsense")[0].size == 0


def test_sources_and_names() -> None:
    store = SeriesStore(capacity=10)
    store.add_snapshot([gpu(1.0, 0), gpu(1.0, 3)], host(1.0), GpuUnavailable("x"))
    store.add_server(ServerSample(t=1.5, running=2, ttft=Quantiles(0.1, 0.2, 0.3, 5), histograms={"ttft": hist(5)},
                                  cache_config={"block_size": "16"}))
    store.add_server(ServerSample(t=2.0, stale=True, reason="gone"))
    keys = store.keys()
    assert "gpu3.mem_used_bytes" in keys and "host.cpu_percent" in keys and "server.ttft_p99" in keys
    assert store.gpu_indices() == [0, 3]
    assert store.series("server.ttft_p99")[1][0] == 0.3
    assert store.series("server.stale")[1].tolist() == [0.0, 1.0]
    assert store.cache_config == {"block_size": "16"} and store.gpu_unavailable == GpuUnavailable("x")
    assert store.span() == (1.0, 2.0)
    d = store.to_dict()
    assert d["server"]["t"] == [1.5, 2.0] and d["server"]["running"] == [2.0, None]
    assert set(d) == {"gpu0", "gpu3", "host", "server"}


def test_first_and_last_histogram_in_range() -> None:
    store = SeriesStore(capacity=10)
    for i in range(1, 6):
        store.add_server(ServerSample(t=float(i), histograms={"ttft": hist(10 * i)}))
    first, last = store.histograms("ttft", 2.0, 4.0)
    assert first == hist(20) and last == hist(40)
    assert store.histograms("itl") == (None, None)
    # new bucket layout after a restart: older rows are dropped rather than mixed
    store.add_server(ServerSample(t=9.0, histograms={"ttft": Histogram((1.0, math.inf), (1, 1), 0.5)}))
    first, last = store.histograms("ttft")
    assert first == last and first is not None and first.bounds == (1.0, math.inf)


def test_rejects_tiny_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SeriesStore(capacity=1)


def test_memory_bound_one_hour_8_gpus() -> None:
    """The stated bound: one hour at 2 Hz for 8 GPUs + host + server stays under 16 MB."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = SeriesStore()  # DEFAULT_CAPACITY = one hour at 2 Hz
    big = Histogram(tuple([*np.linspace(0.01, 100, 24).tolist(), math.inf]), tuple(float(i) for i in range(25)), 1.0)
    for i in range(DEFAULT_CAPACITY + 100):  # wrap once: memory must not grow past capacity
        t = float(i) / 2
        store.add_snapshot([gpu(t, g) for g in range(8)], host(t))
        store.add_server(ServerSample(t=t, running=1, histograms={"ttft": big, "itl": big, "e2e": big}))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(store.series("gpu7.mem_used_bytes")[0]) == DEFAULT_CAPACITY
    assert store.nbytes() < 16e6
    assert used < 16e6, f"store used {used / 1e6:.1f} MB"
