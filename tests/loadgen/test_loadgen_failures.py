"""Each failure kind, produced by a real local server that misbehaves on purpose
(loadgen.testserver), through both transports. A failure never stops the run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from loadgen import records as R
from loadgen.client import ClientConfig, open_client, send
from loadgen.records import PlannedRequest, RequestResult
from loadgen.testserver import ServerConfig, free_port, serve_in_thread


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(gap_s=0.001)) as u:
        yield u


def _send(base_url: str, model: str, transport: str, *, read_timeout: float = 5.0,
          output_len: int = 5) -> RequestResult:
    cfg = ClientConfig(base_url, model, transport=transport, read_timeout_s=read_timeout,
                       connect_timeout_s=2.0)
    out: list[RequestResult] = []

    async def go() -> None:
        client = open_client(cfg)
        try:
            await send(client, cfg, PlannedRequest(0, 3, output_len, prompt="abc"), 7, out.append)
        finally:
            if hasattr(client, "aclose"):
                await client.aclose()
            else:
                client.close()

    asyncio.run(go())
    assert len(out) == 1
    return out[0]


TRANSPORTS = ["fast", "httpx"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ok_request_timings_and_usage(url: str, transport: str) -> None:
    r = _send(url, "m", transport)
    assert r.ok and r.error is None
    assert r.output_tokens == 5 and r.input_tokens == 3 == r.expected_input
    assert len(r.itl_s) == 4  # a gap per chunk after the first
    assert r.e2el_s == pytest.approx(r.ttft_s + sum(r.itl_s))
    assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 4)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("mode", "reason", "detail"),
    [
        ("status=503", R.HTTP_ERROR, "HTTP 503: {\"object\": \"error\", \"message\": \"test server says 503\""),
        ("status=400", R.HTTP_ERROR, "HTTP 400"),
        ("malformed", R.MALFORMED_STREAM, "bad JSON in stream"),
        ("cut", R.TRUNCATED_STREAM, ""),
        ("nodone", R.TRUNCATED_STREAM, "without [DONE]"),
        ("short", R.SHORT_OUTPUT, "4 tokens streamed, 5 asked"),
        ("reset", R.CONNECTION_RESET, ""),
    ],
)
def test_failure_kinds(url: str, transport: str, mode: str, reason: str, detail: str) -> None:
    r = _send(url, f"mode={mode}", transport)
    assert not r.ok and not r.cancelled
    assert r.error == reason, r.error_detail
    assert detail in r.error_detail


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_never_ending_body_times_out(url: str, transport: str) -> None:
    r = _send(url, "mode=hang", transport, read_timeout=0.3)
    assert r.error == R.TIMEOUT


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connection_refused(transport: str) -> None:
    r = _send(f"http://127.0.0.1:{free_port()}", "m", transport)
    assert r.error == R.CONNECT_REFUSED


def test_failures_do_not_stop_a_run() -> None:
    """A run through the misbehaving server: every request fails with its reason and the
    run still reaches its count."""
    from loadgen import ArrivalSpec, LoadRun, WorkloadSpec

    with serve_in_thread(ServerConfig(mode="status=500")) as u:
        run = LoadRun(u, None, WorkloadSpec(input_len=8, output_len=4),
                      ArrivalSpec(concurrency=4, num_requests=12, workers=1))
        res = asyncio.run(run.run())
    assert res.summary["completed"] == 0 and res.summary["failed"] == 12
    assert res.failures_by_reason == {R.HTTP_ERROR: 12}
    assert "HTTP 500" in res.failure_examples[R.HTTP_ERROR]
    assert res.failed_run


def test_a_kept_alive_connection_closed_by_the_server_is_not_a_server_failure() -> None:
    """The server's idle timeout can close a kept-alive connection just as the client reuses
    it: the request never reached the server. The fast client sends it once more on a new
    connection instead of counting a connection_reset against the server. A real server on
    127.0.0.1 answers the first request of each connection and drops the connection, unanswered,
    on the second."""
    import json
    import socket
    import threading

    body = b"".join(
        b"data: " + json.dumps({"choices": [{"text": "x"}]}).encode() + b"\n\n" for _ in range(3)
    ) + b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}).encode() \
        + b"\n\ndata: [DONE]\n\n"
    response = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    connections: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(1)
            with conn:
                conn.recv(65536)
                conn.sendall(response)
                conn.recv(65536)  # the second request on this connection: dropped unanswered

    threading.Thread(target=serve, daemon=True).start()
    cfg = ClientConfig(f"http://127.0.0.1:{listener.getsockname()[1]}", "m", read_timeout_s=5.0)
    out: list[RequestResult] = []

    async def go() -> None:
        client = open_client(cfg)
        try:
            for k in range(3):
                await send(client, cfg, PlannedRequest(k, 3, 3, prompt="abc"), k, out.append)
        finally:
            client.close()

    try:
        asyncio.run(go())
    finally:
        listener.close()
    assert [r.error for r in out] == [None, None, None]
    assert len(connections) >= 2  # reused, found closed, sent again on a new one
    # Each was in the end sent on a connection opened for it, and is timed from that send.
    assert [r.new_conn for r in out] == [True, True, True]
    assert all(0 <= r.send_s <= r.ttft_s <= r.e2el_s for r in out)
