"""One streamed request, timed with ``vllm bench serve``'s definitions.

httpx streaming against ``/v1/completions`` or ``/v1/chat/completions``; the SSE body is
parsed from raw bytes (no text decoding of the whole stream). Timing uses
time.perf_counter; the start is also stamped in time.time() epoch seconds so results
line up with telemetry. Every failure becomes a ``RequestResult`` with a reason; only
cancellation propagates (after its record is handed to the sink).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

import loadgen.records as R
from loadgen.fasthttp import FastPool, HTTPFailure, Response, _Conn, last_data_age_ms
from loadgen.records import PlannedRequest, RequestResult

Sink = Callable[[RequestResult], None]


@dataclass(frozen=True)
class ClientConfig:
    """Where and how to send. Picklable: worker processes receive it."""

    base_url: str
    model: str
    endpoint: str = "completions"  # or "chat"
    api_key: str | None = None
    ignore_eos: bool = True
    connect_timeout_s: float = 10.0
    # Longest silence inside a response: a prefill under overload can take minutes.
    read_timeout_s: float = 600.0
    # Whole-request limit (None = none): catches a server that trickles bytes forever.
    request_timeout_s: float | None = None
    check_output_len: bool = True
    # "fast": loadgen.fasthttp (default, ~4x cheaper per chunk); "httpx": httpx streaming.
    transport: str = "fast"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def make_client(cfg: ClientConfig, pool_size: int, ssl_context: ssl.SSLContext | None = None
                ) -> httpx.AsyncClient:
    """An AsyncClient whose pool holds ``pool_size`` connections (the concurrency), so
    no request waits for a connection inside the client."""
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size,
                          keepalive_expiry=60.0)
    timeout = httpx.Timeout(connect=cfg.connect_timeout_s, read=cfg.read_timeout_s,
                            write=cfg.connect_timeout_s, pool=None)
    # TCP_NODELAY: httpcore writes headers and body separately; Nagle would hold the body.
    transport = httpx.AsyncHTTPTransport(
        verify=ssl_context or ssl.create_default_context(), limits=limits,
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.AsyncClient(headers=headers, timeout=timeout, transport=transport,
                             trust_env=False)


class ClientPool:
    """One single-connection AsyncClient per request in flight, reused from a free list.

    httpcore's shared pool scans every connection (is_idle, has_expired, a getpeername
    and a poll each) whenever a request starts or ends: O(connections) per request, which
    at concurrency 64 cost more CPU than the streaming itself (tests/perf/client_cost.py).
    Single-connection pools make that O(1); together they are a pool sized to the
    concurrency."""

    def __init__(self, cfg: ClientConfig) -> None:
        self.cfg = cfg
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        # One context for all: loading the CA store takes ~20 ms, per client otherwise.
        self._ssl = ssl.create_default_context()

    def prewarm(self, n: int) -> None:
        """Create ``n`` clients before the measured part starts."""
        while len(self._all) < n:
            self._free.append(self._new())

    def _new(self) -> httpx.AsyncClient:
        c = make_client(self.cfg, 1, self._ssl)
        self._all.append(c)
        return c

    def acquire(self) -> httpx.AsyncClient:
        if self._free:
            return self._free.pop()
        return self._new()

    def release(self, c: httpx.AsyncClient) -> None:
        self._free.append(c)

    async def aclose(self) -> None:
        for c in self._all:
            with contextlib.suppress(Exception):
                await c.aclose()
        self._all.clear()
        self._free.clear()

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def build_body(cfg: ClientConfig, p: PlannedRequest,
               messages: list[dict[str, str]] | None = None) -> bytes:
    """The JSON body vLLM's benchmark would send for this request."""
    body: dict[str, object] = {"model": cfg.model, "stream": True,
                               "stream_options": {"include_usage": True}}
    if cfg.endpoint == "chat":
        body["messages"] = messages if messages is not None else [
            {"role": role, "content": text} for role, text in p.messages
        ] or [{"role": "user", "content": p.prompt}]
        body["max_completion_tokens"] = p.output_len
    else:
        body["prompt"] = p.prompt
        body["max_tokens"] = p.output_len
        body["repetition_penalty"] = 1.0
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    return json.dumps(body).encode()


_Fail = HTTPFailure


class _SSE:
    """Incremental parse of a completion stream, with vLLM bench's timing rules."""

    __slots__ = (
        "buf",
        "chat",
        "done",
        "first_at",
        "first_k",
        "itl",
        "last",
        "n",
        "new_conn",
        "read_delay",
        "sent",
        "st",
        "texts",
        "ttft",
        "usage_in",
        "usage_out",
    )

    def __init__(self, st: float, chat: bool, want_text: bool) -> None:
        self.st = st
        self.last = st
        self.sent = st  # when the request's bytes were handed to the socket
        self.new_conn = False  # sent on a connection opened for it (not kept alive)
        self.ttft = 0.0
        self.itl: list[float] = []
        self.n = 0
        self.done = False
        self.usage_in = 0
        self.usage_out = -1
        self.buf = b""
        self.texts: list[str] | None = [] if want_text else None
        self.chat = chat
        self.first_at = 0.0  # the stamp of the read that carried the first token
        self.first_k = 0  # tokens (events with choices) that read carried
        self.read_delay = -1.0  # first_read_delay's, -1 unknown

    def feed(self, now: float, piece: bytes) -> None:
        self.buf += piece
        if b"\n" not in piece:
            return
        lines = self.buf.split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            line = line.strip()
            if not line or line[:1] == b":":
                continue  # blank separator or SSE comment (a ping)
            if line[:5] != b"data:":
                raise _Fail(R.MALFORMED_STREAM, f"not an SSE data line: {line[:120]!r}")
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                data = json.loads(payload)
                choices = data.get("choices")
            except (ValueError, AttributeError):
                raise _Fail(R.MALFORMED_STREAM,
                            f"bad JSON in stream: {payload[:120]!r}") from None
            if choices:
                # TTFT at the first chunk carrying choices, even with empty text (a
                # dummy-weights model streams ""), as vLLM's benchmark does.
                if self.n == 0:
                    self.ttft = now - self.st
                    self.first_at, self.first_k = now, 1
                else:
                    self.itl.append(now - self.last)
                    if now == self.first_at:
                        self.first_k += 1
                self.last = now
                self.n += 1
                if self.texts is not None:
                    c0 = choices[0]
                    t = (c0.get("delta") or {}).get("content") if self.chat else c0.get("text")
                    if t:
                        self.texts.append(t)
            usage = data.get("usage")
            if usage:
                self.usage_out = int(usage.get("completion_tokens") or 0)
                self.usage_in = int(usage.get("prompt_tokens") or 0)

    def finish(self, p: PlannedRequest, cfg: ClientConfig) -> int:
        """Check the stream ended properly; returns output tokens."""
        if self.buf.strip() and not self.done:
            raise _Fail(R.TRUNCATED_STREAM, f"stream ended mid-event: {self.buf[:120]!r}")
        if self.n == 0:
            raise _Fail(R.NO_CHOICES if self.done else R.TRUNCATED_STREAM,
                        "stream carried no token" + ("" if self.done else " and no [DONE]"))
        if not self.done:
            raise _Fail(R.TRUNCATED_STREAM, f"stream ended after {self.n} chunks without [DONE]")
        out = self.usage_out if self.usage_out >= 0 else self.n
        if cfg.ignore_eos and cfg.check_output_len and out < p.output_len:
            raise _Fail(R.SHORT_OUTPUT, f"{out} tokens streamed, {p.output_len} asked")
        return out


def _classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return R.TIMEOUT, text
    if isinstance(exc, httpx.ConnectError | ConnectionRefusedError):
        return R.CONNECT_REFUSED, text
    if isinstance(exc, httpx.RemoteProtocolError):
        # Mid-body this is "peer closed connection without sending complete message body".
        if "without sending a response" in str(exc) or "disconnected" in str(exc).lower():
            return R.CONNECTION_RESET, text
        return R.TRUNCATED_STREAM, text
    if isinstance(exc, httpx.ReadError | httpx.WriteError | ConnectionError):
        return R.CONNECTION_RESET, text
    return R.CLIENT_ERROR, text


Client = httpx.AsyncClient | ClientPool | FastPool
Pool = FastPool | ClientPool  # what open_client gives a worker


def open_client(cfg: ClientConfig) -> Pool:
    """The per-worker client for ``cfg.transport``."""
    if cfg.transport == "httpx":
        return ClientPool(cfg)
    return FastPool(cfg.base_url, connect_timeout_s=cfg.connect_timeout_s,
                    read_timeout_s=cfg.read_timeout_s)


async def _send_head(pool: FastPool, conn: _Conn, cfg: ClientConfig, body: bytes, sse: _SSE) -> Response:
    """Write the request on ``conn`` and read the response's head."""
    conn.requests += 1
    conn.bytes_in = 0
    conn.ages = []
    sse.new_conn = conn.requests == 1
    assert conn.transport is not None  # set on connect, before the pool hands it out
    conn.transport.write(pool.request_bytes(cfg.path, body, cfg.headers()))
    sse.sent = time.perf_counter()
    resp = Response(conn, cfg.read_timeout_s)
    await resp.read_head()
    return resp


async def _stream_fast(pool: FastPool, cfg: ClientConfig, body: bytes, sse: _SSE) -> None:
    conn = await pool.acquire()
    reusable = False
    try:
        try:
            resp = await _send_head(pool, conn, cfg, body, sse)
        except HTTPFailure as exc:
            if exc.reason != R.CONNECTION_RESET or conn.requests == 1 or conn.bytes_in:
                raise
            # A kept-alive connection the server had already closed (its idle timeout met
            # our reuse): the request never reached it. That is the client's race, not a
            # server failure: send once more on a new connection, timed from there.
            pool.release(conn, False)
            conn = await pool.fresh()
            sse.st = sse.last = time.perf_counter()
            resp = await _send_head(pool, conn, cfg, body, sse)
        if resp.status != 200:
            raw = await resp.read_excerpt()
            reusable = resp.complete
            excerpt = raw[:300].decode("utf-8", "replace").strip()
            raise _Fail(R.HTTP_ERROR, f"HTTP {resp.status}: {excerpt}")
        age = -1
        async for now, piece in resp.body():
            sse.feed(now, piece)
            if conn.ages is not None and sse.n:
                age = next((a for t, a in conn.ages if t == sse.first_at), -1)
                conn.ages = None
        if age >= 0:  # the stream's last bytes reached the socket this long ago
            sse.read_delay = first_read_delay(age, last_data_age_ms(conn.sock), time.perf_counter(), sse)
        reusable = resp.complete and resp.headers.get("connection", "").lower() != "close"
    finally:
        conn.ages = None
        pool.release(conn, reusable)


_pace = [0.0]  # the server's last measured gap per token (first_read_delay: a stream read at once)


def first_read_delay(age_ms: int, end_age_ms: int, now: float, sse: _SSE) -> float:
    """How long the first token waited in the socket before this client read it (s; -1 unknown):
    the client's own share of its TTFT, whatever held it (a busy box, its own work).

    The kernel says how long ago the newest bytes of the read that carried it had arrived
    (``age_ms``, loadgen.fasthttp.last_data_age_ms, asked as that read came in). Where that read
    also carried later tokens (the loop was held up while they queued: ``first_k`` > 1), the first
    came before them, at the server's pace: the kernel's arrival times of that read's newest bytes
    and of the stream's last (``end_age_ms`` before ``now``, perf_counter), over the tokens between,
    which no stall of this client can stretch. A stream that came whole in one read takes the last
    pace measured (unknown before one was). Never more than the TTFT itself; ~0 for a client that
    reads tokens as they come."""
    if age_ms < 0 or sse.n == 0:
        return -1.0
    rest = sse.n - sse.first_k
    if rest > 0 and end_age_ms >= 0:
        first, end = sse.first_at - age_ms / 1000, now - end_age_ms / 1000
        _pace[0] = max(0.0, end - first) / rest
    elif sse.first_k > 1 and _pace[0] <= 0:
        return -1.0  # no stream of this process has shown the server's pace yet: cannot say
    return min(sse.ttft, age_ms / 1000 + (sse.first_k - 1) * _pace[0])


async def _stream_httpx(client: httpx.AsyncClient, cfg: ClientConfig, body: bytes,
                        sse: _SSE) -> None:
    async with client.stream("POST", cfg.url, content=body) as resp:
        if resp.status_code != 200:
            raw = b""
            async for piece in resp.aiter_raw():
                raw += piece
                if len(raw) > 2000:
                    break
            excerpt = raw[:300].decode("utf-8", "replace").strip()
            raise _Fail(R.HTTP_ERROR, f"HTTP {resp.status_code}: {excerpt}")
        async for piece in resp.aiter_raw():
            sse.feed(time.perf_counter(), piece)


async def send(client: Client, cfg: ClientConfig, p: PlannedRequest, rid: int,
               sink: Sink, *, worker: int = 0, body: bytes | None = None,
               want_text: bool = False) -> str:
    """Send one request and hand its ``RequestResult`` to ``sink``; returns the generated
    text when ``want_text`` (chat sessions need the reply for the next turn)."""
    if body is None:
        body = build_body(cfg, p)
    conn: httpx.AsyncClient | None = None
    if isinstance(client, ClientPool):
        conn = client.acquire()
    t_start = time.time()
    st = time.perf_counter()
    sse = _SSE(st, cfg.endpoint == "chat", want_text)
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            if isinstance(client, FastPool):
                await _stream_fast(client, cfg, body, sse)
            else:
                await _stream_httpx(conn or client, cfg, body, sse)  # type: ignore[arg-type]
        out_tokens = sse.finish(p, cfg)
        # A request sent again on a new connection (a kept-alive one was found closed) is
        # timed from the second send: sse.st moved, and the start moves with it.
        t_start += sse.st - st
        sink(RequestResult(
            id=rid, t_start=t_start, ttft_s=sse.ttft, itl_s=tuple(sse.itl),
            e2el_s=sse.last - sse.st, input_tokens=sse.usage_in or p.input_len,
            output_tokens=out_tokens, ok=True, expected_input=p.input_len,
            expected_output=p.output_len, worker=worker, new_conn=sse.new_conn,
            send_s=sse.sent - sse.st, read_delay_s=sse.read_delay))
        return "".join(sse.texts) if sse.texts is not None else ""
    except asyncio.CancelledError:
        sink(RequestResult(
            id=rid, t_start=t_start, ttft_s=sse.ttft, itl_s=tuple(sse.itl),
            e2el_s=time.perf_counter() - st, input_tokens=0, output_tokens=sse.n,
            ok=False, cancelled=True, expected_input=p.input_len,
            expected_output=p.output_len, worker=worker))
        raise
    except HTTPFailure as f:
        reason, detail = f.reason, f.detail
    except Exception as exc:  # any transport error is a failed request, never a crash
        reason, detail = _classify(exc)
    finally:
        if conn is not None and isinstance(client, ClientPool):
            client.release(conn)
    sink(RequestResult(
        id=rid, t_start=t_start, ttft_s=sse.ttft, itl_s=tuple(sse.itl),
        e2el_s=time.perf_counter() - st, input_tokens=sse.usage_in, output_tokens=sse.n,
        ok=False, error=reason, error_detail=detail, expected_input=p.input_len,
        expected_output=p.output_len, worker=worker))
    return ""
