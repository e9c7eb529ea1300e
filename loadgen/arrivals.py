"""Open-loop arrival times, reproducible from ``ArrivalSpec.seed``.

Gaps follow vLLM's ``get_request``: gamma with shape ``burstiness`` and scale
``1 / (rate * burstiness)`` (burstiness 1.0 = exponential gaps = Poisson arrivals; an
infinite rate sends everything at once); ``constant`` uses equal gaps; ``ramp`` moves the
rate linearly from ``rate`` to ``end_rate``, by request index when the run has a request
count (as vLLM's linear ramp-up does) or by elapsed time when it only has a duration.
Every worker process draws the same sequence and takes its own share, so no schedule
crosses a process boundary.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from loadgen.spec import ArrivalSpec


def rate_at(spec: ArrivalSpec, k: int, t: float) -> float:
    """Request rate for request ``k`` sent at offset ``t``."""
    if spec.mode != "ramp":
        return spec.rate
    if spec.num_requests > 1:
        frac = k / (spec.num_requests - 1)
    elif spec.duration_s > 0:
        frac = min(1.0, t / spec.duration_s)
    else:
        frac = 1.0
    return spec.rate + (spec.end_rate - spec.rate) * frac


def iter_offsets(spec: ArrivalSpec) -> Iterator[float]:
    """Send offsets in seconds from the run start (first is 0), stopping at the spec's
    request count or duration, whichever comes first."""
    rng = random.Random(spec.seed)
    t = 0.0
    k = 0
    while True:
        if spec.num_requests and k >= spec.num_requests:
            return
        if spec.duration_s and t >= spec.duration_s:
            return
        yield t
        rate = rate_at(spec, k, t)
        k += 1
        if math.isinf(rate):
            gap = 0.0
        elif spec.mode == "constant" or math.isinf(spec.burstiness):
            gap = 1.0 / rate
        else:
            gap = rng.gammavariate(spec.burstiness, 1.0 / (rate * spec.burstiness))
        if math.isinf(rate) and spec.duration_s and not spec.num_requests:
            return  # "all at once" for a duration alone has no count: refuse to spin
        t += gap
