"""What the advisor reads about one run: :class:`RunData`, from the history, a saved file or a
failed start (:func:`failure_from_line`, :func:`failure_from_error`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import EngineDied, MaxModelLenTooLarge, SessionError, StartupError
from engine.modelconfig import config_json_or_none
from engine.runs.flagchange import flag_changes_of
from engine.runs.status import RunStatus
from engine.runs.summary import TelemetryFigures
from engine.server.logparse import StartupFacts, classify_failure
from engine.values import as_int

if TYPE_CHECKING:  # only for annotations
    from engine.runs.history import History


# vLLM defaults used when a flag is unset (V1 engine, OpenAI server). max-num-batched-tokens
# depends on the device and usage context, so an unset value is shown as "default".
DEFAULTS: Mapping[str, float | bool] = {
    "gpu-memory-utilization": 0.9,
    "max-num-seqs": 256,
    "tensor-parallel-size": 1,
    "enable-chunked-prefill": True,
}


class RunDataError(ValueError):
    """Run data that cannot be read: names the file (or source) and the key."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


def _status_word(stored: object) -> str:
    """A recorded run's status in engine.runs.status words (older files say complete/cut_short)."""
    try:
        return RunStatus.parse(str(stored or "ok")).value
    except ValueError:
        return str(stored)


def _norm_flag(name: str) -> str:
    return str(name).strip().lstrip("-").replace("_", "-")


def _f(value: object) -> float | None:
    """A finite float, or None (missing, bool, text, nan)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _pct(d: object, key: str) -> float | None:
    if isinstance(d, Mapping):
        return _f(d.get(key))
    return None


def _time(row: Mapping[str, object]) -> float:
    """A series row's ``t``: a number (what any arithmetic on it needs), else TypeError."""
    t = row["t"]
    if isinstance(t, (int, float)):
        return t
    raise TypeError(f"a row's time is not a number: {t!r}")


# One request row: (input_tokens, output_tokens, ttft_ms, tpot_ms); tpot None for one output token.
RequestRow = tuple[float | None, float | None, float | None, float | None]


@dataclass(frozen=True)
class RunData:
    """Everything the advisor reads about one run, in plain JSON-able values.

    Series are tuples of small dicts with ``t`` (epoch s): ``windows`` (loadgen
    StatsWindow: completed, in_flight, req_s, ttft/tpot p50/p99 ms, client_bound,
    client_lag_ms, client_cpu), ``server`` (running, waiting, kv_cache_usage 0..1,
    preemptions_total, prefix_hit_rate), ``gpus`` (index, util_gpu_pct,
    mem_used_bytes, mem_total_bytes), ``host`` (cpu_percent, cpu_count,
    mem_total_bytes, proc_cpu_percent). ``requests`` holds ``(input_tokens,
    output_tokens, ttft_ms, tpot_ms)`` of successful requests (tpot None for one
    output token). ``load`` is the RunResult summary (vllm bench serve keys);
    ``telemetry`` the TelemetrySummary dict (the figures the rules read, as stored), read once
    into ``telemetry_figures`` (``engine.runs.summary.TelemetryFigures``; a value of the wrong
    type is a ValueError, a RunDataError from a file); ``failure`` the startup failure
    (``kind`` = StartupError class name, ``vllm_line``, ``hint``,
    ``estimated_max_len``); ``model_config`` the model's config.json (for the planner);
    ``startup`` what the server said about itself while starting
    (``engine.server.logparse.StartupFacts.to_dict()``, e.g. ``max_cudagraph_capture_size``),
    where the run kept it (the summary's ``startup``); empty where not; read once into
    ``startup_facts`` (``StartupFacts.from_json``; a wrong type is a ValueError as above).
    ``draft_model`` is not measured: a draft model the caller offers for speculative decoding
    (``vtui advise --draft-model``, or :func:`advise`'s ``draft_model``), a local folder or a
    Hugging Face id; :func:`rule_speculative_draft` names it where the run shows room for one.
    It is the caller's, not the run's, so :meth:`to_dict` does not write it.
    """

    # The mappings hold JSON as read back (from the history or a file): every value is narrowed
    # where it is read (_f, _int, _float, isinstance), never trusted to be of one type; the
    # telemetry's are typed once, in __post_init__ (its mapping stays what to_dict writes).
    name: str
    flags: Mapping[str, object]
    model: str | None = None
    status: str = "ok"  # engine.runs.status words
    started: float | None = None
    ended: float | None = None
    load: Mapping[str, object] = field(default_factory=dict)
    telemetry: Mapping[str, object] = field(default_factory=dict)
    windows: tuple[Mapping[str, object], ...] = ()
    server: tuple[Mapping[str, object], ...] = ()
    gpus: tuple[Mapping[str, object], ...] = ()
    host: tuple[Mapping[str, object], ...] = ()
    requests: tuple[RequestRow, ...] = ()
    workload: Mapping[str, object] = field(default_factory=dict)
    failure: Mapping[str, object] | None = None
    model_config: Mapping[str, object] | None = None
    startup: Mapping[str, object] = field(default_factory=dict)
    draft_model: str | None = None
    # Flags changed live while the run measured (engine.runs.flagchange.FlagChange.to_json each): it
    # measured two configurations, so the advisor reads nothing from it
    flag_changes: tuple[Mapping[str, object], ...] = ()
    note: str = ""
    """Where the data came from (recorded how, or changed how), for test data."""
    telemetry_figures: TelemetryFigures = field(init=False, repr=False, compare=False)
    """``telemetry`` typed: what the rules read (derived, so not compared, not written)."""
    startup_facts: StartupFacts = field(init=False, repr=False, compare=False)
    """``startup`` typed, the same way."""

    def __post_init__(self) -> None:
        # Set here, once per RunData (dataclasses.replace builds a new one: read again), on a frozen
        # dataclass: object.__setattr__ is the way dataclasses document for a derived field.
        object.__setattr__(self, "telemetry_figures",
                           TelemetryFigures.from_json(self.telemetry, f"{self.name}: telemetry"))
        object.__setattr__(self, "startup_facts", StartupFacts.from_json(self.startup, f"{self.name}: startup"))

    # ------------------------------------------------------------- flags
    def flag(self, name: str, default: object = None) -> object:
        """A flag's value (any spelling); for a flag the run did not record, the value the server
        itself reported (vllm:cache_config_info: an attached server's flags are not known) where
        it is not vLLM's default; else ``default``."""
        key = _norm_flag(name)
        if key in self.flags:
            return self.flags[key]
        label = SERVER_REPORTED.get(key)
        if label is not None:
            v = _f(_num_text(self.cache_config.get(label)))
            if v is not None and v != DEFAULTS.get(key):
                return v
        return default

    def flag_or_default(self, name: str) -> object:
        return self.flag(name, DEFAULTS.get(_norm_flag(name)))

    # ------------------------------------------------------------- derived
    @property
    def t0(self) -> float | None:
        """Start of the run: the earliest time stamp seen (for 'N s into the run')."""
        ts = [t for series in (self.windows, self.server) for s in series
              if isinstance(t := s.get("t"), (int, float)) and _f(t) is not None]
        if self.started is not None:
            ts.append(self.started)
        return min(ts) if ts else None

    @property
    def gpu_count(self) -> int:
        return len({g.get("index") for g in self.gpus})

    @property
    def gpu_total_bytes(self) -> float | None:
        totals = [_f(g.get("mem_total_bytes")) for g in self.gpus]
        vals = [v for v in totals if v]
        return max(vals) if vals else None

    @property
    def peak_gpu_used_bytes(self) -> float | None:
        vals = [v for v in (_f(g.get("mem_used_bytes")) for g in self.gpus) if v is not None]
        return max(vals) if vals else None

    @property
    def mean_gpu_util(self) -> float | None:
        vals = [v for v in (_f(g.get("util_gpu_pct")) for g in self.gpus) if v is not None]
        return sum(vals) / len(vals) if vals else None

    @property
    def cache_config(self) -> Mapping[str, object]:
        """vllm:cache_config_info's labels, as the server reported them (text)."""
        return self.telemetry_figures.cache_config

    @property
    def block_size(self) -> int:
        v = _f(_num_text(self.cache_config.get("block_size")))
        return int(v) if v else as_int(self.flag("block-size", 16) or 16)

    @property
    def kv_tokens(self) -> int | None:
        """KV cache size in tokens, as the server reported it."""
        v = _f(_num_text(self.cache_config.get("kv_cache_size_tokens")))
        if v:
            return int(v)
        blocks = _f(_num_text(self.cache_config.get("num_gpu_blocks")))
        return int(blocks * self.block_size) if blocks else None

    def series(self, key: str, source: str = "server") -> list[tuple[float, float]]:
        """``(t, value)`` points of one field of a series, missing values skipped."""
        rows = {"server": self.server, "windows": self.windows, "gpus": self.gpus, "host": self.host}[source]
        out: list[tuple[float, float]] = []
        for row in rows:
            if row.get("stale"):
                continue
            t, v = _f(row.get("t")), _f(row.get(key))
            if t is not None and v is not None:
                out.append((t, v))
        return out

    # ------------------------------------------------------------- loading
    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name, "note": self.note, "model": self.model, "status": self.status,
            "started": self.started, "ended": self.ended, "flags": dict(self.flags),
            "workload": dict(self.workload), "load": dict(self.load), "telemetry": dict(self.telemetry),
            "failure": None if self.failure is None else dict(self.failure),
            "model_config": None if self.model_config is None else dict(self.model_config),
            "windows": [dict(w) for w in self.windows], "server": [dict(s) for s in self.server],
            "gpus": [dict(g) for g in self.gpus], "host": [dict(h) for h in self.host],
            "requests": [list(r) for r in self.requests], "startup": dict(self.startup),
            **({"flag_changes": [dict(c) for c in self.flag_changes]} if self.flag_changes else {}),
        }

    @classmethod
    def from_dict(cls, d: object, source: str = "run data") -> RunData:
        """Inverse of :meth:`to_dict`; raises :class:`RunDataError` naming the bad key."""
        if not isinstance(d, Mapping):
            raise RunDataError(source, "expected a JSON object")
        flags = d.get("flags") or {}
        if not isinstance(flags, Mapping):
            raise RunDataError(source, "key 'flags': expected an object of flag -> value")

        def rows(key: str) -> tuple[Mapping[str, object], ...]:
            value = d.get(key) or []
            if not isinstance(value, list) or not all(isinstance(r, Mapping) for r in value):
                raise RunDataError(source, f"key {key!r}: expected a list of objects")
            return tuple(value)

        def mapping(key: str) -> Mapping[str, object]:
            value = d.get(key) or {}
            if not isinstance(value, Mapping):
                raise RunDataError(source, f"key {key!r}: expected an object")
            return value

        reqs = d.get("requests") or []
        if not isinstance(reqs, list) or not all(isinstance(r, (list, tuple)) and len(r) == 4 for r in reqs):
            raise RunDataError(source, "key 'requests': expected [input_tokens, output_tokens, ttft_ms, tpot_ms] rows")
        failure = d.get("failure")
        if failure is not None and not isinstance(failure, Mapping):
            raise RunDataError(source, "key 'failure': expected an object or null")
        mc = d.get("model_config")
        if mc is not None and not isinstance(mc, Mapping):
            raise RunDataError(source, "key 'model_config': expected an object or null")
        name = str(d.get("name") or source)
        try:
            return cls(
                name=name, note=str(d.get("note") or ""),
                flags={_norm_flag(k): v for k, v in flags.items() if _norm_flag(k) != "model"},
                model=d.get("model"), status=_status_word(d.get("status")),
                started=_f(d.get("started")), ended=_f(d.get("ended")),
                load=mapping("load"), telemetry=mapping("telemetry"), workload=mapping("workload"),
                windows=rows("windows"), server=rows("server"), gpus=rows("gpus"), host=rows("host"),
                requests=tuple(tuple(r) for r in reqs), failure=failure, model_config=mc,
                startup=mapping("startup"), flag_changes=rows("flag_changes"),
            )
        except ValueError as exc:  # a telemetry figure or a startup fact (read in __post_init__, named)
            part = "startup" if str(exc).startswith(f"{name}: startup: ") else "telemetry"
            raise RunDataError(source, f"key {part!r}: {exc}") from None

    @classmethod
    def read(cls, path: str | Path) -> RunData:
        """Read a JSON file written from :meth:`to_dict`."""
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise RunDataError(str(p), exc.strerror or str(exc)) from None
        except ValueError as exc:
            raise RunDataError(str(p), f"not JSON: {exc}") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_startup_failure(
        cls,
        name: str,
        flags: Mapping[str, object],
        error: BaseException,
        *,
        model: str | None = None,
        model_config: Mapping[str, object] | None = None,
        gpu_memory_bytes: float | None = None,
        gpu_count: int = 1,
    ) -> RunData:
        """A launch that failed with ``error`` (an ``engine.errors.StartupError``).

        ``gpu_memory_bytes`` (one device's total) lets the planner put numbers on the fix.
        """
        gpus = tuple({"t": 0.0, "index": i, "mem_total_bytes": gpu_memory_bytes} for i in range(gpu_count)) \
            if gpu_memory_bytes else ()
        return cls(name=name, flags={_norm_flag(k): v for k, v in flags.items() if _norm_flag(k) != "model"},
                   model=model, status="failed", failure=failure_from_error(error), gpus=gpus,
                   model_config=model_config if model_config is not None else config_json_or_none(model))

    @classmethod
    def from_history(cls, history: History, ref: str | int, *, max_requests: int = 400) -> RunData:
        """A stored run (``engine.runs.history``: id, name, ``last``...) as advisor input.

        Keeps series and at most ``max_requests`` request rows (evenly spaced), so the
        result stays small enough to store as test data.
        """
        info = history.resolve(ref)
        windows = [_window_row(t, d) for _, t, d in history.samples(info.id, "window")]
        server = [_server_row(t, d) for _, t, d in history.samples(info.id, "server")]
        gpus: list[dict[str, object]] = []
        host: list[dict[str, object]] = []
        last_host = -math.inf
        for _, t, d in history.samples(info.id, "telemetry"):
            listed = d.get("gpus")
            for g in listed if isinstance(listed, Sequence) and not isinstance(listed, str) else ():
                if not isinstance(g, Mapping):
                    continue  # not a GPU's figures: nothing to take from it
                gpus.append({"t": t, "index": g.get("index"), "util_gpu_pct": g.get("util_gpu_pct"),
                             "mem_used_bytes": g.get("mem_used_bytes"), "mem_total_bytes": g.get("mem_total_bytes")})
            h = d.get("host")
            if isinstance(h, Mapping) and t - last_host >= 1.0:  # 1 Hz is plenty for a mean
                last_host = t
                host.append({"t": t, "cpu_percent": h.get("cpu_percent"), "cpu_count": h.get("cpu_count"),
                             "mem_total_bytes": h.get("mem_total_bytes"),
                             "proc_cpu_percent": h.get("proc_cpu_percent")})
        requests: list[RequestRow] = []
        for r in history.requests(info.id):
            if not r.ok or r.ttft_s is None:
                continue
            n_out = r.output_tokens or 0
            tpot = None
            if n_out > 1 and r.e2el_s is not None:
                tpot = round((r.e2el_s - r.ttft_s) / (n_out - 1) * 1000.0, 3)
            requests.append((r.input_tokens, n_out, round(r.ttft_s * 1000.0, 3), tpot))
        if len(requests) > max_requests:
            step = len(requests) / max_requests
            requests = [requests[int(i * step)] for i in range(max_requests)]
        summary = info.summary
        failure = None
        if info.status == "failed" and summary.error and summary.load is None:
            failure = failure_from_line(summary.error, summary.hint or "")
        # the telemetry and startup parts as stored (RunData's saved format), where they parsed
        stored = summary.to_json()
        tel = stored.get("telemetry") if summary.telemetry is not None else None
        tel = tel if isinstance(tel, Mapping) else {}
        startup = stored.get("startup") if summary.startup is not None else None
        keep = ("peak_kv_cache_usage", "peak_running", "peak_waiting", "preemptions", "prefix_hit_rate",
                "mean_gpu_util_pct", "peak_gpu_mem_bytes", "host_mean_cpu_pct", "server_mean_cpu_pct",
                "server_peak_rss_bytes", "gpu_unavailable", "cache_config", "speed_of_light", "server_itl",
                "server_front_cpu_pct", "server_front_cpu_p90", "server_front_procs")
        return cls(
            name=info.name, flags={_norm_flag(k): v for k, v in info.flags.items()}, model=info.model,
            status=info.status, started=info.started, ended=info.ended,
            # a flat (trace) summary has no "load" key: no figures, as the stored document says
            load={} if summary.flat else summary.load_json(), telemetry={k: tel.get(k) for k in keep if k in tel},
            windows=tuple(windows), server=tuple(server), gpus=tuple(gpus), host=tuple(host),
            requests=tuple(requests), workload=dict(info.workload), failure=failure,
            model_config=config_json_or_none(info.model),
            startup=dict(startup) if isinstance(startup, Mapping) else {},
            flag_changes=tuple(c.to_json() for c in flag_changes_of(summary)),
        )


# Flags whose value the server reports in vllm:cache_config_info (flag: label).
SERVER_REPORTED = {"gpu-memory-utilization": "gpu_memory_utilization",
                   "kv-cache-memory-bytes": "kv_cache_memory_bytes"}  # "None" where the fraction sized it


def _num_text(value: object) -> object:
    """cache_config_info labels are text ("11527"); numbers pass through."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return value


def _window_row(t: float, d: Mapping[str, object]) -> dict[str, object]:
    out: dict[str, object] = {"t": t}
    for key in ("window_s", "completed", "failed", "in_flight", "req_s", "output_tok_s", "client_bound",
                "client_lag_ms", "client_cpu", "total_completed"):
        out[key] = d.get(key)
    for metric in ("ttft", "tpot", "e2el"):
        p = d.get(metric) or {}
        for q in ("mean", "p50", "p99"):
            out[f"{metric}_{q}"] = p.get(q) if isinstance(p, Mapping) else None
    return out


def _server_row(t: float, d: Mapping[str, object]) -> dict[str, object]:
    return {"t": t, "stale": bool(d.get("stale")), "running": d.get("running"), "waiting": d.get("waiting"),
            "kv_cache_usage": d.get("kv_cache_usage"), "preemptions_total": d.get("preemptions_total"),
            "prefix_hit_rate": d.get("prefix_hit_rate")}


def failure_from_line(line: str, hint: str = "") -> dict[str, object]:
    """The typed startup failure for vLLM's line (as ``engine.server.logparse`` classifies it)."""
    err = classify_failure([line])
    out: dict[str, object] = {"kind": type(err).__name__, "vllm_line": err.vllm_line or line,
                              "hint": hint or err.hint}
    est = err.estimated_max_len if isinstance(err, MaxModelLenTooLarge) else None
    if est is not None:
        out["estimated_max_len"] = est
    return out


def failure_from_error(err: BaseException) -> dict[str, object]:
    """A raised ``engine.errors.StartupError`` as ``RunData.failure`` (any other exception by
    its text: vtui's startup errors and EngineDied carry vLLM's line and a hint, SessionError
    a hint)."""
    line, hint = (err.vllm_line, err.hint) if isinstance(err, (StartupError, EngineDied)) else ("", "")
    if isinstance(err, SessionError):
        hint = err.hint
    out: dict[str, object] = {"kind": type(err).__name__, "vllm_line": line or str(err), "hint": hint}
    est = err.estimated_max_len if isinstance(err, MaxModelLenTooLarge) else None
    if est is not None:
        out["estimated_max_len"] = est
    return out
