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
from typing import Any

import httpx

from loadgen import records as R
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

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


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
        verify=ssl_context or ssl.create_default_context(), limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
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
    body: dict[str, Any] = {"model": cfg.model, "stream": True,
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


class _Fail(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return R.TIMEOUT, text
    if isinstance(exc, httpx.ConnectError):
        return R.CONNECT_REFUSED, text
    if isinstance(exc, httpx.RemoteProtocolError):
        # Mid-body this is "peer closed connection without sending complete message body".
        if "without sending a response" in str(exc) or "disconnected" in str(exc).lower():
            return R.CONNECTION_RESET, text
        return R.TRUNCATED_STREAM, text
    if isinstance(exc, httpx.ReadError | httpx.WriteError | ConnectionError):
        return R.CONNECTION_RESET, text
    return R.CLIENT_ERROR, text


async def send(client: httpx.AsyncClient | ClientPool, cfg: ClientConfig, p: PlannedRequest, rid: int,
               sink: Sink, *, worker: int = 0, body: bytes | None = None,
               want_text: bool = False) -> str:
    """Send one request and hand its ``RequestResult`` to ``sink``; returns the generated
    text when ``want_text`` (chat sessions need the reply for the next turn)."""
    if body is None:
        body = build_body(cfg, p)
    if isinstance(client, ClientPool):
        pool = client
        conn = pool.acquire()
        try:
            return await send(conn, cfg, p, rid, sink, worker=worker, body=body,
                              want_text=want_text)
        finally:
            pool.release(conn)
    chat = cfg.endpoint == "chat"
    ttft = 0.0
    itl: list[float] = []
    usage_in = 0
    usage_out = -1
    n_chunks = 0
    done = False
    text_parts: list[str] = []
    t_start = time.time()
    st = time.perf_counter()
    last = st
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            async with client.stream("POST", cfg.url, content=body) as resp:
                if resp.status_code != 200:
                    raw = b""
                    async for piece in resp.aiter_raw():
                        raw += piece
                        if len(raw) > 2000:
                            break
                    excerpt = raw[:300].decode("utf-8", "replace").strip()
                    raise _Fail(R.HTTP_ERROR, f"HTTP {resp.status_code}: {excerpt}")
                buf = b""
                async for piece in resp.aiter_raw():
                    now = time.perf_counter()
                    buf += piece
                    if b"\n" not in piece:
                        continue
                    lines = buf.split(b"\n")
                    buf = lines.pop()
                    for line in lines:
                        line = line.strip()
                        if not line or line[:1] == b":":
                            continue  # blank separator or SSE comment (a ping)
                        if line[:5] != b"data:":
                            raise _Fail(R.MALFORMED_STREAM,
                                        f"not an SSE data line: {line[:120]!r}")
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            continue
                        try:
                            data = json.loads(payload)
                            choices = data.get("choices")
                        except (ValueError, AttributeError):
                            raise _Fail(R.MALFORMED_STREAM,
                                        f"bad JSON in stream: {payload[:120]!r}") from None
                        if choices:
                            # TTFT at the first chunk carrying choices, even with empty
                            # text (dummy weights stream ""), as vLLM's benchmark does.
                            if n_chunks == 0:
                                ttft = now - st
                            else:
                                itl.append(now - last)
                            last = now
                            n_chunks += 1
                            if want_text:
                                c0 = choices[0]
                                t = (c0.get("delta") or {}).get("content") if chat \
                                    else c0.get("text")
                                if t:
                                    text_parts.append(t)
                        usage = data.get("usage")
                        if usage:
                            usage_out = int(usage.get("completion_tokens") or 0)
                            usage_in = int(usage.get("prompt_tokens") or 0)
        if buf.strip() and not done:
            raise _Fail(R.TRUNCATED_STREAM, f"stream ended mid-event: {buf[:120]!r}")
        if n_chunks == 0:
            raise _Fail(R.NO_CHOICES if done else R.TRUNCATED_STREAM,
                        "stream carried no token" + ("" if done else " and no [DONE]"))
        if not done:
            raise _Fail(R.TRUNCATED_STREAM,
                        f"stream ended after {n_chunks} chunks without [DONE]")
        out_tokens = usage_out if usage_out >= 0 else n_chunks
        if cfg.ignore_eos and cfg.check_output_len and out_tokens < p.output_len:
            raise _Fail(R.SHORT_OUTPUT, f"{out_tokens} tokens streamed, {p.output_len} asked")
        sink(RequestResult(
            id=rid, t_start=t_start, ttft_s=ttft, itl_s=tuple(itl), e2el_s=last - st,
            input_tokens=usage_in or p.input_len, output_tokens=out_tokens, ok=True,
            expected_input=p.input_len, expected_output=p.output_len, worker=worker))
        return "".join(text_parts)
    except asyncio.CancelledError:
        sink(RequestResult(
            id=rid, t_start=t_start, ttft_s=ttft, itl_s=tuple(itl),
            e2el_s=time.perf_counter() - st, input_tokens=0, output_tokens=n_chunks,
            ok=False, cancelled=True, expected_input=p.input_len,
            expected_output=p.output_len, worker=worker))
        raise
    except _Fail as f:
        reason, detail = f.reason, f.detail
    except Exception as exc:  # any transport error is a failed request, never a crash
        reason, detail = _classify(exc)
    sink(RequestResult(
        id=rid, t_start=t_start, ttft_s=ttft, itl_s=tuple(itl),
        e2el_s=time.perf_counter() - st, input_tokens=usage_in, output_tokens=n_chunks,
        ok=False, error=reason, error_detail=detail, expected_input=p.input_len,
        expected_output=p.output_len, worker=worker))
    return ""
