"""``Recorder``: an OpenAI-compatible recording proxy, and what a recording says (``summarize``).

A user puts the proxy between their clients and their server for a while. Every request to the
OpenAI API (``RELAYED_PATHS``) and its response pass through unchanged, bytes as they come (SSE
included, error statuses included; a client that goes away closes the upstream connection, so the
server aborts the request as it would without the proxy). Any other path (vLLM's dev routes,
vtui's ``/vtui/live``: --api-key guards neither, and every relayed client reaches the server from
loopback) is answered 404 by the proxy, the server never asked. The generation
requests (``/v1/completions``, ``/v1/chat/completions``) are recorded, one JSON line each, time
zero at the first of them: arrival time, endpoint, prompt tokens and their block hashes, output
tokens asked and made, the sampling parameters that change the work, the conversation when one
can tell, and the outcome.

Kept out of the request's path: the prompt's token ids come from the server's own ``/tokenize``
(chat: with the messages, so the chat template's tokens count) after the response has ended;
output tokens from the response's ``usage``, else by tokenizing the produced text, also after.
Block hashes are chained (a block's hash covers every token before it, so equal prefixes give
equal leading hashes) and salted with a secret drawn per recording and never written, so a
recording does not give away prompts by a dictionary of known texts. No prompt text is written
unless ``keep_prompts``; no header value ever. Each request's line is flushed when written: a
``kill -9`` loses at most the requests in flight.

The file replays with ``vtui bench --dataset-name trace`` (loadgen.traceformats reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import math
import re
import secrets
import string
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from loadgen.stats import percentile
from loadgen.traceformats import TraceFile, read_trace, recording
from loadgen.traceformats.recording import chained_hashes

if TYPE_CHECKING:
    from loadgen.tokens import Codec

RECORDED_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
# What an OpenAI API client asks of vLLM (a trailing "/": every path under it); any other path is refused here.
RELAYED_PATHS = ("/v1/", "/health", "/ping", "/version", "/metrics", "/load", "/tokenize", "/detokenize")
# Under /v1/ but an operator's, not a client's: loading a LoRA adapter from the server's disk or the Hub.
_ADMIN_V1 = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
# A path's characters once decoded (RFC 3986's unreserved, sub-delims, ":" and "@", and "/"): anything else
# (a "%" left after one decoding, a backslash, a space, a control or non-ASCII character) is refused.
_PATH_CHARS = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110's token: a method, a header name
DEFAULT_BLOCK = 16  # vLLM's KV-cache block: reuse is measured in the prefix cache's own unit
_HEAD_LIMIT = 1 << 20


class RecordError(RuntimeError):
    """The proxy cannot start (the port is taken, the upstream URL is bad)."""


@dataclass
class RecorderState:
    """What the live status line shows (read on the recorder's loop)."""

    recorded: int = 0
    in_flight: int = 0
    errors: int = 0
    cancelled: int = 0
    passed: int = 0  # requests on other relayed paths, passed through unrecorded
    refused: int = 0  # requests answered by the proxy (a path not relayed, a head it cannot frame)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        up = time.monotonic() - self.started
        return (f"recorded {self.recorded} requests ({self.errors} errors, {self.cancelled} cancelled), "
                f"{self.in_flight} in flight, {self.passed} others passed through, {self.refused} refused, {up:.0f} s")


def _strip_userinfo(url: str) -> str:
    u = urlsplit(url)
    host = u.hostname or ""
    netloc = host + (f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, "", ""))


def _chunk_size(line: bytes) -> int:
    """A request chunk's size line, strictly (hex digits, then extensions): Python's int() would also
    take "0x10", "+10" and "1_0", which the server's parser refuses or reads otherwise."""
    digits = line.split(b";")[0].strip()
    if not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", digits):
        raise ValueError(f"chunk size {digits[:20]!r}")
    return int(digits, 16)


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return None


def relayed(target: str) -> bool:
    """Whether the proxy relays a request for ``target`` (the request line's): an origin-form target
    whose path, percent-decoded once, is already normal (no empty, "." or ".." segment, nothing left
    to decode) and is in ``RELAYED_PATHS``. The server decodes the path once too before it routes
    (uvicorn's scope["path"]), so /%76tui/live is /vtui/live to it; what is refused here is what could
    name another route there. Absolute-form (``http://host/...``), authority-form and "*" are refused."""
    if not target.startswith("/") or "#" in target:
        return False
    try:
        path = unquote(target.split("?", 1)[0], errors="strict")
    except UnicodeDecodeError:
        return False
    if not set(path) <= _PATH_CHARS:
        return False
    segments = path.split("/")[1:]
    if any(s in (".", "..") for s in segments) or "" in segments[:-1]:
        return False
    if path.startswith("/v1/"):
        return path.rstrip("/") not in _ADMIN_V1
    return path in RELAYED_PATHS


def _head_error(head: bytes) -> str | None:
    """Why a request's head cannot be relayed as it is, else None. The server reads the same bytes
    over the proxy's connection, so the proxy and the server must find the same requests in them: a
    head whose framing two parsers could read differently (both Content-Length and
    Transfer-Encoding, two lengths, a folded or bare-LF line) could hide a second request in a body."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return "not an HTTP/1.x request line"
    if any(b < 0x21 or b > 0x7E for b in parts[1]):
        return "a request target with a control, space or non-ASCII byte"
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or b"\n" in line or b"\r" in line or b"\0" in line:
            return "a header line that is not NAME: VALUE on a line of its own"
        if name.lower() == b"content-length":
            lengths.append(value.strip())
        elif name.lower() == b"transfer-encoding":
            codings.append(value.strip().lower())
    if codings and (lengths or codings != [b"chunked"] or parts[2] == b"HTTP/1.0"):
        return "Transfer-Encoding other than one \"chunked\" in HTTP/1.1, or beside Content-Length"
    if len(lengths) > 1 or (lengths and not lengths[0].isdigit()):
        return "more than one Content-Length, or one that is not a number"
    return None


def _reply(status: int, reason: str, message: str, *, head_only: bool = False, close: bool = False) -> bytes:
    """A JSON error answered by the proxy itself (the shape of the OpenAI API's errors)."""
    body = json.dumps({"error": {"message": message, "type": "vtui_record", "code": status}}).encode()
    head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (status, reason.encode(), len(body), b"connection: close\r\n" if close else b""))
    return head if head_only else head + body


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, wait_s: float = 1.0) -> None:
    """Close after an answer sent before the request's body was read: the body is read and dropped
    first (up to ``wait_s``), as a socket closed with unread bytes resets the connection, and a
    reset can discard the answer before the client reads it."""
    with contextlib.suppress(OSError, RuntimeError):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError, asyncio.LimitOverrunError):
        async with asyncio.timeout(wait_s):
            while await reader.read(1 << 16):
                pass


def _not_relayed(target: str) -> str:
    shown = target if len(target) <= 200 else target[:200] + "..."
    return (f"vtui record relays only the OpenAI API (/v1/...) and {', '.join(RELAYED_PATHS[1:])}: "
            f"{shown} is not relayed")


@dataclass
class _Pending:
    """A generation request on its way: what the recording needs once it has ended."""

    t: float
    endpoint: str
    body: bytes
    auth: bytes | None
    status: int = 0
    outcome: str = "ok"
    stream: bool = False
    payload: bytearray = field(default_factory=bytearray)
    e2el_s: float = 0.0
    ttft_s: float | None = None


class _Chunked:
    """HTTP/1.1 chunked framing followed incrementally: ``feed`` takes the bytes as they arrive and
    returns the content among them; ``done`` once the last chunk and its trailer have passed."""

    __slots__ = ("_buf", "_left", "_state", "done")

    def __init__(self) -> None:
        self._buf = b""  # an unfinished size or trailer line
        self._left = 0  # content bytes (then its CRLF) still to come in the current chunk
        self._state = "size"  # size | data | crlf | trailer
        self.done = False

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        i, n = 0, len(data)
        while i < n and not self.done:
            if self._state == "data":
                take = min(self._left, n - i)
                out += data[i:i + take]
                i += take
                self._left -= take
                if not self._left:
                    self._state, self._left = "crlf", 2
            elif self._state == "crlf":
                take = min(self._left, n - i)
                i += take
                self._left -= take
                if not self._left:
                    self._state = "size"
            else:
                j = data.find(b"\n", i)
                if j < 0:
                    self._buf += data[i:]
                    if len(self._buf) > 4096:
                        raise ValueError("chunk size line too long")
                    break
                line = (self._buf + data[i:j]).rstrip(b"\r")
                self._buf = b""
                i = j + 1
                if self._state == "trailer":
                    self.done = not line
                else:
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    self._state, self._left = ("data", size) if size else ("trailer", 0)
        return bytes(out)


class Recorder:
    """The proxy. ``await start()``, then ``await stop()``; ``state`` for a status line."""

    def __init__(self, upstream: str, out: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 block_size: int = DEFAULT_BLOCK, keep_prompts: bool = False,
                 on_error: Callable[[str], None] | None = None, codec: Codec | None = None) -> None:
        u = urlsplit(upstream)
        if u.scheme != "http" or not u.hostname:
            raise RecordError(f"--upstream {_strip_userinfo(upstream)}: needs an http://HOST:PORT URL "
                              "(https upstreams are not proxied)")
        if block_size < 1:
            raise RecordError(f"--block-size {block_size}: must be at least 1")
        self.upstream = upstream.rstrip("/")
        self._up_host = u.hostname
        self._up_port = u.port or 80
        self.out = Path(out)
        self.host, self.port = host, port
        self.block_size = block_size
        self.keep_prompts = keep_prompts
        self.state = RecorderState()
        self._salt = secrets.token_bytes(16)
        self._t0: float | None = None
        self._server: asyncio.Server | None = None
        self._file: IO[str] | None = None
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._tok: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._on_error = on_error or (lambda _m: None)
        # A tokenizer of the proxy's own: the server is asked nothing (its /tokenize shares the API
        # server's loop with the traffic); a chat request is then its messages' contents, no template.
        self._codec = codec

    # -- life -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the output file (appending to nothing: an existing file is refused) and listen."""
        if self.out.exists() and self.out.stat().st_size > 0:
            raise RecordError(f"--out {self.out}: exists; a recording is never written over (give a new name)")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_HEAD_LIMIT)
        except OSError as exc:
            raise RecordError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        self._file = self.out.open("w", encoding="utf-8")
        self._write(recording.header(
            self.block_size, started=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            upstream=_strip_userinfo(self.upstream),
            tokens_from=("the upstream's /tokenize" if self._codec is None
                         else "the proxy's tokenizer (chat: the messages' contents, no template)"),
            keep_prompts=self.keep_prompts))
        self._worker = asyncio.get_running_loop().create_task(self._tokenize_loop())

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop listening, let requests in flight end (up to ``grace_s``, then cut them: recorded
        as cancelled), write what is left to write and close the file."""
        if self._server is not None:
            self._server.close()
        if self._conns:
            _done, pending = await asyncio.wait(set(self._conns), timeout=grace_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        await self._queue.put(None)
        if self._worker is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._worker, timeout=max(5.0, grace_s))
        if self._tok is not None:
            self._tok[1].close()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, obj: Mapping[str, object]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._file.flush()

    # -- the proxy --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        pending = b""
        try:
            while True:
                try:
                    head = pending + await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                pending = b""
                bad = _head_error(head)
                if bad is not None:  # its body cannot be told from a next request: answer, then close
                    self.state.refused += 1
                    writer.write(_reply(400, "Bad Request", f"vtui record: {bad}", close=True))
                    await _linger(reader, writer)
                    return
                body_raw, body = await self._read_body(reader, head)
                method, target_raw, _ = head.split(b"\r\n", 1)[0].split(b" ")
                target = target_raw.decode("ascii")
                if not relayed(target):  # (the body was read: the connection goes on with the next request)
                    self.state.refused += 1
                    writer.write(_reply(404, "Not Found", _not_relayed(target.split("?", 1)[0]),
                                        head_only=method == b"HEAD"))
                    continue
                path = target.split("?", 1)[0]
                endpoint = RECORDED_PATHS.get(path) if method == b"POST" else None
                rec: _Pending | None = None
                now = time.perf_counter()
                if endpoint is not None:
                    if self._t0 is None:
                        self._t0 = now
                    rec = _Pending(t=now - self._t0, endpoint=endpoint, body=body,
                                   auth=_header(head, b"authorization"))
                    self.state.in_flight += 1
                else:
                    self.state.passed += 1
                if up is None or up[0].at_eof():
                    if up is not None:
                        up[1].close()
                    try:
                        up = await asyncio.open_connection(self._up_host, self._up_port, limit=_HEAD_LIMIT)
                    except OSError as exc:
                        up = None
                        writer.write(_reply(502, "Bad Gateway", f"vtui record: upstream unreachable: {exc}",
                                            head_only=method == b"HEAD"))
                        if rec is not None:
                            rec.status, rec.outcome = 502, "upstream_unreachable"
                            self._finish(rec)
                        continue
                up[1].write(head + body_raw)
                keep, pending, up_ok = await self._relay(up, reader, writer, rec, now, method == b"HEAD")
                if not up_ok:
                    up[1].close()
                    up = None
                if rec is not None:
                    self._finish(rec)
                if not keep:
                    return
        except (asyncio.CancelledError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                ValueError):
            return  # cut at stop, or a request that is not HTTP: the connection ends
        finally:
            if up is not None:
                up[1].close()
            writer.close()
            self._conns.discard(task)

    async def _read_body(self, reader: asyncio.StreamReader, head: bytes) -> tuple[bytes, bytes]:
        """The request body as sent (raw) and as content."""
        te = _header(head, b"transfer-encoding")
        if te is not None and b"chunked" in te.lower():
            raw = bytearray()
            content = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                raw += size_line
                size = _chunk_size(size_line)
                if size == 0:
                    while True:
                        t = await reader.readuntil(b"\r\n")
                        raw += t
                        if t == b"\r\n":
                            return bytes(raw), bytes(content)
                data = await reader.readexactly(size + 2)
                raw += data
                content += data[:-2]
        n = int(_header(head, b"content-length") or b"0")
        body = await reader.readexactly(n) if n else b""
        return body, body

    async def _relay(self, up: tuple[asyncio.StreamReader, asyncio.StreamWriter], creader: asyncio.StreamReader,
                     cwriter: asyncio.StreamWriter, rec: _Pending | None, t_sent: float, head_only: bool
                     ) -> tuple[bool, bytes, bool]:
        """Pass the response through as it comes. Returns (keep the client's connection, bytes the
        client sent meanwhile, keep the upstream connection)."""
        ureader = up[0]
        got_more = b""
        gone = asyncio.Event()

        async def watch() -> None:
            nonlocal got_more
            try:
                got_more = await creader.read(1)
            except ConnectionError:
                got_more = b""
            if not got_more:
                gone.set()
                up[1].transport.abort()  # the client went away: so does the request, as without us

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            keep, up_keep = await self._pass(ureader, cwriter, rec, t_sent, head_only, gone)
        finally:
            if not watcher.done():
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        # Bytes the client sent while this response was under way: its next request (pipelining).
        return keep and not gone.is_set(), got_more, up_keep

    async def _pass(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter, rec: _Pending | None,
                    t_sent: float, head_only: bool, gone: asyncio.Event) -> tuple[bool, bool]:
        """The response, upstream to client; (keep the client's connection, keep the upstream's)."""
        try:
            head = await ureader.readuntil(b"\r\n\r\n")
            cwriter.write(head)
            status = int(head.split(b" ", 2)[1])
            if rec is not None:
                rec.status = status
                rec.outcome = "ok" if status < 400 else "error"
                ctype = _header(head, b"content-type") or b""
                rec.stream = b"text/event-stream" in ctype
            te = _header(head, b"transfer-encoding")
            cl = _header(head, b"content-length")
            close = (_header(head, b"connection") or b"").lower() == b"close"
            payload = rec.payload if rec is not None else None
            first = True
            if head_only or status in (204, 304) or 100 <= status < 200:
                pass
            elif te is not None and b"chunked" in te.lower():
                # Bytes go on to the client as they come (one read, one write, however the chunks fall);
                # the framing is followed beside them, for the end of the response and its content.
                chunks = _Chunked()
                while not chunks.done:
                    data = await ureader.read(1 << 16)
                    if not data:
                        raise asyncio.IncompleteReadError(b"", None)
                    cwriter.write(data)
                    content = chunks.feed(data)
                    if payload is not None and content:
                        if first and rec is not None:
                            rec.ttft_s = time.perf_counter() - t_sent
                            first = False
                        payload += content
                    if cwriter.transport.is_closing():
                        raise ConnectionResetError
            elif cl is not None:
                left = int(cl)
                while left > 0:
                    data = await ureader.read(min(left, 1 << 16))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(data)
                    cwriter.write(data)
                    if payload is not None:
                        payload += data
            else:  # delimited by the upstream closing
                while data := await ureader.read(1 << 16):
                    cwriter.write(data)
                    if payload is not None:
                        payload += data
                close = True
            await cwriter.drain()
            if rec is not None:
                rec.e2el_s = time.perf_counter() - t_sent
            return not close, not close
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError, IndexError):
            if rec is not None:
                rec.e2el_s = time.perf_counter() - t_sent
                rec.outcome = "cancelled" if gone.is_set() or cwriter.transport.is_closing() else "upstream_error"
            return False, False

    def _finish(self, rec: _Pending) -> None:
        self.state.in_flight -= 1
        if rec.outcome == "cancelled":
            self.state.cancelled += 1
        elif rec.outcome != "ok":
            self.state.errors += 1
        self._queue.put_nowait(rec)

    # -- off the path: tokens, hashes, the line ----------------------------------------------

    async def _tokenize(self, body: Mapping[str, object], auth: bytes | None, model: str) -> list[int] | None:
        """``body``'s tokens: by the proxy's own tokenizer when it has one (in a thread: the relay's loop
        goes on), else by the upstream's /tokenize, over one kept-alive connection of its own (httpx cost
        1.1 ms of CPU a request here, as much as relaying the whole response: tests/perf/record_cost.py)."""
        if self._codec is not None:  # (no chat template here: _row then counts a chat's contents)
            prompt = body.get("prompt")
            return await asyncio.to_thread(self._codec.encode, prompt) if isinstance(prompt, str) else None
        data = json.dumps({"model": model, **body}).encode()
        req = (b"POST /tokenize HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
               % (self._up_host.encode(), len(data)))
        if auth:
            req += b"authorization: " + auth + b"\r\n"
        for attempt in (0, 1):
            try:
                if self._tok is None or self._tok[0].at_eof():
                    if self._tok is not None:
                        self._tok[1].close()
                    self._tok = await asyncio.wait_for(
                        asyncio.open_connection(self._up_host, self._up_port, limit=_HEAD_LIMIT), 10.0)
                r, w = self._tok
                w.write(req + b"\r\n" + data)
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 60.0)
                status = int(head.split(b" ", 2)[1])
                n = _header(head, b"content-length")
                if n is None:  # not a plain JSON reply: read to the end and start afresh next time
                    reply = await asyncio.wait_for(r.read(), 60.0)
                    w.close()
                    self._tok = None
                else:
                    reply = await asyncio.wait_for(r.readexactly(int(n)), 60.0)
                if status != 200:
                    return None
                toks = json.loads(reply).get("tokens")
                return [int(t) for t in toks] if isinstance(toks, list) else None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError,
                    IndexError, AttributeError):
                if self._tok is not None:
                    self._tok[1].close()
                    self._tok = None
                if attempt:  # the kept connection may have closed while idle: one fresh try
                    return None
        return None

    async def _tokenize_loop(self) -> None:
        while True:
            rec = await self._queue.get()
            if rec is None:
                return
            try:
                row = await self._row(rec)
            except Exception as exc:  # one odd request must not end the recording
                self._on_error(f"request at {rec.t:.3f} s not recorded: {type(exc).__name__}: {exc}")
                continue
            self._write(row)
            self.state.recorded += 1

    async def _row(self, rec: _Pending) -> dict[str, object]:
        try:
            req = json.loads(rec.body or b"{}")
        except ValueError:
            req = None
        if not isinstance(req, dict):
            req = {}
        model = str(req.get("model", ""))
        messages = req.get("messages") if rec.endpoint == "chat" else None
        ids: list[int] | None = None
        if rec.endpoint == "chat" and isinstance(messages, list):
            ids = await self._tokenize({"messages": messages}, rec.auth, model)
            if not ids:  # a server without chat-template tokenizing, or the proxy's tokenizer: the contents' tokens
                text = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
                ids = await self._tokenize({"prompt": text}, rec.auth, model)
        elif isinstance(req.get("prompt"), str):
            ids = await self._tokenize({"prompt": req["prompt"]}, rec.auth, model)
        elif isinstance(req.get("prompt"), list) and all(isinstance(t, int) for t in req["prompt"]):
            ids = list(req["prompt"])  # a prompt already in token ids
        # A chat answer is resent as text in the conversation's next turn: its re-tokenized length is what
        # that turn's prompt grew by (a model's tokens do not always come back as the same tokens).
        produced, answer = await self._output_tokens(rec, model, answer=isinstance(messages, list))
        return recording.row(req, endpoint=rec.endpoint, t=rec.t, ids=ids, produced=produced, answer=answer,
                             status=rec.status, outcome=rec.outcome, ttft_s=rec.ttft_s, e2el_s=rec.e2el_s,
                             block_size=self.block_size, salt=self._salt, keep_prompts=self.keep_prompts)

    async def _output_tokens(self, rec: _Pending, model: str, *, answer: bool = False) -> tuple[int | None, int | None]:
        """(output tokens: the response's usage.completion_tokens, else its text's tokens; the answer's
        text tokenized again, as a client resending it in the next turn makes the server count it, when
        ``answer`` or no usage came). None for none."""
        texts: list[str] = []
        usage: object = None
        if rec.stream:
            for raw in bytes(rec.payload).split(b"\n"):
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    continue
                try:
                    ev = json.loads(data)
                except ValueError:
                    continue
                if not isinstance(ev, dict):
                    continue
                if isinstance(ev.get("usage"), dict):
                    usage = ev["usage"]
                texts += _choice_texts(ev, "delta")
        elif rec.payload:
            try:
                doc = json.loads(bytes(rec.payload))
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                usage = doc.get("usage")
                texts += _choice_texts(doc, "message")
        produced = (int(usage["completion_tokens"])
                    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int) else None)
        again = None
        if texts and (produced is None or answer):
            ids = await self._tokenize({"prompt": "".join(texts), "add_special_tokens": False}, rec.auth, model)
            again = len(ids) if ids is not None else None
        return (produced if produced is not None else again), again


def _choice_texts(doc: dict[str, Any], part: str) -> list[str]:
    """Each choice's text in an OpenAI response: ``text`` (completions), else ``<part>.content``
    (chat: ``delta`` in a stream's chunk, ``message`` in a whole response)."""
    texts: list[str] = []
    for ch in doc.get("choices") or []:
        if isinstance(ch, dict):
            piece = ch.get("text")
            if piece is None and isinstance(ch.get(part), dict):
                piece = ch[part].get("content")
            if isinstance(piece, str):
                texts.append(piece)
    return texts


# -- what a recording says ---------------------------------------------------------------------


@dataclass(frozen=True)
class PresetShape:
    """A preset's workload as the nearest-preset match reads it."""

    name: str
    input_tokens: float  # a request's prompt tokens (prefix included)
    output_tokens: float
    reuse: float  # share of prompt tokens a prefix cache could serve


@dataclass(frozen=True)
class RecordingSummary:
    """The traffic's shape: rate over time, lengths, prefix reuse, implied concurrency."""

    format: str
    requests: int
    duration_s: float
    rate_buckets: tuple[tuple[float, float], ...]  # (start s, requests/s)
    input_q: dict[str, float]
    output_q: dict[str, float]
    reuse: float | None  # share of prompt tokens in blocks seen before (None: no hashes)
    concurrency: float | None  # mean in flight by Little's law (None: no latencies recorded)
    outcomes: dict[str, int]
    nearest: tuple[str, float] | None = None  # preset, distance
    notes: tuple[str, ...] = ()
    conversations: int = 0  # conversations of more than one turn (traceformats.conversation_chains)
    later_turns: int = 0

    def lines(self, *, brief: bool = False) -> list[str]:
        """The summary, a line each; ``brief``: without the notes and the rate histogram (the TUI's
        Presets tab)."""
        def q(d: dict[str, float]) -> str:
            return ", ".join(f"{k} {v:.0f}" for k, v in d.items())

        out = [f"{self.requests} requests over {self.duration_s:.1f} s ({self.format} trace; "
               + ", ".join(f"{v} {k}" for k, v in sorted(self.outcomes.items())) + ")"]
        if not brief:
            out += [f"  note: {n}" for n in self.notes]
        peak = max((r for _, r in self.rate_buckets), default=0.0)
        mean = self.requests / self.duration_s if self.duration_s > 0 else float("inf")
        out.append(f"arrival rate: mean {mean:.2f} req/s, peak {peak:.2f} req/s a bucket")
        width = self.rate_buckets[1][0] - self.rate_buckets[0][0] if len(self.rate_buckets) > 1 else 0.0
        for t, r in () if brief else self.rate_buckets:
            bar = "#" * (round(30 * r / peak) if peak else 0)
            out.append(f"  {t:9.2f} s +{width:.2f}  {r:8.2f} req/s  {bar}")
        if self.later_turns:
            out.append(f"conversations: {self.conversations}, with {self.later_turns} later turns that carry the "
                       "turns before (replayed with the server's answers)")
        out.append(f"input tokens:  {q(self.input_q)}")
        out.append(f"output tokens: {q(self.output_q)}")
        out.append("prefix reuse: " + (f"{100 * self.reuse:.1f}% of prompt tokens are in blocks seen before"
                                       if self.reuse is not None else "unknown (no block hashes)"))
        out.append("implied concurrency: " + (f"{self.concurrency:.1f} requests in flight on average "
                                              "(sum of latencies / duration)"
                                              if self.concurrency is not None else "unknown (no latencies)"))
        if self.nearest is not None:
            out.append(f"nearest shipped preset: {self.nearest[0]} (distance {self.nearest[1]:.2f}: "
                       "log ratios of mean input and output tokens, plus twice the reuse gap)")
        return out


def _quantiles(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"mean": sum(v) / len(v) if v else 0.0, "p50": percentile(v, 50), "p90": percentile(v, 90),
            "p99": percentile(v, 99), "max": v[-1] if v else 0.0}


def reuse_share(tf: TraceFile) -> float | None:
    """The share of prompt tokens in blocks whose hash id was seen before (chained ids: the whole
    prefix up to it was sent before), in arrival order. None when the trace has no hashes."""
    if not tf.block_size or not any(r.hash_ids for r in tf.rows):
        return None
    seen: set[int | str] = set()
    total = reused = 0
    bs = tf.block_size
    for r in sorted(tf.rows, key=lambda r: r.at_s):
        left = r.input_len
        for h in r.hash_ids:
            n = min(bs, left)
            if n <= 0:
                break
            if h in seen:
                reused += n
            seen.add(h)
            left -= n
        total += r.input_len
    return reused / total if total else 0.0


def summarize(path: str | Path, presets: Sequence[PresetShape] = (), buckets: int = 12) -> RecordingSummary:
    """What a recording (or any trace loadgen.traceformats reads) says about its traffic."""
    tf = read_trace(path)
    rows = sorted(tf.rows, key=lambda r: r.at_s)
    dur = rows[-1].at_s - rows[0].at_s if rows else 0.0
    width = dur / buckets if dur > 0 else 1.0
    counts = [0] * (buckets if dur > 0 else 1)
    for r in rows:
        counts[min(len(counts) - 1, int((r.at_s - rows[0].at_s) / width))] += 1
    rate = tuple((k * width, c / width) for k, c in enumerate(counts))
    ins = [float(r.input_len) for r in rows]
    outs = [float(r.output_len) for r in rows]
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    reuse = reuse_share(tf)
    lat = _latencies(Path(path)) if tf.format == "vtui-recording" else []
    conc = sum(lat) / dur if lat and dur > 0 else None
    nearest = None
    if presets and rows:
        mi, mo = max(1.0, sum(ins) / len(ins)), max(1.0, sum(outs) / len(outs))
        ru = reuse or 0.0

        def dist(p: PresetShape) -> float:
            return (abs(math.log(mi / max(1.0, p.input_tokens))) + abs(math.log(mo / max(1.0, p.output_tokens)))
                    + 2 * abs(ru - p.reuse))

        best = min(presets, key=dist)
        nearest = (best.name, dist(best))
    return RecordingSummary(tf.format, len(rows), dur, rate, _quantiles(ins), _quantiles(outs), reuse, conc,
                            outcomes, nearest, tf.notes, *tf.conversations())


def _latencies(path: Path) -> list[float]:
    out: list[float] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            v = obj.get("e2el_s") if isinstance(obj, dict) else None
            if isinstance(v, int | float) and not isinstance(v, bool):
                out.append(float(v))
    return out


__all__ = ["DEFAULT_BLOCK", "RELAYED_PATHS", "PresetShape", "RecordError", "Recorder", "RecorderState",
           "RecordingSummary", "chained_hashes", "relayed", "reuse_share", "summarize"]
