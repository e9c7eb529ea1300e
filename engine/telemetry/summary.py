"""Per-run telemetry summary computed from a time range of the SeriesStore.

Server-side percentiles over the whole run come from the difference between the
first and the last cumulative histogram in the range, so the run's first scrape
should be taken just before the load starts. Counters are summed over the range
with restarts treated as fresh starts (like PromQL ``increase`` without extrapolation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from engine.telemetry.metrics import Quantiles
from engine.telemetry.store import F64, SeriesStore


def counter_increase(values: F64) -> float | None:
    """Increase of a counter over samples; a drop is a restart counted from zero."""
    v = values[~np.isnan(values)]
    if len(v) == 0:
        return None
    d = np.diff(v)
    return float(np.where(d >= 0, d, v[1:]).sum())


def _max(v: F64) -> float | None:
    v = v[~np.isnan(v)]
    return float(v.max()) if len(v) else None


def _max_int(v: F64) -> int | None:
    m = _max(v)
    return None if m is None else round(m)


def _mean(v: F64) -> float | None:
    v = v[~np.isnan(v)]
    return float(v.mean()) if len(v) else None


def _p90(v: F64) -> float | None:
    v = v[~np.isnan(v)]
    return float(np.percentile(v, 90)) if len(v) else None


@dataclass(frozen=True)
class GpuSummary:
    """One device over a run."""

    index: int
    name: str | None
    samples: int
    peak_mem_bytes: float | None
    mean_mem_bytes: float | None
    mem_total_bytes: float | None
    mean_util_pct: float | None
    peak_server_mem_bytes: float | None
    mean_power_w: float | None
    peak_temp_c: float | None


@dataclass(frozen=True)
class EnergySummary:
    """What the server's GPUs drew over a run's window, summed over devices.

    From NVML's energy counter where every device has one (exact: every joule between the
    window's first and last sample); otherwise from the power samples (``estimated``: what
    the 1 Hz readings miss between them is not counted). ``idle_power_w`` is the mean power
    before the load started (warm-up excluded), the baseline the run's draw compares with.
    """

    joules: float | None
    mean_power_w: float | None
    idle_power_w: float | None
    seconds: float
    estimated: bool
    reason: str | None = None  # why there is no figure

    def per(self, count: float | None) -> float | None:
        """Joules per unit (per output token, per request)."""
        return None if self.joules is None or not count else self.joules / count


def _rate(t: F64, v: F64) -> float | None:
    """Mean rate of a cumulative counter over its samples (its unit per second)."""
    ok = ~np.isnan(v)
    t, v = t[ok], v[ok]
    if len(v) < 2 or t[-1] <= t[0]:
        return None
    inc = counter_increase(v)
    return None if inc is None else inc / float(t[-1] - t[0])


def energy(store: SeriesStore, t0: float, t1: float, idle: tuple[float, float] | None = None) -> EnergySummary:
    """The GPUs' energy over [t0, t1] (see EnergySummary); ``idle``: the span for the baseline."""
    seconds = max(0.0, t1 - t0)
    indices = store.gpu_indices()
    if not indices:
        why = store.gpu_unavailable.reason if store.gpu_unavailable is not None else "no GPU samples"
        return EnergySummary(None, None, None, seconds, False, why)
    # The server's GPUs only: those where its processes hold memory. Where NVML does not
    # say (some containers hide the pids), every sampled GPU counts.
    own = [i for i in indices if (_max(store.series(f"gpu{i}.server_mem_bytes", t0, t1)[1]) or 0) > 0]
    indices = own or indices
    watts: list[float] = []
    estimated = False
    for idx in indices:
        t, e = store.series(f"gpu{idx}.energy_mj", t0, t1)
        rate = _rate(t, e)
        if rate is not None:
            watts.append(rate / 1000.0)
            continue
        p = _mean(store.series(f"gpu{idx}.power_w", t0, t1)[1])
        if p is None:
            return EnergySummary(None, None, None, seconds, False,
                                 f"GPU {idx} reported neither an energy counter nor power in the window")
        watts.append(p)
        estimated = True
    idle_w: float | None = None
    if idle is not None and idle[1] > idle[0]:
        means = [_mean(store.series(f"gpu{idx}.power_w", idle[0], idle[1])[1]) for idx in indices]
        idle_w = float(sum(m for m in means if m is not None)) if all(m is not None for m in means) else None
    power = float(sum(watts))
    return EnergySummary(power * seconds, power, idle_w, seconds, estimated)


@dataclass(frozen=True)
class TelemetrySummary:
    """What the GPU(s), host and server did over one run; ``to_dict()`` for JSON results."""

    t0: float | None
    t1: float | None
    gpus: tuple[GpuSummary, ...]
    gpu_unavailable: str | None
    peak_gpu_mem_bytes: float | None  # the largest peak over devices
    mean_gpu_util_pct: float | None  # mean over devices and time
    host_mean_cpu_pct: float | None
    host_peak_mem_bytes: float | None
    server_peak_rss_bytes: float | None
    server_mean_cpu_pct: float | None
    peak_kv_cache_usage: float | None  # 0..1
    peak_running: float | None
    mean_running: float | None
    peak_waiting: float | None
    preemptions: float | None
    prefix_hit_rate: float | None  # 0..1 over the run
    prompt_tokens: float | None
    generation_tokens: float | None
    server_ttft: Quantiles | None
    server_itl: Quantiles | None
    server_e2e: Quantiles | None
    stale_scrapes: int
    cache_config: dict[str, str]
    energy: EnergySummary | None = None
    # vLLM's busiest API server process, % of one core (engine.telemetry.host.is_front): its
    # mean and the 90th percentile of its samples (how busy it was under the load's plateau).
    server_front_cpu_pct: float | None = None
    server_front_cpu_p90: float | None = None
    # How many API server processes the server's tree had (the most seen over the run's samples;
    # engine.telemetry.host.HostSample.proc_front_procs): 1 unless vLLM ran several.
    server_front_procs: int | None = None
    # vllm:request_queue_time_seconds over the window: how much of TTFT was waiting to be scheduled.
    server_queue: Quantiles | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready dict; latency percentiles in milliseconds."""
        out = asdict(self)
        for key in ("server_ttft", "server_itl", "server_e2e", "server_queue"):
            q = getattr(self, key)
            out[key] = None if q is None else q.to_dict()
        out["gpus"] = [asdict(g) for g in self.gpus]
        return out


def summarize(store: SeriesStore, t0: float | None = None, t1: float | None = None, *,
              idle: tuple[float, float] | None = None) -> TelemetrySummary:
    """Summarise [t0, t1] (the whole store when omitted); ``idle``: the span before the load
    whose mean GPU power is the energy's baseline."""
    gpus: list[GpuSummary] = []
    for idx in store.gpu_indices():
        def s(f: str, idx: int = idx) -> F64:
            return store.series(f"gpu{idx}.{f}", t0, t1)[1]

        mem = s("mem_used_bytes")
        gpus.append(GpuSummary(
            index=idx, name=store.gpu_names.get(idx), samples=len(mem),
            peak_mem_bytes=_max(mem), mean_mem_bytes=_mean(mem), mem_total_bytes=_max(s("mem_total_bytes")),
            mean_util_pct=_mean(s("util_gpu_pct")), peak_server_mem_bytes=_max(s("server_mem_bytes")),
            mean_power_w=_mean(s("power_w")), peak_temp_c=_max(s("temp_c")),
        ))
    peaks = [g.peak_mem_bytes for g in gpus if g.peak_mem_bytes is not None]
    utils = [g.mean_util_pct for g in gpus if g.mean_util_pct is not None]

    def h(f: str) -> F64:
        return store.series(f"host.{f}", t0, t1)[1]

    def sv(f: str) -> F64:
        return store.series(f"server.{f}", t0, t1)[1]

    queries, hits = counter_increase(sv("prefix_queries_total")), counter_increase(sv("prefix_hits_total"))
    hit_rate = None if queries is None or hits is None or queries <= 0 else hits / queries

    def latency(key: str) -> Quantiles | None:
        first, last = store.histograms(key, t0, t1)
        if last is None:
            return None
        return Quantiles.of(last.minus(first))

    stale = sv("stale")
    unavailable = store.gpu_unavailable
    return TelemetrySummary(
        t0=t0, t1=t1, gpus=tuple(gpus),
        gpu_unavailable=None if unavailable is None else unavailable.reason,
        peak_gpu_mem_bytes=max(peaks) if peaks else None,
        mean_gpu_util_pct=float(np.mean(utils)) if utils else None,
        host_mean_cpu_pct=_mean(h("cpu_percent")),
        host_peak_mem_bytes=_max(h("mem_used_bytes")),
        server_peak_rss_bytes=_max(h("proc_rss_bytes")),
        server_mean_cpu_pct=_mean(h("proc_cpu_percent")),
        peak_kv_cache_usage=_max(sv("kv_cache_usage")),
        peak_running=_max(sv("running")),
        mean_running=_mean(sv("running")),
        peak_waiting=_max(sv("waiting")),
        preemptions=counter_increase(sv("preemptions_total")),
        prefix_hit_rate=hit_rate,
        prompt_tokens=counter_increase(sv("prompt_tokens_total")),
        generation_tokens=counter_increase(sv("generation_tokens_total")),
        server_ttft=latency("ttft"),
        server_itl=latency("itl"),
        server_e2e=latency("e2e"),
        server_queue=latency("queue"),
        stale_scrapes=int(np.nansum(stale)) if len(stale) else 0,
        cache_config=dict(store.cache_config),
        energy=energy(store, t0, t1, idle) if t0 is not None and t1 is not None else None,
        server_front_cpu_pct=_mean(h("proc_front_cpu_percent")),
        server_front_cpu_p90=_p90(h("proc_front_cpu_percent")),
        server_front_procs=_max_int(h("proc_front_procs")),
    )


__all__ = ["EnergySummary", "GpuSummary", "TelemetrySummary", "counter_increase", "energy", "summarize"]
