"""A stand-in for one trial's vLLM server and load generator, for the Ray tests (tests/engine/tune/test_tune_ray.py).

It stands in for a vLLM server on a cluster's GPUs, which cannot exist on these CPU machines;
Ray, its actors, their logical GPUs and the search are real. Per configuration key it knows a
limit (the highest load meeting the SLO); a step takes ``step_s`` of real time, so that a test
can kill its actor mid-step. It lives in its own module so that Ray's worker processes can
import it (tests/ is on their PYTHONPATH).
"""

from __future__ import annotations

import asyncio
import math
import os

from engine.flags import FlagSet
from engine.tune.search import Measurement, SearchSpace, StartOutcome


class TableTrial:
    def __init__(self, space: SearchSpace, table: dict[str, float], step_s: float = 0.2) -> None:
        self.space, self.table, self.step_s = space, table, step_s
        self.key = ""

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        self.key = self.space.key({n: flags.get(n) for n, _ in self.space.dims})
        await asyncio.sleep(self.step_s / 2)
        # Where Ray put it: the GPUs it granted this actor.
        return StartOutcome(True, hint=f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        await asyncio.sleep(self.step_s)
        limit = self.table[self.key]
        ok = limit >= 1e9 if math.isinf(load) else load <= limit
        thr = min(load, limit * 1.3)
        return Measurement(load, ok, "" if ok else "p99 TTFT 900 ms > 500 ms", requests=requests,
                           completed=requests, goodput=thr * (0.99 if ok else 0.5), request_throughput=thr,
                           ttft_ms=200.0 if ok else 900.0, duration_s=self.step_s)

    async def close(self) -> None:
        self.key = ""
