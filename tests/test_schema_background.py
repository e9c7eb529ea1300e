"""The installed vLLM's flag schema is read beside a first start, not before it (issue 18, item 9):
``load_schema(wait=False)`` answers at once with the built-in schema while a thread reads and
caches the real one. The extraction is replaced here by a slow stand-in (the real one takes
about 10 s and is exercised by every test that loads the schema)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.flags import schema as flags


@pytest.fixture
def slow_extract(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> threading.Event:
    """A fresh data folder and vLLM version, and an extraction that waits for ``release``."""
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
    return release


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
