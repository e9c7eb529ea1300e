"""A start says how long it has run and how long the last start of the same flags took, and
`vtui` (no --url) starts the server at once (issue 18, item 1).

The server is tests/fakevllm.py's stand-in, started by the real supervisor: these tests are
about vtui's bookkeeping and screen, not vLLM's start (tests/real/test_supervisor_vllm.py starts vLLM).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from engine import paths
from engine.flags import FlagSet
from engine.server.supervisor import STARTS_FILE, Supervisor, last_start_seconds, remember_start_seconds
from engine.session import Session
from tests import fakevllm
from tui.widgets.status import starting_text


def test_starting_text() -> None:
    assert starting_text(None, 57.0) == ""
    assert starting_text(12.4, None) == "12 s (first start of these flags: no estimate yet)"
    assert starting_text(23.0, 57.0) == "23 s of ~57 s (last start)"
    assert starting_text(120.0, 57.0) == "120 s, longer than the last start (57 s)"


def test_start_times_kept_per_command_and_bounded() -> None:
    remember_start_seconds("m --a 1", 12.34)
    remember_start_seconds("m --a 2", 40.0)
    assert last_start_seconds("m --a 1") == 12.3 and last_start_seconds("m --a 3") is None
    for k in range(250):
        remember_start_seconds(f"k{k}", 1.0)
    data = json.loads((paths.data_dir() / STARTS_FILE).read_text())
    assert len(data) == 200 and "k249" in data and "m --a 1" not in data  # the newest kept
    (paths.data_dir() / STARTS_FILE).write_text("{not json")
    assert last_start_seconds("k249") is None  # a bad file is no estimate, never an error
    remember_start_seconds("k1", 2.0)
    assert last_start_seconds("k1") == 2.0


async def test_second_start_of_the_same_flags_knows_the_first(tiny_model: Path) -> None:
    flags = FlagSet(model=str(tiny_model), values={"max-num-seqs": 7})
    sup = Supervisor(flags, launcher=fakevllm.command())
    await sup.start(timeout=30)
    first = time.monotonic() - (sup.launched_at or 0)
    assert sup.expected_start_s is None or sup.expected_start_s > 0
    await sup.stop()
    await sup.start(timeout=30)
    try:
        assert sup.expected_start_s is not None and 0 < sup.expected_start_s <= first + 1
    finally:
        await sup.stop()


async def test_vtui_starts_the_server_at_once_and_shows_its_progress(tiny_model: Path) -> None:
    from tui.app import VtuiApp

    session = Session(FlagSet(model=str(tiny_model), values={"max-num-seqs": 9}), launcher=fakevllm.command(),
                      telemetry=False, record_history=False)
    app = VtuiApp(session, cursor_blink=False, start_server=True)
    seen: list[str] = []
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(300):
                await pilot.pause(0.05)
                snap = session.snapshot()
                if snap.server.state == "STARTING" and snap.server.starting_s is not None:
                    seen.append(starting_text(snap.server.starting_s, snap.server.expected_start_s))
                if snap.server.state == "READY":
                    break
            assert session.snapshot().server.state == "READY"  # nobody pressed s
    finally:
        await session.close()
    assert seen and all(" s" in text for text in seen)
