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

The request's id is its arrival's index (loadgen.worker: ``k``, in send order), so "every request
sent before t came back" is "the ids back without a gap reach one sent at or after t".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.tune.trial import Measurement
from loadgen.stats import RunAggregator
from loadgen.workload import DatasetError, has_sessions

if TYPE_CHECKING:
    from loadgen.records import RequestResult
    from loadgen.spec import SLO, WorkloadSpec


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
    """The requests of one steady stream as they come back, by id (their arrival's index)."""

    def __init__(self) -> None:
        self.back: dict[int, RequestResult] = {}
        self._low = 0  # the lowest id not back yet

    def add(self, r: RequestResult) -> None:
        """One request back (completed, failed or cancelled)."""
        self.back[r.id] = r
        while self._low in self.back:
            self._low += 1

    def settled(self, t: float) -> bool:
        """Whether every request sent before ``t`` (epoch seconds) came back: ids go in send order, so
        that is the last of the unbroken run of ids back having been sent at or after ``t``
        (conservative: while the lowest id not back might have gone before ``t``, False)."""
        return self._low > 0 and self.back[self._low - 1].t_start >= t

    def between(self, t0: float, t1: float) -> tuple[list[RequestResult], int]:
        """The requests sent in [t0, t1) that came back, and how many sent then did not (ids between
        the first back and the last back in that span that are missing)."""
        inside = sorted((r for r in self.back.values() if t0 <= r.t_start < t1), key=lambda r: r.id)
        if not inside:
            return [], 0
        return inside, inside[-1].id - inside[0].id + 1 - len(inside)


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


def windows_refusal(workload: WorkloadSpec) -> str:
    """Why ``workload`` cannot be measured in windows ("" where it can): a window's requests are one
    per arrival, sent at their arrival (the ids above), and a multi-turn session sends its later turns
    when the answer before ends. A dataset that cannot be read refuses nothing here: the load run says
    what is wrong with it."""
    try:
        sessions = has_sessions(workload)
    except DatasetError:
        return ""
    return ("its requests include multi-turn sessions (a later turn waits for the answer before it), and a"
            " window's requests are one per arrival") if sessions else ""


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


__all__ = ["WindowBook", "WindowResult", "combined", "window_measurement", "windows_refusal"]
