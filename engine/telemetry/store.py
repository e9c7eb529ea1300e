"""One bounded time-series store of every telemetry sample, shared by the TUI and headless runs.

Each source (``gpu0``, ``gpu1``, ..., ``host``, ``server``) is a columnar numpy ring
buffer: one float64 timestamp column and one float64 column per numeric field, with
NaN for "not available". Each server latency histogram (cumulative bucket counts and
sum) is a ring of its own, so whole-run percentiles can be taken from the first and
last histogram of any time range.

Bound: ``capacity`` rows per source, default 7200 = one hour at 2 Hz; older rows are
overwritten. With 8 GPUs, host, server and three 25-bucket latency histograms at that
capacity the store holds 12.1 MB, allocated per source on its first sample (measured
with tracemalloc in tests/engine/telemetry/test_telemetry_store.py, which asserts < 16 MB).
All methods are thread-safe: the sampler thread writes while the UI reads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.telemetry.host import HostSample
from engine.telemetry.metrics import Histogram, ServerSample
from engine.telemetry.nvml import GpuSample, GpuUnavailable

F64 = npt.NDArray[np.float64]

DEFAULT_CAPACITY = 7200  # one hour at 2 Hz

GPU_FIELDS = (
    "available", "mem_used_bytes", "mem_total_bytes", "util_gpu_pct", "util_mem_pct", "power_w",
    "power_limit_w", "temp_c", "sm_clock_mhz", "server_mem_bytes", "other_mem_bytes", "energy_mj",
)
HOST_FIELDS = (
    "cpu_percent", "mem_used_bytes", "mem_total_bytes", "proc_alive", "proc_rss_bytes", "proc_cpu_percent",
    "proc_front_cpu_percent", "proc_front_procs",
)
_COUNTER_FIELDS = (
    "preemptions_total", "prompt_tokens_total", "generation_tokens_total", "prefix_queries_total",
    "prefix_hits_total", "requests_total",
)
_LATENCY_KEYS = ("ttft", "itl", "e2e")
SERVER_FIELDS = (
    "stale", "running", "waiting", "kv_cache_usage", "preemptions_per_s", "prefix_hit_rate", "prompt_tok_s",
    "gen_tok_s", "requests_per_s",
    *(f"{k}_{p}" for k in _LATENCY_KEYS for p in ("p50", "p90", "p99")),
    *_COUNTER_FIELDS,
)


def _num(value: object) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value)  # type: ignore[arg-type]  # int/float fields only, by construction


class _Ring:
    """Fixed-capacity rows of (t, values...); the oldest row is overwritten."""

    def __init__(self, capacity: int, width: int) -> None:
        self.t: F64 = np.empty(capacity, dtype=np.float64)
        self.v: F64 = np.empty((capacity, width), dtype=np.float64)
        self.capacity = capacity
        self.appended = 0

    def append(self, t: float, row: Sequence[float]) -> None:
        i = self.appended % self.capacity
        self.t[i] = t
        self.v[i] = row
        self.appended += 1

    def __len__(self) -> int:
        return min(self.appended, self.capacity)

    def ordered(self) -> tuple[F64, F64]:
        n = len(self)
        if self.appended <= self.capacity:
            return self.t[:n], self.v[:n]
        head = self.appended % self.capacity
        return np.concatenate((self.t[head:], self.t[:head])), np.concatenate((self.v[head:], self.v[:head]))

    def window(self, t0: float | None, t1: float | None) -> tuple[F64, F64]:
        t, v = self.ordered()
        mask = np.ones(len(t), dtype=bool)
        if t0 is not None:
            mask &= t >= t0
        if t1 is not None:
            mask &= t <= t1
        return t[mask].copy(), v[mask].copy()


@dataclass(frozen=True)
class _HistRing:
    bounds: tuple[float, ...]
    ring: _Ring


class SeriesStore:
    """Ring-buffered series of GPU, host and server samples; query by name and time range.

    Series names: ``gpu<N>.<field>`` (N = NVML index) for GPU_FIELDS, ``host.<field>``
    for HOST_FIELDS, ``server.<field>`` for SERVER_FIELDS.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 2:
            raise ValueError(f"SeriesStore capacity must be at least 2, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._rings: dict[str, _Ring] = {}
        self._fields: dict[str, tuple[str, ...]] = {}
        self._hists: dict[str, _HistRing] = {}
        self.gpu_names: dict[int, str | None] = {}
        self.gpu_unavailable: GpuUnavailable | None = None
        self.cache_config: dict[str, str] = {}
        self.latest_server: ServerSample | None = None

    # -- writing -----------------------------------------------------------------
    def _append(self, source: str, fields: tuple[str, ...], t: float, row: list[float]) -> None:
        ring = self._rings.get(source)
        if ring is None:
            ring = self._rings[source] = _Ring(self.capacity, len(fields))
            self._fields[source] = fields
        ring.append(t, row)

    def add_gpu(self, sample: GpuSample) -> None:
        """Append one GPU reading."""
        row = [_num(getattr(sample, f)) for f in GPU_FIELDS]
        with self._lock:
            self.gpu_names[sample.index] = sample.name
            self._append(f"gpu{sample.index}", GPU_FIELDS, sample.t, row)

    def add_host(self, sample: HostSample) -> None:
        """Append one host reading."""
        row = [_num(getattr(sample, f)) for f in HOST_FIELDS]
        with self._lock:
            self._append("host", HOST_FIELDS, sample.t, row)

    def add_server(self, sample: ServerSample) -> None:
        """Append one server reading (stale ones too: they show as gaps)."""
        row: list[float] = []
        for f in SERVER_FIELDS:
            key, _, pct = f.partition("_")
            if key in _LATENCY_KEYS and pct in ("p50", "p90", "p99"):
                q = getattr(sample, key)
                row.append(_num(None if q is None else getattr(q, pct)))
            else:
                row.append(_num(getattr(sample, f)))
        with self._lock:
            self._append("server", SERVER_FIELDS, sample.t, row)
            self.latest_server = sample
            if sample.cache_config:
                self.cache_config = dict(sample.cache_config)
            for key, hist in sample.histograms.items():
                hr = self._hists.get(key)
                if hr is None or hr.bounds != hist.bounds:
                    # New bucket layout (another vLLM after a restart): older rows of this
                    # histogram cannot be compared with the new ones, so they are dropped.
                    hr = self._hists[key] = _HistRing(hist.bounds, _Ring(self.capacity, len(hist.bounds) + 1))
                hr.ring.append(sample.t, [*hist.counts, _num(hist.sum)])

    def add_snapshot(self, gpus: Iterable[GpuSample], host: HostSample | None,
                     unavailable: GpuUnavailable | None = None) -> None:
        """Append the GPU and host parts of one sampler tick."""
        for g in gpus:
            self.add_gpu(g)
        if host is not None:
            self.add_host(host)
        if unavailable is not None:
            self.gpu_unavailable = unavailable

    # -- reading -----------------------------------------------------------------
    def keys(self) -> list[str]:
        """Every series name present."""
        with self._lock:
            return [f"{src}.{f}" for src, fields in self._fields.items() for f in fields]

    def gpu_indices(self) -> list[int]:
        """NVML indices of the GPUs seen."""
        with self._lock:
            return sorted(self.gpu_names)

    def series(self, name: str, t0: float | None = None, t1: float | None = None) -> tuple[F64, F64]:
        """Timestamps and values of one series within [t0, t1]; empty arrays if unknown."""
        source, _, fld = name.partition(".")
        with self._lock:
            ring = self._rings.get(source)
            if ring is None or fld not in self._fields[source]:
                return np.empty(0), np.empty(0)
            t, v = ring.window(t0, t1)
            return t, v[:, self._fields[source].index(fld)].copy()

    def histograms(self, key: str, t0: float | None = None, t1: float | None = None
                   ) -> tuple[Histogram | None, Histogram | None]:
        """First and last cumulative histogram (``ttft``/``itl``/``e2e``) within [t0, t1]."""
        with self._lock:
            hr = self._hists.get(key)
            if hr is None:
                return None, None
            t, v = hr.ring.window(t0, t1)
            bounds = hr.bounds
        if len(t) == 0:
            return None, None

        def hist(row: F64) -> Histogram:
            s = float(row[-1])
            return Histogram(bounds, tuple(float(x) for x in row[:-1]), None if math.isnan(s) else s)

        return hist(v[0]), hist(v[-1])

    def span(self) -> tuple[float, float] | None:
        """Earliest and latest timestamp held, over every source."""
        with self._lock:
            ends = [ring.ordered()[0] for ring in self._rings.values() if len(ring)]
        if not ends:
            return None
        return min(float(t[0]) for t in ends), max(float(t[-1]) for t in ends)

    def nbytes(self) -> int:
        """Bytes held by the ring buffers (allocated up front per source)."""
        with self._lock:
            rings = [*self._rings.values(), *(h.ring for h in self._hists.values())]
            return sum(r.t.nbytes + r.v.nbytes for r in rings)

    def to_dict(self, t0: float | None = None, t1: float | None = None) -> dict[str, dict[str, list[float | None]]]:
        """Every source in [t0, t1] as plain lists, ``{"gpu0": {"t": [...], "util_gpu_pct": [...]}}``.

        NaN ("not available") becomes None so the result is valid JSON.
        """
        out: dict[str, dict[str, list[float | None]]] = {}
        with self._lock:
            windows = {src: (ring.window(t0, t1), self._fields[src]) for src, ring in self._rings.items()}
        for src, ((t, v), fields) in windows.items():
            cols: dict[str, list[float | None]] = {"t": [float(x) for x in t]}
            for j, f in enumerate(fields):
                cols[f] = [None if math.isnan(x) else float(x) for x in v[:, j]]
            out[src] = cols
        return out
