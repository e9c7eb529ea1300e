"""`vtui record` relays the OpenAI API and nothing else (issue 48): users run it on 0.0.0.0, and
every client it relays reaches the server from loopback, where vtui's /vtui/live trusts the peer
and vLLM's dev routes have no --api-key. The real Recorder, in front of an upstream that writes
down every request it is sent (and, for the streaming relay, loadgen's test server): the paths it
must relay reach the upstream, every other path, however spelled, is answered 404 by the proxy
and never reaches it, and a head whose framing the two could read differently is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from loadgen.record import Recorder, relayed
from loadgen.testserver import ServerConfig, serve_in_thread

RELAYED = [
    ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health"),
    ("GET", "/metrics"), ("GET", "/ping"), ("GET", "/version"), ("GET", "/load"), ("POST", "/tokenize"),
    ("POST", "/detokenize"), ("POST", "/v1/embeddings"), ("GET", "/v1/models?limit=1"),
    ("GET", "/v1/responses/resp_1"),
]
REFUSED = [
    ("POST", "/vtui/live"), ("GET", "/vtui/live"), ("POST", "/collective_rpc"), ("POST", "/sleep"),
    ("POST", "/wake_up"), ("POST", "/reset_prefix_cache"), ("POST", "/pause"), ("POST", "/update_weights"),
    ("GET", "/server_info"), ("POST", "/v1/load_lora_adapter"), ("GET", "/"), ("GET", "/docs"),
    # the same routes, spelled to look like a relayed one or to decode into a refused one
    ("POST", "/v1/../vtui/live"), ("POST", "/v1/%2e%2e/vtui/live"), ("POST", "/%76tui/live"),
    ("POST", "/%2576tui/live"), ("POST", "//vtui/live"), ("POST", "/health/../vtui/live"),
    ("POST", "/v1/./completions"), ("POST", "/v1\\..\\vtui\\live"), ("POST", "/vtui/live?/v1/models"),
    ("POST", "/v1%2F..%2Fvtui/live"), ("POST", "/v1/%ff"),
    # absolute-form and asterisk-form targets, even naming a relayed path
    ("POST", "http://127.0.0.1:8000/vtui/live"), ("GET", "http://127.0.0.1:8000/v1/models"), ("OPTIONS", "*"),
]


@dataclass
class Upstream:
    """An upstream that answers every request 200 with its target, and writes the target down."""

    seen: list[str] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ")[1].decode()
                if b"transfer-encoding: chunked" in head.lower():
                    await reader.readuntil(b"0\r\n\r\n")
                else:
                    n = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                              if h.lower().startswith(b"content-length")), 0)
                    await reader.readexactly(n)
                self.seen.append(target)
                body = json.dumps({"upstream": target}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[tuple[Recorder, Upstream]]:
    up = Upstream()
    server = await asyncio.start_server(up.serve, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    rec = Recorder(f"http://127.0.0.1:{up.port}", tmp_path / "paths.jsonl")
    await rec.start()
    try:
        yield rec, up
    finally:
        await rec.stop(grace_s=1.0)
        server.close()


async def _exchange(port: int, raw: bytes, n: int = 1, *, eof: bool = False) -> list[tuple[int, bytes, bytes]]:
    """Send ``raw`` on one connection (then end it, with ``eof``); read ``n`` responses (status, head,
    body), fewer if it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    if eof:
        writer.write_eof()
    out: list[tuple[int, bytes, bytes]] = []
    try:
        for _ in range(n):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            out.append((int(head.split(b" ")[1]), head, await reader.readexactly(length)))
    except asyncio.IncompleteReadError:
        pass
    writer.close()
    return out


def _request(method: str, target: str, body: bytes = b"{}") -> bytes:
    return (f"{method} {target} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def test_the_api_is_relayed_and_every_other_path_refused_unseen(proxy: tuple[Recorder, Upstream]) -> None:
    rec, up = proxy
    for method, target in RELAYED:
        [(status, _, body)] = await _exchange(rec.port, _request(method, target))
        assert status == 200 and json.loads(body) == {"upstream": target}, target
    assert up.seen == [t for _, t in RELAYED]
    for method, target in REFUSED:
        [(status, head, body)] = await _exchange(rec.port, _request(method, target))
        msg = json.loads(body)["error"]["message"]
        assert status == 404 and b"application/json" in head, target
        assert msg.startswith("vtui record relays only the OpenAI API (/v1/...) and /health"), msg
        assert msg.endswith(f"{target.split('?')[0]} is not relayed"), msg
    assert up.seen == [t for _, t in RELAYED]  # the upstream was never asked
    assert rec.state.refused == len(REFUSED) and rec.state.passed == len(RELAYED) - 2
    assert f"{len(REFUSED)} refused" in rec.state.line()


async def test_a_refusal_keeps_the_connection_for_the_next_request(proxy: tuple[Recorder, Upstream]) -> None:
    rec, up = proxy
    raw = _request("POST", "/vtui/live", b'{"max_num_seqs": 1}') + _request("GET", "/v1/models")
    (s1, _, _), (s2, _, b2) = await _exchange(rec.port, raw, n=2)
    assert (s1, s2) == (404, 200) and json.loads(b2) == {"upstream": "/v1/models"}
    assert up.seen == ["/v1/models"]
    # HEAD: the refusal's head alone, so the next response on the connection is read as one
    raw = b"HEAD /vtui/live HTTP/1.1\r\nhost: x\r\n\r\n" + _request("GET", "/health")
    reader, writer = await asyncio.open_connection("127.0.0.1", rec.port)
    writer.write(raw)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 404")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
    writer.close()


SMUGGLED = _request("POST", "/vtui/live")
FRAMING = {
    "both lengths": (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\ntransfer-encoding: chunked"
                     b"\r\n\r\n0\r\n\r\n%s" % (5 + len(SMUGGLED), SMUGGLED)),
    "two content-lengths": (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: %d"
                            b"\r\n\r\n{}%s" % (2 + len(SMUGGLED), SMUGGLED)),
    "a coding besides chunked": (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity"
                                 b"\r\n\r\n0\r\n\r\n"),
    "a folded header": b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n transfer-encoding: chunked\r\n\r\n",
    "a bare LF": b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-a: 1\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    "a space before the colon": b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding : chunked\r\n\r\n",
    "chunked in HTTP/1.0": b"POST /v1/completions HTTP/1.0\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    "two targets": b"GET /v1/models /vtui/live HTTP/1.1\r\nhost: x\r\n\r\n",
    "not HTTP/1.x": b"GET /v1/models HTTP/2.0\r\nhost: x\r\n\r\n",
}


@pytest.mark.parametrize("case", list(FRAMING))
async def test_a_head_two_parsers_could_read_apart_is_refused(proxy: tuple[Recorder, Upstream], case: str) -> None:
    rec, up = proxy
    got = await _exchange(rec.port, FRAMING[case], n=2, eof=True)
    assert [s for s, _, _ in got] == [400] and b"connection: close" in got[0][1]  # and the connection ends
    assert json.loads(got[0][2])["error"]["message"].startswith("vtui record: ")
    assert up.seen == [] and rec.state.refused == 1


async def test_a_chunk_size_python_would_take_is_not(proxy: tuple[Recorder, Upstream]) -> None:
    rec, up = proxy
    raw = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n"
    assert await _exchange(rec.port, raw) == []  # closed unanswered
    ok = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2;x=y\r\n{}\r\n0\r\n\r\n"
    [(status, _, _)] = await _exchange(rec.port, ok)
    assert status == 200 and up.seen == ["/v1/completions"]


@pytest.mark.parametrize(("target", "want"), [*((t, True) for _, t in RELAYED), *((t, False) for _, t in REFUSED),
                                              ("/v1/unload_lora_adapter/", False), ("/v1/caf%C3%A9", False),
                                              ("/v1/models%2Fx", True), ("", False), ("/v1", False)])
def test_relayed_reads_the_path_as_the_server_routes_it(target: str, want: bool) -> None:
    assert relayed(target) is want


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(ServerConfig(first_delay_s=0.002, max_model_len=2048)) as u:
        yield u


async def test_the_streaming_relay_is_intact_in_front_of_the_test_server(server: str, tmp_path: Path) -> None:
    rec = Recorder(server, tmp_path / "s.jsonl")
    await rec.start()
    try:
        async with httpx.AsyncClient(base_url=rec.url, trust_env=False) as c:
            r = await c.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 4, "stream": True})
            assert r.status_code == 200 and r.text.count('"text":"a"') == 4 and r.text.endswith("data: [DONE]\n\n")
            assert (await c.get("/v1/models")).status_code == 200 and (await c.get("/health")).status_code == 200
            assert (await c.post("/tokenize", json={"prompt": "abc"})).json()["count"] == 3
            r = await c.post("/vtui/live", json={"max_num_seqs": 1})
            assert r.status_code == 404 and "/vtui/live is not relayed" in r.json()["error"]["message"]
    finally:
        await rec.stop(grace_s=1.0)
    assert rec.state.recorded == 1 and rec.state.passed == 3 and rec.state.refused == 1
    assert "1 refused" in rec.state.line()
