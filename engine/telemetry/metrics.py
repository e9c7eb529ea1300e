"""vLLM's Prometheus ``/metrics``: parse a page, and turn two pages into a windowed sample.

Parsing uses prometheus_client's text parser (escaping, label order and histogram
suffixes are its job, not a regex's). Values are keyed by *sample* name
(``vllm:prompt_tokens_total``, ``..._bucket``), summed over label sets such as
``engine`` so a data-parallel server reads as one. Windowed numbers (rates, hit
rate, latency percentiles) come from deltas between two consecutive scrapes; a
counter that goes down means the server restarted and is treated as a fresh start.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Never

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
# 0..1; vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (V1, 0.10).
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
REQUESTS = ("vllm:request_success_total",)
CACHE_CONFIG = "vllm:cache_config_info"
# Server-side latency histograms, by short key; first name present wins.
LATENCY: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    # vLLM renamed time_per_output_token_seconds (which was per token gap) to
    # inter_token_latency_seconds; request_time_per_output_token_seconds is a different, per-request TPOT.
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    # Time in the WAITING queue before the first schedule: the part of TTFT that is queueing.
    "queue": ("vllm:request_queue_time_seconds",),
}
_COUNTERS: tuple[tuple[str, ...], ...] = (PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, PROMPT_TOKENS, GENERATION_TOKENS, REQUESTS)


def _empty() -> Mapping[str, Never]:
    # An empty mapping, so a Mapping[str, V] for every V (Mapping is covariant in its values).
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram (bucket counts summed over label sets)."""

    bounds: tuple[float, ...]  # upper bounds ("le"), ascending; the last is +Inf on a good page
    counts: tuple[float, ...]  # cumulative counts per bound
    sum: float | None = None

    @property
    def count(self) -> float:
        """Observations in the histogram."""
        return self.counts[-1] if self.counts else 0.0

    def minus(self, earlier: Histogram | None) -> Histogram:
        """Observations since ``earlier``; a reset (fewer counts) or new bounds means fresh start."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        counts = tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True))
        if any(c < 0 for c in counts):
            return self
        total = None if self.sum is None or earlier.sum is None else self.sum - earlier.sum
        return Histogram(self.bounds, counts, total)

    def quantile(self, q: float) -> float | None:
        """Like PromQL histogram_quantile: linear interpolation inside the bucket.

        None when the histogram is empty. A rank in the +Inf bucket returns the
        largest finite bound (Prometheus does the same: it cannot know more).
        """
        if not self.counts or self.count <= 0 or not 0.0 <= q <= 1.0:
            return None
        # Deltas of cumulative counts can be slightly non-monotonic if a scrape saw
        # buckets mid-update; Prometheus repairs that the same way.
        counts: list[float] = []
        for c in self.counts:
            counts.append(max(c, counts[-1]) if counts else c)
        total = counts[-1]
        rank = q * total
        for i, (bound, cum) in enumerate(zip(self.bounds, counts, strict=True)):
            if cum >= rank:
                if math.isinf(bound):
                    finite = [b for b in self.bounds[:i] if not math.isinf(b)]
                    return finite[-1] if finite else None
                lower = self.bounds[i - 1] if i > 0 else 0.0
                below = counts[i - 1] if i > 0 else 0.0
                if i == 0 and bound <= 0:
                    return bound
                in_bucket = cum - below
                if in_bucket <= 0:
                    return bound
                return lower + (bound - lower) * (rank - below) / in_bucket
        return None


@dataclass(frozen=True)
class MetricsPage:
    """One parsed /metrics page. Missing names read as None, never KeyError."""

    values: Mapping[str, float] = field(default_factory=_empty)  # MappingProxyType is a Mapping
    series: Mapping[str, int] = field(default_factory=_empty)
    histograms: Mapping[str, Histogram] = field(default_factory=_empty)
    cache_config: Mapping[str, str] = field(default_factory=_empty)
    parse_errors: int = 0  # lines (or the whole page) the parser rejected
    error: str | None = None  # the first parse error, with its line number

    def value(self, names: Iterable[str]) -> float | None:
        """Sum over label sets of the first present name; None if absent or NaN."""
        for name in names:
            v = self.values.get(name)
            if v is not None:
                return None if math.isnan(v) else v
        return None

    def mean(self, names: Iterable[str]) -> float | None:
        """Mean over label sets (engines) of the first present gauge."""
        for name in names:
            v = self.values.get(name)
            if v is not None:
                n = self.series.get(name, 1)
                return None if math.isnan(v) else v / max(n, 1)
        return None

    def histogram(self, names: Iterable[str]) -> Histogram | None:
        """The first present histogram (by base name, without ``_bucket``)."""
        for name in names:
            h = self.histograms.get(name)
            if h is not None:
                return h
        return None


def _samples(text: str) -> tuple[list[Sample], int, str | None]:
    """All samples of a page, and how many lines were rejected.

    The whole page is parsed in one go; if the parser rejects it, the page is parsed
    line by line so one bad line (say a plugin's metric) costs only that line.
    """
    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples], 0, None
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError, IndexError, TypeError...
        whole_error = f"{type(exc).__name__}: {exc}"
    samples: list[Sample] = []
    errors = 0
    first: str | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            samples.extend(s for fam in text_string_to_metric_families(line + "\n") for s in fam.samples)
        except Exception as exc:  # noqa: BLE001 - as above
            errors += 1
            if first is None:
                first = f"line {lineno}: {type(exc).__name__}: {exc}"[:300]
    if errors == 0:  # the whole page failed on something other than a sample line (a comment)
        errors, first = 1, whole_error[:300]
    return samples, errors, first


def parse_metrics(text: str) -> MetricsPage:
    """Parse Prometheus text; never raises. Garbage gives a page with ``parse_errors``."""
    samples, errors, first = _samples(text)
    values: dict[str, float] = {}
    series: dict[str, int] = {}
    buckets: dict[str, dict[float, float]] = {}
    cache_config: dict[str, str] = {}
    for s in samples:
        name, labels, value = s.name, s.labels, s.value
        try:
            value = float(value)
        except (TypeError, ValueError):
            errors += 1
            continue
        if name.endswith("_bucket") and "le" in labels:
            try:
                le = float(labels["le"])
            except ValueError:
                errors += 1
                continue
            per = buckets.setdefault(name[: -len("_bucket")], {})
            per[le] = per.get(le, 0.0) + value
            continue
        if name == CACHE_CONFIG and not cache_config:
            cache_config = dict(labels)
        values[name] = values.get(name, 0.0) + value
        series[name] = series.get(name, 0) + 1
    histograms: dict[str, Histogram] = {}
    for base, per in buckets.items():
        bounds = tuple(sorted(per))
        histograms[base] = Histogram(bounds, tuple(per[b] for b in bounds), values.get(base + "_sum"))
    return MetricsPage(
        values=MappingProxyType(values),
        series=MappingProxyType(series),
        histograms=MappingProxyType(histograms),
        cache_config=MappingProxyType(cache_config),
        parse_errors=errors,
        error=first,
    )


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Server-side latency percentiles (seconds) over a window, from bucket deltas."""

    p50: float | None
    p90: float | None
    p99: float | None
    count: float  # observations in the window
    mean: float | None = None  # from the _sum delta, exact (not bucket-interpolated)

    @classmethod
    def of(cls, hist: Histogram | None) -> Quantiles | None:
        """Percentiles of a (delta) histogram; None when it holds no observations."""
        if hist is None or hist.count <= 0:
            return None
        mean = None if hist.sum is None else hist.sum / hist.count
        return cls(hist.quantile(0.5), hist.quantile(0.9), hist.quantile(0.99), hist.count, mean)

    def to_dict(self) -> dict[str, float | None]:
        """Plain dict, milliseconds, for JSON results."""

        def ms(v: float | None) -> float | None:
            return None if v is None else v * 1000.0

        return {"p50_ms": ms(self.p50), "p90_ms": ms(self.p90), "p99_ms": ms(self.p99),
                "mean_ms": ms(self.mean), "count": self.count}


@dataclass(frozen=True)
class ServerSample:
    """What the vLLM server reported, windowed between two consecutive scrapes.

    Rates and percentiles are None on the first scrape (no window yet) and when the
    metric is absent; everything is None on a stale sample (server not answering).
    """

    t: float
    window_s: float | None = None
    stale: bool = False
    reason: str | None = None  # why stale
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    preemptions_per_s: float | None = None
    prefix_hit_rate: float | None = None  # 0..1, None when no prefix queries in the window
    prompt_tok_s: float | None = None
    gen_tok_s: float | None = None
    requests_per_s: float | None = None  # finished requests (any reason)
    ttft: Quantiles | None = None
    itl: Quantiles | None = None
    e2e: Quantiles | None = None
    # Raw cumulative counters and histograms: the summary computes whole-run numbers from them.
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_queries_total: float | None = None
    prefix_hits_total: float | None = None
    requests_total: float | None = None
    histograms: Mapping[str, Histogram] = field(default_factory=_empty, repr=False)
    cache_config: Mapping[str, str] = field(default_factory=_empty, repr=False)
    reset: bool = False  # counters went down: the server restarted between the scrapes
    parse_errors: int = 0


def stale_sample(t: float, reason: str) -> ServerSample:
    """A sample for a scrape that failed."""
    return ServerSample(t=t, stale=True, reason=reason)


def server_sample(
    cur: MetricsPage, t: float, prev: MetricsPage | None = None, prev_t: float | None = None
) -> ServerSample:
    """Window the page ``cur`` (taken at ``t``) against the previous page; never raises."""
    window = None if prev is None or prev_t is None else t - prev_t
    if window is not None and window <= 0:
        window = None
    reset = False
    if window is not None and prev is not None:
        for names in _COUNTERS:
            a, b = prev.value(names), cur.value(names)
            if a is not None and b is not None and b < a:
                reset = True
        for names in LATENCY.values():
            ha, hb = prev.histogram(names), cur.histogram(names)
            if ha is not None and hb is not None and hb.count < ha.count:
                reset = True
    base = None if reset else prev

    def delta(names: tuple[str, ...]) -> float | None:
        b = cur.value(names)
        if window is None or b is None:
            return None
        a = base.value(names) if base is not None else 0.0
        d = b - (a or 0.0)
        return d if d >= 0 else b  # a single counter reset on its own: fresh start

    def rate(names: tuple[str, ...]) -> float | None:
        d = delta(names)
        return None if d is None or window is None else d / window

    dq, dh = delta(PREFIX_QUERIES), delta(PREFIX_HITS)
    hit_rate = None if dq is None or dh is None or dq <= 0 else min(max(dh / dq, 0.0), 1.0)
    hists: dict[str, Histogram] = {}
    quantiles: dict[str, Quantiles | None] = {}
    for key, names in LATENCY.items():
        h = cur.histogram(names)
        if h is not None:
            hists[key] = h
        if window is None or h is None:
            quantiles[key] = None
        else:
            quantiles[key] = Quantiles.of(h.minus(base.histogram(names) if base is not None else None))
    return ServerSample(
        t=t,
        window_s=window,
        running=cur.value(RUNNING),
        waiting=cur.value(WAITING),
        kv_cache_usage=cur.mean(KV_USAGE),
        preemptions_per_s=rate(PREEMPTIONS),
        prefix_hit_rate=hit_rate,
        prompt_tok_s=rate(PROMPT_TOKENS),
        gen_tok_s=rate(GENERATION_TOKENS),
        requests_per_s=rate(REQUESTS),
        ttft=quantiles["ttft"],
        itl=quantiles["itl"],
        e2e=quantiles["e2e"],
        preemptions_total=cur.value(PREEMPTIONS),
        prompt_tokens_total=cur.value(PROMPT_TOKENS),
        generation_tokens_total=cur.value(GENERATION_TOKENS),
        prefix_queries_total=cur.value(PREFIX_QUERIES),
        prefix_hits_total=cur.value(PREFIX_HITS),
        requests_total=cur.value(REQUESTS),
        histograms=MappingProxyType(hists),
        cache_config=cur.cache_config,
        reset=reset,
        parse_errors=cur.parse_errors,
    )


class MetricsScraper:
    """Scrapes ``{base_url}/metrics`` and windows each page against the previous one.

    ``client`` may be shared (it is then not closed here). A failed scrape returns a
    stale sample with the reason; the next good page is windowed against the last
    good one, and a restarted server (counters went down) reads as a fresh start.
    """

    def __init__(self, base_url: str, client: httpx.AsyncClient | None = None, *, timeout_s: float = 2.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self._client = client
        self._own_client = client is None
        self._timeout = timeout_s
        self._prev: MetricsPage | None = None
        self._prev_t: float | None = None
        self.parse_errors = 0  # rejected lines over every scrape
        self.last_error: str | None = None  # the most recent parse error text
        self.last_text: str | None = None  # the last page as served (for "show raw" and captures)

    async def scrape(self) -> ServerSample:
        """One scrape; never raises (except CancelledError)."""
        if self._client is None:
            self._client = httpx.AsyncClient()
        t = time.time()
        try:
            resp = await self._client.get(self.url, timeout=self._timeout)
        except httpx.TimeoutException:
            return stale_sample(t, f"{self.url} did not answer within {self._timeout:g} s")
        except httpx.HTTPError as exc:
            return stale_sample(t, f"{self.url} unreachable: {type(exc).__name__}: {exc}")
        if resp.status_code != 200:
            return stale_sample(t, f"{self.url} answered HTTP {resp.status_code}")
        self.last_text = resp.text
        page = parse_metrics(resp.text)
        if page.parse_errors:
            self.parse_errors += page.parse_errors
            self.last_error = page.error
        sample = server_sample(page, t, self._prev, self._prev_t)
        self._prev, self._prev_t = page, t
        return sample

    async def aclose(self) -> None:
        """Close the HTTP client if this scraper made it."""
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None
