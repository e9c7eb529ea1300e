"""The only module that calls NVML.

Design (after nvitop): NVML is initialised lazily on the first sample, shut down at
interpreter exit, and every NVML call goes through one choke point, ``_call``, which
turns any NVML error into ``None`` ("not available"). A box without a driver or GPU
yields one typed :class:`GpuUnavailable` value that the UI shows once; a GPU lost in
the middle of a run reads as not available. Nothing in this module raises into callers.

NVML calls block for 1 to 5 ms each, so callers run :class:`NvmlReader` from the
sampler thread, never from an event loop.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Protocol, TypeVar

from engine.values import as_float, as_int

T = TypeVar("T")

# NVML constants, copied so the fake module in tests need not define them. Their
# values are fixed by the NVML C API.
_NVML_TEMPERATURE_GPU = 0
_NVML_CLOCK_SM = 1

# Errors after which a device is treated as gone until the reader is reopened.
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_Unknown", "NVMLError_Uninitialized")


@dataclass(frozen=True)
class GpuUnavailable:
    """Why there are no GPU samples at all (no driver, no GPU, none visible)."""

    reason: str


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One device at one instant. ``None`` in a field means "not available"."""

    t: float
    index: int  # NVML (physical) index
    uuid: str | None
    name: str | None
    available: bool  # False when the device was lost or every read failed
    reason: str | None  # why not available, else None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    server_mem_bytes: int | None = None  # held by the given process tree (the vLLM server)
    other_mem_bytes: int | None = None  # held by every other compute process
    nprocs: int | None = None  # compute processes on the device
    energy_mj: float | None = None  # NVML's total energy counter (millijoules since the driver loaded)


class NvmlBinding(Protocol):
    """The NVML binding's functions this module calls directly: ``pynvml`` (which has no
    type stubs) or a test's fake. The per-device reads take the binding's own opaque
    handle type, so they are looked up by name (:func:`_function`), like an optional
    function of an older binding."""

    def nvmlInit(self) -> None: ...  # noqa: N802 - pynvml's names

    def nvmlShutdown(self) -> None: ...  # noqa: N802

    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...  # noqa: N802


# A device handle: opaque, only ever handed back to the binding that made it.
Handle = object


def _function(value: object) -> Callable[..., object]:
    """A binding attribute as a function of the binding's own argument types; calling a
    non-callable raises TypeError, as calling it directly would."""
    if callable(value):
        return value

    def not_callable(*_args: object) -> object:
        raise TypeError(f"{type(value).__name__!r} object is not callable")

    return not_callable


def _field(value: object, name: str) -> object:
    """A field of a binding's structure (``mem.used``); AttributeError when it has none."""
    got: object = getattr(value, name)
    return got


def _text(value: object) -> str:
    # Old pynvml returned bytes for names and UUIDs; nvidia-ml-py returns str.
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _import_pynvml() -> NvmlBinding:
    with warnings.catch_warnings():
        # The deprecated "pynvml" wheel warns on import; nvidia-ml-py provides the module.
        warnings.simplefilter("ignore", FutureWarning)
        import pynvml  # noqa: PLC0415 - deferred so importing vtui needs no NVML

    binding: NvmlBinding = pynvml  # pynvml has no stubs: checked against the Protocol only here
    return binding


def parse_visible_devices(value: str) -> list[str]:
    """Split a CUDA_VISIBLE_DEVICES value into entries (indices or UUID prefixes)."""
    return [part.strip() for part in value.split(",") if part.strip()]


class NvmlReader:
    """Reads the visible NVIDIA devices through NVML; never raises.

    ``module`` is the NVML binding (``pynvml`` by default); tests pass a fake.
    ``devices`` is an explicit device list (for example the server's tensor-parallel
    GPUs) in CUDA_VISIBLE_DEVICES syntax: physical indices or UUID prefixes. Without it
    the ``CUDA_VISIBLE_DEVICES`` of ``env`` decides, and without that every device.
    """

    def __init__(
        self,
        module: NvmlBinding | None = None,
        *,
        devices: Sequence[int | str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._module = module
        self._devices = None if devices is None else [str(d) for d in devices]
        self._env = os.environ if env is None else env
        self._lock = threading.Lock()
        self._initialised = False
        self._nvml_up = False  # nvmlInit succeeded, so nvmlShutdown is owed
        self._unavailable: GpuUnavailable | None = None
        self._handles: list[tuple[int, Handle]] = []
        self._ident: dict[int, tuple[str | None, str | None]] = {}
        self._lost: dict[int, str] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._last_error: str | None = None
        self._last_error_kind = ""

    # -- lifecycle ---------------------------------------------------------------
    def status(self) -> GpuUnavailable | None:
        """Initialise NVML if needed; return why GPUs are unavailable, or None."""
        with self._lock:
            self._ensure_init()
            return self._unavailable

    def visible_indices(self) -> tuple[int, ...]:
        """NVML's indices of the devices this reader sees (CUDA_VISIBLE_DEVICES applied); empty
        without NVML or a GPU."""
        with self._lock:
            self._ensure_init()
            return () if self._unavailable is not None else tuple(i for i, _ in self._handles)

    def close(self) -> None:
        """Shut NVML down (idempotent; a later sample initialises afresh). Registered with atexit."""
        with self._lock:
            if self._nvml_up and self._module is not None:  # up implies a module
                try:
                    self._module.nvmlShutdown()
                except Exception:  # noqa: BLE001 - shutting down must never raise
                    pass
                atexit.unregister(self.close)
            self._nvml_up = False
            self._initialised = False
            self._unavailable = None
            self._handles = []
            self._lost = {}
            self._unsupported = set()

    def _ensure_init(self) -> None:
        if self._initialised:
            return
        self._initialised = True
        try:
            if self._module is None:
                self._module = _import_pynvml()
            module = self._module
            module.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            self._unavailable = GpuUnavailable(f"NVML could not start: {_describe(exc)}")
            return
        self._nvml_up = True
        atexit.register(self.close)
        try:
            self._discover(module)
        except Exception as exc:  # noqa: BLE001 - a binding without some function; never raise to callers
            self._unavailable = GpuUnavailable(f"NVML device discovery failed: {_describe(exc)}")

    def _discover(self, module: NvmlBinding) -> None:
        count = self._call(module.nvmlDeviceGetCount)
        if count is None:
            self._unavailable = GpuUnavailable(f"NVML could not count devices: {self._last_error}")
            return
        handles = [(i, self._call(module.nvmlDeviceGetHandleByIndex, i)) for i in range(count)]
        present = [(i, h) for i, h in handles if h is not None]
        # Looked up as attributes (a binding without them fails discovery, as before); they
        # take the binding's own handle type, so the Protocol cannot spell them.
        get_uuid = _function(getattr(module, "nvmlDeviceGetUUID"))  # noqa: B009
        get_name = _function(getattr(module, "nvmlDeviceGetName"))  # noqa: B009
        for i, h in present:
            uuid = self._call(get_uuid, h)
            name = self._call(get_name, h)
            self._ident[i] = (None if uuid is None else _text(uuid), None if name is None else _text(name))
        wanted = self._devices
        source = "the device list"
        if wanted is None and "CUDA_VISIBLE_DEVICES" in self._env:
            wanted = parse_visible_devices(self._env["CUDA_VISIBLE_DEVICES"])
            source = "CUDA_VISIBLE_DEVICES"
        if wanted is None:
            self._handles = present
        else:
            self._handles = self._select(present, wanted)
        if not present:
            self._unavailable = GpuUnavailable("NVML found no NVIDIA GPU")
        elif not self._handles:
            self._unavailable = GpuUnavailable(f"no GPU matches {source} ({','.join(wanted or []) or 'empty'})")

    def _select(self, present: list[tuple[int, Handle]], wanted: list[str]) -> list[tuple[int, Handle]]:
        # Indices are NVML's (PCI bus order). CUDA numbers devices fastest-first unless
        # CUDA_DEVICE_ORDER=PCI_BUS_ID; on a box of identical GPUs (the usual H100/H200
        # node) both orders agree. MIG instance UUIDs ("MIG-...") are not matched.
        by_index = dict(present)
        chosen: list[tuple[int, Handle]] = []
        for entry in wanted:
            match: tuple[int, Handle] | None = None
            if entry.lstrip("-").isdigit():
                idx = int(entry)
                if idx in by_index:
                    match = (idx, by_index[idx])
            else:
                for i, h in present:
                    uuid = self._ident.get(i, (None, None))[0] or ""
                    if uuid.startswith(entry) or uuid.startswith("GPU-" + entry):
                        match = (i, h)
                        break
            if match is None:
                # CUDA ignores every entry after the first invalid one; do the same so we
                # watch the devices the server really sees.
                break
            if match not in chosen:
                chosen.append(match)
        return chosen

    # -- the choke point ---------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: object) -> T | None:
        """Call one NVML function; any error becomes None and is remembered."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses and anything a binding throws
            self._last_error = _describe(exc)
            self._last_error_kind = type(exc).__name__
            return None

    def _dev(self, index: int, handle: Handle, name: str, *args: object) -> object:
        """A per-device read (untyped: the binding's value, converted by the caller);
        remembers NotSupported so it is not retried each tick."""
        if (index, name) in self._unsupported or index in self._lost:
            return None
        fn: object = getattr(self._module, name, None)
        if fn is None:  # an older binding without this function
            self._unsupported.add((index, name))
            return None
        self._last_error_kind = ""
        value = self._call(_function(fn), handle, *args)
        if value is None:
            kind = self._last_error_kind
            if kind == "NVMLError_NotSupported":
                self._unsupported.add((index, name))
            elif kind in _LOST_ERRORS:
                self._lost[index] = self._last_error or kind
        return value

    # -- sampling ----------------------------------------------------------------
    def sample(self, server_pids: Collection[int] = (), t: float | None = None) -> tuple[GpuSample, ...]:
        """One sample per selected device; empty when GPUs are unavailable."""
        with self._lock:
            self._ensure_init()
            if self._unavailable is not None:
                return ()
            now = time.time() if t is None else t
            return tuple(self._sample_safe(i, h, server_pids, now) for i, h in self._handles)

    def _sample_safe(self, index: int, handle: Handle, server_pids: Collection[int], t: float) -> GpuSample:
        try:
            return self._sample_one(index, handle, server_pids, t)
        except Exception as exc:  # noqa: BLE001 - a reading of an unexpected shape; never raise to callers
            uuid, name = self._ident.get(index, (None, None))
            return GpuSample(t, index, uuid, name, False, f"unreadable: {_describe(exc)}")

    def _sample_one(self, index: int, handle: Handle, server_pids: Collection[int], t: float) -> GpuSample:
        uuid, name = self._ident.get(index, (None, None))
        mem = self._dev(index, handle, "nvmlDeviceGetMemoryInfo")
        util = self._dev(index, handle, "nvmlDeviceGetUtilizationRates")
        power = self._dev(index, handle, "nvmlDeviceGetPowerUsage")
        limit = self._dev(index, handle, "nvmlDeviceGetEnforcedPowerLimit")
        temp = self._dev(index, handle, "nvmlDeviceGetTemperature", _NVML_TEMPERATURE_GPU)
        clock = self._dev(index, handle, "nvmlDeviceGetClockInfo", _NVML_CLOCK_SM)
        procs = self._dev(index, handle, "nvmlDeviceGetComputeRunningProcesses")
        energy = self._dev(index, handle, "nvmlDeviceGetTotalEnergyConsumption")  # Volta and later
        if index in self._lost:
            return GpuSample(t, index, uuid, name, False, f"GPU lost: {self._lost[index]}")
        server_mem = other_mem = None
        nprocs = None
        if procs is not None:
            if not isinstance(procs, Sized) or not isinstance(procs, Iterable):
                raise TypeError(f"process list of type {type(procs).__name__!r}")
            nprocs = len(procs)
            server_mem, other_mem = 0, 0
            for proc in procs:
                # usedGpuMemory is None when the driver hides it (e.g. inside some
                # containers, where NVML pids are also host pids and may not match ours).
                used: object = getattr(proc, "usedGpuMemory", None) or 0
                pid: object = getattr(proc, "pid", None)
                if pid in server_pids:
                    server_mem += as_int(used)
                else:
                    other_mem += as_int(used)
        return GpuSample(
            t=t,
            index=index,
            uuid=uuid,
            name=name,
            available=mem is not None or util is not None,
            reason=None if (mem is not None or util is not None) else f"no readings: {self._last_error}",
            mem_used_bytes=None if mem is None else as_int(_field(mem, "used")),
            mem_total_bytes=None if mem is None else as_int(_field(mem, "total")),
            util_gpu_pct=None if util is None else as_float(_field(util, "gpu")),
            util_mem_pct=None if util is None else as_float(_field(util, "memory")),
            power_w=None if power is None else as_float(power) / 1000.0,  # NVML reports milliwatts
            power_limit_w=None if limit is None else as_float(limit) / 1000.0,
            temp_c=None if temp is None else as_float(temp),
            sm_clock_mhz=None if clock is None else as_float(clock),
            server_mem_bytes=server_mem,
            other_mem_bytes=other_mem,
            nprocs=nprocs,
            energy_mj=None if energy is None else as_float(energy),
        )


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def visible_gpus() -> tuple[int, ...]:
    """NVML's indices of the GPUs this process sees (CUDA_VISIBLE_DEVICES applied); empty on a
    box without NVML or a GPU. Opens a reader and closes it."""
    reader = NvmlReader()
    try:
        return reader.visible_indices()
    finally:
        reader.close()
