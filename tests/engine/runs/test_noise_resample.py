"""The within-run bootstrap's resamples (engine.runs.noise.RunNoise) against the plain way of
taking them: every picked block's values in one sorted list, loadgen.stats.percentile and
math.fsum over it. RunNoise counts in the blocks instead of sorting 400 lists (issue 35: a
22,500-request run took a minute of CPU on the TUI's noise thread); its figures must not move."""

from __future__ import annotations

import math
import random
from itertools import chain

import pytest

from engine.runs.history import StoredRequest
from engine.runs.noise import FIGURES, SEED, RunNoise
from loadgen.spec import SLO
from loadgen.stats import LOAD_METRICS, percentile


def made(seed: int, n: int, *, ties: bool = False, odd: bool = False) -> list[StoredRequest]:
    """``n`` requests; ``ties``: values rounded to the ms (many equal), ``odd``: one- and
    two-token requests, missing gaps, failures, starts out of order."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        def q(x: float) -> float:
            return round(x, 3) if ties else x
        ttft = q(0.020 * (1 + rng.uniform(-0.3, 0.3)))
        tokens = rng.choice([1, 2, 16]) if odd else 16
        gaps: tuple[float | None, ...] = tuple(q(0.005 * (1 + rng.uniform(-0.3, 0.3))) for _ in range(tokens - 1))
        if odd and gaps and rng.random() < 0.1:
            gaps = (*gaps[:-1], None)
        out.append(StoredRequest(id=i, t_start=i * 0.01 + (rng.uniform(0, 3) if odd else 0.0), ttft_s=ttft,
                                 e2el_s=ttft + sum(g or 0.0 for g in gaps), itl_s=gaps, input_tokens=12,
                                 output_tokens=tokens, ok=not (odd and rng.random() < 0.05), error=None,
                                 cancelled=False))
    return out


def plain_figures(noise: RunNoise, picks: list[int], has_slo: bool) -> dict[str, float]:
    """The figures of the picked blocks the plain way (the way RunNoise took them before)."""
    blocks = [noise._blocks[i] for i in picks]
    out: dict[str, float] = {}
    for metric in LOAD_METRICS:
        values = sorted(chain.from_iterable(b.latencies[metric].tolist() for b in blocks))
        if not values:
            continue
        out[f"mean_{metric}_ms"] = math.fsum(values) / len(values)
        out[f"median_{metric}_ms"] = percentile(values, 50)
        out[f"p90_{metric}_ms"] = percentile(values, 90)
        out[f"p99_{metric}_ms"] = percentile(values, 99)
    span = noise.block_s * len(noise._blocks)
    out["request_throughput"] = sum(b.completed for b in blocks) / span
    out["output_throughput"] = sum(b.output_tokens for b in blocks) / span
    if has_slo:
        out["request_goodput"] = sum(b.good for b in blocks) / span
    return out


def same(figure: str, got: float, want: float) -> bool:
    """Percentiles and rates to the bit; a mean within rounding (the blocks' sums summed)."""
    if math.isnan(want):
        return math.isnan(got)
    return got == pytest.approx(want, rel=1e-12) if figure.startswith("mean_") else got == want


@pytest.mark.parametrize(("requests", "slo"), [
    (made(1, 400), None),
    (made(2, 1000, ties=True), None),
    (made(3, 700, odd=True), SLO(ttft_ms=21.0)),
    (made(4, 12), None),
], ids=["plain", "ties", "odd", "few"])
def test_resamples_read_as_the_picked_blocks_values_sorted(requests: list[StoredRequest], slo: SLO | None) -> None:
    noise = RunNoise(requests, slo, key=5, resamples=60)
    assert noise.usable
    n = len(noise._blocks)
    whole = plain_figures(noise, list(range(n)), slo is not None)
    got = noise.figures()
    assert got.keys() == whole.keys()
    assert all(same(f, got[f], whole[f]) for f in whole), (got, whole)
    rng = random.Random(SEED * 1_000_003 + 5)  # the picks RunNoise draws, in its order
    rows = [plain_figures(noise, [rng.randrange(n) for _ in range(n)], slo is not None) for _ in range(60)]
    noise.settle()
    for figure in FIGURES:
        want = [row.get(figure, math.nan) for row in rows]
        got_r = noise.replicates(figure)
        if any(math.isnan(v) for v in want):
            assert got_r is None, figure
        else:
            assert got_r is not None and all(same(figure, g, w) for g, w in zip(got_r, want, strict=True)), figure
