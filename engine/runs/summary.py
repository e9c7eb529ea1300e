"""A measured run's stored document, parsed once: :class:`RunSummary`.

:func:`engine.runs.measure.measure` builds one per run; the history stores ``to_json()`` in the
``summary`` column and parses the row back once with :meth:`RunSummary.stored`; every screen,
the comparison, the advisor and the tune read its typed fields. The document's keys, in the order
measure writes them:

``load``
    vllm bench serve's figures (``loadgen.stats.LoadSummary``).
``telemetry``
    ``engine.telemetry.summary.TelemetrySummary.to_dict()`` with the server's own figures over the
    window and its speed of light, typed (:class:`TelemetryFigures`).
``server``
    the ``/metrics`` deltas over the measured window (:class:`ServerWindow`; ``{}`` where the
    scrapes at its edges were not exact).
``energy``
    joules over the window, per token and per request, mean and idle power (:class:`EnergyFigures`).
``cross_check``
    the client against the server (:class:`CrossCheck`; the check: ``engine.runs.crosscheck``).
``stream``
    the stream's shape and the client's own cost (:class:`StreamShape`).
``client_bound``, ``client_cpus``, ``failures_by_reason``
    the client's facts, written with the load figures.
``slo_verdict``
    whether the run met its SLO and why not (:class:`SloVerdict`).
``error``, ``hint``, ``server_log``
    how a run that went wrong ended.
``startup``
    what the server said about itself while starting (``engine.server.logparse.StartupFacts``,
    stored as :func:`startup_json` writes it).

Older rows lack newer keys (they read as absent: None, False, empty); a trace or headless row
is only vllm bench serve's keys (read as ``load``, ``flat``). Nothing stored is lost:
``to_json()`` writes back the document it was parsed from, keys this vtui does not know
included (``extra``), in their order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from engine.server.logparse import StartupFacts
from engine.values import JSONObject, JSONValue, StoredFields
from loadgen.stats import LoadSummary

# A typed part of the document (RunSummary.from_json reads each alike).
_Part = TypeVar("_Part")
# The document's keys, in the order engine.runs.measure writes them.
KEYS = ("load", "telemetry", "energy", "server", "cross_check", "stream", "client_bound", "client_cpus",
        "failures_by_reason", "slo_verdict", "error", "hint", "server_log", "startup")
# Keys a summary reads as False or empty when the document lacks them.
_DEFAULTED = ("client_bound", "client_cpus", "failures_by_reason", "server_log")
# The stream's shape and the client's own cost, as every path stores them (StreamShape's fields).
STREAM_KEYS = ("tokens_per_event", "same_read_gap_fraction", "burst_requests", "stream_bursts",
               "client_lag_p50_ms", "client_own_lag_p99_ms", "client_cpu_mean", "client_cpu_p90",
               "client_sched_delay", "warmup_requests", "warmup_s", "first_request_s", "client_delay_ms",
               "box_bound")


# --------------------------------------------------------------------------- checked values


def _object(value: object, where: str, key: str) -> JSONObject | None:
    """A JSON object (a mapping with text keys) kept as it is, or None."""
    if value is None:
        return None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return value
    raise ValueError(f"{where}: {key} is {value!r}, not a JSON object")


def _value(value: object, where: str, key: str) -> JSONValue:
    """A value of a key this vtui does not read: any JSON value, kept as it is."""
    if value is None or isinstance(value, (bool, int, float, str, list, tuple)):
        return value
    obj = _object(value, where, key) if isinstance(value, Mapping) else None
    if obj is None:
        raise ValueError(f"{where}: {key} is {value!r}, not a JSON value")
    return obj


def _same(a: object, b: object) -> bool:
    """Whether two values are written as the same JSON text (3 and 3.0 are not)."""
    if a is None or b is None:
        return a is b
    if type(a) is type(b) and isinstance(a, (str, int, float)):  # bool is an int
        return a == b and (a != 0 or repr(a) == repr(b))  # 0.0 and -0.0 are written apart
    try:
        return json.dumps(a, default=str) == json.dumps(b, default=str)
    except (TypeError, ValueError):
        return a == b


@dataclass(frozen=True)
class Kept:
    """What a typed part would not write back as it was stored: keys it does not know or would
    write differently (``extra``, written back over it) and keys it writes that the stored part
    lacked (``absent``, left out), and the stored order where it was another (``order``): an
    older row comes back as it was stored."""

    extra: JSONObject = field(default_factory=dict)
    absent: frozenset[str] = frozenset()
    order: tuple[str, ...] = ()

    @classmethod
    def of(cls, stored: Mapping[str, object], written: Mapping[str, JSONValue], where: str) -> Kept | None:
        extra = {k: _value(v, where, k) for k, v in stored.items() if k not in written or not _same(v, written[k])}
        kept = cls(extra, frozenset(k for k in written if k not in stored))
        if list(kept.apply(written)) != list(stored):
            kept = cls(kept.extra, kept.absent, tuple(stored))
        return kept if kept.extra or kept.absent or kept.order else None

    def apply(self, written: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
        out = {k: v for k, v in written.items() if k not in self.absent}
        out.update(self.extra)
        if self.order:
            out = {k: out[k] for k in (*self.order, *out) if k in out}
        return out


# --------------------------------------------------------------------------- typed parts


def _cross_number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class CrossCheck:
    """Client beside server for one run; ``warnings`` says what disagrees and why it matters."""

    client_mean_ttft_ms: float | None
    server_mean_ttft_ms: float | None
    client_mean_tpot_ms: float | None
    server_tpot_ms: float | None  # (server mean E2E - server mean TTFT) / (tokens per request - 1)
    client_prompt_tokens: float | None  # per request, from each response's usage
    server_prompt_tokens: float | None  # per request the server finished, from its counter
    prefix_hit_rate: float | None
    warnings: tuple[str, ...]
    server_mean_queue_ms: float | None = None  # of TTFT, the time requests waited to be scheduled

    def to_dict(self) -> dict[str, JSONValue]:
        d: dict[str, JSONValue] = asdict(self)
        d["warnings"] = list(self.warnings)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> CrossCheck:
        """Back from :meth:`to_dict` (a stored run); missing figures are None."""
        warnings = d.get("warnings") or ()
        return cls(**{f: _cross_number(d.get(f)) for f in (
            "client_mean_ttft_ms", "server_mean_ttft_ms", "client_mean_tpot_ms", "server_tpot_ms",
            "client_prompt_tokens", "server_prompt_tokens", "prefix_hit_rate", "server_mean_queue_ms")},
            warnings=tuple(str(w) for w in warnings) if isinstance(warnings, Iterable) else ())


@dataclass(frozen=True)
class SloVerdict:
    """The run against its SLO (``loadgen.spec.judge``): ``why`` names what it missed."""

    met: bool
    why: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {"met": self.met, "why": self.why}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> SloVerdict:
        f = StoredFields(d, where)
        met = f.maybe_flag("met")
        if met is None:
            raise ValueError(f"{where}: met is missing")
        return cls(met, f.maybe_text("why"))


@dataclass(frozen=True)
class StreamShape:
    """How the responses streamed and what the client cost (``loadgen.run``'s extra keys):
    tokens per stream event, the share of gaps stamped by one read, the requests that came
    whole in one read (``stream_bursts``: enough to make TPOT/ITL unreliable), the client's
    event-loop lag and CPU, a scheduling delay that was not its own, the warm-up apart, and how
    long the first request took to leave. None: the run (or an older one) did not say."""

    tokens_per_event: float | None = None
    same_read_gap_fraction: float | None = None
    burst_requests: int | None = None
    stream_bursts: bool | None = None
    client_lag_p50_ms: float | None = None
    client_own_lag_p99_ms: float | None = None
    client_cpu_mean: float | None = None
    client_cpu_p90: float | None = None
    client_sched_delay: bool | None = None
    warmup_requests: int | None = None
    warmup_s: float | None = None
    first_request_s: float | None = None
    # The delay the client's held-up loop added to the mean TTFT (loadgen.run: measured from its first
    # tokens' waits in the socket), and whether it was past loadgen.run.BOX_DELAY_LIMIT_MS without
    # being the client's own (the run is box-bound).
    client_delay_ms: float | None = None
    box_bound: bool | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "tokens_per_event": self.tokens_per_event, "same_read_gap_fraction": self.same_read_gap_fraction,
            "burst_requests": self.burst_requests, "stream_bursts": self.stream_bursts,
            "client_lag_p50_ms": self.client_lag_p50_ms, "client_own_lag_p99_ms": self.client_own_lag_p99_ms,
            "client_cpu_mean": self.client_cpu_mean, "client_cpu_p90": self.client_cpu_p90,
            "client_sched_delay": self.client_sched_delay, "warmup_requests": self.warmup_requests,
            "warmup_s": self.warmup_s, "first_request_s": self.first_request_s,
            "client_delay_ms": self.client_delay_ms, "box_bound": self.box_bound,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> StreamShape:
        f = StoredFields(d, where)
        num = f.maybe_number
        return cls(
            tokens_per_event=num("tokens_per_event"), same_read_gap_fraction=num("same_read_gap_fraction"),
            burst_requests=f.maybe_whole("burst_requests"), stream_bursts=f.maybe_flag("stream_bursts"),
            client_lag_p50_ms=num("client_lag_p50_ms"), client_own_lag_p99_ms=num("client_own_lag_p99_ms"),
            client_cpu_mean=num("client_cpu_mean"), client_cpu_p90=num("client_cpu_p90"),
            client_sched_delay=f.maybe_flag("client_sched_delay"), warmup_requests=f.maybe_whole("warmup_requests"),
            warmup_s=num("warmup_s"), first_request_s=num("first_request_s"),
            client_delay_ms=num("client_delay_ms"), box_bound=f.maybe_flag("box_bound"))


@dataclass(frozen=True)
class EnergyFigures:
    """The run's energy as every screen and file shows it (``engine.runs.measure.energy_figures``):
    joules over the measured window, per output token and per completed request, the GPUs' mean
    and idle draw, whether the joules are estimated from power samples; without a reading only
    ``reason`` says why (then ``joules`` is None)."""

    joules: float | None = None
    j_per_token: float | None = None
    j_per_request: float | None = None
    mean_power_w: float | None = None
    idle_power_w: float | None = None
    estimated: bool | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        if self.joules is None:
            return {"joules": None, "reason": self.reason}
        return {"joules": self.joules, "j_per_token": self.j_per_token, "j_per_request": self.j_per_request,
                "mean_power_w": self.mean_power_w, "idle_power_w": self.idle_power_w,
                "estimated": self.estimated, "reason": self.reason}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> EnergyFigures:
        f = StoredFields(d, where)
        num = f.maybe_number
        return cls(joules=num("joules"), j_per_token=num("j_per_token"), j_per_request=num("j_per_request"),
                   mean_power_w=num("mean_power_w"), idle_power_w=num("idle_power_w"),
                   estimated=f.maybe_flag("estimated"), reason=f.maybe_text("reason"))


# --------------------------------------------------------------------------- telemetry, as stored


@dataclass(frozen=True)
class ServerLatency:
    """A server latency histogram over the run's window as stored (``engine.telemetry.metrics
    .Quantiles.to_dict()``): milliseconds, and how many observations. An older or partial
    document may lack any of them (None)."""

    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    count: float | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {"p50_ms": self.p50_ms, "p90_ms": self.p90_ms, "p99_ms": self.p99_ms, "mean_ms": self.mean_ms,
                "count": self.count}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> ServerLatency:
        num = StoredFields(d, where).maybe_number
        return cls(num("p50_ms"), num("p90_ms"), num("p99_ms"), num("mean_ms"), num("count"))


def _latency(d: Mapping[str, object], where: str, key: str) -> ServerLatency | None:
    """The latency histogram stored under ``key`` (None where missing or null)."""
    q = _object(d.get(key), where, key)
    return None if q is None else ServerLatency.from_json(q, f"{where}: {key}")


def _latency_json(q: ServerLatency | None) -> JSONValue:
    return None if q is None else q.to_json()


@dataclass(frozen=True)
class GpuFigures:
    """One device over the run as stored (``engine.telemetry.summary.GpuSummary``, its fields)."""

    index: int | None = None
    name: str | None = None
    samples: int | None = None
    peak_mem_bytes: float | None = None
    mean_mem_bytes: float | None = None
    mem_total_bytes: float | None = None
    mean_util_pct: float | None = None
    peak_server_mem_bytes: float | None = None
    mean_power_w: float | None = None
    peak_temp_c: float | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {"index": self.index, "name": self.name, "samples": self.samples,
                "peak_mem_bytes": self.peak_mem_bytes, "mean_mem_bytes": self.mean_mem_bytes,
                "mem_total_bytes": self.mem_total_bytes, "mean_util_pct": self.mean_util_pct,
                "peak_server_mem_bytes": self.peak_server_mem_bytes, "mean_power_w": self.mean_power_w,
                "peak_temp_c": self.peak_temp_c}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> GpuFigures:
        f = StoredFields(d, where)
        num = f.maybe_number
        return cls(index=f.maybe_whole("index"), name=f.maybe_text("name"), samples=f.maybe_whole("samples"),
                   peak_mem_bytes=num("peak_mem_bytes"), mean_mem_bytes=num("mean_mem_bytes"),
                   mem_total_bytes=num("mem_total_bytes"), mean_util_pct=num("mean_util_pct"),
                   peak_server_mem_bytes=num("peak_server_mem_bytes"), mean_power_w=num("mean_power_w"),
                   peak_temp_c=num("peak_temp_c"))


@dataclass(frozen=True)
class WindowEnergy:
    """What the server's GPUs drew over the window as stored (``engine.telemetry.summary
    .EnergySummary``, its fields): the figures the run's :class:`EnergyFigures` are made from."""

    joules: float | None = None
    mean_power_w: float | None = None
    idle_power_w: float | None = None
    seconds: float | None = None
    estimated: bool | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {"joules": self.joules, "mean_power_w": self.mean_power_w, "idle_power_w": self.idle_power_w,
                "seconds": self.seconds, "estimated": self.estimated, "reason": self.reason}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> WindowEnergy:
        f = StoredFields(d, where)
        num = f.maybe_number
        return cls(joules=num("joules"), mean_power_w=num("mean_power_w"), idle_power_w=num("idle_power_w"),
                   seconds=num("seconds"), estimated=f.maybe_flag("estimated"), reason=f.maybe_text("reason"))


@dataclass(frozen=True)
class SpeedOfLightFigures:
    """The run against its GPU's limits as stored (``engine.server.speedoflight.SpeedOfLight``'s
    fields, then its ``line`` and ``reason``), or only why there is none (``reason``; then
    ``floor_ms`` is None and only the reason is written). Times in milliseconds."""

    gpu: str | None = None
    batch: float | None = None
    context: float | None = None
    step_ms: float | None = None
    floor_ms: float | None = None
    bound: str | None = None
    mbu: float | None = None
    prefill_mfu: float | None = None
    launch_bound: bool | None = None
    source: str | None = None
    line: str | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        if self.floor_ms is None:
            return {"reason": self.reason}
        return {"gpu": self.gpu, "batch": self.batch, "context": self.context, "step_ms": self.step_ms,
                "floor_ms": self.floor_ms, "bound": self.bound, "mbu": self.mbu, "prefill_mfu": self.prefill_mfu,
                "launch_bound": self.launch_bound, "source": self.source, "line": self.line, "reason": self.reason}

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> SpeedOfLightFigures:
        f = StoredFields(d, where)
        num, text = f.maybe_number, f.maybe_text
        return cls(gpu=text("gpu"), batch=num("batch"), context=num("context"), step_ms=num("step_ms"),
                   floor_ms=num("floor_ms"), bound=text("bound"), mbu=num("mbu"), prefill_mfu=num("prefill_mfu"),
                   launch_bound=f.maybe_flag("launch_bound"), source=text("source"), line=text("line"),
                   reason=text("reason"))


@dataclass(frozen=True)
class TelemetryFigures:
    """The run's telemetry document, typed: ``engine.telemetry.summary.TelemetrySummary.to_dict()``
    over the measured window (its fields, latencies in ms as written), the server's own figures
    from the scrapes at the window's edges written over it (``engine.runs.measure.server_window``:
    the latencies, the token counters, the prefix-cache hit rate, the preemptions) and the run
    against its GPU's limits (``speed_of_light``, :class:`SpeedOfLightFigures`; absent where it
    was not computed). A part an older or partial document lacks reads
    as None (``cache_config``: empty; ``gpus``: none); a value of the wrong type is a ValueError
    naming the document and the key.

    Its own numbers are not used for anything but reading the stored ones: the telemetry room's
    ``TelemetrySummary`` (seconds, numpy) computes them."""

    t0: float | None = None
    t1: float | None = None
    gpus: tuple[GpuFigures, ...] = ()
    gpu_unavailable: str | None = None
    peak_gpu_mem_bytes: float | None = None
    mean_gpu_util_pct: float | None = None
    host_mean_cpu_pct: float | None = None
    host_peak_mem_bytes: float | None = None
    server_peak_rss_bytes: float | None = None
    server_mean_cpu_pct: float | None = None
    peak_kv_cache_usage: float | None = None  # 0..1
    peak_running: float | None = None
    mean_running: float | None = None
    peak_waiting: float | None = None
    preemptions: float | None = None
    prefix_hit_rate: float | None = None  # 0..1
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    server_ttft: ServerLatency | None = None
    server_itl: ServerLatency | None = None
    server_e2e: ServerLatency | None = None
    stale_scrapes: int | None = None
    cache_config: Mapping[str, str] = field(default_factory=dict)  # vllm:cache_config_info's labels
    energy: WindowEnergy | None = None
    server_front_cpu_pct: float | None = None
    server_front_cpu_p90: float | None = None
    server_front_procs: int | None = None
    server_queue: ServerLatency | None = None  # vllm:request_queue_time_seconds (ms)
    speed_of_light: SpeedOfLightFigures | None = None

    def to_json(self) -> dict[str, JSONValue]:
        """The document in TelemetrySummary.to_dict()'s order, ``speed_of_light`` last where there
        is one (as engine.runs.measure adds it)."""
        latency = _latency_json
        out: dict[str, JSONValue] = {
            "t0": self.t0, "t1": self.t1, "gpus": [g.to_json() for g in self.gpus],
            "gpu_unavailable": self.gpu_unavailable, "peak_gpu_mem_bytes": self.peak_gpu_mem_bytes,
            "mean_gpu_util_pct": self.mean_gpu_util_pct, "host_mean_cpu_pct": self.host_mean_cpu_pct,
            "host_peak_mem_bytes": self.host_peak_mem_bytes, "server_peak_rss_bytes": self.server_peak_rss_bytes,
            "server_mean_cpu_pct": self.server_mean_cpu_pct, "peak_kv_cache_usage": self.peak_kv_cache_usage,
            "peak_running": self.peak_running, "mean_running": self.mean_running, "peak_waiting": self.peak_waiting,
            "preemptions": self.preemptions, "prefix_hit_rate": self.prefix_hit_rate,
            "prompt_tokens": self.prompt_tokens, "generation_tokens": self.generation_tokens,
            "server_ttft": latency(self.server_ttft), "server_itl": latency(self.server_itl),
            "server_e2e": latency(self.server_e2e), "stale_scrapes": self.stale_scrapes,
            "cache_config": dict(self.cache_config),
            "energy": None if self.energy is None else self.energy.to_json(),
            "server_front_cpu_pct": self.server_front_cpu_pct, "server_front_cpu_p90": self.server_front_cpu_p90,
            "server_front_procs": self.server_front_procs, "server_queue": latency(self.server_queue),
        }
        if self.speed_of_light is not None:
            out["speed_of_light"] = self.speed_of_light.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> TelemetryFigures:
        def part(key: str) -> JSONObject | None:
            return _object(d.get(key), where, key)

        def latency(key: str) -> ServerLatency | None:
            return _latency(d, where, key)

        gpus = d.get("gpus") or []
        if not isinstance(gpus, (list, tuple)):
            raise ValueError(f"{where}: gpus is {gpus!r}, not a list of devices")
        devices = []
        for i, g in enumerate(gpus):
            one = _object(g, where, f"gpus[{i}]")
            if one is None:
                raise ValueError(f"{where}: gpus[{i}] is null, not a device")
            devices.append(GpuFigures.from_json(one, f"{where}: gpus[{i}]"))
        cc = part("cache_config") or {}
        if not all(isinstance(v, str) for v in cc.values()):
            raise ValueError(f"{where}: cache_config is {cc!r}, not text labels")
        energy = part("energy")
        sol = part("speed_of_light")
        f = StoredFields(d, where)
        num, whole = f.maybe_number, f.maybe_whole
        return cls(
            t0=num("t0"), t1=num("t1"), gpus=tuple(devices), gpu_unavailable=f.maybe_text("gpu_unavailable"),
            peak_gpu_mem_bytes=num("peak_gpu_mem_bytes"), mean_gpu_util_pct=num("mean_gpu_util_pct"),
            host_mean_cpu_pct=num("host_mean_cpu_pct"), host_peak_mem_bytes=num("host_peak_mem_bytes"),
            server_peak_rss_bytes=num("server_peak_rss_bytes"), server_mean_cpu_pct=num("server_mean_cpu_pct"),
            peak_kv_cache_usage=num("peak_kv_cache_usage"), peak_running=num("peak_running"),
            mean_running=num("mean_running"), peak_waiting=num("peak_waiting"), preemptions=num("preemptions"),
            prefix_hit_rate=num("prefix_hit_rate"), prompt_tokens=num("prompt_tokens"),
            generation_tokens=num("generation_tokens"),
            server_ttft=latency("server_ttft"), server_itl=latency("server_itl"), server_e2e=latency("server_e2e"),
            stale_scrapes=whole("stale_scrapes"),
            cache_config={k: v for k, v in cc.items() if isinstance(v, str)},
            energy=None if energy is None else WindowEnergy.from_json(energy, f"{where}: energy"),
            server_front_cpu_pct=num("server_front_cpu_pct"), server_front_cpu_p90=num("server_front_cpu_p90"),
            server_front_procs=whole("server_front_procs"), server_queue=latency("server_queue"),
            speed_of_light=None if sol is None else SpeedOfLightFigures.from_json(sol, f"{where}: speed_of_light"))


@dataclass(frozen=True)
class ServerWindow:
    """The server's own figures over the measured window as stored (``engine.runs.measure
    .server_window``: the ``/metrics`` deltas between the scrapes at the window's edges, ``t0``
    and ``t1``): its latencies (ms), token counters, prefix-cache hit rate and preemptions. All
    None where the scrapes were not exact (measure stores an empty document, ``{}``); an older or
    partial document reads None for what it lacks."""

    server_ttft: ServerLatency | None = None
    server_itl: ServerLatency | None = None
    server_e2e: ServerLatency | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prefix_hit_rate: float | None = None  # 0..1
    preemptions: float | None = None
    t0: float | None = None
    t1: float | None = None
    server_queue: ServerLatency | None = None  # vllm:request_queue_time_seconds (ms)

    def to_json(self) -> dict[str, JSONValue]:
        """In server_window's order; ``{}`` for the empty window."""
        if self == ServerWindow():
            return {}
        return {"server_ttft": _latency_json(self.server_ttft), "server_itl": _latency_json(self.server_itl),
                "server_e2e": _latency_json(self.server_e2e), "prompt_tokens": self.prompt_tokens,
                "generation_tokens": self.generation_tokens, "prefix_hit_rate": self.prefix_hit_rate,
                "preemptions": self.preemptions, "t0": self.t0, "t1": self.t1,
                "server_queue": _latency_json(self.server_queue)}

    def figures(self) -> TelemetryFigures:
        """The window as telemetry figures (what ``engine.runs.crosscheck.cross_check`` reads)."""
        return TelemetryFigures(t0=self.t0, t1=self.t1, preemptions=self.preemptions,
                                prefix_hit_rate=self.prefix_hit_rate, prompt_tokens=self.prompt_tokens,
                                generation_tokens=self.generation_tokens, server_ttft=self.server_ttft,
                                server_itl=self.server_itl, server_e2e=self.server_e2e,
                                server_queue=self.server_queue)

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> ServerWindow:
        num = StoredFields(d, where).maybe_number
        return cls(server_ttft=_latency(d, where, "server_ttft"), server_itl=_latency(d, where, "server_itl"),
                   server_e2e=_latency(d, where, "server_e2e"), prompt_tokens=num("prompt_tokens"),
                   generation_tokens=num("generation_tokens"), prefix_hit_rate=num("prefix_hit_rate"),
                   preemptions=num("preemptions"), t0=num("t0"), t1=num("t1"),
                   server_queue=_latency(d, where, "server_queue"))


def startup_json(facts: StartupFacts) -> dict[str, JSONValue]:
    """A run's ``startup`` as stored: ``StartupFacts.to_dict()``, without ``non_default_args``
    where the facts have none (engine.runs.measure leaves vLLM's echo of its arguments out: it
    is the flags again, and could carry a secret given on a command line)."""
    return {k: _value(v, "startup", k) for k, v in facts.to_dict().items()
            if not (k == "non_default_args" and v is None)}


# --------------------------------------------------------------------------- the document


@dataclass(frozen=True)
class RunSummary:
    """A measured run's stored document, typed (see the module's text). ``telemetry`` is
    the telemetry document typed (:class:`TelemetryFigures`; ``to_json()["telemetry"]`` gives it
    as stored); ``server`` the server's window (:class:`ServerWindow`);
    ``startup`` the server's own startup facts (``StartupFacts``).

    ``extra``: stored keys no typed field holds (a newer vtui's, or a typed part stored empty),
    written back as they were. ``flat``: a trace/headless row whose document is only vllm bench
    serve's keys (``load``). ``keys``: the stored document's keys in order (empty when built here:
    then written in measure's order). ``kept``: per typed part, what of the stored part it would
    not write back as it was (see :class:`Kept`)."""

    load: LoadSummary | None = None
    telemetry: TelemetryFigures | None = None
    energy: EnergyFigures | None = None
    server: ServerWindow | None = None
    cross_check: CrossCheck | None = None
    stream: StreamShape | None = None
    client_bound: bool = False
    client_cpus: tuple[int, ...] = ()
    failures_by_reason: Mapping[str, int] = field(default_factory=dict)
    slo: SloVerdict | None = None
    error: str | None = None
    hint: str | None = None
    server_log: tuple[str, ...] = ()
    startup: StartupFacts | None = None
    extra: JSONObject = field(default_factory=dict)
    flat: bool = False
    keys: tuple[str, ...] = ()
    kept: Mapping[str, Kept] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------- reading
    def figure(self, name: str) -> float | None:
        """A load figure by vllm bench serve's name (``LoadSummary.get``), as stored: None where
        the run has no load figures or its stored load lacked this one (an older row)."""
        if self.load is None:
            return None
        kept = self.kept.get("load")
        if kept is not None:
            if name in kept.absent:
                return None
            if name in kept.extra:
                value = kept.extra[name]
                return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        return self.load.get(name)

    def load_json(self) -> dict[str, JSONValue]:
        """The load figures as stored (vllm bench serve's keys); empty without any."""
        if self.load is None:
            return {}
        kept = self.kept.get("load")
        written: dict[str, JSONValue] = dict(self.load.to_dict())
        return kept.apply(written) if kept is not None else written

    @property
    def slo_met(self) -> bool | None:
        """Whether the run met its SLO; None when it had none."""
        return self.slo.met if self.slo is not None else None

    @property
    def mean_power_w(self) -> float | None:
        """The GPUs' mean draw over the measured window (the energy figures'), when measured."""
        return self.energy.mean_power_w if self.energy is not None else None

    @property
    def empty(self) -> bool:
        """Nothing stored (a run refused before it measured anything, with no error to say)."""
        parts = (self.load, self.telemetry, self.energy, self.server, self.cross_check, self.stream, self.slo,
                 self.error, self.startup)
        return (not self.keys and not self.extra and all(p is None for p in parts)
                and not (self.client_bound or self.client_cpus or self.failures_by_reason or self.hint
                         or self.server_log))

    # ------------------------------------------------------------- writing
    def _present(self, key: str) -> bool:
        """Whether ``key`` is written where the stored document lacked it: a summary built here
        follows measure's rules (the client's facts go with the load figures); a parsed one gains
        only what was set since."""
        if key in ("client_bound", "client_cpus", "failures_by_reason"):
            return (self.load is not None and not self.keys) or bool(self._part(key))
        if key in ("hint", "server_log"):
            return bool(self._part(key))
        return self._part(key) is not None

    def _part(self, key: str) -> JSONValue:
        kept = self.kept.get(key)
        typed: dict[str, JSONValue] | None = None
        if key == "load":
            return self.load_json() if self.load is not None else None
        if key == "cross_check":
            typed = self.cross_check.to_dict() if self.cross_check is not None else None
        elif key == "stream":
            typed = self.stream.to_json() if self.stream is not None else None
        elif key == "slo_verdict":
            typed = self.slo.to_json() if self.slo is not None else None
        elif key == "energy":
            typed = self.energy.to_json() if self.energy is not None else None
        elif key == "telemetry":
            typed = self.telemetry.to_json() if self.telemetry is not None else None
        elif key == "server":
            typed = self.server.to_json() if self.server is not None else None
        elif key == "startup":
            typed = startup_json(self.startup) if self.startup is not None else None
        else:
            simple: dict[str, JSONValue] = {
                "client_bound": self.client_bound, "client_cpus": list(self.client_cpus),
                "failures_by_reason": dict(self.failures_by_reason), "error": self.error, "hint": self.hint,
                "server_log": list(self.server_log)}
            return simple[key]
        return kept.apply(typed) if typed is not None and kept is not None else typed

    def to_json(self) -> dict[str, JSONValue]:
        """The stored document: the keys it was parsed from, in their order (a summary built
        here: measure's keys in measure's order), unknown keys included."""
        if self.flat:
            return self.load_json()
        order = [*self.keys, *(k for k in KEYS if k not in self.keys and self._present(k)),
                 *(k for k in self.extra if k not in self.keys)]
        out: dict[str, JSONValue] = {}
        for key in order:
            value = self._part(key) if key in KEYS else None
            if key in self.extra and (value is None or (key in _DEFAULTED and not value)):
                value = self.extra[key]
            elif value is None and key not in KEYS:
                continue  # an unknown key taken out of extra
            out[key] = value
        return out

    # ------------------------------------------------------------- parsing
    @classmethod
    def from_json(cls, doc: Mapping[str, object], where: str = "run summary") -> RunSummary:
        """Parse a stored document once: an older row without newer keys, or a trace/headless
        row of bench serve's keys only (``flat``), reads as it was meant; a value of the wrong
        type is a ValueError naming ``where`` and the key."""
        if "load" not in doc and "telemetry" not in doc:
            if any(LoadSummary.is_figure_name(k) for k in doc):
                figures = LoadSummary.from_dict(doc, where)
                kept = Kept.of(doc, figures.to_dict(), where)
                return cls(load=figures, flat=True, keys=tuple(doc), kept={"load": kept} if kept else {})

        extra: dict[str, JSONValue] = {}
        kept_parts: dict[str, Kept] = {}

        def typed(key: str, read: Callable[[Mapping[str, object], str], _Part],
                  write: Callable[[_Part], Mapping[str, JSONValue]]) -> _Part | None:
            """A typed part read from its stored object (``read``), and what of that object
            ``write`` would not give back kept; None (the stored value kept in extra) when
            stored empty or null."""
            stored = _object(doc.get(key), where, key)
            if not stored:
                if key in doc:
                    extra[key] = _value(doc[key], where, key)
                return None
            typed = read(stored, f"{where}: {key}")
            kept = Kept.of(stored, write(typed), f"{where}: {key}")
            if kept is not None:
                kept_parts[key] = kept
            return typed

        load = typed("load", LoadSummary.from_dict, LoadSummary.to_dict)
        check = typed("cross_check", lambda d, _where: CrossCheck.from_dict(d), CrossCheck.to_dict)
        stream = typed("stream", StreamShape.from_json, StreamShape.to_json)
        slo = typed("slo_verdict", SloVerdict.from_json, SloVerdict.to_json)
        energy = typed("energy", EnergyFigures.from_json, EnergyFigures.to_json)
        telemetry = typed("telemetry", TelemetryFigures.from_json, TelemetryFigures.to_json)
        server = typed("server", ServerWindow.from_json, ServerWindow.to_json)
        startup = typed("startup", StartupFacts.from_json, startup_json)

        cpus = doc.get("client_cpus") or []
        if not isinstance(cpus, (list, tuple)) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cpus):
            raise ValueError(f"{where}: client_cpus is {cpus!r}, not a list of core numbers")
        failures = doc.get("failures_by_reason") or {}
        if not isinstance(failures, Mapping) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in failures.items()):
            raise ValueError(f"{where}: failures_by_reason is {failures!r}, not counts by reason")
        log = doc.get("server_log") or []
        if not isinstance(log, (list, tuple)) or not all(isinstance(line, str) for line in log):
            raise ValueError(f"{where}: server_log is {log!r}, not a list of lines")
        extra.update({k: _value(v, where, k) for k, v in doc.items() if k not in KEYS})
        top = StoredFields(doc, where)
        return cls(
            load=load,
            telemetry=telemetry,
            energy=energy,
            server=server,
            cross_check=check,
            stream=stream,
            client_bound=top.flag("client_bound", False),
            client_cpus=tuple(cpus),
            failures_by_reason=dict(failures),
            slo=slo,
            error=top.maybe_text("error"),
            hint=top.maybe_text("hint"),
            server_log=tuple(log),
            startup=startup,
            extra=extra,
            keys=tuple(doc),
            kept=kept_parts,
        )

    @classmethod
    def stored(cls, doc: object, where: str) -> RunSummary:
        """A history row's document: :meth:`from_json`, or, where it does not parse (a damaged
        or hand-edited row), the document kept whole in ``extra`` so that the row still lists and
        is written back as it was."""
        if not isinstance(doc, Mapping) or not all(isinstance(k, str) for k in doc):
            return cls()
        try:
            return cls.from_json(doc, where)
        except ValueError:
            return cls(extra={k: _value(v, where, k) for k, v in doc.items()}, keys=tuple(doc))


__all__ = ["KEYS", "STREAM_KEYS", "EnergyFigures", "GpuFigures", "Kept", "RunSummary", "ServerLatency", "ServerWindow",
           "SloVerdict", "SpeedOfLightFigures", "StreamShape", "TelemetryFigures", "WindowEnergy", "startup_json"]
