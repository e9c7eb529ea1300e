"""Trials side by side (issue 19, on one host): slots out of the GPUs given, and the search
running one configuration per slot. The GPUs here are logical (this box has none): a slot is
the CUDA_VISIBLE_DEVICES its server gets and the cores it is pinned to; the measurers are the
table-driven stand-ins of test_tune.py, which yield to the event loop so trials interleave."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from test_tune import BASE, SCHEMA, SLO_TTFT, FakeClock, TableMeasurer, keys, space_of

from engine.flags import FlagSet
from engine.tune.search import (
    DOMINATED,
    DONE,
    UNSTABLE,
    Measurement,
    StartOutcome,
    StepRule,
    Tuner,
    TuneResult,
    TuneSettings,
    TuneState,
    best_config,
)
from engine.tune.slots import Slot, SlotError, parse_gpus, plan_slots


@pytest.mark.parametrize(("text", "gpus"), [("0,1,2,3", (0, 1, 2, 3)), ("0-3", (0, 1, 2, 3)), ("0,2-3", (0, 2, 3)),
                                            ("5", (5,))])
def test_parse_gpus(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpus(text) == gpus


@pytest.mark.parametrize(("text", "words"), [("0,x", "'x' is not a GPU index"), ("3-1", "runs backwards"),
                                             ("0,0", "named twice"), ("", "is not a GPU index")])
def test_parse_gpus_errors_name_the_part(text: str, words: str) -> None:
    with pytest.raises(SlotError, match=words):
        parse_gpus(text)


def test_slots_never_share_a_gpu_and_split_the_cores() -> None:
    slots = plan_slots(range(8), 2, cpus=range(16))
    assert [s.gpus for s in slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [s.cpus for s in slots] == [tuple(range(i * 4, i * 4 + 4)) for i in range(4)]
    assert slots[1].env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert slots[1].launcher("/usr/bin/taskset") == ["/usr/bin/taskset", "-c", "4,5,6,7"]
    assert slots[1].launcher(None) == []
    assert [s.gpus for s in plan_slots((0, 1, 2, 3, 4), 2, cpus=range(4))] == [(0, 1), (2, 3)]  # GPU 4 idles
    assert len(plan_slots(range(8), 1, parallel=3, cpus=range(8))) == 3
    # Fewer cores than slots: they share them rather than get none.
    assert [s.cpus for s in plan_slots(range(4), 1, cpus=(0, 1))] == [(0, 1)] * 4


def test_no_gpu_is_one_slot_as_before_and_bad_sizes_say_why() -> None:
    assert plan_slots((), 1, cpus=(0, 1)) == [Slot(0, (), (0, 1))]
    with pytest.raises(SlotError, match="needs 4 GPUs, and 2 were given"):
        plan_slots((0, 1), 4, cpus=(0,))
    with pytest.raises(SlotError, match="at least 1"):
        plan_slots((0, 1), 1, parallel=0, cpus=(0,))


class SlotMeasurer(TableMeasurer):
    """A TableMeasurer that yields while it measures (as a real one awaits its server), and
    records which other slots were measuring at the same moment."""

    live: set[int] = set()
    overlaps: list[tuple[int, frozenset[int]]] = []

    def __init__(self, slot: int, *args: Any, alone_ok: bool = True, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.slot = slot
        self.alone_ok = alone_ok

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        SlotMeasurer.live.add(self.slot)
        try:
            await asyncio.sleep(0.001)
            SlotMeasurer.overlaps.append((self.slot, frozenset(SlotMeasurer.live - {self.slot})))
            m = await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)
            alone = len(SlotMeasurer.live) == 1
            if alone and not self.alone_ok and m.ok and self.key == self.table.get("_fragile"):
                return Measurement(load, False, "p99 TTFT 700 ms > 500 ms", requests=requests, completed=requests)
            return m
        finally:
            SlotMeasurer.live.discard(self.slot)


def slot_tuner(space: Any, table: dict[str, Any], n: int, **kw: Any) -> tuple[Tuner, list[SlotMeasurer]]:
    SlotMeasurer.live, SlotMeasurer.overlaps = set(), []
    clock = FakeClock()
    alone_ok = kw.pop("alone_ok", True)
    ms = [SlotMeasurer(i, space, table, clock, alone_ok=alone_ok) for i in range(n)]
    settings = TuneSettings(budget_s=1e9, step=StepRule(min_requests=50), **kw)
    tuner = Tuner(ms[0], slots=ms[1:], base_flags=BASE, space=space, slo=SLO_TTFT, settings=settings,
                  schema=SCHEMA, clock=clock, max_request_len=192)
    return tuner, ms


async def test_two_slots_measure_side_by_side_and_find_the_same_best_as_one() -> None:
    space = space_of(max_num_seqs=(16, 32, 64, 128))
    table = dict(zip(keys(space), (4.0, 7.0, 10.0, 6.0), strict=True))
    alone_tuner, _ = slot_tuner(space, table, 1, exhaustive=True)
    alone = await alone_tuner.run()
    tuner, ms = slot_tuner(space, table, 2, exhaustive=True)
    res = await tuner.run()
    assert res.best is not None and alone.best is not None and res.best.key == alone.best.key == keys(space)[2]
    # Where both measured a configuration fully, the same limit (side by side, a trial can start
    # before the best so far would have ruled it out, so more rows may be DONE).
    one = {c.key: c.limit_load for c in alone.configs if c.status == DONE}
    two = {c.key: c.limit_load for c in res.configs if c.status == DONE}
    assert set(one) <= set(two) and all(two[k] == v for k, v in one.items())
    # Both slots measured, at the same moments, and every row says where and beside what it ran.
    assert all(m.starts for m in ms)
    assert any(others for _, others in SlotMeasurer.overlaps)
    rows = {c.key: c for c in res.configs}
    assert {c.slot for c in rows.values()} == {0, 1}
    assert any(c.side_by_side for c in rows.values())
    for c in rows.values():
        for other in c.side_by_side:
            assert c.key in rows[other].side_by_side  # side by side is mutual
    # The winner and the runner-up were measured again alone, on slot 0, with slot 1 stopped.
    assert res.best.alone and ms[1].closed
    # The runner-up: the best limit after the winner's, whatever its status (one that lost to the
    # winner beside it has one too, from the steps it passed before).
    runner_up = best_config(rows.values(), "goodput", exclude=res.best.key)
    assert runner_up is not None and runner_up.alone
    assert sum(1 for c in rows.values() if c.alone) == 2
    # The state round-trips the new fields (a resumed search keeps them).
    again = TuneState.from_json(tuner.state.to_json(), "test")
    assert again.configs[res.best.key].slot == rows[res.best.key].slot and again.configs[res.best.key].alone


@pytest.mark.parametrize(("prune", "words"), [
    # Every trial measured fully: 16 measures beside 64 while 64 checks its limit, so only the
    # final step alone finds it out.
    (False, "missed it alone"),
    # Pruned: 16 misses 64's pass beside it and stops (held, then measured again when 64's limit
    # does not hold), so 64 checks its limit alone already.
    (True, "missed when measured again"),
])
async def test_a_limit_that_holds_only_beside_others_is_unstable(prune: bool, words: str) -> None:
    space = space_of(max_num_seqs=(16, 64))
    k16, k64 = keys(space)
    table: dict[str, Any] = {k16: 4.0, k64: 10.0, "_fragile": k64}
    tuner, _ = slot_tuner(space, table, 2, exhaustive=True, alone_ok=False, prune=prune)
    res = await tuner.run()
    rows = {c.key: c for c in res.configs}
    assert rows[k64].status == UNSTABLE and words in rows[k64].reason
    assert res.best is not None and res.best.key == k16 and rows[k16].status == DONE


async def test_one_slot_is_the_search_as_before() -> None:
    space = space_of(max_num_seqs=(16, 64))
    tuner, ms = slot_tuner(space, dict(zip(keys(space), (4.0, 10.0), strict=True)), 1)
    res = await tuner.run()
    assert all(c.slot is None and not c.side_by_side and not c.alone for c in res.configs)
    assert res.best is not None and res.best.key == keys(space)[1] and ms[0].closed


def test_flagset_base_has_the_schema() -> None:
    assert isinstance(BASE, FlagSet)


def test_vtui_tune_cuts_the_visible_gpus_into_slots_of_the_largest_configuration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML here is tests/fake_nvml.py with 4 logical GPUs (this box has none).
    import argparse

    from fake_nvml import FakeNvml

    from engine.telemetry import nvml
    from engine.tune.search import SearchSpace
    from engine.tune.slots import slot_supervisor
    from tui.commands.tune import _slots

    monkeypatch.setattr(nvml, "_import_pynvml", lambda: FakeNvml(device_count=4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    space = SearchSpace.parse(["tensor-parallel-size=1,2", "max-num-seqs=64,128"])
    args = argparse.Namespace(gpus=None, parallel=None)
    slots = _slots(args, BASE, space)
    assert [s.gpus for s in slots] == [(0, 1), (2, 3)]  # tp 2 is the largest: two slots of two
    assert len(_slots(argparse.Namespace(gpus="1-3", parallel=None), BASE, space_of(max_num_seqs=(8, 16)))) == 3
    assert len(_slots(argparse.Namespace(gpus=None, parallel=1), BASE, space)) == 1
    # tp 8 cannot run on 4 GPUs: the search marks it invalid; the rest still get slots of their size.
    wide = SearchSpace.parse(["tensor-parallel-size=1,8"])
    assert [s.gpus for s in _slots(args, BASE, wide)] == [(0,), (1,), (2,), (3,)]
    # A GPU this process cannot see is refused by name, before anything starts.
    from tui.cli import UserError

    with pytest.raises(UserError, match=r"--gpus 2-5: GPU 4, 5 is not visible here \(visible: 0,1,2,3"):
        _slots(argparse.Namespace(gpus="2-5", parallel=None), BASE, space)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(UserError, match=r"GPU 0 is not visible here \(visible: 1;"):
        _slots(argparse.Namespace(gpus="0", parallel=None), BASE, space)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    sup = slot_supervisor(slots[1])(BASE)
    assert sup.extra_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert not sup.launcher or (sup.launcher[1:3] == ("-c", ",".join(map(str, slots[1].cpus))))


def test_a_lone_trial_on_chosen_gpus_gets_those_gpus_and_every_core() -> None:
    # `vtui tune --gpus 3` on a many-GPU box is one slot: its server must see GPU 3 only (it
    # saw every GPU, and so used GPU 0, before this), not pinned to any core.
    from engine.tune.slots import trial_supervisor

    make = trial_supervisor(Slot(0, (3,), (0, 1, 2, 3)), side_by_side=False)
    assert make is not None
    sup = make(BASE)
    assert sup.extra_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "3"}
    assert sup.launcher == ()
    assert trial_supervisor(Slot(0, (), (0, 1)), side_by_side=False) is None  # a CPU box alone: as always
    beside = trial_supervisor(Slot(1, (), (1,)), side_by_side=True)
    assert beside is not None and beside(BASE).extra_env == {}


def test_slot_supervisor_gives_each_server_its_slots_gpus_and_cores() -> None:
    from engine.tune.slots import slot_supervisor, trial_needs

    slot = Slot(1, (2, 3), (4, 5))
    make = slot_supervisor(slot, taskset="/usr/bin/taskset")
    a, b = make(BASE), make(BASE.set("max-num-seqs", 8))
    assert a.extra_env == b.extra_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert a.launcher == ("/usr/bin/taskset", "-c", "4,5")
    assert a.flags.model == BASE.model and a is not b
    assert slot_supervisor(Slot(0), taskset="/usr/bin/taskset")(BASE).extra_env == {}  # a CPU box: as before
    assert trial_needs(BASE, [{"tensor-parallel-size": 2}, {"pipeline-parallel-size": 2, "tensor-parallel-size": 2},
                              {}]) == [2, 4, 1]


async def test_side_by_side_trials_run_their_own_servers_on_their_own_gpus_and_ports(tmp_path: Any) -> None:
    """Two slots, each a real Supervisor running the stand-in server (tests/fakevllm.py: no
    model on this box for two vLLMs at once) with its slot's CUDA_VISIBLE_DEVICES; both alive
    at once on two ports, each with its own environment, and every process gone at the end.
    Each trial's load generator runs on its slot's cores (issue 19, item 3), as its steps say."""
    import os

    import fakevllm
    import psutil

    from engine.server.supervisor import Supervisor
    from engine.tune.search import ServerMeasurer
    from loadgen.spec import SLO, WorkloadSpec

    seen: dict[int, tuple[int | None, str]] = {}
    ran_on: list[tuple[tuple[int, ...] | None, tuple[int, ...]]] = []
    slots = plan_slots((0, 1, 2, 3), 2, cpus=sorted(os.sched_getaffinity(0))[:2])

    def factory(slot: Slot) -> Any:
        def make(flags: FlagSet) -> Supervisor:
            return Supervisor(flags, env=slot.env(), log_dir=tmp_path, program=fakevllm.command())
        return make

    class Watching(ServerMeasurer):
        async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
            assert self.sup is not None and self.sup.pid is not None
            env = psutil.Process(self.sup.pid).environ()
            seen[self.sup.pid] = (self.sup.port, env.get("CUDA_VISIBLE_DEVICES", ""))
            m = await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)
            if m.completed:
                ran_on.append((self.client_cpus, m.client_cpus))
            return m

    ms = [Watching(WorkloadSpec(input_len=8, output_len=2), SLO(ttft_ms=5000.0), supervisor_factory=factory(s),
                   warmup_burst=0, client_cpus=s.cpus) for s in slots]
    space = space_of(max_num_seqs=(8, 16))
    settings = TuneSettings(budget_s=120, step=StepRule(min_requests=10, max_requests=20), exhaustive=True,
                            start_timeout_s=60, step_timeout_s=30, max_load=20.0)
    model = tmp_path / "model"  # the supervisor checks that a local model folder exists
    model.mkdir()
    tuner = Tuner(ms[0], slots=ms[1:], base_flags=FlagSet(str(model), {}, SCHEMA), space=space,
                  slo=SLO(ttft_ms=5000.0), settings=settings, schema=SCHEMA, validate_flags=False)
    res = await tuner.run()
    assert {c.slot for c in res.configs} == {0, 1}, [(c.key, c.status, c.reason) for c in res.configs]
    assert sorted({gpus for _, gpus in seen.values()}) == ["0,1", "2,3"], [(c.key, c.status, c.reason) for c in res.configs]
    assert len({port for port, _ in seen.values()}) >= 2
    assert ran_on and all(got == asked for asked, got in ran_on), ran_on
    assert {asked for asked, _ in ran_on} == {s.cpus for s in slots}
    assert not [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


async def test_the_live_view_shows_what_each_slot_measures_now() -> None:
    """Issue 19, item 5: every running trial, its slot's GPUs, phase, load and last step."""
    space = space_of(max_num_seqs=(16, 32, 64, 128))
    table = dict(zip(keys(space), (4.0, 7.0, 10.0, 6.0), strict=True))
    tuner, _ = slot_tuner(space, table, 2, exhaustive=True)
    tuner._slot_gpus = ((0, 1), (2, 3))
    seen: list[tuple[Any, ...]] = []
    tuner.on_update = lambda result: seen.append(result.running)
    res = await tuner.run()
    trials = [t for running in seen for t in running]
    assert {(t.slot, t.gpus) for t in trials} == {(0, (0, 1)), (1, (2, 3))}
    assert any(len(running) == 2 for running in seen)  # both slots at once
    assert {t.phase for t in trials} >= {"starting", "measuring", "alone"}
    measured = [t for t in trials if t.last is not None]
    assert measured and all(t.steps >= 1 and t.key in table for t in measured)
    assert all(t.load is not None for t in trials if t.phase == "measuring")
    assert res.running == () and tuner.result().running == ()  # nothing runs once it ended


class PacedMeasurer(SlotMeasurer):
    """Steps of a configuration take ``pace[key]`` real seconds: one trial can finish while
    its neighbour is still on its first steps."""

    pace: dict[str, float] = {}

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        await asyncio.sleep(PacedMeasurer.pace.get(self.key, 0.0))
        return await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)


async def test_a_trial_is_pruned_as_soon_as_a_neighbour_finishes_better() -> None:
    """Issue 19, item 2: a trial that cannot beat the best so far is stopped even while it runs."""
    space = space_of(max_num_seqs=(16, 64))
    k16, k64 = keys(space)
    table: dict[str, Any] = {k16: 4.0, k64: 10.0}
    PacedMeasurer.pace = {k16: 0.05, k64: 0.0}  # 64 brackets its limit while 16 takes its first step
    SlotMeasurer.live, SlotMeasurer.overlaps = set(), []
    clock = FakeClock()
    ms = [PacedMeasurer(i, space, table, clock) for i in range(2)]
    tuner = Tuner(ms[0], slots=ms[1:], base_flags=BASE, space=space, slo=SLO_TTFT,
                  settings=TuneSettings(budget_s=1e9, step=StepRule(min_requests=50)), schema=SCHEMA,
                  clock=clock, max_request_len=192)
    res = await tuner.run()
    rows = {c.key: c for c in res.configs}
    assert rows[k64].status == DONE and res.best is not None and res.best.key == k64
    assert rows[k16].status == DOMINATED and "where max-num-seqs=64 meets it" in rows[k16].reason
    loads16 = [m.load for m in res.measurements[k16]]
    # Checked at the winner's limit, twice, then stopped; 16 is the cheaper (fewer max-num-seqs), which
    # wins a tie within the noise, so at the lower edge of that limit's noise (issue 34, item 4).
    from engine.tune.ranking import tie_load

    assert rows[k64].limit_load is not None
    assert loads16[-2:] == [tie_load(rows[k64].limit_load, 0.05)] * 2
    assert len(loads16) == 3  # inf, then twice at the winner's limit; bracketing its own limit alone took 7
    alone = await Tuner(TableMeasurer(space, {k16: 4.0}, FakeClock()), base_flags=BASE, space=space_of(max_num_seqs=(16,)),
                        slo=SLO_TTFT, settings=TuneSettings(budget_s=1e9, step=StepRule(min_requests=50)),
                        schema=SCHEMA, clock=FakeClock(), max_request_len=192).run()
    assert alone.configs[0].steps > len(loads16)


class SlowStartMeasurer(PacedMeasurer):
    """A PacedMeasurer whose server start also takes ``start_pace[key]`` real seconds, and whose
    ``lucky`` configurations meet the SLO above their real limit once: their first step between
    ``lucky[key]`` and the table's limit passes, every later one there misses (noise on a busy box)."""

    start_pace: dict[str, float] = {}
    lucky: dict[str, float] = {}
    used: set[str] = set()

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        out = await super().start(flags, timeout=timeout)
        await asyncio.sleep(SlowStartMeasurer.start_pace.get(self.key, 0.0))
        return out

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        m = await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)
        real = SlowStartMeasurer.lucky.get(self.key)
        if real is not None and m.ok and load > real:
            if self.key in SlowStartMeasurer.used:
                return Measurement(load, False, "p99 TTFT 900 ms > 500 ms", requests=requests, completed=requests)
            SlowStartMeasurer.used.add(self.key)
        return m


async def beside_search(space: Any, table: dict[str, Any], n: int) -> tuple[TuneResult, list[str]]:
    """The search of ``table`` with ``n`` slots of SlowStartMeasurer; its progress lines too."""
    SlotMeasurer.live, SlotMeasurer.overlaps = set(), []
    SlowStartMeasurer.used = set()
    clock = FakeClock()
    ms = [SlowStartMeasurer(i, space, table, clock) for i in range(n)]
    said: list[str] = []
    tuner = Tuner(ms[0], slots=ms[1:], base_flags=BASE, space=space, slo=SLO_TTFT,
                  settings=TuneSettings(budget_s=1e9, step=StepRule(min_requests=50)), schema=SCHEMA,
                  clock=clock, max_request_len=192, say=said.append)
    return await tuner.run(), said


async def test_a_trial_started_beside_a_neighbour_that_met_a_load_is_measured_there_first() -> None:
    """Issue 19, item 2: with no finished best, a trial starts where a running neighbour has met
    the SLO (not with the capacity probe), and one that misses there twice is dropped once that
    neighbour's limit is confirmed there: the same winner as one at a time, in fewer steps."""
    space = space_of(max_num_seqs=(16, 64, 128))
    k16, k64, k128 = keys(space)
    table: dict[str, Any] = {k16: ("start", "CUDA out of memory"), k64: 10.0, k128: 6.0}
    # 64 (the seed) brackets slowly; 16 fails to start once 64 has met 9.75 (its only pass below
    # its limit 10), so 128 starts in 16's slot while 64 is still measuring.
    PacedMeasurer.pace = {k64: 0.2}  # wide margins: a busy CI box delays the loop by tens of ms
    SlowStartMeasurer.start_pace, SlowStartMeasurer.lucky = {k16: 0.6}, {}
    one, _ = await beside_search(space, table, 1)
    res, said = await beside_search(space, table, 2)
    assert res.best is not None and one.best is not None and res.best.key == one.best.key == k64
    met = [m.load for m in res.measurements[k64] if m.ok]
    assert set(met) == {9.75}
    assert [m.load for m in res.measurements[k128]] == [9.75, 9.75]  # at 64's pass, checked once more; no probe
    rows = {c.key: c for c in res.configs}
    assert rows[k128].status == DOMINATED and f"where {k64} meets it" in rows[k128].reason
    assert any(f"{k128}: violates the SLO at 9.75, where {k64} met it beside it" in line for line in said)
    # One at a time: 128 was measured against the finished best the same way.
    assert [m.load for m in one.measurements[k128]] == [9.75, 9.75]
    assert res.steps < one.steps + 2  # + the winner measured alone once more; nothing else


async def test_a_trial_that_lost_to_a_neighbours_lucky_pass_is_measured_again() -> None:
    """A neighbour's single pass may be luck: a trial that missed that load is not dropped when the
    neighbour's limit does not hold there; it is measured again (its steps reused) and wins, as
    one at a time."""
    space = space_of(max_num_seqs=(16, 64, 128))
    k16, k64, k128 = keys(space)
    table: dict[str, Any] = {k16: ("start", "CUDA out of memory"), k64: 10.0, k128: 6.0}
    PacedMeasurer.pace = {k64: 0.2}  # wide margins: a busy CI box delays the loop by tens of ms
    # 64 really holds only 3: its one pass at 9.75 is luck, its limit check misses (unstable).
    SlowStartMeasurer.start_pace, SlowStartMeasurer.lucky = {k16: 0.6}, {k64: 3.0}
    one, _ = await beside_search(space, table, 1)
    res, said = await beside_search(space, table, 2)
    rows = {c.key: c for c in res.configs}
    assert rows[k64].status == UNSTABLE and {c.key: c.status for c in one.configs}[k64] == UNSTABLE
    assert res.best is not None and one.best is not None and res.best.key == one.best.key == k128
    assert rows[k128].status == DONE and rows[k128].limit_load == {c.key: c for c in one.configs}[k128].limit_load
    assert [m.load for m in res.measurements[k128]][:2] == [9.75, 9.75]  # lost to 64's pass beside it ...
    assert any(line.startswith(f"{k128}: back in the queue") for line in said)  # ... then measured again
    assert res.measurements[k128][2].load == math.inf  # from the start: no limit rules it out


@pytest.mark.parametrize(("resources", "needs", "parallel", "trials", "each"), [
    ({"GPU": 8.0, "CPU": 64.0}, [1, 2, 1, 2], None, 4, 2),  # the largest (tp 2) sizes every actor
    ({"GPU": 8.0, "CPU": 64.0}, [1, 2, 1, 2], 3, 3, 2),  # --parallel caps them
    ({"GPU": 8.0, "CPU": 64.0}, [1, 1], 16, 8, 1),  # a cap above what the GPUs hold changes nothing
    ({"GPU": 6.0}, [4, 1], None, 1, 4),  # 6 GPUs hold one 4-GPU trial; two idle
    ({"GPU": 4.0}, [8, 2], None, 2, 2),  # tp 8 does not fit: the search marks it invalid
    ({"CPU": 16.0}, [1, 2], 4, 1, 0),  # no GPU on the cluster: one actor, no GPUs
])
def test_ray_trials_from_the_clusters_resources(resources: dict[str, float], needs: list[int],
                                                parallel: int | None, trials: int, each: int) -> None:
    # engine.tune.ray imports ray only when a cluster is joined: this runs without it.
    from engine.tune.ray import ray_trials

    plan = ray_trials(resources, needs, parallel=parallel)
    assert (plan.trials, plan.gpus_each) == (trials, each)
    assert (plan.gpus, plan.cpus) == (int(resources.get("GPU", 0)), resources.get("CPU", 0.0))


def test_a_steps_client_cores_are_kept_and_older_steps_still_load() -> None:
    m = Measurement(4.0, True, requests=10, completed=10, client_cpus=(2, 3))
    back = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m and back.client_cpus == (2, 3)
    old = {k: v for k, v in m.to_dict().items() if k != "client_cpus"}  # saved before the field
    assert Measurement.from_dict(old).client_cpus == ()
