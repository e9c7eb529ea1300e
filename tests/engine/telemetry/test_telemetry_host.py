"""Host sampler on real processes (psutil)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil
import pytest
from strangers import spawn_stranger

from engine.telemetry.host import HostSampler

pytestmark = pytest.mark.serial  # CPU shares of processes, read against what else runs: run alone (scripts/test.sh)

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_machine_numbers() -> None:
    s = HostSampler().sample(t=5.0)
    assert s.t == 5.0 and s.cpu_count == psutil.cpu_count()
    assert 0 < s.mem_used_bytes < s.mem_total_bytes and 0.0 <= s.cpu_percent <= 100.0
    assert s.proc_root_pid is None and s.proc_rss_bytes is None


def test_process_tree_rss_and_cpu() -> None:
    # a parent that spins up one busy child: the tree is parent + child
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}])"]
    )
    try:
        sampler = HostSampler(parent.pid)
        deadline = time.time() + 10
        first = sampler.sample()
        while first.proc_count < 2 and time.time() < deadline:
            time.sleep(0.1)
            first = sampler.sample()
        assert first.proc_count == 2 and first.proc_alive
        assert sampler.tree_pids() == {parent.pid, *(c.pid for c in psutil.Process(parent.pid).children())}
        time.sleep(1.0)
        second = sampler.sample()
        assert second.proc_rss_bytes is not None and second.proc_rss_bytes > 5 * 1024 * 1024
        # the busy child burns up to a core (less on a shared box); cpu_percent needs the cached Process objects to see it
        assert second.proc_cpu_percent is not None and second.proc_cpu_percent > 5.0
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
    gone = sampler.sample()
    assert not gone.proc_alive and gone.proc_rss_bytes is None and sampler.tree_pids() == frozenset()


def test_first_reading_of_a_new_tree_has_no_cpu_yet() -> None:
    s = HostSampler(psutil.Process().pid).sample()
    assert s.proc_alive and s.proc_cpu_percent is None and s.proc_rss_bytes


def test_missing_pid_does_not_raise() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    s = HostSampler(proc.pid).sample()
    assert not s.proc_alive and s.proc_count == 0


@pytest.mark.parametrize("pid", [None, 1])
def test_set_root_switches_tree(pid: int | None) -> None:
    sampler = HostSampler(psutil.Process().pid)
    sampler.sample()
    sampler.set_root(pid)
    assert sampler.root_pid == pid and sampler.tree_pids() == frozenset()


def test_machine_cpu_sees_a_busy_process() -> None:
    a = HostSampler()
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(1.5)
        s = a.sample()
    finally:
        busy.kill()
        busy.wait()
    # one spinning process on this machine's cores: at least a few percent of all CPU time
    assert 100.0 / psutil.cpu_count() * 0.2 < s.cpu_percent <= 100.0


def _titled(title: str, busy: bool) -> str:
    """A child process named ``title`` (its comm, as vLLM's setproctitle leaves it) that spins or sleeps."""
    body = BUSY if busy else "import time\ntime.sleep(30)\n"
    return ("import ctypes\nctypes.CDLL(None).prctl(15, " + repr(title.encode()) + ", 0, 0, 0)\n" + body)


@pytest.mark.parametrize(("title", "counted"), [("VLLM::EngineCore", False), ("VLLM::APIServer_1", True)])
def test_api_server_cpu_is_the_front_processes_only(title: str, counted: bool) -> None:
    # A sleeping root (an API server's name: the interpreter's) over one spinning child titled as
    # vLLM titles its processes: the engine core's CPU is the tree's, not the frontend's; one of
    # several API servers is the frontend's.
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{_titled(title, busy=True)!r}])"])
    try:
        sampler = HostSampler(parent.pid)
        deadline = time.time() + 10
        first = sampler.sample()
        while (first.proc_count < 2 or not any(
                p.name().startswith("VLLM::") for p in psutil.Process(parent.pid).children())) and time.time() < deadline:
            time.sleep(0.1)
            first = sampler.sample()
        time.sleep(1.0)
        s = sampler.sample()
        assert s.proc_cpu_percent is not None and s.proc_cpu_percent > 15.0, s
        assert s.proc_front_cpu_percent is not None, s
        if counted:
            assert s.proc_front_cpu_percent > 15.0, s
        else:
            assert s.proc_front_cpu_percent < 5.0, s  # the sleeping root only
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_is_front_by_vllm_process_titles() -> None:
    from engine.telemetry.host import is_front

    assert is_front("vllm") and is_front("python3") and is_front("VLLM::APIServer")  # comm keeps 15 characters
    assert not is_front("VLLM::EngineCor") and not is_front("VLLM::Worker_TP0") and not is_front("VLLM::Worker")


@pytest.mark.parametrize(("titles", "expected"), [
    (("VLLM::APIServer_0", "VLLM::APIServer_1", "VLLM::EngineCore"), 2),  # vllm serve --api-server-count 2
    (("VLLM::EngineCore",), 1),  # one API server: the root, with the interpreter's name
])
def test_api_server_processes_are_counted(titles: tuple[str, ...], expected: int) -> None:
    # A sleeping root over sleeping children titled as vLLM titles its processes.
    spawn = "; ".join(f"subprocess.Popen([sys.executable, '-c', {_titled(t, busy=False)!r}])" for t in titles)
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; {spawn}; time.sleep(30)"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline and sum(
                p.name().startswith("VLLM::") for p in psutil.Process(parent.pid).children()) < len(titles):
            time.sleep(0.1)
        s = HostSampler(parent.pid).sample()
        assert s.proc_count == 1 + len(titles), s
        assert s.proc_front_procs == expected, s
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
    assert HostSampler().sample().proc_front_procs is None  # no tree


def test_is_api_server_by_title() -> None:
    from engine.telemetry.host import is_api_server

    assert is_api_server("VLLM::APIServer_1") and is_api_server("VLLM::APIServer")  # comm keeps 15 characters
    assert not is_api_server("python3") and not is_api_server("VLLM::EngineCor") and not is_api_server("vllm")


def _burn(seconds: float) -> str:
    return f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def test_box_share_counts_our_tree_and_a_stranger_apart() -> None:
    """BoxLedger: a busy child of ours (joined before the reading: its time is in our reaped
    children's) reads as ours; a busy process outside our tree (its starting shell gone, as
    another user's job is) reads as other. Each burns 1 s of CPU."""
    from engine.telemetry.host import BoxLedger

    ledger = BoxLedger((os.getpid(),))
    ledger.mark()
    subprocess.run([sys.executable, "-c", _burn(1.0)], check=True)
    ours = ledger.share()
    assert ours is not None and ours.ours_cores * ours.seconds >= 0.9, ours
    stranger = psutil.Process(spawn_stranger(_burn(1.0)))
    assert stranger.ppid() != os.getpid()
    ledger.mark()
    deadline = time.monotonic() + 30
    try:
        # not our child: done once gone or a zombie (whoever adopted it may not reap it at once)
        while stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the busy process did not end in 30 s"
            time.sleep(0.05)
    except psutil.NoSuchProcess:
        pass
    finally:
        with contextlib.suppress(psutil.Error):
            if stranger.status() != psutil.STATUS_ZOMBIE:
                stranger.kill()  # the process this test started, by its pid
    share = ledger.share()
    assert share is not None and share.other_cores * share.seconds >= 0.8, share
    assert share.ours_cores * share.seconds < 0.3, share  # the test's own waiting only
    assert share.to_json()["other_cores"] == round(share.other_cores, 3)
