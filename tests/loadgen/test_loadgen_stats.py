"""Statistics against hand-computed values (vLLM bench's definitions)."""

from __future__ import annotations

import math

import pytest

from loadgen.records import RequestResult
from loadgen.spec import SLO, judge
from loadgen.stats import Accumulator, LoadSummary, Percentiles, RunAggregator, SlidingWindow, percentile


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),  # rank 1.5 -> between 2 and 3
        ([1, 2, 3, 4], 90, 3.7),  # rank 2.7 -> 3 + 0.7
        ([1, 2, 3, 4], 99, 3.97),
        ([1, 2, 3, 4], 0, 1.0),
        ([1, 2, 3, 4], 100, 4.0),
        ([5], 99, 5.0),
        ([], 50, 0.0),  # vLLM: np.percentile(x or 0) -> 0
        ([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 95, 95.5),  # rank 8.55
    ],
)
def test_percentile_matches_numpy_linear(values: list[float], p: float, expected: float) -> None:
    assert percentile(sorted(values), p) == pytest.approx(expected)


def test_accumulator_mean_population_std_max() -> None:
    acc = Accumulator()
    acc.extend([0.001, 0.002, 0.003, 0.004])  # seconds
    s = acc.summary()
    assert s.mean == pytest.approx(2.5)
    # population std of 1,2,3,4 ms = sqrt(1.25)
    assert s.std == pytest.approx(math.sqrt(1.25))
    assert (s.p50, s.p90, s.max, s.count) == (pytest.approx(2.5), pytest.approx(3.7), 4.0, 4)


def test_accumulator_reservoir_bounds_memory_and_keeps_exact_moments() -> None:
    acc = Accumulator(cap=1000, seed=3)
    n = 20_000
    acc.extend(i / n for i in range(n))
    assert not acc.exact
    assert len(acc._values) == 1000
    s = acc.summary()
    assert s.mean == pytest.approx(1000 * (n - 1) / (2 * n))
    assert s.max == pytest.approx(1000 * (n - 1) / n)
    # Uniform reservoir of 1000: the median is within a few percent of the truth.
    assert s.p50 == pytest.approx(500, abs=50)


def _r(i: int, ttft: float, itl: tuple[float, ...], out: int, ok: bool = True, t: float = 100.0,
       inp: int = 10) -> RequestResult:
    e2el = ttft + sum(itl)
    return RequestResult(id=i, t_start=t, ttft_s=ttft, itl_s=itl, e2el_s=e2el,
                         input_tokens=inp, output_tokens=out, ok=ok,
                         error=None if ok else "http_error", expected_input=inp)


def test_run_aggregator_hand_computed() -> None:
    agg = RunAggregator(slo=SLO(ttft_ms=150, tpot_ms=60))
    agg.set_origin(100.0)
    # A: ttft 100 ms, 3 tokens, gaps 50+50 -> e2el 200, tpot 50  -> good
    assert agg.add(_r(0, 0.100, (0.05, 0.05), 3))
    # B: ttft 200 ms -> misses the ttft SLO; 1 token -> tpot not aggregated
    assert not agg.add(_r(1, 0.200, (), 1, t=100.5))
    # C: failure, counted by reason, not in latency stats
    agg.add(_r(2, 0.0, (), 0, ok=False))
    s = agg.summary(duration_s=2.0, percentiles=(50, 99))
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["total_input_tokens"] == 20 and s["total_output_tokens"] == 4
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["request_goodput"] == pytest.approx(0.5)
    assert s["output_throughput"] == pytest.approx(2.0)
    assert s["total_token_throughput"] == pytest.approx(12.0)
    assert s["mean_ttft_ms"] == pytest.approx(150.0)
    assert s["median_ttft_ms"] == pytest.approx(150.0)
    assert s["std_ttft_ms"] == pytest.approx(50.0)
    assert s["p99_ttft_ms"] == pytest.approx(199.0)
    assert s["mean_tpot_ms"] == pytest.approx(50.0)  # only A has > 1 token
    assert s["mean_itl_ms"] == pytest.approx(50.0)
    assert s["mean_e2el_ms"] == pytest.approx(200.0)  # A 200, B 200
    # Token stamps: A at 100.1, 100.15, 100.2 -> second 0; B at 100.7 -> second 0.
    assert s["max_output_tokens_per_s"] == 4.0
    assert s["max_concurrent_requests"] == 2
    assert s["peak_in_flight"] == 1  # A ends at 100.2, B starts at 100.5: never two at once
    assert agg.failures_by_reason == {"http_error": 1}


def test_a_percentile_has_one_name_for_keys_and_verdicts() -> None:
    agg = RunAggregator(slo=SLO(ttft_ms=150, percentile=99.9))
    agg.set_origin(100.0)
    agg.add(_r(0, 0.100, (0.05, 0.05), 3))
    agg.add(_r(1, 0.200, (), 1, t=100.5))
    s = agg.summary(duration_s=2.0, percentiles=(50, 99.9))
    assert s.at_percentile("ttft", 99.9) == s["p99.9_ttft_ms"] == pytest.approx(199.9)
    assert s.at_percentile("ttft", 50.0) == s["p50_ttft_ms"]
    assert s.at_percentile("ttft", 95) is None  # not asked for: not measured
    assert judge(SLO(ttft_ms=150, percentile=99.9), s) == (False, "p99.9 TTFT 200 ms > 150 ms")
    assert judge(SLO(ttft_ms=150, percentile=95), s) == (False, "p95 TTFT not measured")


def test_peak_in_flight_counts_each_request_once() -> None:
    agg = RunAggregator()
    # One closed-loop slot: each request starts as the one before ends, 0.4 s apart, so
    # vLLM's per-second buckets see two or three per second; a second slot overlaps them.
    for k in range(6):
        agg.add(_r(k, 0.1, (0.1, 0.1, 0.1), 4, t=100.0 + 0.4 * k))
    agg.add(_r(9, 0.1, (0.1,), 2, t=100.05))
    s = agg.summary(duration_s=3.0)
    assert s["max_concurrent_requests"] >= 3
    assert s["peak_in_flight"] == 2


def test_no_slo_means_no_goodput() -> None:
    agg = RunAggregator()
    agg.add(_r(0, 0.1, (0.01,), 2))
    assert agg.summary(1.0)["request_goodput"] is None


def test_sliding_window_drops_old_results_and_rates_over_window() -> None:
    w = SlidingWindow(window_s=10.0)
    w.add(100.0, _r(0, 0.1, (0.01,), 2), True)
    w.add(105.0, _r(1, 0.3, (0.01,), 2), False)
    w.add(108.0, _r(2, 0.0, (), 0, ok=False), False)
    snap = w.snapshot(112.0, run_start=90.0, slo=SLO(ttft_ms=200), in_flight=3,
                      totals=(2, 1, 6), client=(False, 1.0, 0.2))
    # The first result (t=100) is older than 10 s at t=112.
    assert (snap.completed, snap.failed, snap.in_flight) == (1, 1, 3)
    assert snap.req_s == pytest.approx(0.1)
    assert snap.ttft.p50 == pytest.approx(300.0)
    assert snap.slo_attainment == 0.0 and snap.goodput == 0.0
    assert isinstance(snap.ttft, Percentiles)
    d = snap.to_dict()
    assert d["ttft"]["p50"] == pytest.approx(300.0) and d["total_sent"] == 6


def test_load_summary_is_typed_and_round_trips_through_its_result_file_keys() -> None:
    agg = RunAggregator(slo=SLO(ttft_ms=150))
    agg.set_origin(100.0)
    agg.add(_r(0, 0.100, (0.05, 0.05), 3))
    s = agg.summary(duration_s=2.0, percentiles=(50, 99.9))
    assert isinstance(s, LoadSummary) and s.completed == 1 and isinstance(s.completed, int)
    d = s.to_dict()
    # bench serve's keys, its fixed ones first, every metric's statistics after them
    assert list(d)[:4] == ["duration", "completed", "failed", "total_input_tokens"]
    assert {"p99.9_ttft_ms", "median_itl_ms", "std_e2el_ms", "max_tpot_ms"} <= set(d)
    assert LoadSummary.from_dict(d) == s
    assert s.get("p99.9_ttft_ms") == pytest.approx(100.0) and s["completed"] == 1 and "mean_itl_ms" in s
    assert s.get("nonsense") is None and "nonsense" not in s
    with pytest.raises(KeyError):
        s["nonsense"]


def test_load_summary_from_a_stored_document() -> None:
    # An older history row: no peak_in_flight, other documents' keys beside bench serve's.
    old = LoadSummary.from_dict({"completed": 3, "failed": 1, "duration": 2, "request_throughput": 1.5,
                                 "mean_ttft_ms": 40, "client_bound": False, "model_id": "m"})
    assert (old.completed, old.failed, old.peak_in_flight, old.request_goodput) == (3, 1, None, None)
    assert old.latency == {"mean_ttft_ms": 40.0} and old.duration == 2.0
    with pytest.raises(ValueError, match="completed is 'many'"):
        LoadSummary.from_dict({"completed": "many"}, where="run 7")


def _peak_by_events(spans: list[tuple[float, float]]) -> int:
    """The peak as the old code computed it: every start and end in order, an end first at a tie."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = cur = 0
    for _, step in events:
        cur += step
        peak = max(peak, cur)
    return peak


def test_peak_in_flight_from_sorted_arrays_matches_the_event_walk() -> None:
    """Issue 35: the peak comes from two sorted arrays (16 bytes a request), not a list of 2n
    tuples (about 250 bytes a request, 500 MB at the 2M cap); the figure is the same, ties
    (an end at the instant of a start, starts at one instant) included."""
    import random

    rng = random.Random(7)
    for n in (1, 2, 50, 3000):
        spans = []
        for _ in range(n):
            s = round(rng.uniform(0, 20), 1)  # coarse: many ties
            spans.append((s, s + round(rng.uniform(0, 3), 1)))
        agg = RunAggregator()
        for i, (s, e) in enumerate(spans):
            agg.add(RequestResult(id=i, t_start=s, ttft_s=0.0, itl_s=(), e2el_s=e - s, input_tokens=1,
                                  output_tokens=1, ok=True))
        # the ends as the aggregator sees them (t_start + e2el_s, rounded as floats are)
        assert agg.peak_in_flight() == _peak_by_events([(s, s + (e - s)) for s, e in spans]), n
    assert RunAggregator().peak_in_flight() == 0


def test_percentiles_past_numpys_threshold_equal_the_sorted_lists() -> None:
    """Large samples are sorted by numpy (a buffer, not 2M float objects); the figures are the
    ones sorted() gives, bit for bit."""
    import random

    rng = random.Random(3)
    values = [rng.expovariate(20.0) for _ in range(50_000)]
    acc = Accumulator()
    acc.extend(values)
    ordered = sorted(values)
    for p in (0, 1, 50, 90, 99, 99.9, 100):
        got = acc.quantile(p)
        assert type(got) is float and got == percentile(ordered, p), p


def test_the_reservoirs_bound_is_shown_once_it_samples() -> None:
    """Past the cap the percentiles are read from a uniform sample; the bound on their rank is
    three standard errors, sqrt(p (1 - p) / cap), in percentile points (0 while exact)."""
    import random

    from loadgen.stats import DEFAULT_CAP, rank_error

    values = [i / 5000 for i in range(5000)]  # uniform over 0..1 s
    random.Random(1).shuffle(values)
    acc = Accumulator(cap=1000, seed=1)
    acc.extend(values[:1000])
    assert acc.exact and acc.rank_error(99) == 0.0 and acc.samples == 1000
    acc.extend(values[1000:])
    assert not acc.exact and acc.samples == 1000
    assert acc.rank_error(50) == pytest.approx(300 * math.sqrt(0.25 / 1000))  # +-4.7 points at 1000
    assert rank_error(99, DEFAULT_CAP) == pytest.approx(0.0211, abs=1e-4)  # p99 of 2M: p98.98-p99.02
    # The bound holds: the reservoir's p90 is the true p90 +- the bound.
    s = acc.summary()
    assert abs(s.p90 / 1000 - 0.9) * 100 <= acc.rank_error(90)
