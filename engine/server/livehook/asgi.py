"""Inside vLLM's API server: ``/vtui/live``, added by vLLM's public ``--middleware`` option.

``GET /vtui/live`` returns the engines' started and live limits; ``POST /vtui/live`` with a JSON
object of flag names and values (``{"max-num-seqs": 2}``) changes them on every engine, or on
none: each engine checks the change first (a dry run), then each applies it. Only a loopback
peer is served (a server bound to 0.0.0.0 included), and only with the server's API key where it
has one (vLLM's ``--api-key`` guards its own API paths, not this one, so it is checked here). Every
other path passes through untouched.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from engine.server.livehook import ENV, ROUTE, UTILITY

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_MAX_BODY = 64 * 1024


class LiveLimitsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != ROUTE or os.environ.get(ENV) != "1":
            await self.app(scope, receive, send)
            return
        status, body = await self._serve(scope, receive)
        payload = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _serve(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, Any]]:
        if not _from_loopback(scope):
            return 403, {"error": "live limits are served to this machine only (loopback)"}
        if not _key_ok(scope):
            return 401, {"error": "the server has an API key: send it as 'Authorization: Bearer KEY'"}
        method = scope.get("method", "GET")
        changes: dict[str, Any] = {}
        if method == "POST":
            raw = await _read_body(receive)
            if raw is None:
                return 413, {"error": f"request body over {_MAX_BODY} bytes"}
            try:
                parsed = json.loads(raw or b"{}")
            except ValueError as exc:
                return 400, {"error": f"the body is not JSON: {exc}"}
            if not isinstance(parsed, dict):
                return 400, {"error": "the body must be a JSON object of flag names and values"}
            changes = parsed
        elif method != "GET":
            return 405, {"error": f"{method} is not served here: GET reads the limits, POST changes them"}
        app = scope.get("app")
        client = getattr(getattr(getattr(app, "state", None), "engine_client", None), "engine_core", None)
        if client is None:
            return 503, {"error": "the API server has no engine client yet"}
        try:
            return 200, await _call_engines(client, changes)
        except _Refused as exc:
            return 409, {"error": str(exc)}
        except Exception as exc:  # the engine's refusal, or a vLLM without the utility method
            return 409, {"error": _engine_message(str(exc))}


class _Refused(Exception):
    pass


async def _call_engines(client: Any, changes: dict[str, Any]) -> dict[str, Any]:
    engines = list(getattr(client, "core_engines", None) or [])
    if len(engines) <= 1:
        state = await client.call_utility_async(UTILITY, changes, False)
        _raise_refusal([state])
        return {"engines": 1, **state}
    call = getattr(client, "_call_utility_async", None)
    if call is None or "engine" not in inspect.signature(call).parameters:
        raise _Refused(f"this vLLM runs {len(engines)} engines and offers no way to reach each one: "
                       "a change to some and not others would be worse than a restart")
    if changes:
        _raise_refusal(await asyncio.gather(*[call(UTILITY, changes, True, engine=e) for e in engines]))
    states = await asyncio.gather(*[call(UTILITY, changes, False, engine=e) for e in engines])
    _raise_refusal(states)
    first = dict(states[0])
    first["engines"] = len(engines)
    if any(s.get("live") != first.get("live") for s in states):
        first["warning"] = "the engines report different live limits"
    return first


def _raise_refusal(states: list[Any]) -> None:
    """An engine's answer that refused the change (as data: vLLM's own words) becomes a 409."""
    for state in states:
        if isinstance(state, dict) and state.get("refused"):
            raise _Refused(str(state["refused"]))


def _engine_message(text: str) -> str:
    # vLLM wraps a utility's exception as "Call to vtui_live method failed: <message>".
    marker = f"Call to {UTILITY} method failed: "
    if marker in text:
        return text.split(marker, 1)[1]
    if "has no attribute" in text and UTILITY in text:
        return ("the engine has no live-limits hook: vLLM did not load vtui's plugin (vtui must be installed in "
                "vLLM's environment, and VLLM_PLUGINS, if set, must name vtui_live)")
    return text


def _from_loopback(scope: Scope) -> bool:
    peer = scope.get("client")
    if peer is None:
        return scope.get("server") is None  # a Unix socket: only this machine reaches it
    host = str(peer[0])
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _server_keys(scope: Scope) -> list[str]:
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


def _key_ok(scope: Scope) -> bool:
    keys = _server_keys(scope)
    if not keys:
        return True
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    given = headers.get("authorization", "")
    return any(hmac.compare_digest(given.encode(), f"Bearer {key}".encode()) for key in keys)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
