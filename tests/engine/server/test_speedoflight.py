"""Speed of light (issue 20, item 2): the decode floor from the model's bytes and the GPU's
peaks, checked by hand for Qwen2.5-7B on an H200; MBU, prefill MFU, the launch-bound verdict,
the peak table's NVML names, and the figures in compare and the advisor."""

from __future__ import annotations

from typing import Any

import pytest

from engine.advise.advisor import RunData, rule_launch_bound
from engine.runs.compare import METRICS
from engine.runs.summary import RunSummary
from engine.server.planner import kv_bytes_per_token, load_model_config, weight_bytes
from engine.server.speedoflight import ModelCost, assess, decode_floor, for_run, peaks_for, prefill_flops

QWEN = load_model_config("qwen2.5-7b")
H200 = peaks_for("NVIDIA H200")
assert H200 is not None
COST = ModelCost.of(QWEN, weight_bytes=weight_bytes(QWEN), kv_bytes_per_token=kv_bytes_per_token(QWEN))

# By hand: Qwen2.5-7B has 7.6156e9 parameters (bf16: 2 bytes each) and 28 layers x 4 KV heads
# x 128 dims x (K and V) x 2 bytes = 57,344 KV bytes per token; an H200 reads 4.8e12 bytes/s.
WEIGHTS = 7_615_616_512 * 2
KV_PER_TOKEN = 28 * 4 * 128 * 2 * 2


def test_the_cost_is_the_models_bytes() -> None:
    assert COST.weight_bytes_per_gpu == WEIGHTS and COST.kv_bytes_per_token_per_gpu == KV_PER_TOKEN == 57_344
    assert COST.flops_per_token == 2 * 7_615_616_512


def test_decode_floor_of_qwen7b_on_an_h200_by_hand() -> None:
    floor, read, bound = decode_floor(COST, H200, batch=1, context=0)
    assert read == WEIGHTS and bound == "memory"
    assert floor * 1000 == pytest.approx(WEIGHTS / 4.8e12 * 1000) == pytest.approx(3.17, abs=0.01)  # "about 3.2 ms"
    floor, read, bound = decode_floor(COST, H200, batch=64, context=2048)
    kv = 64 * 2048 * KV_PER_TOKEN  # 7.5e9 bytes of KV cache per step
    assert read == WEIGHTS + kv and bound == "memory"
    assert floor * 1000 == pytest.approx((WEIGHTS + kv) / 4.8e12 * 1000) == pytest.approx(4.74, abs=0.01)
    # The FLOPs of that step take about a millisecond at 989 TFLOPS: memory binds.
    flops = 64 * (2 * 7_615_616_512 + 4 * 28 * 28 * 128 * 2048)
    assert flops / 989e12 * 1000 == pytest.approx(1.04, abs=0.01)
    # A huge batch over a short context becomes compute-bound.
    assert decode_floor(COST, H200, batch=4096, context=16)[2] == "compute"


def test_tensor_parallel_splits_weights_and_kv_heads() -> None:
    cost2 = ModelCost.of(QWEN, weight_bytes=weight_bytes(QWEN),
                         kv_bytes_per_token=kv_bytes_per_token(QWEN, tensor_parallel_size=2), tp=2)
    assert cost2.weight_bytes_per_gpu == WEIGHTS / 2 and cost2.kv_bytes_per_token_per_gpu == KV_PER_TOKEN / 2
    assert decode_floor(cost2, H200, 1, 0)[0] == pytest.approx(decode_floor(COST, H200, 1, 0)[0] / 2)


def test_a_runs_mbu_mfu_and_the_launch_bound_verdict() -> None:
    load = {"completed": 100, "total_input_tokens": 102_400, "total_output_tokens": 25_600,
            "median_tpot_ms": 9.9, "mean_ttft_ms": 50.0, "request_throughput": 1.0, "mean_e2el_ms": 2500.0}
    sol = assess(COST, H200, load, mean_running=1.0)
    assert sol.context == 1024 + 128 and sol.batch == 1.0
    floor = (WEIGHTS + 1152 * KV_PER_TOKEN) / 4.8e12
    assert sol.floor_ms == pytest.approx(floor * 1000)
    assert sol.mbu == pytest.approx(floor * 1000 / 9.9) == pytest.approx(0.32, abs=0.005)
    assert not sol.launch_bound  # 32%: above the 30% line
    assert sol.line().startswith("decode step 9.9 ms, floor 3.2 ms (memory-bound at batch 1, context 1152), MBU 32%")
    # One 1024-token prompt: 2 x params x 1024 + causal attention, over a 50 ms TTFT at 989 TFLOPS.
    one = 1024 * 2 * 7_615_616_512 + 4 * 28 * 28 * 128 * 1024 * 1024 / 2
    assert prefill_flops(COST, 1024) == pytest.approx(one)
    assert sol.prefill_mfu == pytest.approx(one / (0.050 * 989e12))
    slow = assess(COST, H200, {**load, "median_tpot_ms": 20.0}, mean_running=1.0)
    assert slow.launch_bound and "launch- or scheduling-bound" in slow.line()
    busy = assess(COST, H200, {**load, "median_tpot_ms": 20.0}, mean_running=32.0)
    assert not busy.launch_bound  # a large batch that slow is something else (the advisor's other rules)
    # Without the server's running count, Little's law: 1 req/s x 2.5 s in the system.
    assert assess(COST, H200, load, mean_running=None).batch == pytest.approx(2.5)


@pytest.mark.parametrize(("nvml_name", "table"), [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA B200", "B200"),
])
def test_the_peak_table_knows_nvmls_names(nvml_name: str, table: str) -> None:
    peaks = peaks_for(nvml_name)
    assert peaks is not None and peaks.name == table and peaks.source


def test_unknown_gpus_take_peaks_from_the_user() -> None:
    assert peaks_for("NVIDIA Quadro RTX 6000") is None
    given = peaks_for("NVIDIA Quadro RTX 6000", mem_bw_tbs=0.672, tflops=130.5)
    assert given is not None and given.mem_bw == 0.672e12 and given.source == "given by the user"
    with pytest.raises(ValueError, match="> 0"):
        peaks_for("x", mem_bw_tbs=0.0, tflops=1.0)


def test_for_run_says_why_there_is_no_figure(tmp_path: Any) -> None:
    load = {"completed": 10, "total_input_tokens": 1280, "total_output_tokens": 640, "median_tpot_ms": 5.0}
    assert for_run("qwen2.5-7b", {}, None, load, mean_running=1.0) == "no GPU: the speed of light is a GPU's"
    assert "not in the peak table: give --peak-bw-tbs" in str(for_run("qwen2.5-7b", {}, "NVIDIA T4", load,
                                                                         mean_running=1.0))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert "cannot read the model's config" in str(for_run(str(bad), {}, "NVIDIA H200", load, mean_running=1.0))
    sol = for_run("qwen2.5-7b", {"tensor-parallel-size": 2}, "NVIDIA H200", load, mean_running=1.0)
    assert not isinstance(sol, str) and sol.floor_ms == pytest.approx(
        (WEIGHTS / 2 + 160 * KV_PER_TOKEN / 2) / 4.8e12 * 1000)


def run_with(sol: dict[str, Any], **flags: Any) -> RunData:
    return RunData(name="r", flags=flags, load={"completed": 50}, telemetry={"speed_of_light": sol},
                   workload={"arrivals": {"mode": "closed", "concurrency": 1}})


def test_the_advisor_names_launches_when_decode_is_far_from_the_floor() -> None:
    sol = {"launch_bound": True, "step_ms": 20.0, "floor_ms": 3.2, "mbu": 0.16, "batch": 1.0, "gpu": "H200"}
    [eager] = rule_launch_bound(run_with(sol, **{"enforce-eager": True}))
    assert eager.changes[0].describe() == "--enforce-eager on -> off"
    assert "decode step 20.0 ms against a floor of 3.2 ms on H200 (MBU 16%)" in eager.symptom
    [graphs] = rule_launch_bound(run_with(sol))
    assert graphs.changes[0].describe() == "concurrency 1 -> 4 (load generator)"
    # where the installed vLLM has it, overlapping the scheduler with the model is offered too
    assert [c.describe() for alt in graphs.alternatives for c in alt] == ["--async-scheduling (default) -> on"]
    [done] = rule_launch_bound(run_with(sol, **{"async-scheduling": True}))
    assert done.alternatives == ()
    assert rule_launch_bound(run_with({**sol, "launch_bound": False})) == []
    assert rule_launch_bound(run_with({"reason": "no GPU: the speed of light is a GPU's"})) == []


def test_compare_reads_the_speed_of_light_from_the_runs_telemetry() -> None:
    by_key = {m.key: m for m in METRICS}
    tel = RunSummary.from_json({"telemetry": {"speed_of_light": {"floor_ms": 3.2, "mbu": 0.32, "prefill_mfu": 0.25}}})
    assert by_key["mbu"].read(tel) == pytest.approx(32.0)
    assert by_key["decode_floor"].read(tel) == 3.2
    assert by_key["prefill_mfu"].read(RunSummary.from_json({"telemetry": {"speed_of_light": {"reason": "no GPU"}}})) is None
