"""vtui's side of live limits: which flag edits a running server can take without a
restart, asking it, and the reason when it cannot.

The server side is ``engine.server.livehook`` (loaded into vLLM). Every request carries the
server's per-launch key, read from this user's registry of the servers vtui started
(``engine.server.registry.find_by_url``), and its API key where it has one. A server vtui did
not start has no ``/vtui/live``: every change there is a restart, and ``LiveUnavailable`` says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine.flags import FlagSet
from engine.server.livehook import BY_NAME, HEADER, LIVE, LIVE_FLAGS, RESET_ROUTE, ROUTE
from engine.server.registry import find_by_url

__all__ = [
    "LIVE_FLAGS",
    "LiveRefused",
    "LiveResult",
    "LiveState",
    "LiveTry",
    "LiveUnavailable",
    "change_live",
    "parse_assignments",
    "parse_value",
    "plan_change",
    "read_live",
    "reset_prefix_cache",
    "try_live",
    "wait_drained",
    "with_headroom",
]

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class LiveUnavailable(Exception):
    """The server cannot take live changes at all (not started by vtui, an old vLLM, unreachable)."""


class LiveRefused(Exception):
    """The server can take live changes, but not this one (above the started value, a combination
    vLLM refuses); the message is the server's reason."""


@dataclass(frozen=True)
class LiveState:
    vllm: str
    admission: str  # how the cap is applied ("max_num_active_reqs" or "running-bound guard")
    started: dict[str, Any]
    live: dict[str, Any]
    engines: int = 1
    running: int = 0  # summed over every engine
    waiting: int = 0  # every queue the scheduler keeps, summed over every engine
    steps: int = 0  # engine 0's steps that scheduled work since the last change
    max_step_tokens: int = 0  # the most tokens one of those steps scheduled
    max_step_requests: int = 0  # the most requests one of those steps ran

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LiveState:
        try:
            started = {k: data["started"][k] for k in LIVE_FLAGS}
            live = {k: data["live"][k] for k in LIVE_FLAGS}
            return cls(vllm=str(data.get("vllm", "?")), admission=str(data.get("admission", "?")),
                       started=started, live=live, engines=int(data.get("engines", 1)),
                       running=int(data.get("running", 0)), waiting=int(data.get("waiting", 0)),
                       steps=int(data.get("steps", 0)), max_step_tokens=int(data.get("max_step_tokens", 0)),
                       max_step_requests=int(data.get("max_step_requests", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise LiveUnavailable(f"the server's live-limits answer is not understood ({exc!r}): {dict(data)!r:.200}") from exc


@dataclass(frozen=True)
class LiveResult:
    before: LiveState
    after: LiveState
    seconds: float  # from sending the change to the engine's answer that it took it

    @property
    def changed(self) -> dict[str, tuple[Any, Any]]:
        return {k: (self.before.live[k], self.after.live[k]) for k in LIVE_FLAGS if self.before.live[k] != self.after.live[k]}


@dataclass(frozen=True)
class ChangePlan:
    """How an edit reaches a running server: ``live`` (flag -> value) when every edited flag can
    change live, else ``restart_reasons`` (one line per flag that forces the restart)."""

    live: dict[str, Any] = field(default_factory=dict)
    restart_reasons: list[str] = field(default_factory=list)

    @property
    def is_live(self) -> bool:
        return not self.restart_reasons


def parse_value(name: str, text: str) -> Any:
    """A live flag's value from text (``vtui set``'s ``FLAG=VALUE``); ValueError naming the flag."""
    if BY_NAME[name].switch:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"--{name} takes true or false, not {text!r}")
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"--{name} takes a whole number, not {text!r}") from None
    if value < 1:
        raise ValueError(f"--{name} takes a whole number of at least 1, not {value}")
    return value


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["max-num-seqs=2", "enable-chunked-prefill=false"]`` -> {flag: value}; ValueError naming
    the bad item (no '=', a flag that cannot change live, a bad value, a flag given twice)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().removeprefix("--")
        if not sep or not name:
            raise ValueError(f"{item!r}: write FLAG=VALUE, e.g. max-num-seqs=2")
        if name not in LIVE_FLAGS:
            raise ValueError(f"--{name} cannot change on a running server (live: {', '.join(LIVE_FLAGS)}); "
                             "apply it in the TUI or start the server with it")
        if name in out:
            raise ValueError(f"--{name} is given twice")
        out[name] = parse_value(name, text)
    return out


def plan_change(edited: Mapping[str, tuple[object, object]], state: LiveState | None,
                why_not_live: str | None = None) -> ChangePlan:
    """How the edits ``edited`` (flag -> (old, new) value; new None: unset, back to the started
    value) reach a running server whose live state is ``state`` (None: it has no live limits, for
    ``why_not_live``). The server's own report of its started values decides (defaults included)."""
    live: dict[str, Any] = {}
    reasons: list[str] = []
    for name, (_old, new) in edited.items():
        if name not in LIVE_FLAGS:
            reasons.append(f"--{name} needs a restart (only {', '.join(LIVE_FLAGS)} change live)")
            continue
        if state is None:
            reasons.append(f"--{name}: {why_not_live or 'the server takes no live changes'}")
            continue
        value = state.started[name] if new is None else new
        if BY_NAME[name].switch:
            value = _as_bool(value)
        else:
            try:
                value = int(str(value))
            except ValueError:
                reasons.append(f"--{name} {value!r} is not a whole number")
                continue
            if value > int(state.started[name]):
                reasons.append(f"--{name} {value} is above the {state.started[name]} the server was started with")
                continue
        live[name] = value
    return ChangePlan(live=live if not reasons else {}, restart_reasons=reasons)


def _as_bool(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def _headers(url: str, api_key: str | None) -> dict[str, str]:
    """The door's headers: the API key, and the per-launch key from this user's registry."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    entry = find_by_url(url)
    if entry is not None and entry.live_key:
        headers[HEADER] = entry.live_key
    return headers


def _answer(resp: httpx.Response, url: str, route: str = ROUTE) -> dict[str, Any]:
    """The door's JSON answer; LiveRefused for a 409 (nothing changed), LiveUnavailable otherwise."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    error = str(data.get("error", resp.text)) if isinstance(data, dict) else resp.text[:200]
    if resp.status_code == 404:
        entry = find_by_url(url)
        if entry is not None and entry.live_off:
            raise LiveUnavailable(f"vtui started {url} without its live hook ({entry.live_off}): every change needs a restart")
        if entry is None:
            raise LiveUnavailable(f"{url} has no live limits (vtui did not start this server): every change needs a restart")
        raise LiveUnavailable(f"{url} serves no {route} although vtui started it with its live hook (a vLLM that "
                              "ignores --middleware?): every change needs a restart")
    if resp.status_code == 401 and HEADER not in resp.request.headers:
        raise LiveUnavailable(f"{url}'s live limits answer only the vtui that started the server and its user, and "
                              "this user's vtui records hold no key for it (another user's server, or an older vtui's)")
    if resp.status_code == 409 and isinstance(data, dict):
        raise LiveRefused(error)
    if resp.status_code != 200 or not isinstance(data, dict):
        raise LiveUnavailable(f"{url}{route} answered HTTP {resp.status_code}: {error}")
    return data


async def _request(url: str, route: str, api_key: str | None, timeout: float,
                   body: Mapping[str, Any] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        try:
            if body is None:
                return await client.get(url.rstrip("/") + route, headers=_headers(url, api_key))
            return await client.post(url.rstrip("/") + route, json=dict(body), headers=_headers(url, api_key))
        except httpx.HTTPError as exc:
            raise LiveUnavailable(f"cannot reach {url}: {exc or type(exc).__name__}") from exc


async def read_live(url: str, api_key: str | None = None, *, timeout: float = 10.0) -> LiveState:
    """The server's started and live limits; LiveUnavailable when they cannot be read (no hook, not
    every engine reachable, a refusal: a read changes nothing, so it never raises LiveRefused)."""
    resp = await _request(url, ROUTE, api_key, timeout)
    try:
        data = _answer(resp, url)
    except LiveRefused as exc:
        raise LiveUnavailable(str(exc)) from None
    if "error" in data:
        raise LiveUnavailable(str(data["error"]))
    return LiveState.from_json(data)


async def reset_prefix_cache(url: str, api_key: str | None = None, *, timeout: float = 10.0) -> bool:
    """Empty every engine's prefix cache through vtui's door; False when vLLM did not (requests
    running). LiveUnavailable where the server has no door (not started by vtui, no hook)."""
    resp = await _request(url, RESET_ROUTE, api_key, timeout, body={})
    try:
        return bool(_answer(resp, url, RESET_ROUTE).get("reset"))
    except LiveRefused as exc:
        raise LiveUnavailable(str(exc)) from None


async def change_live(url: str, changes: Mapping[str, Any], api_key: str | None = None,
                      *, timeout: float = 30.0) -> LiveResult:
    """Change live limits on the server at ``url``; returns once its engines took the change.
    LiveRefused carries vLLM's or vtui's reason; nothing is changed then."""
    before = await read_live(url, api_key, timeout=timeout)
    t0 = time.perf_counter()
    resp = await _request(url, ROUTE, api_key, timeout, body=changes)
    seconds = time.perf_counter() - t0
    after = LiveState.from_json(_answer(resp, url))
    return LiveResult(before=before, after=after, seconds=seconds)


@dataclass(frozen=True)
class LiveTry:
    """One attempt at setting flags live: the result, or why they must restart instead."""

    result: LiveResult | None = None
    refusal: str | None = None


async def try_live(base_url: str, started: FlagSet, current: FlagSet, target: FlagSet, api_key: str | None = None,
                   *, timeout: float = 30.0) -> LiveTry:
    """Set ``target`` on the server at ``base_url`` (started with ``started``, running ``current``)
    without a restart, where it differs from both only in live flags within their started values:
    every live flag is sent (unset ones back to the started value). The one way the TUI's apply,
    the tune and the sweep change a running server's limits."""
    restart = [n for n in {**current.diff(target), **started.diff(target)} if n not in LIVE_FLAGS]
    if restart:
        return LiveTry(refusal=f"--{restart[0]} needs a restart")
    try:
        state = await read_live(base_url, api_key, timeout=timeout)
        plan = plan_change({n: (None, target.get(n)) for n in LIVE_FLAGS}, state)
        if not plan.is_live:
            return LiveTry(refusal="; ".join(plan.restart_reasons))
        return LiveTry(result=await change_live(base_url, plan.live, api_key, timeout=timeout))
    except (LiveUnavailable, LiveRefused) as exc:
        return LiveTry(refusal=str(exc))


def with_headroom(flags: FlagSet, factor: float) -> FlagSet:
    """``flags`` to start a server with so that later edits stay live: the numeric live flags set in
    ``flags`` times ``factor`` (unset ones stay vLLM's default), the switches on. Off by default: a
    larger max-num-batched-tokens changes the KV cache the start profiles, and so every measurement
    on that server (each run stores the started flags)."""
    if factor <= 1:
        return flags
    out = flags
    for flag in LIVE:
        value = flags.get(flag.name)
        if not flag.switch and isinstance(value, int) and not isinstance(value, bool):
            out = out.set(flag.name, int(value * factor))
    if out is not flags:
        for flag in LIVE:
            if flag.switch and flags.get(flag.name) is False:
                out = out.set(flag.name, True)
    return out


async def wait_drained(base_url: str, api_key: str | None = None, *, timeout: float = 60.0) -> bool:
    """Wait until nothing admitted under the old limits runs or waits (a measured step counts from
    there); False when ``timeout`` ran out first."""
    end = time.monotonic() + timeout
    while True:
        state = await read_live(base_url, api_key)
        if state.running == 0 and state.waiting == 0:
            return True
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(0.2)
