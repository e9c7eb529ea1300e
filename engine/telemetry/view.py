"""The samples as the screen reads them: the resource table's rows (DeviceView, from a
TelemetrySnapshot) and the server's own figures from /metrics (ServerMetricsView, from a
ServerSample). Frozen data and the pure functions that build it; a figure the sample does not
have (None) shows as "-"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.telemetry.metrics import Quantiles, ServerSample
    from engine.telemetry.sampler import TelemetrySnapshot


@dataclass(frozen=True)
class DeviceView:
    """One row of the resource table: a GPU, or the host when no GPU is visible."""

    name: str
    mem_used_gib: float | None
    mem_total_gib: float | None
    vllm_mem_gib: float | None  # the vLLM process tree's share (RSS on the CPU backend)
    util_pct: float | None  # GPU utilization, or host CPU percent
    power_w: float | None = None  # the GPU's draw now (None for the host row)
    index: int | None = None  # NVML's index of the GPU (None for the host row)


@dataclass(frozen=True)
class ServerMetricsView:
    """The server's own figures from /metrics over the last window."""

    running: float | None = None
    waiting: float | None = None
    kv_usage_pct: float | None = None
    preemptions_per_s: float | None = None
    prefix_hit_pct: float | None = None
    ttft_ms: Mapping[str, float] = field(default_factory=dict)  # "p50"/"p90"/"p99"
    itl_ms: Mapping[str, float] = field(default_factory=dict)
    e2el_ms: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None  # why the scrape failed, when it did
    # vLLM's busiest API server process, % of one core (engine.telemetry.host): the frontend
    # that streams every sequence's tokens; near 100 it, not the GPU, sets the pace.
    api_server_cpu_pct: float | None = None
    api_servers: int | None = None  # how many API server processes (vllm serve --api-server-count)


def _gib(value: float | None) -> float | None:
    return None if value is None else float(value) / 2**30


def devices_view(snap: TelemetrySnapshot | None) -> tuple[tuple[DeviceView, ...], str | None]:
    """GPU rows from a TelemetrySnapshot, or the host row when NVML gave none."""
    if snap is None:
        return (), None
    unavailable = snap.gpu_unavailable.reason if snap.gpu_unavailable is not None else None
    rows: list[DeviceView] = []
    for g in snap.gpus:
        name = f"GPU{g.index}" + ("" if g.available else f" ({g.reason or 'lost'})")
        rows.append(
            DeviceView(
                name=name,
                mem_used_gib=_gib(g.mem_used_bytes),
                mem_total_gib=_gib(g.mem_total_bytes),
                vllm_mem_gib=_gib(g.server_mem_bytes),
                util_pct=g.util_gpu_pct,
                power_w=g.power_w,
                index=g.index,
            )
        )
    host = snap.host
    if not rows and host is not None:
        rows.append(
            DeviceView(
                name="host",
                mem_used_gib=_gib(host.mem_used_bytes),
                mem_total_gib=_gib(host.mem_total_bytes),
                vllm_mem_gib=_gib(host.proc_rss_bytes),
                util_pct=host.cpu_percent,
            )
        )
    return tuple(rows), unavailable


def _ms(q: Quantiles | None) -> dict[str, float]:
    """Server Quantiles (seconds) to {"p50": ms, ...}."""
    if q is None:
        return {}
    return {k: v * 1000.0 for k, v in (("p50", q.p50), ("p90", q.p90), ("p99", q.p99)) if v is not None}


def server_metrics_view(s: ServerSample | None, telemetry: TelemetrySnapshot | None = None) -> ServerMetricsView:
    """The Live panel's server figures from the latest ServerSample, with the API server's
    CPU from the latest telemetry's host sample."""
    host = telemetry.host if telemetry is not None else None
    front = host.proc_front_cpu_percent if host is not None else None
    servers = host.proc_front_procs if host is not None else None
    if s is None:
        return ServerMetricsView(api_server_cpu_pct=front, api_servers=servers)
    if s.stale:
        return ServerMetricsView(error=s.reason or "no answer", api_server_cpu_pct=front, api_servers=servers)
    return ServerMetricsView(
        api_server_cpu_pct=front, api_servers=servers,
        running=s.running,
        waiting=s.waiting,
        kv_usage_pct=None if s.kv_cache_usage is None else s.kv_cache_usage * 100,
        preemptions_per_s=s.preemptions_per_s,
        prefix_hit_pct=None if s.prefix_hit_rate is None else s.prefix_hit_rate * 100,
        ttft_ms=_ms(s.ttft),
        itl_ms=_ms(s.itl),
        e2el_ms=_ms(s.e2e),
    )
