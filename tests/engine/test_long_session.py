"""A long session: what finished runs keep (issue 35), what Live shows once a run ended
(issue 32, item 3) and how runs are named (issue 33, item 7).

The retention test feeds the session's load runs (``engine.runs.part.RunsPart``, what the
``r`` key drives) many thousands of synthetic completed requests over several runs, through
the same history recording ``engine.runs.measure.measure`` writes, and weighs what stays
(tracemalloc): the load itself is not the subject, so ``measure`` is replaced by one that
hands back what the real one does (a ``MeasuredRun`` whose ``RunResult`` holds the run's
requests, as ``loadgen.LoadRun`` keeps up to 50,000). The Live figures test is a real run of
the session against loadgen's stand-in server.
"""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.flags import FlagSet
from engine.runs import part as runs_part
from engine.runs.history import History, Recording
from engine.runs.measure import MeasuredRun, RunPlan, Target
from engine.runs.part import FINISHED_WINDOWS, UNSTORED_REQUESTS, RunGround, RunsPart, run_name
from engine.runs.status import RunStatus
from engine.runs.summary import RunSummary
from engine.session import Session
from engine.telemetry.store import SeriesStore
from engine.views import LIVE_METRICS
from loadgen import ArrivalSpec, RunResult, WorkloadSpec
from loadgen.records import RequestResult
from loadgen.stats import LoadSummary, Percentiles, RunAggregator, SlidingWindow, StatsWindow

REQUESTS_PER_RUN = 10_000
OUTPUT_TOKENS = 24
RUNS = 3


def synthetic_measure(requests: int, *, windows: int = 200) -> Callable[..., Any]:
    """A stand-in for engine.runs.measure.measure: ``requests`` completed requests (their
    gaps, tokens and times as a stream gives them), each handed to ``on_request`` and written
    to the history as the real pipeline writes them, every hundredth closing a window."""

    async def measure(target: Target, plan: RunPlan, *, history: History | None = None, store: object = None,
                      handle: object = None, on_window: Callable[[StatsWindow], None] | None = None,
                      on_request: Callable[[RequestResult], None] | None = None, **_: object) -> MeasuredRun:
        rec = Recording(history, plan.name, flags=dict(target.flags))
        rng = random.Random(plan.name)
        t0 = 1_800_000_000.0
        kept: list[RequestResult] = []
        recorded: list[StatsWindow] = []
        every = max(1, requests // windows)
        for i in range(requests):
            itl = tuple(rng.uniform(0.008, 0.012) for _ in range(OUTPUT_TOKENS - 1))
            ttft = rng.uniform(0.018, 0.025)
            r = RequestResult(id=i, t_start=t0 + i / 150, ttft_s=ttft, itl_s=itl, e2el_s=ttft + sum(itl),
                              input_tokens=64, output_tokens=OUTPUT_TOKENS, ok=True, expected_input=64)
            kept.append(r)  # loadgen.run keeps up to 50,000 of them
            rec.add_request(r)
            if on_request is not None:
                on_request(r)
            if i % every == every - 1:
                w = _window(r.t_end, t0, i + 1)
                recorded.append(w)
                rec.add_window(w)
                if on_window is not None:
                    on_window(w)
            if i % 2000 == 0:
                await asyncio.sleep(0)
        duration = requests / 150
        load = LoadSummary.from_dict({
            "duration": duration, "completed": requests, "failed": 0, "total_input_tokens": 64 * requests,
            "total_output_tokens": OUTPUT_TOKENS * requests, "request_throughput": 150.0,
            "output_throughput": 150.0 * OUTPUT_TOKENS, "total_token_throughput": 150.0 * (64 + OUTPUT_TOKENS),
            **{f"{stat}_{m}_ms": 20.0 + k for k, m in enumerate(("ttft", "tpot", "itl", "e2el"))
               for stat in ("mean", "median", "std", "p90", "p99", "max")}})
        result = RunResult(summary=load, windows=tuple(recorded), requests=tuple(kept), failures_by_reason={},
                           failure_examples={}, client_bound=False, client_lag_p99_ms=0.5, client_cpu_max=0.1,
                           cancelled=False, workers=1, extra={"percentiles_exact": True, "t_start": t0})
        summary = RunSummary(load=load)
        info = rec.finish(history, RunStatus.OK, summary)
        return MeasuredRun(name=plan.name, status=RunStatus.OK, started=t0, ended=t0 + duration, summary=summary,
                           result=result, info=info)

    return measure


def _window(t: float, t0: float, done: int) -> StatsWindow:
    """A published window as loadgen makes them (figures made up: the subject is what is kept)."""
    p = {m: Percentiles(mean=v, std=v / 4, p50=v, p90=v * 1.2, p95=v * 1.3, p99=v * 1.5, max=v * 2, count=1500)
         for m, v in (("ttft", 21.0 + t % 1), ("tpot", 10.0 + t % 0.5), ("itl", 10.0 + t % 0.3), ("e2el", 250.0 + t % 3))}
    return StatsWindow(t=t, window_s=10.0, elapsed_s=t - t0, completed=1500, failed=0, in_flight=4, req_s=150.0 + t % 1,
                       output_tok_s=3600.0 + t % 7, total_tok_s=13200.0, ttft=p["ttft"], tpot=p["tpot"], itl=p["itl"],
                       e2el=p["e2el"], goodput=None, slo_attainment=None, total_completed=done, total_failed=0,
                       total_sent=done + 4, client_bound=False, client_lag_ms=0.5, client_cpu=0.1)


def retained_bytes(root: object) -> int:
    """The bytes of every object reachable from ``root`` (sys.getsizeof over gc's referents),
    leaving out what a run does not own: code, modules, classes, the history's connection and
    the session's telemetry store, threads and locks."""
    import sys
    import threading
    import types

    from engine.flags import Schema

    skip = (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
            types.CodeType, History, SeriesStore, Schema, threading.Thread, type(threading.Lock()))
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def _ground(n: int) -> RunGround:
    flags = FlagSet(model="tiny", values={"max-num-seqs": n})
    return RunGround(base_url="http://127.0.0.1:9", ready=True, workload=WorkloadSpec(input_len=64, output_len=24),
                     arrivals=ArrivalSpec(mode="constant", rate=150, duration_s=60), slo=None, preset_name="soak",
                     flags=flags, supervisor=None, model="test-model", pid=None, version="stand-in",
                     name_base="soak", preset_flags=FlagSet(model="tiny", values={}))


def _runs_part(record_history: bool) -> RunsPart:
    return RunsPart(emit=lambda event: None, clock=lambda: 0.0, store=SeriesStore(capacity=4),
                    push=lambda name, value: None, clear_series=lambda names: None, record_history=record_history)


def _retained(record_history: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[RunsPart, list[int]]:
    """Run RUNS synthetic runs of REQUESTS_PER_RUN; the bytes the session's runs hold after each."""
    monkeypatch.setattr(runs_part, "measure", synthetic_measure(REQUESTS_PER_RUN))
    runs = _runs_part(record_history)

    async def go() -> list[int]:
        held = []
        for n in range(1, RUNS + 1):
            await runs.run(_ground(n))
            held.append(retained_bytes(runs))
        return held

    return runs, asyncio.run(go())


def test_finished_runs_keep_their_figures_not_their_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: each finished run kept its per-request records in the TUI (~100 MB a 9-minute
    run at 150 req/s). 3 runs of 10,000 requests (24 tokens each) held 32 MB on the old code
    (10.7 MB a run); a finished run now keeps its figures and windows (270 kB here), the
    requests stay in the history."""
    runs, held = _retained(True, monkeypatch)
    assert len(runs.runs) == RUNS
    for record in runs.runs:
        assert record.history_id is not None
        assert record.result is not None and record.result.requests == ()
        assert record.summary.figure("completed") == REQUESTS_PER_RUN  # the figures stay whole
    # What is left per run: its summary, its 200 windows, its record.
    assert held[-1] < 1_500_000, f"held after each run: {held} bytes"
    assert held[-1] - held[1] < 500_000, held  # a later run adds about what the one before did
    # What a view needs of the requests is read back from the history: the trace export, the
    # advisor's percentiles.
    history = runs.get_history()
    assert history is not None
    last = runs.runs[-1]
    assert last.history_id is not None and len(history.requests(last.history_id)) == REQUESTS_PER_RUN


def test_a_run_not_stored_keeps_a_bounded_part_of_its_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a history (not writable, or turned off) a finished run keeps its first
    UNSTORED_REQUESTS records for its trace, never all of them."""
    runs, held = _retained(False, monkeypatch)
    for record in runs.runs:
        assert record.history_id is None
        assert record.result is not None and len(record.result.requests) == UNSTORED_REQUESTS
    # 2,000 records of 24 tokens (~1.1 kB) a run, and its windows: 2.4 MB a run (10.7 on the old code)
    assert held[-1] < RUNS * 2_500_000, held


def test_a_long_runs_windows_are_thinned_once_it_ended() -> None:
    """A finished run keeps at most FINISHED_WINDOWS of its one-a-second windows, the last one
    (its final state) among them; the history has every one."""
    import dataclasses

    from engine.runs.part import finished_result

    windows = tuple(SlidingWindow(10.0).snapshot(float(t), run_start=0.0, slo=None, in_flight=0, totals=(t, 0, t),
                                                 client=(False, 0.0, 0.0)) for t in range(1, 7201))
    result = RunResult(summary=RunAggregator().summary(7200.0), windows=windows, requests=(), failures_by_reason={},
                       failure_examples={}, client_bound=False, client_lag_p99_ms=0.0, client_cpu_max=0.0,
                       cancelled=False, workers=1)
    kept = finished_result(result, stored=True)
    assert len(kept.windows) <= FINISHED_WINDOWS + 1 and kept.windows[-1] is windows[-1]
    assert kept.windows[0] is windows[0]
    short = dataclasses.replace(result, windows=windows[:30])
    assert finished_result(short, stored=True).windows == windows[:30]  # a short run's are all kept


# ---------------------------------------------------------------- Live's figures (issue 32, item 3)


async def test_live_shows_the_runs_own_figures_once_it_ended(tiny_model: Path) -> None:
    """Live showed its last 10 s window after a run (17.1 req/s) where Runs showed the whole
    run (17.6). While a run goes Live's figures are its window, labelled so; once it ended they
    are the stored run's, labelled the whole run, figure for figure."""
    from engine.server.attach import AttachedServer
    from loadgen.testserver import ServerConfig, serve_in_thread

    with serve_in_thread(ServerConfig(first_delay_s=0.01, gap_s=0.004, max_model_len=4096)) as url:
        session = Session(FlagSet(model=str(tiny_model), values={}),
                          workload=WorkloadSpec(input_len=32, output_len=8),
                          arrivals=ArrivalSpec(mode="constant", rate=40, duration_s=4.0),
                          workload_label="figures", record_history=True, telemetry=False)
        got = []
        session.subscribe(got.append)
        publisher = asyncio.create_task(session.publish_forever(hz=20))
        try:
            session.attach_server(AttachedServer(url=url, version="stand-in", models=("test-model",),
                                                 max_model_len=4096))
            record = await session.run_workload()
            await asyncio.sleep(0.15)
        finally:
            publisher.cancel()
            await session.close()
    during = [s.figures for s in got if s.run is not None and s.figures is not None]
    assert during and all(f.scope == "last 10 s" and not f.whole_run for f in during)
    final = session.snapshot().figures
    assert final is not None and final.whole_run and final.scope == "whole run"
    history = History()
    assert record.history_id is not None
    stored = history.get_run(record.history_id).summary
    fig = stored.figure
    assert final.req_s == fig("request_throughput") and final.out_tok_s == fig("output_throughput")
    assert final.completed == fig("completed") and final.failed == fig("failed") == 0
    rows = dict(final.latency)
    for label, metric in LIVE_METRICS:
        assert rows[label] == (fig(f"median_{metric}_ms"), fig(f"p90_{metric}_ms"), fig(f"p99_{metric}_ms")), label
    # ... the figures the last window had are not what Live shows any more
    window = session.snapshot().window
    assert window is not None and (window.req_s, window.ttft.p50) != (final.req_s, rows["TTFT"][0])


async def test_the_live_panel_labels_its_figures(tiny_model: Path) -> None:
    """The panel says which figures it shows: ``last 10 s`` while the run goes, ``whole run``
    after it, with the stored run's req/s."""
    import dataclasses

    import tui_data

    from tui.widgets.live import LivePanel

    app_session = tui_data.make_session()
    running = tui_data.ready_running(app_session)
    ended = tui_data.with_runs(app_session)
    from tests.tui.test_tui_snapshots import _app

    app = _app(app_session)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.screen.query_one(LivePanel)
        for snap, scope, req in ((running, "last 10 s", "18.0 req/s"), (ended, "whole run", "21.5 req/s")):
            app.show_snapshot(snap)
            await pilot.pause()
            text = str(panel.query_one("#live-throughput").render())
            assert text.startswith(scope) and req in text, text
        assert dataclasses.replace(ended, run=running.run).figures.scope == "last 10 s"  # type: ignore[union-attr]


# ---------------------------------------------------------------- run names (issue 33, item 7)


def test_a_run_on_an_attached_server_is_named_by_what_differs_from_its_preset() -> None:
    """Issue 33, item 7: ``online-chat ecp=default epc=off h=127.0.0.1 mml=2048 mnbt=default
    mns=default p=18601``: where the server listens is not a flag of the run, and ``=default``
    said nothing. Flags the server leaves to vLLM's default are named once, together."""
    preset = FlagSet(model="m", values={"enable-chunked-prefill": True, "enable-prefix-caching": True,
                                        "max-num-batched-tokens": 2048, "max-num-seqs": 128})
    attached = FlagSet(model="m", values={"host": "127.0.0.1", "port": 18601, "max-model-len": 2048,
                                          "enable-prefix-caching": False, "api-key": "sk-secret"})
    name = run_name("online-chat", preset, attached, [])
    assert name == "online-chat epc=off mml=2048 vllm-default:ecp,mnbt,mns"
    assert "=default" not in name and "127.0.0.1" not in name and "18601" not in name
    assert run_name("online-chat", preset, attached, [name]) == f"{name} (2)"
    # the preset's own server, and one edit of it
    assert run_name("online-chat", preset, preset.set("port", 8001), []) == "online-chat"
    assert run_name("online-chat", preset, preset.set("max-num-seqs", 64), []) == "online-chat mns=64"


def test_a_run_name_fits_80_columns_whatever_differs() -> None:
    """Many differing flags, long values: the name stays readable at 80 columns (numbered,
    in the notice line), the rest counted; flags whose initials clash are
    named in full."""
    preset = FlagSet(model="m", values={})
    many = FlagSet(model="m", values={
        "max-num-seqs": 256, "max-num-batched-tokens": 8192, "max-model-len": 32768, "block-size": 32,
        "kv-cache-dtype": "fp8", "dtype": "bfloat16", "gpu-memory-utilization": 0.92,
        "speculative-config": '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'})
    name = run_name("online-chat-long-context", preset, many, [])
    assert len(f"run {name} (12): slo-missed") <= 80, name  # the notice line when it ends
    assert name.startswith("online-chat-long-context bs=32 ") and name.endswith(" flags"), name
    # a long value is cut
    spec = run_name("p", preset, FlagSet(model="m", values={"speculative-config": many.values["speculative-config"]}), [])
    assert len(spec) <= 2 + len("speculative-config=") + 14 and spec.endswith("~"), spec
    # enable-chunked-prefill and enable-custom-ar... share "ecp": both in full
    clash = FlagSet(model="m", values={"enable-chunked-prefill": False, "enable-cuda-profiling": True})
    assert run_name("p", preset, clash, []) == "p enable-chunked-prefill=off enable-cuda-profiling=on"
