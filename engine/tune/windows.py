"""Several configurations measured under one steady load: which requests of the stream
belong to which configuration's window, and a window's figures.

One load run sends the workload at a steady rate (or concurrency) while the tuner switches the
server's live limits (engine.server.livelimits) between windows. A window of configuration C:

1. the limits are set to C's (milliseconds; nothing drains, the stream goes on);
2. *settling*: until every request sent before the change has come back. Those were admitted (or
   queued) under the limits before, and lowering max-num-seqs preempts nothing, so while any runs
   the server is not yet C. Requests sent meanwhile belong to no window;
3. *measuring*: the requests sent in the next ``window_s`` seconds are C's;
4. *tail*: C's limits stay until every one of those has come back, so each of C's requests ran its
   whole life under C alone; requests sent in the tail go on loading the server and belong to no
   window (the next change's step 2 waits for them).

So a request belongs to the window whose limits admitted and served it from its send to its last
token, and to that one only; a request that straddles a change belongs to none. Dropping
straddlers does not favour short requests: membership is decided by the send time alone, before
anyone knows how long the request will take, and every request sent in the measured span is
waited for (one that never comes back within the tail's time counts as failed). The stream does
not stop between windows, so the server is loaded as in a step of its own, without the drain and
ramp of a run per configuration.

A request's id names its arrival (loadgen.worker: ``k``, in send order) and, in a stream of
multi-turn sessions, its turn (``k * TURN_IDS + turn``). So "every request sent before t came back"
is: the arrivals back without a gap reach one sent at or after t, and no session's later turn that
was sent before t (as the turn before it ended: ``RequestResult.follows``) is still out. A session
spans windows turn by turn: each turn belongs to the window it was sent and served in, as a lone
request does (its prompt carries the answers before it, whose lengths no configuration changes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.tune.trial import Measurement
from loadgen.records import TURN_IDS
from loadgen.stats import RunAggregator

if TYPE_CHECKING:
    from loadgen.records import RequestResult
    from loadgen.spec import SLO


@dataclass(frozen=True)
class WindowResult:
    """One configuration's window under the shared load: its figures, and where its time went."""

    key: str
    measurement: Measurement
    settle_s: float = 0.0
    """From the change of limits to the last request sent before it coming back (and the change itself)."""
    measure_s: float = 0.0
    """The measured span and its tail (the window's requests coming back)."""
    max_num_seqs: int | None = None
    """The live max-num-seqs during the window (None: not set by the space)."""
    span: tuple[float, float] = (0.0, 0.0)
    """The measured span's start and end (epoch seconds): its requests were sent between them."""


class WindowBook:
    """The requests of one steady stream as they come back, by id: its arrival's index, times
    TURN_IDS plus the turn where the stream has multi-turn ``sessions`` (see the module's text)."""

    def __init__(self, sessions: bool = False) -> None:
        self.back: dict[int, RequestResult] = {}
        self._per = TURN_IDS if sessions else 1
        self._low = 0  # the lowest arrival whose first (or only) request is not back yet
        self._out: dict[int, float] = {}  # a later turn sent, not back: id -> when (the turn before it ended)

    def add(self, r: RequestResult) -> None:
        """One request back (completed, failed or cancelled)."""
        self.back[r.id] = r
        if r.id % self._per == 0:
            while self._low * self._per in self.back:
                self._low += 1
        else:
            self._out.pop(r.id, None)
        if r.follows and r.id + 1 not in self.back:
            self._out[r.id + 1] = r.t_end

    def settled(self, t: float) -> bool:
        """Whether every request sent before ``t`` (epoch seconds) came back: arrivals go in send
        order, so the last of the unbroken run of them back was sent at or after ``t``
        (conservative: while the lowest one not back might have gone before ``t``, False), and no
        later turn sent before ``t`` is out."""
        return (self._low > 0 and self.back[(self._low - 1) * self._per].t_start >= t
                and all(sent >= t for sent in self._out.values()))

    def between(self, t0: float, t1: float) -> tuple[list[RequestResult], int]:
        """The requests sent in [t0, t1) that came back, and how many sent then did not: arrivals
        between the first and the last back in that span that are missing, and later turns sent
        in it that are out."""
        inside = sorted((r for r in self.back.values() if t0 <= r.t_start < t1), key=lambda r: r.id)
        firsts = [r.id // self._per for r in inside if r.id % self._per == 0]
        missing = firsts[-1] - firsts[0] + 1 - len(firsts) if firsts else 0
        return inside, missing + sum(1 for sent in self._out.values() if t0 <= sent < t1)


def window_measurement(load: float, results: Sequence[RequestResult], span_s: float, slo: SLO, *,
                       unfinished: int = 0, percentiles: Sequence[float] = (50.0, 90.0, 95.0, 99.0)) -> Measurement:
    """A window's step: its requests through the run's own statistics (loadgen.stats.RunAggregator,
    vLLM's definitions) over ``span_s`` (the measured span: goodput = requests meeting the SLO / span),
    judged as any step is (Measurement.of_summary)."""
    agg = RunAggregator(slo=slo)
    for r in results:
        if not r.cancelled:
            agg.add(r)
    pcts = tuple(sorted({*percentiles, float(slo.percentile)}))
    summary = agg.summary(span_s, pcts)
    sent = len(results) + unfinished
    m = Measurement.of_summary(load, summary, slo, requests=sent, duration_s=span_s,
                               unfinished=unfinished + sum(1 for r in results if r.cancelled))
    fastest = min((r.e2el_s for r in results if r.ok and not r.cancelled and r.e2el_s > 0), default=None)
    return dataclasses.replace(m, e2el_min_ms=fastest * 1000 if fastest is not None else None)


def combined(ms: Sequence[Measurement]) -> Measurement:
    """A configuration's windows at one load as one step: it meets the SLO where every window did;
    goodput and throughputs the mean over the windows; counts summed; latencies the worst window's
    (so a reuse of it as a step at that load is no kinder than its worst window)."""
    assert ms
    worst = max(ms, key=lambda m: (not m.ok, m.ttft_ms or 0.0, m.e2el_ms or 0.0))
    n = len(ms)
    return dataclasses.replace(
        worst, ok=all(m.ok for m in ms), reason=next((m.reason for m in ms if not m.ok), ""),
        requests=sum(m.requests for m in ms), completed=sum(m.completed for m in ms),
        failed=sum(m.failed for m in ms), goodput=sum(m.goodput for m in ms) / n,
        request_throughput=sum(m.request_throughput for m in ms) / n,
        output_throughput=sum(m.output_throughput for m in ms) / n,
        duration_s=sum(m.duration_s for m in ms),
        e2el_min_ms=min((m.e2el_min_ms for m in ms if m.e2el_min_ms is not None), default=None))


__all__ = ["WindowBook", "WindowResult", "combined", "window_measurement"]
