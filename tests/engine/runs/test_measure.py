"""engine.runs.measure: the one measured-run pipeline, and engine.runs.status, its one vocabulary.

Against loadgen.testserver (a stand-in without a model: these tests are about what the
pipeline decides and stores, not about vLLM's figures; the real-vLLM paths are in
tests/real/: test_session_vllm.py, test_sweep_vllm.py and test_faults_vllm.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.runs.history import History
from engine.runs.measure import RunHandle, RunPlan, Target, measure, server_window, speed_of_light
from engine.runs.status import RunStatus, decide
from engine.runs.summary import ServerWindow, TelemetryFigures
from engine.telemetry.metrics import Histogram, ServerSample
from engine.telemetry.store import SeriesStore
from engine.telemetry.summary import summarize
from loadgen import ArrivalSpec, WorkloadSpec
from loadgen.spec import SLO
from loadgen.testserver import ServerConfig, free_port, serve_in_processes
from tests.engine.telemetry.test_telemetry_summary import BOUNDS, build_store


def test_status_words_and_legacy_names() -> None:
    assert RunStatus.parse("complete") is RunStatus.OK
    assert RunStatus.parse("cut_short") is RunStatus.CANCELLED
    assert RunStatus.parse("server died") is RunStatus.SERVER_DIED
    assert RunStatus.parse("slo-missed") is RunStatus.SLO_MISSED
    with pytest.raises(ValueError, match="unknown run status 'finished'"):
        RunStatus.parse("finished")
    assert [s for s in RunStatus if s.measured] == [RunStatus.OK, RunStatus.SLO_MISSED, RunStatus.CLIENT_BOUND,
                                                    RunStatus.BOX_BOUND]
    assert [s for s in RunStatus if s.spoiled] == [RunStatus.CLIENT_BOUND, RunStatus.BOX_BOUND]


@pytest.mark.parametrize(("facts", "status"), [
    ({"server_died": True, "cancelled": True, "completed": 0}, RunStatus.SERVER_DIED),
    ({"cancelled": True, "completed": 5, "client_bound": True}, RunStatus.CANCELLED),
    ({"completed": 0, "client_bound": True, "slo_met": False}, RunStatus.FAILED),
    ({"completed": 5, "client_bound": True, "slo_met": False}, RunStatus.CLIENT_BOUND),
    ({"completed": 5, "client_bound": True, "box_bound": True}, RunStatus.CLIENT_BOUND),
    ({"completed": 5, "box_bound": True, "slo_met": False}, RunStatus.BOX_BOUND),
    ({"cancelled": True, "completed": 5, "box_bound": True}, RunStatus.CANCELLED),
    ({"completed": 5, "slo_met": False}, RunStatus.SLO_MISSED),
    ({"completed": 5, "slo_met": None}, RunStatus.OK),
])
def test_status_precedence(facts: dict[str, object], status: RunStatus) -> None:
    base = {"server_died": False, "cancelled": False, "client_bound": False, "slo_met": True}
    assert decide(**{**base, **facts}) is status  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_processes(ServerConfig(gap_s=0.01)) as srv:
        yield srv.url


def _plan(name: str, n: int, **kw: object) -> RunPlan:
    return RunPlan(name, WorkloadSpec(input_len=12, output_len=8),
                   ArrivalSpec(concurrency=2, num_requests=n, warmup_requests=2), **kw)  # type: ignore[arg-type]


def test_a_run_is_stored_once_with_what_every_path_shows(url: str, tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as history:
        run = asyncio.run(measure(Target(url), _plan("plain", 8, tags=("t",)), history=history))
        stored = history.get_run(run.history_id or -1)
        requests = history.requests(stored.id)
    assert run.status is RunStatus.OK and stored.status == "ok" and stored.tags == ("t",)
    # the summary the caller shows is the one stored, warm-up counted apart
    assert stored.summary.load == run.summary.load and run.load["completed"] == 8
    assert stored.summary.to_json() == run.summary.to_json()
    assert run.summary.stream is not None and len(requests) == 8 and run.summary.stream.warmup_requests == 2
    # When the first request left, counted from the run's start (prompts built, worker spawned).
    first = run.summary.stream.first_request_s
    assert isinstance(first, float) and 0.0 <= first <= run.ended - run.started
    # stored as every earlier vtui stored it: measure's keys in measure's order
    assert [k for k in stored.summary.to_json() if k not in ("telemetry", "energy")] == [
        "load", "server", "cross_check", "stream", "client_bound", "client_cpus", "failures_by_reason",
        "prefix_cache_reset", "box_cpu"]
    assert {"load", "telemetry", "server", "cross_check", "stream", "client_bound"} <= set(stored.summary.to_json())


def test_slo_missed_is_a_status_not_a_failure(url: str) -> None:
    run = asyncio.run(measure(Target(url), _plan("strict", 6, slo=SLO(e2el_ms=1.0))))
    assert run.status is RunStatus.SLO_MISSED and run.load["completed"] == 6
    assert run.summary.slo is not None and run.summary.slo.met is False and "E2EL" in (run.summary.slo.why or "")


def test_cancel_keeps_what_completed(url: str) -> None:
    async def go() -> object:
        handle = RunHandle()
        done: list[object] = []

        def on_request(r: object) -> None:
            done.append(r)
            if len(done) == 5:
                handle.cancel()

        return await measure(Target(url), _plan("stopped", 400), handle=handle, on_request=on_request)

    run = asyncio.run(go())
    assert run.status is RunStatus.CANCELLED  # type: ignore[attr-defined]
    assert 5 <= run.load["completed"] < 400  # type: ignore[attr-defined]


def test_a_refused_load_is_failed_with_the_reason() -> None:
    run = asyncio.run(measure(Target(f"http://127.0.0.1:{free_port()}"), _plan("nobody", 4)))
    assert run.status is RunStatus.FAILED and run.result is None
    assert run.error is not None and "cannot reach" in run.error


def test_the_server_going_away_mid_run_is_server_died() -> None:
    """The stand-in's process is SIGKILLed mid-run: the run stops at once, keeps what
    completed and says server-died (vLLM's own death is in tests/real/test_faults_vllm.py)."""
    import multiprocessing

    from loadgen.testserver import _proc_main

    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_proc_main, args=(ServerConfig(gap_s=0.02), "127.0.0.1", port, None, None),
                       daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port}"

    async def go() -> object:
        import httpx

        for _ in range(200):
            try:
                httpx.get(url + "/health", timeout=1.0, trust_env=False)
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
        done: list[object] = []

        def on_request(r: object) -> None:
            done.append(r)
            if len(done) == 6 and proc.pid:
                os.kill(proc.pid, signal.SIGKILL)  # our own child, by pid

        return await asyncio.wait_for(
            measure(Target(url), _plan("dies", 2000), on_request=on_request), 60)

    try:
        run = asyncio.run(go())
    finally:
        proc.kill()
        proc.join(5)
    assert run.status is RunStatus.SERVER_DIED  # type: ignore[attr-defined]
    assert run.load["completed"] >= 6 and run.error  # type: ignore[attr-defined]


def test_runs_draw_distinct_seeds_unless_one_is_set(url: str, tmp_path: Path) -> None:
    """Two runs of one workload never send the same prompts (a prefix cache would serve the
    second); each stores the seed it used, so it can be repeated; a set seed is kept."""
    with History(tmp_path / "h.sqlite") as history:
        a, b = (asyncio.run(measure(Target(url), _plan(name, 4), history=history)) for name in ("a", "b"))
        seeds = [history.get_run(r.history_id or -1).workload["workload"]["seed"] for r in (a, b)]
    assert seeds[0] != seeds[1]
    assert [r.result.extra["seed"] for r in (a, b)] == seeds  # type: ignore[union-attr]
    fixed = RunPlan("fixed", WorkloadSpec(input_len=12, output_len=8, seed=7), ArrivalSpec(num_requests=2))
    run = asyncio.run(measure(Target(url), fixed))
    assert run.result is not None and run.result.extra["seed"] == 7


def test_speed_of_light_reads_the_runs_telemetry() -> None:
    """measure's speed of light (its failures are kept off the run, so tested here): the first named
    GPU and the mean running requests of the run's TelemetrySummary; none without a GPU."""
    load = {"completed": 10, "total_input_tokens": 1280, "total_output_tokens": 640, "median_tpot_ms": 5.0,
            "request_throughput": 2.0, "mean_e2el_ms": 400.0}
    target = Target("http://127.0.0.1:1", model_label="qwen2.5-7b")
    tsum = summarize(build_store(), 100.0, 109.0)
    sol = speed_of_light(target, _plan("sol", 1), tsum, load)
    assert sol["reason"] is None and sol["gpu"] == "H200" and sol["batch"] == tsum.mean_running  # the peak table's name
    assert "on H200" in str(sol["line"])
    # stored with the telemetry, it reads back as the run's speed of light
    figures = TelemetryFigures.from_json({**tsum.to_dict(), "speed_of_light": sol}, "run")
    assert figures.speed_of_light is not None and figures.speed_of_light.to_json() == sol
    assert figures.speed_of_light.batch == tsum.mean_running and figures.speed_of_light.launch_bound is not None
    none = speed_of_light(target, _plan("sol", 1), summarize(SeriesStore(capacity=2)), load)
    assert none == {"reason": "no GPU: the speed of light is a GPU's"}


def test_the_server_window_reads_back_as_measure_writes_it() -> None:
    # measure stores server_window's document and builds the run's ServerWindow from it: the
    # typed window must write the same document (no Kept for a run built here).
    def sample(t: float, n: float) -> ServerSample:
        return ServerSample(t=t, running=2.0, waiting=0.0, kv_cache_usage=0.1, preemptions_total=n / 10,
                            prompt_tokens_total=100.0 * n, generation_tokens_total=50.0 * n,
                            prefix_queries_total=100.0 * n, prefix_hits_total=25.0 * n,
                            histograms={"ttft": Histogram(BOUNDS, (0.0, n / 2, n, n), n * 0.4),
                                        "e2e": Histogram(BOUNDS, (0.0, 0.0, n, n), n * 0.8)})

    doc = server_window(sample(100.0, 0.0), sample(110.0, 30.0))
    window = ServerWindow.from_json(doc, "the server's window")
    assert window.to_json() == doc and list(window.to_json()) == list(doc)
    assert window.prompt_tokens == 3000.0 and window.server_e2e is not None and window.server_e2e.count == 30.0
    assert window.figures().server_ttft == window.server_ttft and window.figures().t1 == 110.0
