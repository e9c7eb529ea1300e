"""Issue 32, item 2: the client measures how long each first token waited in the socket before it
read it (RequestResult.read_delay_s), and a run's client_delay_ms is the mean of those: the
client's own share of its mean TTFT, measured instead of estimated from its loop's stalls."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator

import pytest

from loadgen import ArrivalSpec, LoadRun, WorkloadSpec
from loadgen.client import _SSE, ClientConfig, first_read_delay, open_client, send
from loadgen.fasthttp import FastPool, last_data_age_ms
from loadgen.records import PlannedRequest, RequestResult
from loadgen.testserver import ServerConfig, serve_in_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tcp_info is Linux's")


@linux
def test_the_kernel_says_how_long_data_waited_in_a_socket() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    with srv, socket.create_connection(srv.getsockname()) as c:
        s, _ = srv.accept()
        with s:
            s.sendall(b"x")
            time.sleep(0.08)
            age = last_data_age_ms(c)
    assert 60 <= age <= 200  # jiffies: 1-10 ms steps; a busy box may add to the sleep
    assert last_data_age_ms(None) == -1


def _sse(ttft: float, first_at: float, first_k: int, n: int) -> _SSE:
    sse = _SSE(0.0, False, False)
    sse.ttft, sse.first_at, sse.first_k, sse.n = ttft, first_at, first_k, n
    return sse


def test_tokens_read_with_the_first_count_at_the_servers_pace() -> None:
    # The first read at t=0.31 s carried 6 tokens, its newest 10 ms old; the stream's last bytes
    # came 100 ms after that read's newest (2 more tokens: 50 ms a token, the server's pace).
    sse = _sse(ttft=0.31, first_at=0.31, first_k=6, n=8)
    assert first_read_delay(10, 0, 0.40, sse) == pytest.approx(0.010 + 5 * 0.050)
    # a stream that came whole in one read takes the last pace measured; never past the TTFT
    assert first_read_delay(5, 0, 1.0, _sse(0.5, 0.5, 8, 8)) == pytest.approx(0.005 + 7 * 0.050)
    assert first_read_delay(5, 0, 1.0, _sse(0.1, 0.1, 8, 8)) == pytest.approx(0.1)
    # a token read as it came: its own age only; unknown stays unknown
    assert first_read_delay(0, 0, 2.0, _sse(0.05, 0.05, 1, 8)) == 0.0
    assert first_read_delay(-1, 0, 2.0, _sse(0.05, 0.05, 1, 8)) == -1.0


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    # first token after 50 ms, then one every 50 ms: 8 tokens in 400 ms
    with serve_in_thread(ServerConfig(first_delay_s=0.05, gap_s=0.05)) as u:
        yield u


@linux
def test_a_held_loop_reads_the_first_token_late_and_says_by_how_much(url: str) -> None:
    cfg = ClientConfig(url, "test-model")
    p = PlannedRequest(0, input_len=4, output_len=8, prompt="abcd")

    async def one(hold_s: float) -> RequestResult:
        pool = open_client(cfg)
        assert isinstance(pool, FastPool)
        out: list[RequestResult] = []

        async def holder() -> None:
            await asyncio.sleep(0.01)  # the request is out
            time.sleep(hold_s)  # the loop held: tokens queue in the socket meanwhile

        try:
            await asyncio.gather(send(pool, cfg, p, 0, out.append), holder())
        finally:
            pool.close()
        return out[0]

    async def main() -> tuple[RequestResult, RequestResult]:
        return await one(0.0), await one(0.3)

    quiet, held = asyncio.run(main())
    assert quiet.ok and held.ok
    assert 0 <= quiet.read_delay_s < 0.02
    # the first token came at ~50 ms and was read at ~310 ms: it waited ~260 ms of its TTFT
    assert held.ttft_s > 0.28
    assert held.read_delay_s == pytest.approx(held.ttft_s - 0.05, abs=0.03)


@linux
def test_a_run_says_the_mean_first_token_wait_as_its_client_delay(url: str) -> None:
    run = LoadRun(url, None, WorkloadSpec(input_len=8, output_len=3), ArrivalSpec(concurrency=2, num_requests=10, workers=1))
    res = asyncio.run(run.run())
    extra = res.extra
    assert extra["client_delay_source"] == "first-token reads"
    assert res.client_delay_ms == extra["client_delay_ms"] == extra["client_read_delay_ms"]
    assert 0 <= res.client_delay_ms < 20 and not res.box_bound
    assert isinstance(extra["client_stall_delay_ms"], float)  # the older estimate, kept beside it


def test_no_pace_seen_yet_means_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    import loadgen.client

    monkeypatch.setattr(loadgen.client, "_pace", [0.0])
    assert first_read_delay(5, 0, 1.0, _sse(0.5, 0.5, 8, 8)) == -1.0  # whole stream in one read
    assert first_read_delay(5, 0, 1.0, _sse(0.5, 0.5, 1, 1)) == 0.005  # one token: its own age says it


def _result(k: int, read_delay_s: float) -> RequestResult:
    return RequestResult(id=k, t_start=1000.0 + k, ttft_s=0.05, itl_s=(0.01,), e2el_s=0.06, input_tokens=4,
                         output_tokens=2, ok=True, read_delay_s=read_delay_s)


@pytest.mark.parametrize(("known", "source"), [(10, "first-token reads"), (9, "first-token reads"),
                                               (8, "loop stalls")])
def test_the_measured_mean_stands_where_nearly_every_request_has_one(known: int, source: str) -> None:
    from loadgen.run import _State
    from loadgen.worker import Batch

    state = _State(LoadRun("http://127.0.0.1:1", None, WorkloadSpec(), ArrivalSpec(num_requests=10)), 1, None, None)
    state.start(999.0)
    results = tuple(_result(k, 0.03 if k < known else -1.0) for k in range(10))
    state.on_batch(Batch(0, results, 0, 10, 0.0, 0.1, stall_s2=0.0))
    res = state.result("m", 0, 1020.0)
    assert res.extra["client_delay_source"] == source
    assert res.extra["client_read_delay_ms"] == pytest.approx(30.0) and res.extra["client_read_delay_n"] == known
    assert res.client_delay_ms == (pytest.approx(30.0) if known >= 9 else 0.0)
    assert res.box_bound is (known >= 9)
