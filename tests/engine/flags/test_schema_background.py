"""The installed vLLM's flag schema is read beside a first start, not before it (issue 18, item 9):
``load_schema(wait=False)`` answers at once with the built-in schema while a thread reads and
caches the real one. The extraction is replaced here by a slow stand-in (the real one takes
about 10 s and is exercised by every test that loads the schema)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.flags import schema as flags


@pytest.fixture
def slow_extract(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[threading.Event]:
    """A fresh data folder and vLLM version, and an extraction that waits for ``release``. At the end
    every background read is released and joined while the stand-ins are still in place: a read that
    outlived its test would cache the stand-in schema for the real vLLM version (every later preset
    check then read "unknown flag for vLLM 9.9.9-test")."""
    monkeypatch.setenv("VTUI_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(flags, "installed_vllm_version", lambda: "9.9.9-test")
    monkeypatch.setattr(flags, "_SCHEMAS", {})
    monkeypatch.setattr(flags, "_BACKGROUND", {})
    monkeypatch.setattr(flags, "_BACKGROUND_FAILED", {})
    monkeypatch.setattr(flags, "START_GRACE_S", 0.0)
    release = threading.Event()

    def extract(timeout: float) -> dict[str, Any]:
        assert release.wait(10)
        return {"version": "9.9.9-test", "quantization": [], "flags": [
            {"options": ["--max-num-seqs"], "type": "int", "default": None, "help": "",
             "action": "_StoreAction", "nargs": None, "choices": None}]}

    monkeypatch.setattr(flags, "_extract_vllm_schema", extract)
    yield release
    release.set()
    for thread in list(flags._BACKGROUND.values()):
        thread.join(10)


def test_a_first_start_does_not_wait_for_the_schema(slow_extract: threading.Event) -> None:
    t0 = time.monotonic()
    first = flags.load_schema(wait=False)
    assert time.monotonic() - t0 < 1.0
    assert not first.complete and "being read in the background" in first.source
    assert flags.schema_pending()
    assert not flags.load_schema(wait=False).complete  # asked again meanwhile: still the built-in one
    slow_extract.set()
    for thread in list(flags._BACKGROUND.values()):
        thread.join(10)
    assert not flags.schema_pending()
    later = flags.load_schema(wait=False)
    assert later.complete and later.vllm_version == "9.9.9-test" and later.get("max-num-seqs") is not None
    cached = list((Path(flags.os.environ["VTUI_HOME"]) / "data").glob("schema-*.json"))
    assert [p.name for p in cached] == ["schema-9.9.9-test.json"]


def test_a_failed_background_read_says_why_and_is_not_retried(monkeypatch: pytest.MonkeyPatch,
                                                                 slow_extract: threading.Event) -> None:
    calls: list[float] = []

    def broken(timeout: float) -> dict[str, Any]:
        calls.append(timeout)
        raise flags.FlagError("", "importing vLLM failed (exit 1): ImportError: no torch")

    monkeypatch.setattr(flags, "_extract_vllm_schema", broken)
    flags.load_schema(wait=False)
    for thread in list(flags._BACKGROUND.values()):
        thread.join(10)
    again = flags.load_schema()  # even a caller that would wait gets the reason, not a second try
    assert not again.complete and "unavailable: importing vLLM failed (exit 1)" in again.source
    assert len(calls) == 1


def test_the_background_read_waits_while_a_server_starts(monkeypatch: pytest.MonkeyPatch,
                                                          slow_extract: threading.Event) -> None:
    """It imports vLLM too: beside a server's own start on an empty data folder it cost 4-6 s on the H200."""
    started: list[float] = []

    def extract(timeout: float) -> dict[str, Any]:
        started.append(time.monotonic())
        return {"version": "9.9.9-test", "quantization": [], "flags": []}

    monkeypatch.setattr(flags, "_extract_vllm_schema", extract)
    with flags.background_held():
        with flags.background_held():  # two starts at once (a restart beside a tune trial)
            flags.load_schema(wait=False)
            time.sleep(0.3)
        time.sleep(0.2)
        assert started == [] and flags.schema_pending()
        released = time.monotonic()
    for thread in list(flags._BACKGROUND.values()):
        thread.join(10)
    assert len(started) == 1 and started[0] >= released
    assert flags.load_schema(wait=False).vllm_version == "9.9.9-test"


def test_attaching_on_a_first_start_does_not_wait_for_the_schema(slow_extract: threading.Event) -> None:
    """`vtui --url` on a fresh data folder sat 99 s at "attaching…" (2026-12-05, a busy 2-core box):
    reading the attached server's command line extracted the schema a second time, blocking."""
    import asyncio

    from engine.server.attach import attach
    from loadgen.testserver import ServerConfig, serve_in_thread

    with serve_in_thread(ServerConfig(first_delay_s=0.001, gap_s=0.001)) as url:
        t0 = time.monotonic()
        server = asyncio.run(attach(url))
        took = time.monotonic() - t0
    slow_extract.set()
    assert server.local and server.pid is not None  # its process was read (the flags: not a vLLM)
    assert took < 5.0, f"attach waited {took:.1f} s for the schema's extraction"


def test_kill_9_of_vtui_serve_on_a_first_start_ends_the_schema_read(tmp_path: Path) -> None:
    """Issue 44 item 2: `vtui serve` on an empty data folder reads vLLM's flag schema in a child
    (importing vLLM: 10-30 s here); kill -9 of vtui left that child running 20-30 s after it. A
    process vtui started ends with it: the process table read 10 s after the kill holds none of
    vtui's children. The server is tests/fakevllm.py through `--launcher` (the schema read waits
    for a server to be ready, and a real one takes 35-70 s here: the reaper that ends it is tested
    in test_orphans.py); the schema read is the real one."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from tests import fakevllm

    if flags.installed_vllm_version() is None:
        pytest.skip("no vLLM installed: no schema read to start")
    home = tmp_path / "home"  # an empty data folder: no schema cached
    vtui = subprocess.Popen([sys.executable, "-m", "tui.cli", "serve", "--launcher", " ".join(fakevllm.command())],
                            env={**os.environ, "VTUI_HOME": str(home)}, cwd=Path(__file__).resolve().parents[3],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and vtui.poll() is None:
            children = psutil.Process(vtui.pid).children(recursive=True)
            if any("vtui-schema" in " ".join(p.cmdline()) for p in children if p.is_running()):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no schema read seen (vtui exit {vtui.poll()})")
        vtui.send_signal(signal.SIGKILL)
        vtui.wait(5)
        time.sleep(10)
        left = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [" ".join(p.cmdline())[:80] for p in left]
    finally:
        if vtui.poll() is None:
            vtui.kill()
        for p in children:  # the test's own grandchildren, by pid and start time (psutil checks it)
            if p.is_running():
                p.kill()
