"""A streaming server with no model, for measuring the client and for failure tests.

Answers ``/v1/completions`` and ``/v1/chat/completions`` with vLLM-shaped SSE (chunked
transfer encoding, one token per event, a usage event, ``data: [DONE]``) after a
configurable first-chunk delay and inter-chunk gap; ``/v1/models``; and a byte-level
``/tokenize``/``/detokenize`` (one token per UTF-8 byte) so prompt building can be
tested against it. It is written on raw asyncio protocols so it costs little CPU and
can run in several ``SO_REUSEPORT`` processes: it must never be the bottleneck of a
client measurement.

It also misbehaves on purpose. ``mode`` (server-wide, or per request with a model name
``mode=<mode>``): ``ok``; ``status=<code>`` (an error status with a JSON body);
``malformed`` (a non-JSON data line); ``cut`` (closes the connection mid-stream);
``hang`` (headers, then silence); ``short`` (fewer tokens than asked); ``nodone``
(clean end without ``[DONE]``); ``reset`` (closes before answering).

With ``live_limits`` it answers ``/vtui/live`` as a server vtui started does (engine.server.livehook:
GET the started and live limits and how many requests run, POST ``{flag: value}`` to change them,
never above the started value): the limits are only kept and reported, nothing here obeys them.

Run standalone: ``python -m loadgen.testserver --port 8001 --processes 2 --first-delay-ms
100 --gap-ms 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadgen.aio import run_fast

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import SynchronizedArray


@dataclass(frozen=True)
class ServerConfig:
    first_delay_s: float = 0.0
    gap_s: float = 0.0
    mode: str = "ok"
    model: str = "test-model"
    max_model_len: int = 4096
    api_key: str | None = None  # when set, requests without "Bearer <key>" get 401
    # (flag, started value) of the live limits served at /vtui/live; None: no such route (404)
    live_limits: tuple[tuple[str, int | bool], ...] | None = None


LIVE_ROUTE = "/vtui/live"  # engine.server.livehook.ROUTE (loadgen imports nothing of the engine)


class _LiveLimits:
    """The limits one server process reports at /vtui/live, and the requests it is streaming."""

    def __init__(self, started: tuple[tuple[str, int | bool], ...]) -> None:
        self.started: dict[str, int | bool] = dict(started)
        self.live: dict[str, int | bool] = dict(started)
        self.running = 0

    def answer(self, method: str, changes: object) -> tuple[int, dict[str, object]]:
        if method == "POST":
            if not isinstance(changes, dict):
                return 400, {"error": "send {flag: value}"}
            for name, value in changes.items():
                if name not in self.live:
                    return 409, {"error": f"--{name} cannot change live"}
                started = self.started[name]
                if not isinstance(started, bool) and (not isinstance(value, int) or value > started or value < 1):
                    return 409, {"error": f"--{name} {value!r}: a whole number from 1 to the started {started}"}
            self.live.update(changes)
        return 200, {"vllm": "testserver", "admission": "none (reported only)", "started": self.started,
                     "live": self.live, "engines": 1, "running": self.running, "waiting": 0}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD_SSE = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
             b"transfer-encoding: chunked\r\n\r\n")


def _json_response(status: int, obj: object) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, reason, len(body))) + body


class _Proto(asyncio.Protocol):
    def __init__(self, cfg: ServerConfig, stats: SynchronizedArray[float] | None = None,
                 live: _LiveLimits | None = None) -> None:
        self.cfg = cfg
        self.live = live  # the server's, shared by its connections
        self.stats = stats  # shared [count, sum_s, max_s] of real first-chunk delays
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Small SSE writes must leave at once: Nagle would hold a token behind an ACK.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        for t in self.tasks:
            t.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1").split("\r\n")
        length = 0
        auth = ""
        for h in head[1:]:
            k, _, v = h.partition(":")
            key = k.strip().lower()
            if key == "content-length":
                length = int(v.strip())
            elif key == "authorization":
                auth = v.strip()
        if len(self.buf) < head_end + 4 + length:
            return
        body = self.buf[head_end + 4: head_end + 4 + length]
        self.buf = self.buf[head_end + 4 + length:]
        method, path, _ = head[0].split(" ", 2)
        self.busy = True
        task = asyncio.get_running_loop().create_task(self._handle(method, path, body, auth))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _done(self) -> None:
        self.busy = False
        self._next()

    async def _handle(self, method: str, path: str, body: bytes, auth: str = "") -> None:
        tr = self.transport
        assert tr is not None
        cfg = self.cfg
        # As vLLM: /health answers without the key, everything else needs it.
        if cfg.api_key and auth != f"Bearer {cfg.api_key}" and path != "/health":
            tr.write(_json_response(401, {"error": "Unauthorized"}))
            self._done()
            return
        if method == "GET" and path == "/v1/models":
            tr.write(_json_response(200, {"object": "list", "data": [
                {"id": cfg.model, "object": "model", "max_model_len": cfg.max_model_len}]}))
            self._done()
            return
        if method == "GET" and path == "/health":
            tr.write(_json_response(200, {}))
            self._done()
            return
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            tr.write(_json_response(400, {"error": "bad json"}))
            self._done()
            return
        if path == "/tokenize":
            text = req.get("prompt", "")
            toks = list(text.encode())
            tr.write(_json_response(200, {"count": len(toks), "tokens": toks,
                                          "max_model_len": cfg.max_model_len}))
            self._done()
            return
        if path == LIVE_ROUTE and self.live is not None:
            tr.write(_json_response(*self.live.answer(method, req)))
            self._done()
            return
        if path == "/detokenize":
            text = bytes(t for t in req.get("tokens", []) if 0 <= t < 256)
            tr.write(_json_response(200, {"prompt": text.decode("utf-8", "ignore")}))
            self._done()
            return
        chat = path == "/v1/chat/completions"
        if path not in ("/v1/completions", "/v1/chat/completions"):
            tr.write(_json_response(404, {"error": f"no route {path}"}))
            self._done()
            return
        mode = cfg.mode
        model = str(req.get("model", ""))
        if model.startswith("mode="):
            mode = model[5:]
        if self.live is None:
            await self._stream(tr, req, chat, mode)
            return
        self.live.running += 1
        try:
            await self._stream(tr, req, chat, mode)
        finally:
            self.live.running -= 1

    async def _stream(self, tr: asyncio.Transport, req: dict[str, Any], chat: bool,
                      mode: str) -> None:
        # req: the request's JSON body as parsed, read key by key (a parsing edge).
        cfg = self.cfg
        if mode == "reset":
            tr.abort()
            return
        if mode.startswith("status="):
            code = int(mode[7:])
            tr.write(_json_response(code, {"object": "error", "message":
                                           f"test server says {code}", "code": code}))
            self._done()
            return
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        if chat:
            prompt_len = sum(len(str(m.get("content", "")).encode())
                             for m in req.get("messages", []))
        else:
            prompt_len = len(str(req.get("prompt", "")).encode())
        t_arrived = time.perf_counter()
        tr.write(_HEAD_SSE)
        if mode == "hang":
            await asyncio.sleep(3600)
            return
        if cfg.first_delay_s:
            # Event-loop timers fire up to ~1 ms late; sleep short, then yield until the
            # deadline, so the first chunk leaves at the asked delay (client TTFT tests).
            deadline = t_arrived + cfg.first_delay_s
            await asyncio.sleep(max(0.0, cfg.first_delay_s - 0.002))
            while time.perf_counter() < deadline:
                await asyncio.sleep(0)
        emit = n - 1 if mode == "short" else n
        for i in range(emit):
            if i and cfg.gap_s:
                await asyncio.sleep(cfg.gap_s)
            if mode == "cut" and i == min(2, emit - 1):
                tr.write(_chunk(b'data: {"choices":[{"index":0,"te'))
                tr.abort()
                return
            if mode == "malformed" and i == 1:
                tr.write(_chunk(b"data: {this is not json}\n\n"))
                continue
            if chat:
                choice = b'{"index":0,"delta":{"content":"a"},"finish_reason":null}'
                obj = b"chat.completion.chunk"
            else:
                choice = b'{"index":0,"text":"a","logprobs":null,"finish_reason":null}'
                obj = b"text_completion"
            tr.write(_chunk(b'data: {"id":"cmpl-t","object":"%s","created":0,"model":"m",'
                            b'"choices":[%s],"usage":null}\n\n' % (obj, choice)))
            if i == 0 and self.stats is not None:
                d = time.perf_counter() - t_arrived
                with self.stats.get_lock():
                    self.stats[0] += 1
                    self.stats[1] += d
                    self.stats[2] = max(self.stats[2], d)
        usage = {"prompt_tokens": prompt_len, "completion_tokens": emit,
                 "total_tokens": prompt_len + emit}
        tr.write(_chunk(b'data: {"id":"cmpl-t","choices":[],"usage":%s}\n\n'
                        % json.dumps(usage).encode()))
        if mode != "nodone":
            tr.write(_chunk(b"data: [DONE]\n\n"))
        tr.write(b"0\r\n\r\n")
        self._done()


async def serve(cfg: ServerConfig, sock: socket.socket, stats: SynchronizedArray[float] | None = None) -> None:
    """Serve forever on an already bound socket. Cancelled (serve_in_thread's exit), it drops
    every open connection, as a server process that dies does: its clients' streams end at
    once instead of waiting out their read timeout on a socket nobody serves."""
    loop = asyncio.get_running_loop()
    conns: weakref.WeakSet[_Proto] = weakref.WeakSet()
    live = _LiveLimits(cfg.live_limits) if cfg.live_limits is not None else None

    def accept() -> _Proto:
        proto = _Proto(cfg, stats, live)
        conns.add(proto)
        return proto

    server = await loop.create_server(accept, sock=sock, backlog=4096)
    try:
        async with server:
            await server.serve_forever()
    finally:
        handlers = [t for proto in conns for t in proto.tasks]
        for proto in list(conns):
            if proto.transport is not None and not proto.transport.is_closing():
                proto.transport.abort()
        for t in handlers:
            t.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


def _proc_main(cfg: ServerConfig, host: str, port: int, cpu: int | None,
               stats: SynchronizedArray[float] | None = None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    with contextlib.suppress(KeyboardInterrupt):
        run_fast(serve(cfg, _bind(host, port), stats))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serve_in_thread(cfg: ServerConfig | None = None) -> Iterator[str]:
    """A server on 127.0.0.1 in a background thread (its own event loop); yields the URL."""
    cfg = cfg or ServerConfig()
    sock = _bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    task_box: list[asyncio.Task[None]] = []

    def main() -> None:
        asyncio.set_event_loop(loop)
        task_box.append(loop.create_task(serve(cfg, sock)))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task_box[0])

    th = threading.Thread(target=main, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        while not task_box:
            pass
        loop.call_soon_threadsafe(task_box[0].cancel)
        th.join(5)
        sock.close()


class ServerHandle:
    """Processes serving one URL, with their shared first-chunk delay statistics."""

    def __init__(self, url: str, stats: SynchronizedArray[float]) -> None:
        self.url = url
        self._stats = stats

    def first_chunk_delays(self) -> tuple[int, float, float]:
        """(count, mean s, max s) of real delays from request read to first chunk written."""
        with self._stats.get_lock():
            n, total, mx = self._stats[0], self._stats[1], self._stats[2]
        return int(n), (total / n if n else 0.0), mx

    def reset(self) -> None:
        with self._stats.get_lock():
            for i in range(3):
                self._stats[i] = 0.0


@contextlib.contextmanager
def serve_in_processes(cfg: ServerConfig, processes: int = 1, cpus: list[int] | None = None,
                       port: int | None = None) -> Iterator[ServerHandle]:
    """``processes`` server processes sharing one port (SO_REUSEPORT), optionally pinned."""
    port = port or free_port()
    ctx = multiprocessing.get_context("spawn")
    stats = ctx.Array("d", 3)
    procs = []
    for i in range(processes):
        cpu = cpus[i % len(cpus)] if cpus else None
        p = ctx.Process(target=_proc_main, args=(cfg, "127.0.0.1", port, cpu, stats),
                        daemon=True)
        p.start()
        procs.append(p)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(200):
        try:
            httpx.get(url + "/health", timeout=1.0, trust_env=False)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield ServerHandle(url, stats)
    finally:
        for p in procs:
            p.terminate()  # our own children, by handle
        for p in procs:
            p.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--first-delay-ms", type=float, default=0.0)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--model", default="test-model")
    a = ap.parse_args()
    cfg = ServerConfig(a.first_delay_ms / 1000, a.gap_ms / 1000, a.mode, a.model)
    if a.processes == 1:
        _proc_main(cfg, a.host, a.port, None)
        return
    with serve_in_processes(cfg, a.processes, port=a.port):
        threading.Event().wait()


if __name__ == "__main__":
    main()
