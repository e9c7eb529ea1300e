"""A minimal HTTP/1.1 streaming client on asyncio protocols, for the hot path only.

Why not httpx here: on one core httpx streamed ~300 requests/s (16 tokens each) where
``vllm bench serve``'s aiohttp client did ~1,170 (tests/perf/client_cost.py; httpcore's
pool scan, anyio and h11 cost tens of microseconds per chunk). This client does only
what a completion stream needs -- one POST with a JSON body, a status line, headers,
a chunked / content-length / close-delimited body, keep-alive -- and stamps every read
with time.perf_counter in ``data_received``, the earliest moment Python sees the bytes.
httpx remains for everything else (probing, /tokenize) and as ``transport="httpx"``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit


class HTTPFailure(Exception):
    """Transport-level failure with one of loadgen.records' reasons."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux


def last_data_age_ms(sock: socket.socket | None) -> int:
    """How long ago (ms, the kernel's jiffies: 1-10 ms steps) the newest data reached this TCP
    socket (``tcp_info.tcpi_last_data_recv``); -1 where the kernel does not say."""
    if sock is None or _TCP_INFO is None:
        return -1
    try:
        return int(struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 56), 52)[0])
    except (OSError, AttributeError, struct.error, ValueError):
        return -1


class _Conn(asyncio.Protocol):
    """One TCP connection; received data queues up with its arrival time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.chunks: list[tuple[float, bytes]] = []
        # While a response's first token is awaited: each read's stamp and how long its newest
        # bytes had waited in the socket (last_data_age_ms): see loadgen.client.first_read_delay.
        self.ages: list[tuple[float, int]] | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.error: BaseException | None = None
        self.requests = 0  # requests sent on this connection (>1: it was kept alive)
        self.bytes_in = 0  # bytes received since the last request was written

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP connection's transport: an asyncio.Transport, or uvloop's, which behaves as
        # one without subclassing it (so a cast, not an isinstance check).
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.sock = sock
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        self.chunks.append((t, data))
        self.bytes_in += len(data)
        ages = self.ages
        if ages is not None and len(ages) < 16:  # one syscall (~2 us) a read, first token only
            ages.append((t, last_data_age_ms(self.sock)))
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def usable(self) -> bool:
        return (self.transport is not None and not self.eof
                and not self.transport.is_closing())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class FastPool:
    """Keep-alive connections to one origin, one per request in flight."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        u = urlsplit(base_url)
        self.host = u.hostname or "127.0.0.1"
        self.tls = u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.host_header = u.netloc
        self.prefix = u.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._ssl = (ssl_context or ssl.create_default_context()) if self.tls else None
        self._free: list[_Conn] = []
        self._all: set[_Conn] = set()

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(
                    _Conn, self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self.tls else None)
        except TimeoutError:
            raise HTTPFailure("timeout", f"connect to {self.host}:{self.port} timed out after "
                              f"{self.connect_timeout_s:g} s") from None
        except ConnectionRefusedError as exc:
            raise HTTPFailure("connection_refused",
                              f"{self.host}:{self.port}: {exc.strerror or exc}") from None
        except OSError as exc:
            raise HTTPFailure("connection_refused",
                              f"{self.host}:{self.port}: {exc.strerror or exc}") from None
        self._all.add(proto)
        return proto

    async def warm(self, n: int) -> None:
        """Open ``n`` connections ahead of the measured part."""
        conns = await asyncio.gather(*(self._connect() for _ in range(n)),
                                     return_exceptions=True)
        self._free.extend(c for c in conns if isinstance(c, _Conn))

    async def fresh(self) -> _Conn:
        """A new connection, never a kept-alive one."""
        return await self._connect()

    async def acquire(self) -> _Conn:
        while self._free:
            c = self._free.pop()
            if c.usable and not c.chunks:
                return c
            self._drop(c)
        return await self._connect()

    def release(self, c: _Conn, reusable: bool) -> None:
        if reusable and c.usable and not c.chunks:
            self._free.append(c)
        else:
            self._drop(c)

    def _drop(self, c: _Conn) -> None:
        c.close()
        self._all.discard(c)

    def close(self) -> None:
        for c in list(self._all):
            c.close()
        self._all.clear()
        self._free.clear()

    def request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        head = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}",
                "Content-Type: application/json", "Accept: text/event-stream",
                f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


async def _wait(c: _Conn, timeout: float) -> None:
    """Until data, EOF or timeout (HTTPFailure 'timeout')."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    c.waiter = fut
    handle = loop.call_later(timeout, _expire, fut)
    try:
        await fut
    finally:
        handle.cancel()
        c.waiter = None


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(HTTPFailure("timeout", "no data from the server for the read timeout"))


class Response:
    """Status, headers and a body iterator of (perf_counter at arrival, bytes)."""

    def __init__(self, conn: _Conn, read_timeout_s: float) -> None:
        self._c = conn
        self._timeout = read_timeout_s
        self._buf = b""
        self._t = 0.0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False  # the whole body was read (connection reusable)

    async def _more(self) -> bool:
        """Append the next received data to the buffer; False at EOF."""
        c = self._c
        if not c.chunks:
            if c.eof:
                return False
            await _wait(c, self._timeout)
            if not c.chunks:
                return False
        # One network read at a time, so each keeps its own arrival stamp.
        self._t, data = c.chunks.pop(0)
        self._buf += data
        return True

    def _lost(self, what: str) -> HTTPFailure:
        err = self._c.error
        if isinstance(err, ConnectionResetError):
            return HTTPFailure("connection_reset", f"connection reset {what}")
        if what == "before the response":
            return HTTPFailure("connection_reset", "server closed the connection before "
                               "answering")
        return HTTPFailure("truncated_stream", f"server closed the connection {what}")

    async def read_head(self) -> None:
        while True:
            i = self._buf.find(b"\r\n\r\n")
            if i >= 0:
                break
            if not await self._more():
                raise self._lost("before the response")
        head = self._buf[:i].decode("latin-1").split("\r\n")
        self._buf = self._buf[i + 4:]
        parts = head[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise HTTPFailure("malformed_stream", f"not an HTTP status line: {head[0][:80]!r}")
        self.status = int(parts[1])
        for line in head[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()

    async def body(self) -> AsyncIterator[tuple[float, bytes]]:
        """Body bytes as they arrive, de-chunked, each with its arrival stamp."""
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            async for item in self._chunked():
                yield item
            return
        length = self.headers.get("content-length")
        if length is not None:
            left = int(length)
            while left > 0:
                if not self._buf and not await self._more():
                    raise self._lost(f"with {left} body bytes missing")
                piece, self._buf = self._buf[:left], self._buf[left:]
                left -= len(piece)
                yield self._t, piece
            self.complete = True
            return
        while True:  # close-delimited
            if self._buf:
                piece, self._buf = self._buf, b""
                yield self._t, piece
            if not await self._more():
                return

    async def _chunked(self) -> AsyncIterator[tuple[float, bytes]]:
        while True:
            while True:
                i = self._buf.find(b"\r\n")
                if i >= 0:
                    break
                if not await self._more():
                    raise self._lost("mid-stream")
            size_s = self._buf[:i].split(b";", 1)[0].strip()
            try:
                size = int(size_s, 16)
            except ValueError:
                raise HTTPFailure("malformed_stream",
                                  f"bad chunk size {size_s[:40]!r}") from None
            if size == 0:
                # Trailer section ends with an empty line.
                while self._buf.find(b"\r\n\r\n", i) < 0 and self._buf[i:i + 4] != b"\r\n\r\n":
                    if not await self._more():
                        break
                self._buf = b""
                self.complete = True
                return
            need = i + 2 + size + 2
            while len(self._buf) < need:
                if not await self._more():
                    raise self._lost("mid-stream")
            data = self._buf[i + 2: i + 2 + size]
            self._buf = self._buf[need:]
            yield self._t, data

    async def read_excerpt(self, limit: int = 2000) -> bytes:
        out = b""
        try:
            async for _, piece in self.body():
                out += piece
                if len(out) >= limit:
                    break
        except HTTPFailure:
            pass
        return out
