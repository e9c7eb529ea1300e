"""Bad input, the gaps the per-module tests leave: every flag kind's bad values (named flag),
dataset files that are empty, huge or binary, and a session fed misbehaving servers (error
statuses, broken streams, a /metrics page that is not Prometheus text, log lines that are
not vLLM's): counted or shown, never a crash.

Per-module coverage lives elsewhere: preset files (test_presets: syntax, types, unknown
keys, huge, empty, non-UTF-8 with file/line/key), dataset lines (test_loadgen_workload),
each failure mode of a stream (test_loadgen_failures), parser fuzzing (test_logparse,
test_telemetry_metrics, test_flags_fuzz).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.flags import FlagError, FlagSet, parse_command_line, validate
from engine.server.logparse import LEVELS, classify_line
from engine.session import Session
from loadgen import ArrivalSpec, WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_thread
from loadgen.workload import DatasetError, build_requests
from tests import fakevllm


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("max-num-seqs", "abc"),  # int
        ("max-num-seqs", -1),  # int below its minimum
        ("max-num-seqs", "3.5"),
        ("gpu-memory-utilization", "lots"),  # float
        ("gpu-memory-utilization", 1.5),  # float above its maximum
        ("enable-prefix-caching", "maybe"),  # bool
        ("kv-cache-dtype", "fp3"),  # choice
        ("compilation-config", "{bad"),  # json
        ("cudagraph-capture-sizes", "1,two"),  # list of int
        ("max-model-len", "$(reboot)"),  # shell text is a value, never run
    ],
)
def test_every_kind_of_bad_flag_value_names_the_flag(flag: str, value: Any) -> None:
    flags = FlagSet(model="m", values={})
    try:
        problems = validate(flags.set(flag, value))
    except FlagError as exc:
        problems = [exc]
    assert problems, f"--{flag} {value!r} was accepted"
    assert problems[0].flag == flag and f"--{flag}" in str(problems[0])


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        ("vllm serve m --max-num-seqs", "max-num-seqs"),  # no value
        ("vllm serve m --max-num-seqs 'x y'", "max-num-seqs"),
        ("vllm serve m --compilation-config '{\"level\": }'", "compilation-config"),
    ],
)
def test_bad_command_lines_name_the_flag(line: str, flag: str) -> None:
    with pytest.raises(FlagError) as info:
        problems = validate(parse_command_line(line))
        if problems:
            raise problems[0]
    assert info.value.flag == flag


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", r"bad\.jsonl"),  # empty
        (b"\x00\x01\x02\xff" * 1000, r"bad\.jsonl"),  # binary garbage
        (b"\n\n\n", r"bad\.jsonl"),  # blank lines only
    ],
    ids=["empty", "binary", "blank"],
)
def test_unusable_dataset_files_name_the_file(tmp_path: Path, tiny_model: Path, content: bytes, match: str) -> None:
    from loadgen.tokens import LocalTokenizer

    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=match):
        build_requests(WorkloadSpec(kind="jsonl", dataset=str(path)), LocalTokenizer(tiny_model), 4)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_log_level_classifier_never_raises(text: str) -> None:
    assert classify_line(text).level in LEVELS


@pytest.mark.parametrize("mode", ["status=500", "status=429", "malformed", "cut", "reset"])
async def test_session_run_against_a_misbehaving_server_counts_failures(mode: str) -> None:
    with serve_in_thread(ServerConfig(mode=mode, model="m")) as url:
        session = Session(FlagSet(model="m", values={}), workload=WorkloadSpec(input_len=8, output_len=4),
                          arrivals=ArrivalSpec(concurrency=2, num_requests=6), record_history=False)
        await session.attach(url)
        record = await session.run_workload()
        await session.close()
    result = record.result
    assert result is not None and result.summary["failed"] == 6
    assert sum(result.failures_by_reason.values()) == 6
    assert record.status == "failed"  # nothing completed


async def test_non_vllm_log_lines_and_a_missing_metrics_page_are_shown_not_fatal(tiny_model: Path) -> None:
    session = Session(FlagSet(model=str(tiny_model), values={}), launcher=fakevllm.command(),
                      workload=WorkloadSpec(input_len=8, output_len=4),
                      arrivals=ArrivalSpec(concurrency=2, num_requests=4))
    try:
        await session.start_server(timeout=30)
        for _ in range(40):  # the stand-in's /metrics answers 404: scrapes fail, quietly
            await asyncio.sleep(0.1)
        snap = session.snapshot()
        texts = [line.text for line in snap.logs]
        assert any("some line that is not a known vLLM line" in t for t in texts)
        record = await session.run_workload()
        assert record.status in ("ok", "box-bound")  # box-bound: the busy box's delay (engine.runs.status)
        assert session.snapshot().server.state == "READY"
    finally:
        await session.close()


def test_thread_safety_of_snapshot_while_logging() -> None:
    """Log lines arrive from the loop while the UI builds snapshots: no torn state."""
    session = Session(FlagSet(model="m", values={}), telemetry=False, record_history=False)
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            session._add_log(f"\x00\udcff garbage line {n}")
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(200):
            snap = session.snapshot()
            ns = [line.n for line in snap.logs]
            assert ns == sorted(ns)
    finally:
        stop.set()
        thread.join()
