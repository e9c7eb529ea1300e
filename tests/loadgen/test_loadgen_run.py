"""LoadRun end to end against loadgen.testserver (a real local streaming server whose
byte-level /tokenize stands in for the model's tokenizer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen import SLO, ArrivalSpec, LoadRun, RunResult, ServerError, StatsWindow, WorkloadSpec
from loadgen.records import TURN_IDS, RequestResult
from loadgen.testserver import ServerConfig, free_port, serve_in_thread


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(first_delay_s=0.005, gap_s=0.001, max_model_len=1000)) as u:
        yield u


def _run(run: LoadRun, **kw: object) -> object:
    return asyncio.run(run.run(**kw))  # type: ignore[arg-type]


def test_closed_loop_counts_keys_windows_and_jsonl(url: str, tmp_path: Path) -> None:
    windows: list[StatsWindow] = []
    seen: list[RequestResult] = []
    f = tmp_path / "req.jsonl"
    run = LoadRun(url, None, WorkloadSpec(input_len=50, output_len=6, seed=2),
                  ArrivalSpec(concurrency=4, num_requests=40, workers=1), SLO(ttft_ms=1000),
                  publish_s=0.05, requests_file=f)
    res = asyncio.run(run.run(on_window=windows.append, on_request=seen.append))
    s = res.summary
    assert s["completed"] == 40 and s["failed"] == 0
    assert s["total_input_tokens"] == 40 * 50  # the server's usage agrees with the prompts
    assert res.extra["input_len_mismatches"] == 0
    assert s["total_output_tokens"] == 240
    for key in ("duration", "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests", "peak_in_flight",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
                "median_tpot_ms", "p99_itl_ms", "median_e2el_ms"):
        assert key in s
    assert s["median_ttft_ms"] >= 5.0  # the server's first-chunk delay
    assert s["request_goodput"] == pytest.approx(s["request_throughput"])
    assert len(seen) == 40 and len(res.requests) == 40
    lines = f.read_text().splitlines()
    assert len(lines) == 40 and json.loads(lines[0])["ok"] is True
    assert windows and windows[-1].total_completed <= 40
    assert all(w.t > 1e9 for w in windows)  # epoch stamps, telemetry's clock
    doc = res.to_json()
    json.dumps(doc)
    assert doc["failures_by_reason"] == {} and doc["client_bound"] in (True, False)


def test_two_worker_processes(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=20, output_len=4),
                  ArrivalSpec(concurrency=8, num_requests=60, workers=2))
    res = asyncio.run(run.run())
    assert res.workers == 2
    assert res.summary["completed"] == 60
    assert {r.worker for r in res.requests} == {0, 1}
    assert len({r.id for r in res.requests}) == 60


def test_isolated_single_worker_process(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=20, output_len=4),
                  ArrivalSpec(concurrency=2, num_requests=10, workers=1), isolate=True)
    res = asyncio.run(run.run())
    assert res.summary["completed"] == 10 and res.workers == 1


def test_open_loop_rate_and_in_flight_cap(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=10, output_len=3),
                  ArrivalSpec(mode="poisson", rate=200.0, num_requests=60, max_in_flight=2,
                              workers=1, seed=1))
    res = asyncio.run(run.run())
    assert res.summary["completed"] == 60
    starts = sorted((r.t_start, r.t_end) for r in res.requests)
    # Never more than 2 requests in flight at once.
    for t0, _ in starts:
        assert sum(1 for a, b in starts if a <= t0 < b) <= 2


def test_warmup_excluded(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=10, output_len=3),
                  ArrivalSpec(concurrency=2, num_requests=10, warmup_requests=4, workers=1))
    res = asyncio.run(run.run())
    assert res.summary["completed"] == 10
    assert all(r.id >= 0 for r in res.requests)


def test_cancel_counts_in_flight_as_cancelled() -> None:
    with serve_in_thread(ServerConfig(first_delay_s=0.01, gap_s=0.05)) as u:
        run = LoadRun(u, None, WorkloadSpec(input_len=10, output_len=50),
                      ArrivalSpec(concurrency=3, duration_s=60, workers=1))

        async def go() -> object:
            streaming = asyncio.Event()

            def on_window(w: StatsWindow) -> None:
                if w.in_flight == 3:
                    streaming.set()

            task = asyncio.ensure_future(run.run(on_window=on_window))
            await asyncio.wait_for(streaming.wait(), 30)  # the worker process is up and sending
            run.cancel()
            return await asyncio.wait_for(task, 10)

        res = asyncio.run(go())
    assert res.cancelled  # type: ignore[attr-defined]
    assert res.extra["cancelled_requests"] == 3  # type: ignore[attr-defined]
    assert res.summary["failed"] == 0  # type: ignore[attr-defined]
    assert res.failures_by_reason == {}  # type: ignore[attr-defined]


def test_cancel_with_worker_processes() -> None:
    with serve_in_thread(ServerConfig(gap_s=0.05)) as u:
        run = LoadRun(u, None, WorkloadSpec(input_len=10, output_len=100),
                      ArrivalSpec(concurrency=4, duration_s=60, workers=2))

        async def go() -> object:
            streaming = asyncio.Event()

            def on_window(w: StatsWindow) -> None:
                if w.in_flight == 4:
                    streaming.set()

            task = asyncio.ensure_future(run.run(on_window=on_window))
            await asyncio.wait_for(streaming.wait(), 30)  # both worker processes are sending
            run.cancel()
            return await asyncio.wait_for(task, 20)

        res = asyncio.run(go())
    assert res.cancelled and res.extra["cancelled_requests"] == 4  # type: ignore[attr-defined]


def test_chat_sessions_grow_the_conversation(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(kind="chat", endpoint="chat", input_len=10,
                                          output_len=3, num_turns=3),
                  ArrivalSpec(concurrency=2, num_requests=6, workers=1))
    res = asyncio.run(run.run())
    assert res.summary["completed"] == 6
    by_turn = sorted(res.requests, key=lambda r: r.id)
    # Turn 0: prefix-free 10 bytes; turn 1: + reply "aaa" + 10 bytes; turn 2: + 13 more.
    assert [r.input_tokens for r in by_turn[:3]] == [10, 23, 36]
    # Ids name arrival and turn; every turn but the last says another follows it.
    assert [(r.id // TURN_IDS, r.id % TURN_IDS, r.follows) for r in by_turn] == [
        (a, t, t < 2) for a in (0, 1) for t in range(3)]


def test_a_trace_with_conversations_numbers_its_lone_requests_as_turn_zero(tmp_path: Path, url: str) -> None:
    """A lone row's id in a stream with sessions is its arrival x TURN_IDS, so it can never be taken
    for a conversation's later turn (arrival 1's turn 0 was id 1, a clash with arrival 0's turn 1)."""
    f = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0.0, "input_len": 5, "output_len": 2, "conversation": "c", "turn": 0},
            {"timestamp": 0.1, "input_len": 5, "output_len": 2},
            {"timestamp": 0.2, "input_len": 12, "output_len": 2, "conversation": "c", "turn": 1}]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    run = LoadRun(url, None, WorkloadSpec(kind="trace", dataset=str(f)),
                  ArrivalSpec(mode="trace", num_requests=3, workers=1))
    res = asyncio.run(run.run())
    assert sorted((r.id, r.follows) for r in res.requests) == [(0, True), (1, False), (TURN_IDS, False)]


def test_trace_replay_timing(tmp_path: Path, url: str) -> None:
    f = tmp_path / "trace.jsonl"
    f.write_text("\n".join(json.dumps({"timestamp": t, "input_len": 5, "output_len": 2})
                           for t in (0.0, 0.2, 0.6)))
    run = LoadRun(url, None, WorkloadSpec(kind="trace", dataset=str(f), time_scale=0.5),
                  ArrivalSpec(mode="trace", num_requests=3, workers=1))
    res = asyncio.run(run.run())
    t = sorted(r.t_start for r in res.requests)
    # Scaled offsets are 0.1 and 0.3 s; unscaled ones would be 0.2 and 0.6. The tolerance is
    # half the smallest gap between the two answers, so a wrong scale always fails while a
    # worker process woken 30-50 ms late on a busy 2-core box (seen in a CI-like run) does not.
    assert [x - t[0] for x in t] == pytest.approx([0.0, 0.1, 0.3], abs=0.05)
    assert all(b > a for a, b in zip(t, t[1:], strict=False))


def test_lengths_beyond_max_model_len_rejected_before_the_run(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=900, output_len=200),
                  ArrivalSpec(concurrency=1, num_requests=1))
    with pytest.raises(ServerError, match="1100 tokens .* max-model-len of 1000"):
        asyncio.run(run.run())


def test_unreachable_server() -> None:
    run = LoadRun(f"http://127.0.0.1:{free_port()}", None, WorkloadSpec(),
                  ArrivalSpec(num_requests=1))
    with pytest.raises(ServerError, match="cannot reach"):
        asyncio.run(run.run())


def test_unknown_model_names_served_ones(url: str) -> None:
    run = LoadRun(url, "other", WorkloadSpec(), ArrivalSpec(num_requests=1))
    with pytest.raises(ServerError) as exc:
        asyncio.run(run.run())
    assert "served: test-model" in exc.value.hint


def test_client_bound_when_the_loop_is_blocked() -> None:
    """A consumer that works 60 ms per window on the event loop it shares with the worker
    (isolate=False) makes the run say client-bound with the lag figure, instead of passing
    the delay off as latency: that lag is the client's own work, not a wait for a core."""
    import time

    windows: list[StatsWindow] = []

    def slow_consumer(w: StatsWindow) -> None:
        windows.append(w)
        end = time.thread_time() + 0.06  # 60 ms of work on the loop's own thread
        while time.thread_time() < end:
            pass

    with serve_in_thread(ServerConfig(gap_s=0.02)) as u:
        run = LoadRun(u, None, WorkloadSpec(input_len=10, output_len=10),
                      ArrivalSpec(concurrency=2, num_requests=12, workers=1), publish_s=0.05,
                      isolate=False)
        res = asyncio.run(run.run(on_window=slow_consumer))
    assert res.client_bound and res.client_lag_p99_ms > 20
    assert any(w.client_bound and w.client_lag_ms > 20 for w in windows)


def test_not_client_bound_when_idle(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=10, output_len=3),
                  ArrivalSpec(concurrency=1, num_requests=30, workers=1))
    res = asyncio.run(run.run())
    assert res.client_lag_p99_ms < 20


def test_a_server_that_goes_away_stops_the_run_at_once() -> None:
    """Once connections are refused the worker stops sending (no spinning through the
    queue as refusals), keeps what completed, and the run says server_gone."""
    import threading
    import time

    results: list[object] = []
    with serve_in_thread(ServerConfig(gap_s=0.01)) as u:
        run = LoadRun(u, None, WorkloadSpec(input_len=10, output_len=20),
                      ArrivalSpec(concurrency=2, num_requests=100_000), read_timeout_s=3.0)
        done, some = threading.Event(), threading.Event()
        completed: list[object] = []

        def on_request(r: object) -> None:
            completed.append(r)
            if len(completed) >= 5:
                some.set()

        def go() -> None:
            results.append(asyncio.run(run.run(on_request=on_request)))
            done.set()

        threading.Thread(target=go, daemon=True).start()
        assert some.wait(60), "no request completed"
    stopped = time.monotonic()
    assert done.wait(30), "the run did not end after the server went away"
    ended = time.monotonic() - stopped
    res = results[0]
    assert res.server_gone  # type: ignore[attr-defined]
    assert res.summary["completed"] > 0  # type: ignore[attr-defined]
    assert res.failures_by_reason.get("connection_refused", 0) <= 2  # type: ignore[attr-defined]
    # The server's connections die with it (as a process's do): the streams end at once, not at
    # their 3 s read timeout on a socket nobody serves.
    assert ended < 3.0
    assert res.to_json()["server_gone"] is True  # type: ignore[attr-defined]


STDERR_WITHOUT_FD = '''
import asyncio, sys
class Capture:  # as Textual's print capture inside an app: a stream whose fileno() is -1
    def write(self, s): return len(s)
    def flush(self): pass
    def fileno(self): return -1
from loadgen import ArrivalSpec, LoadRun, WorkloadSpec
sys.stderr = Capture()
run = LoadRun(sys.argv[1], None, WorkloadSpec(input_len=8, output_len=4), ArrivalSpec(num_requests=3))
print("completed", asyncio.run(run.run()).summary["completed"])
'''


def test_worker_spawns_when_stderr_has_no_file_descriptor(url: str) -> None:
    """The TUI's first run: the first spawn starts multiprocessing's resource tracker, which
    was handed stderr's fileno() of -1 ("bad value(s) in fds_to_keep"). A fresh process, so
    the tracker is not already running."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", STDERR_WITHOUT_FD, url], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "completed 3"


def test_a_pinned_client_runs_on_the_cores_it_was_given(url: str) -> None:
    """Trials side by side (issue 19, item 3): LoadRun(cpus=...) pins its worker processes,
    and the result says the cores each worker read back; without cpus, every core as before.
    isolate=False with cpus still runs the worker in a process of its own: this one's
    affinity (its event loop, the caller's) is left as it was."""
    import os

    every = tuple(sorted(os.sched_getaffinity(0)))
    first = every[:1]
    work, arrive = WorkloadSpec(input_len=20, output_len=4), ArrivalSpec(concurrency=2, num_requests=10, workers=1)
    pinned = _run(LoadRun(url, None, work, arrive, cpus=first, isolate=False))
    assert isinstance(pinned, RunResult) and pinned.summary["completed"] == 10
    assert pinned.client_cpus == first and pinned.to_json()["client_cpus"] == list(first)
    assert pinned.extra["client_isolated"] is True
    assert tuple(sorted(os.sched_getaffinity(0))) == every
    two = _run(LoadRun(url, None, work, ArrivalSpec(concurrency=4, num_requests=20, workers=2), cpus=first))
    assert isinstance(two, RunResult) and two.client_cpus == first and two.summary["completed"] == 20
    free = _run(LoadRun(url, None, work, arrive))
    assert isinstance(free, RunResult) and free.client_cpus == every
    inline = _run(LoadRun(url, None, work, arrive, isolate=False))  # in this loop: read back here
    assert isinstance(inline, RunResult) and inline.client_cpus == every
