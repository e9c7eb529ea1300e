"""NVML adapter against the fake NVML module (tests/fake_nvml.py; no NVIDIA GPU here)."""

from __future__ import annotations

import os

import pytest
from fake_nvml import MIB, FakeNvml, NVMLError_DriverNotLoaded, NVMLError_LibraryNotFound, load_capture

from engine.telemetry.nvml import GpuSample, GpuUnavailable, NvmlReader, parse_visible_devices


def test_replays_captured_h200_row() -> None:
    fake = FakeNvml(server_pid=4242)
    row = next(i for i, r in enumerate(fake.rows) if r.mem_used_mib == 131229)
    fake.cursor = row
    reader = NvmlReader(fake, env={})
    (g,) = reader.sample({4242}, t=123.0)
    assert g == GpuSample(
        t=123.0, index=0, uuid="GPU-fa4e0000-0000-0000-0000-000000000000", name="NVIDIA H200",
        available=True, reason=None, mem_used_bytes=131229 * MIB, mem_total_bytes=143771 * MIB,
        util_gpu_pct=23.0, util_mem_pct=20.0, power_w=134.0, power_limit_w=700.0, temp_c=40.0,
        sm_clock_mhz=1980.0, server_mem_bytes=(131229 - 615) * MIB, other_mem_bytes=0, nprocs=1,
        energy_mj=float(fake.nvmlDeviceGetTotalEnergyConsumption(0)),
    )
    assert g.energy_mj is not None and g.energy_mj > 123_456_789  # the counter, in millijoules


def test_memory_attributed_to_server_tree_vs_others() -> None:
    fake = FakeNvml(server_pid=10, other_procs=[(99, 2 * MIB), (98, None)])
    fake.cursor = len(fake.rows) - 1
    (g,) = NvmlReader(fake, env={}).sample({10, 11})
    assert g.server_mem_bytes == (133615 - 615) * MIB
    assert g.other_mem_bytes == 2 * MIB  # a hidden usedGpuMemory (None) counts as 0
    assert g.nprocs == 3
    (g,) = NvmlReader(fake, env={}).sample(())  # no server tree known: all is "other"
    assert g.server_mem_bytes == 0


@pytest.mark.parametrize(
    ("error", "needle"),
    [(NVMLError_DriverNotLoaded, "Driver Not Loaded"), (NVMLError_LibraryNotFound, "LibraryNotFound")],
)
def test_no_driver_gives_one_typed_reason(error: type[Exception], needle: str) -> None:
    reader = NvmlReader(FakeNvml(init_error=error), env={})
    status = reader.status()
    assert isinstance(status, GpuUnavailable) and needle in status.reason
    assert reader.sample() == ()
    assert reader.status() is status  # decided once, not retried every tick


def test_real_pynvml_on_this_gpu_less_box_is_unavailable_not_raising() -> None:
    reader = NvmlReader(env={})
    status = reader.status()
    if status is None:
        pytest.skip("this machine has a working NVIDIA driver")
    assert "NVML could not start" in status.reason
    assert reader.sample() == ()


def test_no_device_at_all() -> None:
    status = NvmlReader(FakeNvml(device_count=0), env={}).status()
    assert status == GpuUnavailable("NVML found no NVIDIA GPU")


@pytest.mark.parametrize(
    ("env", "devices", "expected"),
    [
        ({}, None, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, None, [2, 0]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-fa4e0003"}, None, [3]),  # UUID prefix
        ({"CUDA_VISIBLE_DEVICES": "fa4e0001-0000"}, None, [1]),  # UUID without GPU-
        ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, None, [1]),  # CUDA stops at the first invalid entry
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, [3], [3]),  # an explicit list (server's TP GPUs) wins
        ({}, ["1", 2], [1, 2]),
    ],
)
def test_device_selection(env: dict[str, str], devices: list[int | str] | None, expected: list[int]) -> None:
    reader = NvmlReader(FakeNvml(device_count=4), devices=devices, env=env)
    assert [g.index for g in reader.sample()] == expected


def test_empty_visible_devices_is_unavailable() -> None:
    status = NvmlReader(FakeNvml(device_count=2), env={"CUDA_VISIBLE_DEVICES": ""}).status()
    assert status is not None and "CUDA_VISIBLE_DEVICES" in status.reason


def test_parse_visible_devices() -> None:
    assert parse_visible_devices(" 0, 1 ,,GPU-ab ") == ["0", "1", "GPU-ab"]


def test_not_supported_field_is_none_and_not_retried() -> None:
    fake = FakeNvml(not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses"})
    reader = NvmlReader(fake, env={})
    (g,) = reader.sample()
    assert g.available and g.power_w is None and g.server_mem_bytes is None and g.nprocs is None
    assert g.mem_used_bytes == 615 * MIB and g.power_limit_w == 700.0
    calls = fake.calls
    reader.sample()
    assert fake.calls - calls == 6  # eight reads, minus the two known unsupported


def test_gpu_lost_mid_run_reads_not_available_and_others_continue() -> None:
    fake = FakeNvml(device_count=2, lost_after={1: 3})
    reader = NvmlReader(fake, env={})
    before = reader.sample()
    assert all(g.available for g in before)
    fake.advance(3)
    g0, g1 = reader.sample()
    assert g0.available and g0.mem_used_bytes is not None
    assert not g1.available and g1.mem_used_bytes is None and "GPU is lost" in (g1.reason or "")
    g0, g1 = reader.sample()  # stays lost, no exception
    assert not g1.available and g0.available


def test_lazy_init_and_shutdown() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake, env={})
    assert not fake.initialised  # nothing happens until the first sample
    reader.sample()
    assert fake.initialised
    reader.close()
    reader.close()
    assert fake.shutdowns == 1 and not fake.initialised


def test_capture_loads_every_row() -> None:
    rows = load_capture()
    assert len(rows) == 462 and rows[0].name == "NVIDIA H200" and max(r.mem_used_mib for r in rows) == 133615


def test_this_process_attribution_uses_given_pids() -> None:
    fake = FakeNvml(server_pid=os.getpid())
    fake.cursor = 100
    (g,) = NvmlReader(fake, env={}).sample({os.getpid()})
    assert g.server_mem_bytes == (fake.row.mem_used_mib - 615) * MIB


def test_binding_without_a_function_or_with_odd_values_never_raises() -> None:
    class OldBinding(FakeNvml):
        nvmlDeviceGetComputeRunningProcesses = None  # type: ignore[assignment]  # missing in old pynvml

        def nvmlDeviceGetUtilizationRates(self, handle: int) -> object:  # noqa: N802
            return object()  # no .gpu / .memory

    (g,) = NvmlReader(OldBinding(), env={}).sample()
    assert not g.available and "unreadable" in (g.reason or "")

    class NoProcs(FakeNvml):
        nvmlDeviceGetComputeRunningProcesses = None  # type: ignore[assignment]

    (g,) = NvmlReader(NoProcs(), env={}).sample()
    assert g.available and g.nprocs is None and g.mem_used_bytes == 615 * MIB


def test_close_shuts_down_even_without_devices_and_reopens_fresh() -> None:
    fake = FakeNvml(device_count=0)
    reader = NvmlReader(fake, env={})
    assert reader.status() is not None
    reader.close()
    assert fake.shutdowns == 1  # nvmlInit succeeded, so shutdown is owed
    fake.device_count = 1  # e.g. the driver came back
    assert reader.status() is None and len(reader.sample()) == 1
