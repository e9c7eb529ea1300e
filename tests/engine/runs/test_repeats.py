"""Repeats as a part of a run (issue 34, item 1): a preset's ``repeats``, the session's `r` and
`n`, the TUI's sweep in rounds, all through engine.runs.series (issue 36, item 1)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.errors import SessionError
from engine.flags import FlagSet
from engine.presets import PresetError, dumps_toml, loads_preset
from engine.runs.series import Slot, measure_sound, rounds, run_series
from engine.runs.status import RunStatus
from engine.server.attach import AttachedServer
from engine.session import Session
from loadgen import ArrivalSpec, WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_thread

PRESET = """name = "{name}"
repeats = {repeats}
[workload]
input_len = 12
output_len = 8
[arrivals]
concurrency = 2
num_requests = 12
"""


# --------------------------------------------------------------------------- the preset's setting

def test_a_presets_repeats_are_read_written_and_checked() -> None:
    preset = loads_preset(PRESET.format(name="three", repeats=3))
    assert preset.repeats == 3 and preset.for_tiny_model().repeats == 3
    assert "repeats = 3" in dumps_toml(preset.to_dict())
    assert loads_preset('name = "one"\n').repeats == 1
    for bad, words in (("0", "must be 1 to 50"), ("51", "must be 1 to 50"), ('"3"', "not a string"),
                       ("true", "not a boolean"), ("2.5", "not a float")):
        with pytest.raises(PresetError, match=words) as info:
            loads_preset(PRESET.format(name="bad", repeats=bad))
        assert "repeats" in str(info.value) and ":2:" in str(info.value)  # the key and its line


# --------------------------------------------------------------------------- the series itself

def test_rounds_alternate_between_configurations() -> None:
    order = [(s.config, s.repeat) for s in rounds("ab", 3)]
    assert order == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert [s.label("x") for s in rounds("a", 2)] == ["[1/2] x (repeat 1/2)", "[2/2] x (repeat 2/2)"]
    with pytest.raises(ValueError, match="must be 1 or more"):
        rounds("a", 0)


class _Run:
    def __init__(self, status: RunStatus) -> None:
        self.status = status


def test_a_spoiled_step_is_measured_again_at_most_three_times_and_repeats_are_not() -> None:
    said: list[str] = []
    statuses = iter([RunStatus.BOX_BOUND, RunStatus.OK, RunStatus.BOX_BOUND, RunStatus.BOX_BOUND,
                     RunStatus.BOX_BOUND])
    calls: list[str] = []

    async def step(slot: Slot[str]) -> _Run:
        calls.append(str(slot.config))
        return _Run(next(statuses))

    done = asyncio.run(run_series(["a", "b"], step, say=said.append))
    assert calls == ["a", "a", "b", "b", "b"] and [r.status for _, r in done] == [RunStatus.OK, RunStatus.BOX_BOUND]
    assert said == ["[1/2] a: box-bound: measured again (try 2 of 3)", "[2/2] b: box-bound: measured again (try 2 of 3)",
                    "[2/2] b: box-bound: measured again (try 3 of 3)"]
    kept = iter([RunStatus.BOX_BOUND, RunStatus.OK])

    async def first() -> _Run:
        return _Run(next(kept))

    assert asyncio.run(measure_sound(first, spoiled=lambda r: r.status.spoiled)).status is RunStatus.OK


def test_repeats_stop_after_a_run_that_ends_them() -> None:
    statuses = iter([RunStatus.OK, RunStatus.CANCELLED, RunStatus.OK])

    async def step(slot: object) -> _Run:
        return _Run(next(statuses))

    done = asyncio.run(run_series(["a"], step, repeats=3, retry_spoiled=False,
                                  stop=lambda r: r.status is RunStatus.CANCELLED))
    assert [r.status for _, r in done] == [RunStatus.OK, RunStatus.CANCELLED]


# --------------------------------------------------------------------------- the session (the TUI's r, n, w)

def _session(url: str, tmp_path: Path) -> Session:
    session = Session(FlagSet(model="test-model", values={}), workload=WorkloadSpec(input_len=12, output_len=8),
                      arrivals=ArrivalSpec(concurrency=2, num_requests=12), workload_label="rep",
                      record_history=True, telemetry=False)
    session.attach_server(AttachedServer(url=url, version="stand-in", models=("test-model",), max_model_len=4096))
    return session


async def test_r_runs_the_repeats_as_one_column_with_an_interval_over_them(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with serve_in_thread(ServerConfig(first_delay_s=0.005, gap_s=0.002, max_model_len=4096)) as url:
        session = _session(url, tmp_path)
        try:
            assert session.repeats == 1
            with pytest.raises(SessionError, match="not a whole number"):
                session.set_repeats("three")
            with pytest.raises(SessionError, match="must be 1 to 50"):
                session.set_repeats("0")
            assert session.set_repeats(" 3 ") == 3 and session.snapshot().repeats == 3
            records = await session.run_repeats()
            single = await session.run_workload()
        finally:
            await session.close()
    assert [r.label for r in records] == ["rep (1/3)", "rep (2/3)", "rep (3/3)"]
    assert {r.group for r in records} == {1} and single.group is None
    assert all(r.status is RunStatus.OK for r in records)
    view = session.comparison()
    assert view is not None and view.columns == ("rep x3", single.label)
    assert view.counts == (3, 1) and view.statuses == ("ok x3", "ok")


async def test_a_preset_brings_its_repeats_and_saving_keeps_them(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    path = tmp_path / "two.toml"
    path.write_text(PRESET.format(name="two", repeats=2))
    session = Session(FlagSet(model="test-model", values={}), telemetry=False, record_history=False)
    try:
        session.load_preset(path)
        assert session.repeats == 2
        saved = session.save_preset("two-again")
        assert "repeats = 2" in saved.read_text()
        session.set_repeats(1)
        assert "repeats" not in Path(session.save_preset("one-again")).read_text()
    finally:
        await session.close()


async def test_the_tuis_sweep_runs_rounds_and_groups_each_preset(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    presets = []
    for name in ("left", "right"):
        path = tmp_path / f"{name}.toml"
        path.write_text(PRESET.format(name=name, repeats=2 if name == "left" else 1))
        presets.append(loads_preset(path.read_text(), source=path))
    with serve_in_thread(ServerConfig(first_delay_s=0.005, gap_s=0.002, max_model_len=4096)) as url:
        session = _session(url, tmp_path)
        try:
            with pytest.raises(SessionError, match=r"no preset named .no-such-preset-here."):
                await session.sweep(["no-such-preset-here"])
            records = await session.sweep(presets)  # the most repeats any asks for: 2 rounds
        finally:
            await session.close()
    assert [r.label for r in records] == ["left (1/2)", "right (1/2)", "left (2/2)", "right (2/2)"]
    view = session.comparison()
    assert view is not None and view.columns == ("left x2", "right x2") and view.counts == (2, 2)
    assert session.repeats == 1  # the last preset loaded (right) asks for one run


async def test_the_tuis_sweep_takes_ns_repeats_when_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    path = tmp_path / "one.toml"
    path.write_text(PRESET.format(name="one", repeats=1))
    with serve_in_thread(ServerConfig(first_delay_s=0.005, gap_s=0.002, max_model_len=4096)) as url:
        session = _session(url, tmp_path)
        try:
            session.set_repeats(2)
            records = await session.sweep([loads_preset(path.read_text(), source=path)])
        finally:
            await session.close()
    assert [r.label for r in records] == ["one (1/2)", "one (2/2)"]


# --------------------------------------------------------------------------- the CLI as typed

def test_vtui_bench_runs_a_presets_repeats_unless_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from engine.presets import user_presets_dir
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    (user_presets_dir() / "two.toml").write_text(PRESET.format(name="two", repeats=2))
    with serve_in_thread(ServerConfig(first_delay_s=0.005, gap_s=0.002, max_model_len=4096)) as url:
        rc = main(["bench", "--url", url, "--preset", "two", "-q", "--no-history", "--allow-box-bound"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert "preset two: 2 repeats (--repeat 1 for one run)" in out.err and "repeat 2 of 2" in out.err
        assert out.out.count("Serving Benchmark Result") == 2 and "Repeats: 2 of 2 runs measured" in out.out
        rc = main(["bench", "--url", url, "--preset", "two", "-q", "--no-history", "--allow-box-bound",
                   "--repeat", "1"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert out.out.count("Serving Benchmark Result") == 1 and "repeat" not in out.err
