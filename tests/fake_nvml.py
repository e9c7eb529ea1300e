"""A FAKE NVML module, standing in for pynvml because these machines have no NVIDIA GPU.

It exposes the handful of pynvml names that ``engine.telemetry.nvml`` calls, with the
same error classes (``NVMLError`` and ``NVMLError_<Name>`` subclasses), and replays the
per-device readings captured on a real H200 during a vLLM load
(``tests/data/captures/h200-nvml-during-load.csv``). It can also simulate the failures
the adapter must survive: the driver not loaded, a function not supported, a GPU lost.
The real NVML path is checked on an H200 by ``tests/perf/nvml_h200_check.py``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CAPTURE = Path(__file__).parent / "data" / "captures" / "h200-nvml-during-load.csv"
MIB = 1024 * 1024


class NVMLError(Exception):
    """Base of the fake's NVML errors, like pynvml.NVMLError."""


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    pass


@dataclass(frozen=True)
class Row:
    """One line of the captured CSV."""

    t: float
    gpu: int
    name: str
    mem_used_mib: int
    mem_total_mib: int
    util_gpu: int
    util_mem: int
    power_w: float
    temp_c: int
    sm_mhz: int
    nprocs: int


def load_capture(path: Path = CAPTURE) -> list[Row]:
    """Rows of the H200 capture, in file order."""
    with path.open() as fh:
        return [
            Row(
                float(r["t"]), int(r["gpu"]), r["name"], int(r["mem_used_mib"]), int(r["mem_total_mib"]),
                int(r["util_gpu"]), int(r["util_mem"]), float(r["power_w"]), int(r["temp_c"]),
                int(r["sm_mhz"]), int(r["nprocs"]),
            )
            for r in csv.DictReader(fh)
        ]


@dataclass
class _Mem:
    used: int
    total: int
    free: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's name


@dataclass
class FakeNvml:
    """Duck-typed pynvml replaying captured rows; one row per ``advance()``.

    ``device_count`` devices all replay the same rows (device i gets a distinct UUID).
    ``server_pid`` (when set) is reported as the one compute process whenever the
    capture says a process ran, holding the memory above the idle baseline of the
    capture's first row; ``other_procs`` adds (pid, bytes) of foreign processes.
    """

    rows: list[Row] = field(default_factory=load_capture)
    device_count: int = 1
    init_error: type[NVMLError] | None = None
    not_supported: set[str] = field(default_factory=set)
    lost_after: dict[int, int] = field(default_factory=dict)  # device index -> rows before loss
    server_pid: int | None = None
    other_procs: list[tuple[int, int | None]] = field(default_factory=list)
    auto_advance: bool = False  # advance on every memory read of device 0
    cursor: int = 0
    calls: int = 0
    initialised: bool = False
    shutdowns: int = 0

    # error classes, looked up by name like pynvml's module attributes
    NVMLError = NVMLError
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost

    def advance(self, n: int = 1) -> None:
        """Move to the next captured row (stays on the last one at the end)."""
        self.cursor = min(self.cursor + n, len(self.rows) - 1)

    @property
    def row(self) -> Row:
        return self.rows[self.cursor]

    def _check(self, fn: str, handle: int | None = None) -> None:
        self.calls += 1
        if not self.initialised:
            raise NVMLError("Uninitialized")
        if fn in self.not_supported:
            raise NVMLError_NotSupported("Not Supported")
        if handle is not None and handle in self.lost_after and self.cursor >= self.lost_after[handle]:
            raise NVMLError_GpuIsLost("GPU is lost")

    # -- the pynvml functions the adapter calls -------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.init_error is not None:
            raise self.init_error("Driver Not Loaded")
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check("nvmlDeviceGetCount")
        return self.device_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.device_count:
            raise NVMLError_InvalidArgument("Invalid Argument")
        return index  # the fake's handle is the index itself

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        self._check("nvmlDeviceGetUUID", handle)
        return f"GPU-fa4e{handle:04d}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        self._check("nvmlDeviceGetName", handle)
        return self.row.name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Mem:  # noqa: N802
        if self.auto_advance and handle == 0 and self.initialised:
            self.advance()
        self._check("nvmlDeviceGetMemoryInfo", handle)
        r = self.row
        return _Mem(r.mem_used_mib * MIB, r.mem_total_mib * MIB, (r.mem_total_mib - r.mem_used_mib) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:  # noqa: N802
        self._check("nvmlDeviceGetUtilizationRates", handle)
        return _Util(self.row.util_gpu, self.row.util_mem)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        self._check("nvmlDeviceGetPowerUsage", handle)
        return int(self.row.power_w * 1000)  # milliwatts, as NVML

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # noqa: N802
        """Millijoules since the driver loaded: the capture's power integrated over its rows
        (rows are ``t`` seconds apart), from an arbitrary non-zero start like a real counter."""
        self._check("nvmlDeviceGetTotalEnergyConsumption", handle)
        rows = self.rows
        total = 123_456_789.0
        for a, b in zip(rows[: self.cursor], rows[1 : self.cursor + 1], strict=True):
            total += (a.power_w + b.power_w) / 2 * max(0.0, b.t - a.t) * 1000
        return int(total)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:  # noqa: N802
        self._check("nvmlDeviceGetEnforcedPowerLimit", handle)
        return 700_000  # an H200 SXM's 700 W

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        self._check("nvmlDeviceGetTemperature", handle)
        return self.row.temp_c

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:  # noqa: N802
        self._check("nvmlDeviceGetClockInfo", handle)
        return self.row.sm_mhz

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:  # noqa: N802
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        procs: list[Any] = []
        if self.row.nprocs and self.server_pid is not None:
            baseline = self.rows[0].mem_used_mib
            procs.append(_Proc(self.server_pid, (self.row.mem_used_mib - baseline) * MIB))
        procs.extend(_Proc(pid, used) for pid, used in self.other_procs)
        return procs
