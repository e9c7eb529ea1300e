"""Arrival processes checked statistically with fixed seeds."""

from __future__ import annotations

import math
import statistics

import pytest

from loadgen.arrivals import iter_offsets
from loadgen.spec import ArrivalSpec, SpecError


def _gaps(spec: ArrivalSpec) -> list[float]:
    t = list(iter_offsets(spec))
    return [b - a for a, b in zip(t, t[1:], strict=False)]


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_gaps_mean_and_cv(burstiness: float) -> None:
    gaps = _gaps(ArrivalSpec(mode="poisson", rate=20.0, burstiness=burstiness,
                             num_requests=20_001, seed=5))
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.03)
    # Gamma(k, theta): coefficient of variation = 1/sqrt(k); Poisson (k=1) -> 1.
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_poisson_counts_per_second_have_poisson_variance() -> None:
    t = list(iter_offsets(ArrivalSpec(mode="poisson", rate=10.0, duration_s=2000, seed=1)))
    counts = [0] * 2000
    for x in t:
        counts[int(x)] += 1
    assert statistics.mean(counts) == pytest.approx(10, rel=0.03)
    assert statistics.pvariance(counts) == pytest.approx(10, rel=0.1)


def test_seed_reproduces() -> None:
    a = list(iter_offsets(ArrivalSpec(mode="poisson", rate=5, num_requests=50, seed=2)))
    b = list(iter_offsets(ArrivalSpec(mode="poisson", rate=5, num_requests=50, seed=2)))
    c = list(iter_offsets(ArrivalSpec(mode="poisson", rate=5, num_requests=50, seed=3)))
    assert a == b != c


def test_constant_rate_and_duration_stop() -> None:
    t = list(iter_offsets(ArrivalSpec(mode="constant", rate=4.0, duration_s=2.0)))
    assert t == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75])


def test_infinite_rate_sends_all_at_once() -> None:
    assert list(iter_offsets(ArrivalSpec(mode="poisson", rate=math.inf, num_requests=5))) == [0] * 5


def test_linear_ramp_by_index() -> None:
    spec = ArrivalSpec(mode="ramp", rate=1.0, end_rate=100.0, burstiness=math.inf,
                       num_requests=100)
    gaps = _gaps(spec)
    assert gaps[0] == pytest.approx(1.0)
    assert gaps[-1] == pytest.approx(1 / (1 + 99 * 98 / 99))
    assert all(a >= b for a, b in zip(gaps, gaps[1:], strict=False))


def test_linear_ramp_by_time_rates() -> None:
    t = list(iter_offsets(ArrivalSpec(mode="ramp", rate=10.0, end_rate=50.0, duration_s=100,
                                      seed=4)))
    first = sum(1 for x in t if x < 10) / 10
    last = sum(1 for x in t if x >= 90) / 10
    assert first == pytest.approx(12, rel=0.2)  # mean rate over 0..10 s is 12
    assert last == pytest.approx(48, rel=0.1)


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"mode": "closed", "concurrency": 0, "num_requests": 1}, "concurrency"),
        ({"mode": "poisson", "rate": 0, "num_requests": 1}, "rate"),
        ({"mode": "closed"}, "set num_requests or duration_s"),
        ({"mode": "ramp", "rate": 1, "num_requests": 3}, "end_rate"),
        ({"mode": "poisson", "rate": 1, "burstiness": 0, "num_requests": 1}, "burstiness"),
    ],
)
def test_arrival_spec_errors(d: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        ArrivalSpec.from_dict(d)


def test_arrival_round_trip_inf() -> None:
    a = ArrivalSpec(mode="poisson", rate=math.inf, num_requests=10)
    assert a.to_dict() == {"mode": "poisson", "num_requests": 10}
    b = ArrivalSpec(mode="poisson", rate=2.5, num_requests=10)
    assert ArrivalSpec.from_dict(b.to_dict()) == b
    assert ArrivalSpec.from_dict({"rate": "inf", "mode": "poisson", "num_requests": 1}).rate == math.inf
