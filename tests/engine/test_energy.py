"""Energy per run (issue 20, item 1): NVML's energy counter over a run's window, the
power-sample estimate where a GPU has no counter, the server's GPUs only, an idle baseline,
J/token in compare and in `vtui bench`'s line, and tune's energy objectives.

NVML here is tests/fake_nvml.py (these machines have no NVIDIA GPU): it replays power
readings captured on a real H200 under vLLM load and integrates them into the counter.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any

import pytest
from fake_nvml import FakeNvml, load_capture

from engine.runs.compare import compare
from engine.runs.history import RunInfo
from engine.runs.measure import energy_figures
from engine.runs.summary import RunSummary
from engine.telemetry.nvml import GpuSample, GpuUnavailable, NvmlReader
from engine.telemetry.store import SeriesStore
from engine.telemetry.summary import energy, summarize
from engine.tune.search import Measurement, format_table, objective_value
from tests.engine.tune.test_tune import SLO_TTFT, TableMeasurer, keys, make_tuner, space_of
from tui.commands.output import energy_line

ROWS = load_capture()


def replay(fake: FakeNvml, upto: float) -> SeriesStore:
    """Sample the fake at each captured row's time up to ``upto`` s (as the sampler would)."""
    store = SeriesStore()
    reader = NvmlReader(fake, env={})
    while True:
        for g in reader.sample({os.getpid()}, t=fake.row.t):
            store.add_gpu(g)
        if fake.cursor >= len(fake.rows) - 1 or fake.rows[fake.cursor + 1].t > upto:
            return store
        fake.advance()


def trapezoid(t0: float, t1: float) -> float:
    """The capture's power integrated over rows within [t0, t1], by hand: joules."""
    rows = [r for r in ROWS if t0 <= r.t <= t1]
    return sum((a.power_w + b.power_w) / 2 * (b.t - a.t) for a, b in itertools.pairwise(rows))


def test_the_energy_counter_gives_the_joules_of_the_window() -> None:
    store = replay(FakeNvml(server_pid=os.getpid()), upto=231)
    t0, t1 = 120.14, 220.27  # captured rows: under load (124-677 W)
    e = energy(store, t0, t1, idle=(0.0, 30.0))
    expected = trapezoid(t0, t1)
    assert e.joules is not None and e.joules == pytest.approx(expected, rel=1e-4)
    assert not e.estimated and e.reason is None
    assert e.mean_power_w == pytest.approx(expected / (t1 - t0), rel=1e-4)
    assert e.idle_power_w == pytest.approx(80.0, abs=1.5)  # the capture's first 30 s: an idle H200
    assert e.mean_power_w > 2 * e.idle_power_w


def test_without_a_counter_power_samples_give_an_estimate_marked_as_such() -> None:
    fake = FakeNvml(server_pid=os.getpid(), not_supported={"nvmlDeviceGetTotalEnergyConsumption"})
    store = replay(fake, upto=231)
    t0, t1 = 120.14, 220.27
    e = energy(store, t0, t1)
    watts = [r.power_w for r in ROWS if t0 <= r.t <= t1]
    assert e.estimated and e.mean_power_w == pytest.approx(sum(watts) / len(watts))
    assert e.joules == pytest.approx(e.mean_power_w * (t1 - t0))
    assert e.joules == pytest.approx(trapezoid(t0, t1), rel=0.05)  # close to the counter's figure here
    fake = FakeNvml(not_supported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"})
    e = energy(replay(fake, upto=50), 0.0, 50.0)
    assert e.joules is None and "neither an energy counter nor power" in (e.reason or "")


def gpu(t: float, index: int, watts: float, energy_mj: float, server_mem: int) -> GpuSample:
    return GpuSample(t, index, f"GPU-{index}", "NVIDIA H200", True, None, mem_used_bytes=1, mem_total_bytes=2,
                     power_w=watts, energy_mj=energy_mj, server_mem_bytes=server_mem)


def test_only_the_servers_gpus_count() -> None:
    store = SeriesStore()
    for k in range(11):  # 10 s: GPU0 runs the server at 300 W, GPU1 idles at 70 W for someone else
        store.add_gpu(gpu(float(k), 0, 300.0, 1e9 + 300_000.0 * k, 5 << 30))
        store.add_gpu(gpu(float(k), 1, 70.0, 2e9 + 70_000.0 * k, 0))
    e = energy(store, 0.0, 10.0)
    assert e.joules == pytest.approx(3000.0) and e.mean_power_w == pytest.approx(300.0)
    # Where NVML hides the processes (no server memory on any GPU), every sampled GPU counts.
    store = SeriesStore()
    for k in range(11):
        store.add_gpu(gpu(float(k), 0, 300.0, 300_000.0 * k, 0))
        store.add_gpu(gpu(float(k), 1, 70.0, 70_000.0 * k, 0))
    assert energy(store, 0.0, 10.0).mean_power_w == pytest.approx(370.0)


def test_no_gpu_says_why() -> None:
    store = SeriesStore()
    store.gpu_unavailable = GpuUnavailable("NVML Shared Library Not Found")
    e = summarize(store, 0.0, 10.0).energy
    assert e is not None and e.joules is None and e.reason == "NVML Shared Library Not Found"
    figures = energy_figures(e, {"total_output_tokens": 100, "completed": 2})
    assert figures == {"joules": None, "reason": "NVML Shared Library Not Found"}
    assert energy_line(figures) == "energy: n/a (NVML Shared Library Not Found)"


def test_per_token_per_request_in_the_run_summary_compare_and_bench_line() -> None:
    store = replay(FakeNvml(server_pid=os.getpid()), upto=231)
    tsum = summarize(store, 120.14, 220.27, idle=(0.0, 30.0))
    load = {"total_output_tokens": 25_600, "completed": 100, "request_throughput": 1.0}
    figures = energy_figures(tsum.energy, load)
    assert figures["j_per_token"] == pytest.approx(figures["joules"] / 25_600)
    assert figures["j_per_request"] == pytest.approx(figures["joules"] / 100)
    line = energy_line(figures)
    assert f"{figures['j_per_token']:.3f} J/output token" in line and "(idle 80 W)" in line
    # compare reads the stored telemetry's energy: the run with fewer joules per token wins
    tel = tsum.to_dict()
    half = {**tel, "energy": {**tel["energy"], "joules": tel["energy"]["joules"] / 2}}
    def run(i: int, telemetry: dict[str, Any]) -> RunInfo:
        return RunInfo(id=i, name=f"r{i}", preset=None, started=float(i), ended=float(i) + 100, status="ok",
                       flags={}, vllm_version=None, model="m", gpus=[], workload={},
                       summary=RunSummary.from_json({"load": load, "telemetry": telemetry}, "test"), baseline=False, tags=())

    # over two repeats each (energy has no within-run model: single runs take no best mark)
    runs = [[run(1, tel), run(3, tel)], [run(2, half), run(4, half)]]
    row = next(r for r in compare(runs).rows if r.key == "j_per_token")
    assert row.values[0] == pytest.approx(figures["j_per_token"]) and row.best == frozenset({1})
    single = next(r for r in compare([run(1, tel), run(2, half)]).rows if r.key == "j_per_token")
    assert single.best == frozenset() and single.deltas[1] == pytest.approx(-50.0)


class PoweredMeasurer(TableMeasurer):
    """TableMeasurer whose steps report a fixed GPU power per configuration."""

    def __init__(self, *args: Any, power: dict[str, float], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.power = power

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        m = await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)
        return dataclasses.replace(m, mean_power_w=self.power[self.key])


@pytest.mark.parametrize("objective", ["goodput", "goodput-per-watt", "tokens-per-joule"])
async def test_tune_maximises_the_chosen_objective(objective: str) -> None:
    space = space_of(max_num_seqs=(16, 64, 256))
    k16, k64, k256 = keys(space)
    # 256 serves the most (limit 12 req/s) but draws 700 W; 64 serves 10 req/s at 400 W.
    tuner, base = make_tuner(space, {k16: 4.0, k64: 10.0, k256: 12.0}, objective=objective)
    m = PoweredMeasurer(base.space, base.table, base.clock, power={k16: 300.0, k64: 400.0, k256: 700.0})
    tuner.measurer = m
    res = await tuner.run()
    assert res.best is not None
    assert res.best.key == (k256 if objective == "goodput" else k64)
    by = {c.key: c for c in res.configs}
    if objective != "goodput":
        # Every config is measured to its limit: none dropped at the best's limit load.
        assert all(c.limit_load is not None for c in by.values())
        assert objective_value(by[k64].at, objective) > objective_value(by[k256].at, objective)
        table = format_table(res)
        assert "GPU W" in table and objective in table
        assert res.to_json()["objective"] == objective and res.to_json()["best_score"] == pytest.approx(
            objective_value(res.best.at, objective))


async def test_an_energy_objective_without_power_readings_finds_no_best() -> None:
    space = space_of(max_num_seqs=(16, 64))
    tuner, _ = make_tuner(space, dict.fromkeys(keys(space), 5.0), objective="goodput-per-watt")
    res = await tuner.run()
    assert res.best is None  # no figure to rank by, rather than a winner by another measure
    assert SLO_TTFT.ttft_ms == 500.0


def test_vtui_tune_refuses_an_energy_objective_without_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    assert main(["tune", "--objective", "goodput-per-watt", "--budget-min", "1"]) == 2
    err = capsys.readouterr().err
    assert "--objective goodput-per-watt needs the GPUs' power from NVML" in err
    assert "use --objective goodput" in err
