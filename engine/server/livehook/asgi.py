"""Inside vLLM's API server: vtui's door, added by vLLM's public ``--middleware`` option.

Two routes, every other path passed through untouched:

- ``GET /vtui/live``: the engines' started and live limits, and their running and waiting
  requests summed over every engine. ``POST /vtui/live`` with a JSON object of flag names and
  values (``{"max-num-seqs": 2}``) changes them on every engine or on none (``_Engines.change``).
- ``POST /vtui/reset-prefix-cache``: empties every engine's prefix cache (vLLM's own
  ``EngineClient.reset_prefix_cache``), so vtui needs none of vLLM's dev routes.

Who may ask (``_refusal``): a request must come straight from this machine (a loopback peer, and
no ``Origin``, ``Forwarded``, ``X-Forwarded-*`` or ``X-Real-IP`` header: uvicorn rewrites the
peer from ``X-Forwarded-For``, and a web page in the user's browser sends ``Origin``), carry the
per-launch key vtui gave the server in its environment (``KEY_ENV``; only the vtui that started
the server and the same OS user can read it) as ``X-Vtui-Key``, and the server's API key where it
has one. A POST must be ``Content-Type: application/json`` (a browser's form or ``text/plain``
POST is refused without a preflight). Answers: 200, 400 bad body, 401 key missing or wrong, 403
not from this machine, 405, 409 refused (nothing changed), 413, 415, 500 the engines disagree
after a failed roll back, 501 the engine has no hook, 503 no engine client yet.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from engine.server.livehook import ENV, HEADER, KEY_ENV, RESET_ROUTE, ROUTE, UTILITY

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_MAX_BODY = 64 * 1024
_PROXIED = ("origin", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip")
_ROUTES = (ROUTE, RESET_ROUTE)


class _Answer(Exception):
    """An HTTP answer other than 200: its status and message."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.extra = status, extra


class LiveLimitsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.lock = asyncio.Lock()  # one change at a time through this API server
        self.hook_missing: str | None = None  # once the engine said it has no hook, asked no more

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") not in _ROUTES or os.environ.get(ENV) != "1":
            await self.app(scope, receive, send)
            return
        try:
            status, body = 200, await self._serve(scope, receive)
        except _Answer as answer:
            status, body = answer.status, {"error": str(answer), **answer.extra}
        payload = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _serve(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        headers = _headers(scope)
        refusal = _refusal(scope, headers)
        if refusal is not None:
            raise refusal
        method = scope.get("method", "GET")
        path = scope.get("path")
        if method not in ("GET", "POST") or (path == RESET_ROUTE and method != "POST"):
            allowed = "POST empties the prefix cache" if path == RESET_ROUTE else "GET reads the limits, POST changes them"
            raise _Answer(405, f"{method} is not served here: {allowed}")
        changes = await _json_body(headers, receive) if method == "POST" else {}
        engine_client: Any = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
        client = getattr(engine_client, "engine_core", None)
        if client is None:
            raise _Answer(503, "the API server has no engine client yet")
        if path == RESET_ROUTE:
            return {"reset": bool(await engine_client.reset_prefix_cache())}
        if self.hook_missing is not None:
            raise _Answer(501, self.hook_missing)
        engines = _Engines(client)
        try:
            if not changes:
                return await engines.read()
            async with self.lock:
                return await engines.change(changes)
        except _Answer as answer:
            if answer.status == 501:
                self.hook_missing = str(answer)
            raise


class _Engines:
    """Every engine behind one API server, reached one by one through the engine client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.ids = list(getattr(client, "core_engines", None) or [None])

    async def _call(self, engine: Any, *args: Any) -> dict[str, Any]:
        try:
            if engine is None:
                answer = await self.client.call_utility_async(UTILITY, *args)
            else:
                answer = await self.client._call_utility_async(UTILITY, *args, engine=engine)
        except Exception as exc:  # vLLM wraps a utility's exception; a missing method is the usual one
            raise _engine_failure(str(exc)) from None
        if not isinstance(answer, dict):
            raise _Answer(501, f"the engine's {UTILITY} answered {type(answer).__name__}, not its limits")
        return answer

    async def _all(self, *args: Any) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*[self._call(e, *args) for e in self.ids]))

    def _reachable(self, states: list[dict[str, Any]]) -> None:
        ranks = max(int(s.get("data_parallel_size", 1) or 1) for s in states)
        if len(self.ids) < ranks:
            raise _Answer(409, f"this API server reaches {len(self.ids)} of the server's {ranks} data-parallel "
                          "engines (an external or hybrid load balancer): a change to some and not others would "
                          "be worse than a restart")

    async def read(self) -> dict[str, Any]:
        states = await self._all({}, False, None)
        self._reachable(states)
        return _summed(states)

    async def change(self, changes: dict[str, Any]) -> dict[str, Any]:
        before = await self._all({}, False, None)
        self._reachable(before)
        _raise_refusal(await self._all(changes, True, None))  # every engine's dry run first
        done: list[tuple[Any, dict[str, Any]]] = []
        for engine, prior in zip(self.ids, before, strict=True):
            try:
                after = await self._call(engine, changes, False, prior["live"])
                _raise_refusal([after])
            except _Answer as failure:
                await self._roll_back(done, failure)
                raise
            done.append((engine, prior))
        return _summed(await self._all({}, False, None))

    async def _roll_back(self, done: list[tuple[Any, dict[str, Any]]], failure: _Answer) -> None:
        """Engines that took the change go back to their prior limits; a 409 says nothing changed."""
        stuck: list[str] = []
        for engine, prior in done:
            try:
                _raise_refusal([await self._call(engine, dict(prior["live"]), False, None)])
            except _Answer as exc:
                stuck.append(str(exc))
        if stuck:
            raise _Answer(500, f"{failure}; and rolling back the engines that took it failed ({'; '.join(stuck)}): "
                          "the engines may now run different limits, restart the server", partial=True)
        if done:
            raise _Answer(409, f"{failure} (the {len(done)} engine(s) that had taken it were rolled back: nothing changed)")


def _summed(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer for every engine: the first's limits, running and waiting summed over all."""
    first = dict(states[0])
    first.pop("data_parallel_size", None)
    first["engines"] = len(states)
    first["running"] = sum(int(s.get("running", 0)) for s in states)
    first["waiting"] = sum(int(s.get("waiting", 0)) for s in states)
    if any(s.get("live") != first.get("live") or s.get("started") != first.get("started") for s in states):
        first["warning"] = "the engines report different limits"
    return first


def _raise_refusal(states: list[dict[str, Any]]) -> None:
    """An engine's answer that refused the change (as data: vLLM's own words) becomes a 409."""
    for state in states:
        if state.get("refused"):
            raise _Answer(409, str(state["refused"]))


def _engine_failure(text: str) -> _Answer:
    # vLLM wraps a utility's exception as "Call to vtui_live method failed: <message>".
    inner = text.split(f"Call to {UTILITY} method failed: ", 1)[-1]
    if "has no attribute" in inner and UTILITY in inner:
        return _Answer(501, "the engine has no live-limits hook: vLLM did not load vtui's plugin in its engine "
                       "(vtui must be installed in vLLM's environment, and VLLM_PLUGINS, if set, must name vtui_live)")
    return _Answer(409, inner)


def _refusal(scope: Scope, headers: dict[str, str]) -> _Answer | None:
    """Why this request (``headers``: its headers, names lower-cased) may not use the door, or None."""
    proxied = [name for name in _PROXIED if name in headers]
    if proxied:
        return _Answer(403, f"requests carrying {proxied[0]} (a proxy or a web page) are refused here")
    if not _from_loopback(scope):
        return _Answer(403, "vtui's routes are served to this machine only (loopback)")
    expected = os.environ.get(KEY_ENV, "")
    given = headers.get(HEADER.lower(), "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        return _Answer(401, f"send the key vtui gave this server at its start as {HEADER} "
                       "(vtui and `vtui set` read it from vtui's own records)")
    keys = _api_keys(scope)
    if keys and not any(hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {k}".encode())
                        for k in keys):
        return _Answer(401, "the server has an API key: send it as 'Authorization: Bearer KEY'")
    return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _from_loopback(scope: Scope) -> bool:
    peer = scope.get("client")
    if peer is None:
        return scope.get("server") is None  # a Unix socket: only this machine reaches it
    try:
        address = ipaddress.ip_address(str(peer[0]))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _api_keys(scope: Scope) -> list[str]:
    keys: list[str] = []
    env = os.environ.get("VLLM_API_KEY")
    if env:
        keys.append(env)
    args = getattr(getattr(scope.get("app"), "state", None), "args", None)
    value = getattr(args, "api_key", None)
    if isinstance(value, str) and value:
        keys.append(value)
    elif isinstance(value, list | tuple):
        keys.extend(str(v) for v in value if v)
    return keys


async def _json_body(headers: dict[str, str], receive: Receive) -> dict[str, Any]:
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise _Answer(415, f"send a JSON body as Content-Type: application/json (not {media or 'none'})")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            raise _Answer(413, f"request body over {_MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    try:
        parsed = json.loads(b"".join(chunks) or b"{}")
    except ValueError as exc:
        raise _Answer(400, f"the body is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise _Answer(400, "the body must be a JSON object of flag names and values")
    return parsed
