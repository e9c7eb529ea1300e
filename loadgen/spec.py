"""What to send and when: ``WorkloadSpec``, ``ArrivalSpec`` and ``SLO``.

The dict form of each (``to_dict``/``from_dict``) is what preset TOML files hold under
``[workload]``; ``from_dict`` names the source and the key of every bad value.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

WORKLOAD_KINDS = ("random", "sharegpt", "jsonl", "trace", "chat")
LENGTH_DISTS = ("fixed", "uniform", "normal")
ARRIVAL_MODES = ("closed", "poisson", "constant", "ramp", "trace")
ENDPOINTS = ("completions", "chat")


class SpecError(ValueError):
    """A bad workload/arrival/SLO value; names where it came from and which key."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}")
        self.source = source
        self.key = key
        self.reason = reason


def _coerce(source: str, key: str, value: object, typ: type) -> object:
    """Convert a TOML/JSON/flag value to the field's type, or raise SpecError naming the key."""
    if value is None:
        return None
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise SpecError(source, key, f"expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise SpecError(source, key, f"expected an integer, got {value!r}")
        return int(value)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
                return math.inf
            raise SpecError(source, key, f"expected a number, got {value!r}")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise SpecError(source, key, f"expected a string, got {value!r}")
        return value
    return value


_D = TypeVar("_D", bound="DataclassInstance")


def _from_dict(cls: type[_D], d: Mapping[str, object], source: str) -> _D:
    if not isinstance(d, Mapping):
        raise SpecError(source, cls.__name__, f"expected a table, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, object] = {}
    for key, value in d.items():
        name = key.replace("-", "_")
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise SpecError(source, key, f"unknown key (known: {known})")
        typ = _TYPES[cls.__name__][name]
        kwargs[name] = _coerce(source, key, value, typ)
    try:
        obj = cls(**kwargs)
    except SpecError as exc:
        raise SpecError(source, exc.key, exc.reason) from None
    return obj


def _to_dict(obj: DataclassInstance) -> dict[str, object]:
    """Only the fields that differ from the defaults, so preset files stay short."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if value != default:
            out[f.name] = value
    return out


@dataclass(frozen=True)
class WorkloadSpec:
    """What each request carries.

    ``kind``: ``random`` (synthetic lengths, prompts built from the served model's tokenizer
    so input lengths are exact), ``sharegpt`` (ShareGPT JSON: first human turn as prompt,
    the reply's length as output length), ``jsonl`` (one ``{"prompt", "output_len"?}`` per
    line), ``trace`` (vtui's JSONL of ``timestamp`` s, ``input_len``, ``output_len``,
    ``prompt``?, ``hash_ids``?, a ``vtui record`` recording, or a published Mooncake, Bailian,
    Azure or BurstGPT trace, detected by ``loadgen.traceformats``; replayed at
    ``time_scale``), ``chat`` (multi-turn sessions; each turn carries the
    conversation so far, including the server's real replies).
    """

    kind: str = "random"
    input_len: int = 512
    output_len: int = 128
    # "fixed": exact lengths; "uniform": within +-range_ratio of the mean (vLLM's
    # --random-range-ratio); "normal": gaussian with *_std, clipped to [min_len, max_len].
    length_dist: str = "fixed"
    range_ratio: float = 0.0
    input_std: float = 0.0
    output_std: float = 0.0
    min_len: int = 1
    max_len: int = 0  # 0 = no upper clip
    prefix_len: int = 0  # shared prefix tokens in front of each prompt
    num_prefixes: int = 1  # distinct shared prefixes (requests pick one round-robin)
    dataset: str = ""  # path for sharegpt/jsonl/trace
    min_input_len: int = 4  # dataset filters (sharegpt/jsonl), like vLLM's
    max_input_len: int = 0  # 0 = limited only by the server's max-model-len
    max_output_len: int = 0
    time_scale: float = 1.0  # trace: 2.0 replays twice as slow, 0.5 twice as fast
    # trace: tokens per hash id and the timestamps' unit, where the file's own (or the rule
    # loadgen.traceformats infers them by) is wrong; 0 / "" = the file's.
    trace_block_size: int = 0
    trace_time_unit: str = ""
    # trace: True replays at the recorded times; False sends the recorded requests under the
    # arrival model (a rate or concurrency sweep over your own traffic).
    trace_timing: bool = True
    num_turns: int = 3  # chat: turns per session
    endpoint: str = "completions"  # or "chat" (/v1/chat/completions)
    ignore_eos: bool = True
    # None (the default): every run draws a fresh seed and records it, so two runs never send
    # the same prompts (a server's prefix cache would serve the second run's prefills and make
    # it look faster). Set it to repeat a run's prompts exactly.
    seed: int | None = None
    num_prompts: int = 0  # size of the prompt pool; 0 = as many as requests (or 1000)

    def __post_init__(self) -> None:
        src = "workload"
        if self.kind not in WORKLOAD_KINDS:
            raise SpecError(src, "kind", f"must be one of {', '.join(WORKLOAD_KINDS)}")
        if self.length_dist not in LENGTH_DISTS:
            raise SpecError(src, "length_dist", f"must be one of {', '.join(LENGTH_DISTS)}")
        if self.endpoint not in ENDPOINTS:
            raise SpecError(src, "endpoint", f"must be one of {', '.join(ENDPOINTS)}")
        if self.input_len < 1:
            raise SpecError(src, "input_len", "must be at least 1")
        if self.output_len < 1:
            raise SpecError(src, "output_len", "must be at least 1")
        if not 0.0 <= self.range_ratio < 1.0:
            raise SpecError(src, "range_ratio", "must be in [0, 1)")
        if self.input_std < 0 or self.output_std < 0:
            raise SpecError(src, "input_std", "standard deviations must be >= 0")
        if self.prefix_len < 0:
            raise SpecError(src, "prefix_len", "must be >= 0")
        if self.num_prefixes < 1:
            raise SpecError(src, "num_prefixes", "must be at least 1")
        if self.kind in ("sharegpt", "jsonl", "trace") and not self.dataset:
            raise SpecError(src, "dataset", f"kind {self.kind!r} needs a dataset file path")
        if self.time_scale <= 0:
            raise SpecError(src, "time_scale", "must be > 0")
        if self.trace_block_size < 0:
            raise SpecError(src, "trace_block_size", "must be >= 0 (0 = the file's)")
        if self.trace_time_unit not in ("", "s", "ms", "us"):
            raise SpecError(src, "trace_time_unit", "must be s, ms or us")
        if self.num_turns < 1:
            raise SpecError(src, "num_turns", "must be at least 1")

    @classmethod
    def from_dict(cls, d: Mapping[str, object], source: str = "workload") -> WorkloadSpec:
        """Build from a preset's ``[workload]`` table; errors name ``source`` and the key."""
        return _from_dict(cls, d, source)

    def to_dict(self) -> dict[str, object]:
        """Non-default fields only."""
        return _to_dict(self)

    def with_run_seed(self) -> WorkloadSpec:
        """This spec with the seed a run uses: its own when set, else a fresh one (then
        :attr:`seed_drawn` says so)."""
        if self.seed is not None:
            return self
        spec = dataclasses.replace(self, seed=secrets.randbelow(2**31))
        object.__setattr__(spec, "_seed_drawn", True)  # not a field: equality, hash and the file ignore it
        return spec

    @property
    def seed_drawn(self) -> bool:
        """True when :meth:`with_run_seed` drew ``seed`` for one run: no later run asks for these
        prompts again, so a plan cache has no reason to keep them (every run of a
        session drew one, and loadgen.workload kept each run's plan, up to 32M characters)."""
        return bool(self.__dict__.get("_seed_drawn", False))

    @property
    def shares_prefixes(self) -> bool:
        """Whether its prompts may share prefixes: a shared prefix, a conversation's turns, or
        a trace's recorded reuse (shared block hashes, conversations)."""
        return bool(self.prefix_len) or self.kind in ("chat", "trace")

    def max_request_len(self) -> int:
        """The longest prompt + output this spec can ask for (synthetic kinds), for the
        max-model-len check before a run."""
        if self.length_dist == "uniform":
            i = math.floor(self.input_len * (1 + self.range_ratio))
            o = math.floor(self.output_len * (1 + self.range_ratio))
        elif self.length_dist == "normal":
            i = self.max_len or math.ceil(self.input_len + 4 * self.input_std)
            o = self.max_len or math.ceil(self.output_len + 4 * self.output_std)
        else:
            i, o = self.input_len, self.output_len
        turns = self.num_turns if self.kind == "chat" else 1
        return self.prefix_len + turns * (i + o)


@dataclass(frozen=True)
class ArrivalSpec:
    """When requests are sent.

    ``mode``: ``closed`` (``concurrency`` requests always in flight), ``poisson`` (open
    loop at ``rate`` with gamma gaps of shape ``burstiness``, 1.0 = Poisson; ``inf`` rate
    sends all at once), ``constant`` (equal gaps), ``ramp`` (rate rises linearly from
    ``rate`` to ``end_rate`` over the run), ``trace`` (the dataset's own timestamps).
    Open-loop modes honour ``max_in_flight`` (0 = no cap). The run stops after
    ``num_requests`` or ``duration_s``, whichever comes first (0 = not set).
    """

    mode: str = "closed"
    concurrency: int = 8
    rate: float = math.inf
    end_rate: float = 0.0
    burstiness: float = 1.0
    max_in_flight: int = 0
    num_requests: int = 0
    duration_s: float = 0.0
    warmup_requests: int = 0
    seed: int = 0
    # Worker processes that generate load (0 = decide from concurrency/rate; 1 = in-process).
    workers: int = 0

    def __post_init__(self) -> None:
        src = "arrivals"
        if self.mode not in ARRIVAL_MODES:
            raise SpecError(src, "mode", f"must be one of {', '.join(ARRIVAL_MODES)}")
        if self.mode == "closed" and self.concurrency < 1:
            raise SpecError(src, "concurrency", "must be at least 1")
        if self.mode in ("poisson", "constant", "ramp") and not self.rate > 0:
            raise SpecError(src, "rate", "must be > 0 requests/s")
        if self.mode == "ramp" and not (0 < self.end_rate < math.inf):
            raise SpecError(src, "end_rate", "a ramp needs a finite end rate > 0")
        if self.mode == "ramp" and not math.isfinite(self.rate):
            raise SpecError(src, "rate", "a ramp needs a finite start rate")
        if not self.burstiness > 0:
            raise SpecError(src, "burstiness", "must be > 0")
        if self.num_requests < 0 or self.duration_s < 0 or self.warmup_requests < 0:
            raise SpecError(src, "num_requests", "counts and durations must be >= 0")
        if self.num_requests == 0 and self.duration_s == 0 and self.mode != "trace":
            # (a trace's own times with neither: all of its requests, once)
            raise SpecError(src, "num_requests", "set num_requests or duration_s (or both)")
        if self.max_in_flight < 0 or self.workers < 0:
            raise SpecError(src, "max_in_flight", "must be >= 0")

    @classmethod
    def from_dict(cls, d: Mapping[str, object], source: str = "arrivals") -> ArrivalSpec:
        """Build from a preset table; errors name ``source`` and the key."""
        return _from_dict(cls, d, source)

    def to_dict(self) -> dict[str, object]:
        """Non-default fields only (``inf`` rate written as the string "inf" for TOML/JSON)."""
        d = _to_dict(self)
        if "rate" in d and math.isinf(self.rate):
            d["rate"] = "inf"
        return d

    @property
    def in_flight_cap(self) -> int:
        """Most requests in flight at once (0 = unbounded)."""
        return self.concurrency if self.mode == "closed" else self.max_in_flight


@dataclass(frozen=True)
class SLO:
    """Latency limits in ms (None = not judged). A request is *good* when it meets every
    given limit (vLLM's goodput); the run meets the SLO when the ``percentile`` of each
    metric is within its limit."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentile: float = 99.0

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise SpecError("slo", name, "must be > 0 ms")
        if not 0 < self.percentile <= 100:
            raise SpecError("slo", "percentile", "must be in (0, 100]")

    @property
    def empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None

    @classmethod
    def from_percentile_limits(cls, limits: Mapping[tuple[str, float], float | None]) -> SLO | None:
        """From ``{("ttft", 99.0): 500.0, ("tpot", 90.0): None, ...}`` (metric, percentile -> ms; None:
        not given): one percentile for all, one limit per metric. None where no limit is given;
        SpecError naming what was wrong."""
        given = {(m, p): v for (m, p), v in limits.items() if v is not None}
        metrics = [m for m, _ in given]
        twice = next((m for m in metrics if metrics.count(m) > 1), None)
        if twice is not None:
            raise SpecError("slo", twice, f"two limits for {twice.upper()}: give one percentile per metric")
        pcts = {p for _, p in given}
        if len(pcts) > 1:
            raise SpecError("slo", "percentile", f"limits at both p{min(pcts):g} and p{max(pcts):g}: the SLO is judged"
                            " at one percentile, use one of them")
        if not given:
            return None
        return cls(percentile=pcts.pop(), **{f"{m}_ms": v for (m, _), v in given.items()})

    def is_good(self, ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
        """vLLM's per-request test; tpot is 0 for one-token outputs."""
        if self.ttft_ms is not None and ttft_s * 1000 > self.ttft_ms:
            return False
        if self.tpot_ms is not None and tpot_s * 1000 > self.tpot_ms:
            return False
        return not (self.e2el_ms is not None and e2el_s * 1000 > self.e2el_ms)

    def goodput_config(self) -> dict[str, float]:
        """The ``--goodput`` dict vLLM's result JSON would carry."""
        out: dict[str, float] = {}
        for key in ("ttft", "tpot", "e2el"):
            v = getattr(self, f"{key}_ms")
            if v is not None:
                out[key] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object], source: str = "slo") -> SLO:
        return _from_dict(cls, d, source)

    def to_dict(self) -> dict[str, object]:
        return _to_dict(self)


_TYPES: dict[str, dict[str, type]] = {
    "WorkloadSpec": {
        "kind": str, "input_len": int, "output_len": int, "length_dist": str,
        "range_ratio": float, "input_std": float, "output_std": float, "min_len": int,
        "max_len": int, "prefix_len": int, "num_prefixes": int, "dataset": str,
        "min_input_len": int, "max_input_len": int, "max_output_len": int,
        "time_scale": float, "trace_block_size": int, "trace_time_unit": str,
        "trace_timing": bool, "num_turns": int, "endpoint": str, "ignore_eos": bool,
        "seed": int, "num_prompts": int,
    },
    "ArrivalSpec": {
        "mode": str, "concurrency": int, "rate": float, "end_rate": float,
        "burstiness": float, "max_in_flight": int, "num_requests": int,
        "duration_s": float, "warmup_requests": int, "seed": int, "workers": int,
    },
    "SLO": {"ttft_ms": float, "tpot_ms": float, "e2el_ms": float, "percentile": float},
}


def percentile_word(p: float) -> str:
    """A percentile as vllm bench serve names it in its keys and lines: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def allowed_failures(n: int, percentile: float) -> int:
    """Failed requests a step may have and still meet the SLO: the share above the percentile."""
    return math.floor(n * (100.0 - percentile) / 100.0)


class RunFigures(Protocol):
    """What :func:`judge` reads of a run: ``loadgen.stats.LoadSummary`` has it. Written here, not
    imported, because loadgen.stats imports this module (SLO, percentile_word): no import circle."""

    @property
    def completed(self) -> int: ...
    @property
    def failed(self) -> int: ...
    def at_percentile(self, metric: str, p: float) -> float | None: ...


def judge(slo: SLO, summary: RunFigures) -> tuple[bool, str]:
    """Whether a run's figures meet ``slo``; the reason when not."""
    p = slo.percentile
    word = percentile_word(p)
    completed, failed = summary.completed, summary.failed
    n = completed + failed
    if completed == 0:
        return False, "no request completed"
    if failed > allowed_failures(n, p):
        return False, f"{failed} of {n} requests failed"
    for metric in ("ttft", "tpot", "e2el"):
        limit = getattr(slo, f"{metric}_ms")
        if limit is None:
            continue
        value = summary.at_percentile(metric, p)
        if value is None:
            return False, f"p{word} {metric.upper()} not measured"
        if value > limit:
            return False, f"p{word} {metric.upper()} {value:.0f} ms > {limit:g} ms"
    return True, ""


__all__ = ["SLO", "ArrivalSpec", "SpecError", "WorkloadSpec", "allowed_failures", "judge"]
