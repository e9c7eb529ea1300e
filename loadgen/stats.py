"""Statistics with ``vllm bench serve``'s definitions, in bounded memory.

Percentiles use numpy's default (linear interpolation between closest ranks), std is the
population std (numpy's ddof=0), as vLLM's ``calculate_metrics`` does. Mean, std and max
are exact for any run length (streaming sums); percentiles are exact until a metric has
``cap`` samples, then come from a uniform reservoir of ``cap`` samples, so an hours-long
run at thousands of tokens/s stays within a few tens of MB. The bound past the cap: the
p-th percentile read from a uniform sample of ``cap`` is the true ``p +- 3 * 100 *
sqrt(p/100 (1 - p/100) / cap)``-th (three standard errors of a sample quantile's rank;
``rank_error``): at the default cap of 2M, p99 is the true p98.98-p99.02 and p50 the true
p49.9-p50.1, whatever the run's length. A run's result says whether its percentiles were
exact (``percentiles_exact``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from loadgen.records import RequestResult
from loadgen.spec import SLO, percentile_word

DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
# 2M float64 = 16 MB per metric: exact percentiles for a 2M-token run, unbiased after.
DEFAULT_CAP = 2_000_000
# Two events stamped by the same network read are this close (they get one stamp).
SAME_READ_S = 1e-6
# More than this share of requests arriving whole in one read marks a run's stream bursty.
BURST_SHARE = 0.1


LOAD_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class LoadSummary:
    """A run's figures as ``vllm bench serve`` writes them, typed; ``to_dict()`` is its result
    file's keys, in its order. ``latency`` holds the per-metric statistics under bench serve's
    names (``mean_ttft_ms``, ``median_tpot_ms``, ``p99_itl_ms``, ``std_e2el_ms``, ``max_..._ms``);
    ``get``/``[]`` read any figure by those names (a field or a latency figure)."""

    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None  # None without an SLO
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float | None = None  # None: not in an older stored run
    max_concurrent_requests: int | None = None
    peak_in_flight: int | None = None
    latency: Mapping[str, float] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        """A figure by bench serve's name; None when the run has no such figure."""
        if key in LOAD_FIGURES:
            value: float | None = getattr(self, key)
            return value
        return self.latency.get(key)

    def at_percentile(self, metric: str, p: float) -> float | None:
        """The ``p`` percentile of ``metric`` (ttft, tpot, itl, e2el) in ms; None when the run
        has no such figure."""
        return self.get(f"p{percentile_word(p)}_{metric}_ms")

    def __getitem__(self, key: str) -> float | None:
        if key not in self:
            raise KeyError(key)
        return self.get(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in LOAD_FIGURES or key in self.latency)

    @staticmethod
    def is_figure_name(key: str) -> bool:
        """Whether ``key`` is a figure's name in bench serve's result file (a field, or a
        per-metric statistic such as ``p99.9_itl_ms``), whether or not a run has it."""
        return key in LOAD_FIGURES or _is_latency_key(key)

    def to_dict(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {k: self.get(k) for k in LOAD_FIGURES}
        out.update(self.latency)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "load summary") -> LoadSummary:
        """Parse a stored summary (a result file, a history row): numbers where numbers belong,
        a clear ValueError naming the key otherwise; keys of other documents are left out."""

        def number(key: str, *, required: bool) -> float | None:
            value = d.get(key)
            if value is None:
                if required:
                    return 0.0
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where}: {key} is {value!r}, not a number")
            return float(value)

        def whole(key: str, *, required: bool) -> int | None:
            value = number(key, required=required)
            return None if value is None else int(value)

        latency = {k: float(v) for k, v in d.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and _is_latency_key(k)}
        return cls(
            duration=number("duration", required=True) or 0.0,
            completed=whole("completed", required=True) or 0,
            failed=whole("failed", required=True) or 0,
            total_input_tokens=whole("total_input_tokens", required=True) or 0,
            total_output_tokens=whole("total_output_tokens", required=True) or 0,
            request_throughput=number("request_throughput", required=True) or 0.0,
            request_goodput=number("request_goodput", required=False),
            output_throughput=number("output_throughput", required=True) or 0.0,
            total_token_throughput=number("total_token_throughput", required=True) or 0.0,
            max_output_tokens_per_s=number("max_output_tokens_per_s", required=False),
            max_concurrent_requests=whole("max_concurrent_requests", required=False),
            peak_in_flight=whole("peak_in_flight", required=False),
            latency=latency)


# The result file's figures other than the per-metric statistics, in its order (LoadSummary's fields).
LOAD_FIGURES = tuple(f.name for f in dataclasses.fields(LoadSummary) if f.name != "latency")


def _is_latency_key(key: str) -> bool:
    """``mean_ttft_ms``, ``p99.9_itl_ms``, ...: a per-metric figure under bench serve's name."""
    head, _, rest = key.partition("_")
    metric, _, unit = rest.partition("_")
    if unit != "ms" or metric not in LOAD_METRICS:
        return False
    return head in ("mean", "median", "std", "max") or (head.startswith("p") and _is_number(head[1:]))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def rank_error(p: float, samples: int) -> float:
    """Three standard errors, in percentile points, of the rank of the ``p``-th percentile read
    from a uniform sample of ``samples`` values (the reservoir past ``cap``): the figure is the
    true ``p +- rank_error(p, samples)``-th percentile. 0.0 for an empty sample."""
    if samples <= 0:
        return 0.0
    q = min(max(p / 100.0, 0.0), 1.0)
    return 300.0 * math.sqrt(q * (1.0 - q) / samples)


def _sorted(values: array[float]) -> Sequence[float]:
    """``values`` in order, as 8-byte floats: numpy sorts a copy of the buffer (16 MB for the 2M
    samples of a capped metric) where ``sorted()`` made a list of 2M float objects (64 MB)
    at every run's end. Small arrays skip numpy's import."""
    if len(values) < 4096:
        return sorted(values)
    import numpy as np  # here, not at the top: loadgen is imported by scripts that never sort much

    return cast("Sequence[float]", np.sort(np.frombuffer(values, dtype=np.float64)))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """numpy.percentile(values, p) with the default 'linear' method; 0.0 when empty."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = (n - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    a, b = sorted_values[lo], sorted_values[hi]
    return a + (b - a) * frac


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Summary of one metric, in milliseconds."""

    mean: float = 0.0
    std: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    count: int = 0

    @classmethod
    def from_seconds(cls, values: Iterable[float]) -> Percentiles:
        """Exact summary of a small list of values in seconds."""
        acc = Accumulator()
        acc.extend(values)
        return acc.summary()

    def get(self, p: float) -> float:
        """A stored percentile by number (50, 90, 95, 99, 100)."""
        if p == 100:
            return self.max
        return float(getattr(self, f"p{int(p)}"))


class Accumulator:
    """Streaming mean/std/max plus exact-then-reservoir percentiles (values in seconds)."""

    __slots__ = ("_cap", "_m2", "_max", "_mean", "_rng", "_sorted", "_values", "n")

    def __init__(self, cap: int = DEFAULT_CAP, seed: int = 0) -> None:
        self.n = 0
        self._mean = 0.0
        self._m2 = 0.0
        self._max = 0.0
        self._values = array("d")
        self._cap = cap
        self._rng = random.Random(seed)
        self._sorted: Sequence[float] | None = None

    def add(self, x: float) -> None:
        self.n += 1
        # Welford: exact-enough std over billions of samples, O(1) memory.
        d = x - self._mean
        self._mean += d / self.n
        self._m2 += d * (x - self._mean)
        if self.n == 1 or x > self._max:
            self._max = x
        if len(self._values) < self._cap:
            self._values.append(x)
        else:
            # Reservoir sampling (Algorithm R): every sample kept with probability cap/n.
            j = self._rng.randrange(self.n)
            if j < self._cap:
                self._values[j] = x
        self._sorted = None

    def extend(self, xs: Iterable[float]) -> None:
        for x in xs:
            self.add(x)

    @property
    def exact(self) -> bool:
        """True while percentiles are computed from every sample."""
        return self.n <= self._cap

    @property
    def samples(self) -> int:
        """How many values the percentiles are read from (every one, up to ``cap``)."""
        return len(self._values)

    def rank_error(self, p: float) -> float:
        """The bound on the ``p``-th percentile's rank (percentile points, see :func:`rank_error`);
        0.0 while exact."""
        return 0.0 if self.exact else rank_error(p, len(self._values))

    def quantile(self, p: float) -> float:
        """The p-th percentile in seconds."""
        if self._sorted is None:
            self._sorted = _sorted(self._values)
        return float(percentile(self._sorted, p))

    @property
    def mean(self) -> float:
        """Exact mean of everything added, in the values' own unit (0.0 when empty)."""
        return self._mean

    def summary(self) -> Percentiles:
        """Mean, std, percentiles and max in milliseconds (the values are seconds)."""
        if self.n == 0:
            return Percentiles()
        ms = 1000.0
        return Percentiles(
            mean=self._mean * ms,
            std=math.sqrt(self._m2 / self.n) * ms,
            p50=self.quantile(50) * ms,
            p90=self.quantile(90) * ms,
            p95=self.quantile(95) * ms,
            p99=self.quantile(99) * ms,
            max=self._max * ms,
            count=self.n,
        )


@dataclass(frozen=True, slots=True)
class StatsWindow:
    """An immutable snapshot for a live view: the last ``window_s`` seconds (requests that
    finished in it) plus run-wide counters. ``t`` is epoch seconds (telemetry's clock)."""

    t: float
    window_s: float
    elapsed_s: float
    completed: int  # in the window
    failed: int  # in the window
    in_flight: int
    req_s: float
    output_tok_s: float
    total_tok_s: float
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2el: Percentiles
    goodput: float | None  # good requests/s in the window; None without an SLO
    slo_attainment: float | None  # fraction of window completions that met the SLO
    total_completed: int
    total_failed: int
    total_sent: int
    client_bound: bool
    client_lag_ms: float  # worst event-loop lag seen in the window, any worker
    client_cpu: float  # busiest worker's CPU use in the window, 0..1 of one core

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {}
        for k in self.__slots__:
            v = getattr(self, k)
            d[k] = _pct_dict(v) if isinstance(v, Percentiles) else v
        return d


def _pct_dict(p: Percentiles) -> dict[str, float]:
    return {k: getattr(p, k) for k in Percentiles.__slots__}


class SlidingWindow:
    """Results that finished in the last ``window_s`` seconds; memory bounded by time."""

    # Window ITL percentiles are computed 4 times a second: sample at most this many gaps.
    MAX_WINDOW_ITL = 20_000

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._items: deque[tuple[float, RequestResult, bool]] = deque()

    def add(self, t_done: float, result: RequestResult, good: bool) -> None:
        self._items.append((t_done, result, good))

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._items and self._items[0][0] < cutoff:
            self._items.popleft()

    def snapshot(
        self, now: float, *, run_start: float, slo: SLO | None, in_flight: int,
        totals: tuple[int, int, int], client: tuple[bool, float, float],
    ) -> StatsWindow:
        self._trim(now)
        span = max(1e-9, min(self.window_s, now - run_start))
        ok = [r for _, r, _ in self._items if r.ok]
        failed = sum(1 for _, r, _ in self._items if not r.ok and not r.cancelled)
        good = sum(1 for _, r, g in self._items if r.ok and g)
        out_tok = sum(r.output_tokens for r in ok)
        in_tok = sum(r.input_tokens for r in ok)
        n_itl = sum(len(r.itl_s) for r in ok)
        stride = max(1, math.ceil(n_itl / self.MAX_WINDOW_ITL))
        itl = Accumulator()
        for r in ok:
            itl.extend(r.itl_s[::stride])
        tpots = [r.tpot_s for r in ok if r.output_tokens > 1]
        has_slo = slo is not None and not slo.empty
        return StatsWindow(
            t=now, window_s=self.window_s, elapsed_s=now - run_start,
            completed=len(ok), failed=failed, in_flight=in_flight,
            req_s=len(ok) / span, output_tok_s=out_tok / span,
            total_tok_s=(in_tok + out_tok) / span,
            ttft=Percentiles.from_seconds(r.ttft_s for r in ok),
            tpot=Percentiles.from_seconds(tpots),
            itl=itl.summary(),
            e2el=Percentiles.from_seconds(r.e2el_s for r in ok),
            goodput=good / span if has_slo else None,
            slo_attainment=(good / len(ok) if ok else None) if has_slo else None,
            total_completed=totals[0], total_failed=totals[1], total_sent=totals[2],
            client_bound=client[0], client_lag_ms=client[1], client_cpu=client[2],
        )


@dataclass
class RunAggregator:
    """Whole-run totals with vLLM's definitions; feed every finished result once."""

    slo: SLO | None = None
    cap: int = DEFAULT_CAP
    ttft: Accumulator = field(init=False)
    tpot: Accumulator = field(init=False)
    itl: Accumulator = field(init=False)
    e2el: Accumulator = field(init=False)
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    good: int = 0
    total_input: int = 0
    total_output: int = 0
    input_mismatches: int = 0
    # The stream's shape: events (chunks carrying choices) received, gaps of zero (an
    # event that came in the same network read as the one before it) and requests whose
    # whole output came in one read. On a box where the server's API process is starved of
    # CPU it writes a backlog of events back to back, and every client (vllm bench serve's
    # too) then sees zero gaps: TPOT/ITL of such requests say nothing about decode speed.
    events: int = 0
    same_read_gaps: int = 0
    burst_requests: int = 0
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)
    # Per-second buckets since the first start, as vLLM computes max_output_tokens_per_s
    # and max_concurrent_requests; one int per second of run, so bounded by duration.
    _tok_buckets: dict[int, int] = field(default_factory=dict)
    _conc_buckets: dict[int, int] = field(default_factory=dict)
    _t0: float | None = None
    # Start and end of every completed request (up to ``cap``), for the true peak of
    # requests in flight: vLLM's per-second buckets count a request that ends and one
    # that starts in the same second both, so they read up to 2x the concurrency.
    _starts: array[float] = field(default_factory=lambda: array("d"))
    _ends: array[float] = field(default_factory=lambda: array("d"))

    def __post_init__(self) -> None:
        self.ttft = Accumulator(self.cap, 1)
        self.tpot = Accumulator(self.cap, 2)
        self.itl = Accumulator(self.cap, 3)
        self.e2el = Accumulator(self.cap, 4)

    def set_origin(self, t0: float) -> None:
        """Epoch second that bucket 0 starts at (vLLM: earliest successful start)."""
        self._t0 = t0

    def add(self, r: RequestResult) -> bool:
        """Count one result; returns whether it met the SLO (False for failures)."""
        if r.cancelled:
            self.cancelled += 1
            return False
        if not r.ok:
            self.failed += 1
            reason = r.error or "client_error"
            self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1
            self.failure_examples.setdefault(reason, r.error_detail[:300])
            return False
        self.completed += 1
        self.total_input += r.input_tokens
        self.total_output += r.output_tokens
        if r.expected_input and r.input_tokens != r.expected_input:
            self.input_mismatches += 1
        self.ttft.add(r.ttft_s)
        self.e2el.add(r.e2el_s)
        tpot = r.tpot_s
        if r.output_tokens > 1:
            self.tpot.add(tpot)
        self.itl.extend(r.itl_s)
        self.events += len(r.itl_s) + 1
        zeros = sum(1 for gap in r.itl_s if gap <= SAME_READ_S)
        self.same_read_gaps += zeros
        if r.output_tokens > 1 and r.itl_s and zeros == len(r.itl_s):
            self.burst_requests += 1
        good = self.slo.is_good(r.ttft_s, tpot, r.e2el_s) if self.slo else False
        if good:
            self.good += 1
        if self._t0 is None:
            self._t0 = r.t_start
        t0 = self._t0
        t = r.t_start + r.ttft_s
        b = int(t - t0)
        self._tok_buckets[b] = self._tok_buckets.get(b, 0) + 1
        for gap in r.itl_s:
            t += gap
            b = int(t - t0)
            self._tok_buckets[b] = self._tok_buckets.get(b, 0) + 1
        for s in range(int(r.t_start - t0), int(r.t_end - t0) + 1):
            self._conc_buckets[s] = self._conc_buckets.get(s, 0) + 1
        if len(self._starts) < self.cap:
            self._starts.append(r.t_start)
            self._ends.append(r.t_end)
        return good

    def peak_in_flight(self) -> int:
        """Most completed requests in flight at one instant, each counted once (a request that
        ends at the instant another starts is not counted with it)."""
        if not self._starts:
            return 0
        import numpy as np  # here, not at the top: see _sorted

        # Just after each start, in flight = starts so far - ends so far (an end at the same
        # instant before the start). Sorted arrays, not a list of 2n (t, step) tuples: at the
        # cap of 2M requests that list took about 500 MB at the run's end.
        starts = np.sort(np.frombuffer(self._starts, dtype=np.float64))
        ends = np.sort(np.frombuffer(self._ends, dtype=np.float64))
        started = np.searchsorted(starts, starts, side="right")
        ended = np.searchsorted(ends, starts, side="right")
        return int(max(0, int((started - ended).max())))

    def summary(self, duration_s: float, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> LoadSummary:
        """The figures ``vllm bench serve`` writes, computed the same way."""
        dur = max(duration_s, 1e-9)
        out: dict[str, float] = {}
        for name in LOAD_METRICS:
            acc: Accumulator = getattr(self, name)
            s = acc.summary()
            out[f"mean_{name}_ms"] = s.mean
            out[f"median_{name}_ms"] = acc.quantile(50) * 1000 if acc.n else 0.0
            out[f"std_{name}_ms"] = s.std
            for p in percentiles:
                out[f"p{percentile_word(p)}_{name}_ms"] = acc.quantile(p) * 1000 if acc.n else 0.0
            out[f"max_{name}_ms"] = s.max
        return LoadSummary(
            duration=duration_s, completed=self.completed, failed=self.failed,
            total_input_tokens=self.total_input, total_output_tokens=self.total_output,
            request_throughput=self.completed / dur,
            request_goodput=(self.good / dur) if self.slo and not self.slo.empty else None,
            output_throughput=self.total_output / dur,
            total_token_throughput=(self.total_input + self.total_output) / dur,
            max_output_tokens_per_s=float(max(self._tok_buckets.values(), default=0)),
            max_concurrent_requests=max(self._conc_buckets.values(), default=0),
            peak_in_flight=self.peak_in_flight(), latency=out)

    def stream_shape(self) -> dict[str, float | bool | None]:
        """Tokens per stream event, the share of gaps of zero and the requests that came
        whole in one read; ``stream_bursts`` is set when those make TPOT/ITL unreliable."""
        gaps = self.events - self.completed
        return {
            "tokens_per_event": self.total_output / self.events if self.events else None,
            "same_read_gap_fraction": self.same_read_gaps / gaps if gaps > 0 else None,
            "burst_requests": self.burst_requests,
            "stream_bursts": self.completed > 0 and self.burst_requests / self.completed > BURST_SHARE,
        }

    def percentiles(self) -> dict[str, Percentiles]:
        return {n: getattr(self, n).summary() for n in ("ttft", "tpot", "itl", "e2el")}

    @property
    def exact(self) -> bool:
        return all(getattr(self, n).exact for n in ("ttft", "tpot", "itl", "e2el"))
