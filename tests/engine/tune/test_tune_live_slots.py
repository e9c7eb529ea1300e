"""The Tune screen's search on several slots (issue 19, items 1 and 5): the form's GPUs and
parallel fields, the slots planned as ``vtui tune --gpus --parallel`` plans them
(engine.tune.slots), and every trial on a server of its own beside the others.

This box has no GPU: the GPUs are logical (a telemetry sample naming them, as NVML would), and
the trials' measurers come from the session's measurer factory, as in
tests/engine/tune/test_session_tune.py: table stand-ins (a known limit per configuration), and, in one
test, real ``ServerMeasurer`` s measuring loadgen.testserver servers (no model) with real load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import tui_data
from standins import ServerStandIn
from test_session_tune import BEST, LIMITS, SETTINGS, SPACE, RecordedMeasurer

from engine.flags import FlagSet
from engine.server.logparse import StartupFacts
from engine.server.supervisor import RestartResult, ServerState
from engine.session import Session, SessionError, TuneFormError, parse_tune_form
from engine.telemetry.nvml import GpuSample
from engine.telemetry.sampler import TelemetrySnapshot
from engine.tune.search import DONE, Measurement, SearchSpace, StepRule, TuneSettings
from engine.tune.slots import Slot, search_slots, slot_measurers
from engine.views import TuneRequest
from loadgen.spec import SLO, WorkloadSpec

GIB = 1 << 30


def gpus_seen(session: Session, n: int) -> None:
    """The session's telemetry sees ``n`` logical GPUs (as NVML's sampler would report them)."""
    t = time.time()
    gpus = tuple(GpuSample(t, i, f"GPU-{i}", "NVIDIA H200", True, None, mem_used_bytes=(10 + i) * GIB,
                           mem_total_bytes=141 * GIB, util_gpu_pct=50.0 + i) for i in range(n))
    session.inject_telemetry(TelemetrySnapshot(t=t, gpus=gpus, host=None, gpu_unavailable=None, sample_cost_s=0.0))


def form(session: Session, **fields: str) -> dict[str, str]:
    return {**session.tune_form_defaults(), "space": "max-num-seqs=64,128\nmax-num-batched-tokens=512,2048",
            "budget_min": "60", "ttft_ms": "500", "tpot_ms": "", **fields}


class SlotTables:
    """The session's measurer factory for trials side by side: a new RecordedMeasurer per call
    (one per slot), each call's keyword arguments kept; ``hold`` gates every step on one event."""

    def __init__(self, *, hold: bool = False) -> None:
        self.made: list[tuple[RecordedMeasurer, dict[str, Any]]] = []
        self.hold = hold
        self.go = asyncio.Event()
        self.inside = 0  # steps waiting at the gate now

    def factory(self, workload: Any, slo: Any, **kwargs: Any) -> RecordedMeasurer:
        owner = self

        class Gated(RecordedMeasurer):
            async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
                if owner.hold:
                    owner.inside += 1
                    try:
                        await owner.go.wait()
                    finally:
                        owner.inside -= 1
                await asyncio.sleep(0.001)  # yield, as a real step does: the slots interleave
                return await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)

        m = Gated(LIMITS)
        self.made.append((m, {"workload": workload, "slo": slo, **kwargs}))
        return m


def session_with(factory: Any, gpus: int) -> Session:
    session = tui_data.make_session()
    session._tune_measurer = factory
    session.load_preset("online-chat")
    if gpus:
        gpus_seen(session, gpus)
    return session


# ---------------------------------------------------------------------------- the form


def test_the_form_reads_gpus_and_parallel() -> None:
    session = session_with(RecordedMeasurer(LIMITS).factory, 0)
    defaults = session.tune_form_defaults()
    assert defaults["gpus"] == "" and defaults["parallel"] == ""  # every GPU seen, one trial per slot
    plain = parse_tune_form(form(session))
    assert isinstance(plain, TuneRequest) and plain.gpus is None and plain.parallel is None
    got = parse_tune_form(form(session, gpus=" 0,2-3 ", parallel="2"))
    assert isinstance(got, TuneRequest) and (got.gpus, got.parallel) == ("0,2-3", 2)
    assert got.space.dims == SPACE.dims and got.slo == SLO(ttft_ms=500.0)


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"gpus": "0,x"}, "gpus", "GPUs '0,x': 'x' is not a GPU index or a range such as 0-3"),
    ({"gpus": "3-1"}, "gpus", "GPUs '3-1': the range '3-1' runs backwards"),
    ({"gpus": "1,1"}, "gpus", "GPUs '1,1': a GPU is named twice"),
    ({"parallel": "0"}, "parallel", "parallel '0': must be at least 1"),
    ({"parallel": "-2"}, "parallel", "parallel '-2': must be at least 1"),
    ({"parallel": "two"}, "parallel", "parallel 'two': not a whole number"),
    ({"parallel": "1.5"}, "parallel", "parallel '1.5': not a whole number"),
])
def test_bad_gpus_or_parallel_names_the_field(fields: dict[str, str], field: str, words: str) -> None:
    session = session_with(RecordedMeasurer(LIMITS).factory, 0)
    with pytest.raises(TuneFormError) as info:
        parse_tune_form(form(session, **fields))
    assert info.value.field == field and words in str(info.value) and info.value.hint


@pytest.mark.parametrize(("fields", "space", "field", "words"), [
    # GPUs the session does not see.
    ({"gpus": "0-3"}, None, "gpus", "GPUs 0-3: GPU 2, 3 is not visible here (visible: 0,1;"),
    # A configuration wider than the GPUs named, or than every GPU the session sees.
    ({"gpus": "1"}, "tensor-parallel-size=1,2", "gpus",
     "tensor-parallel-size=2 needs 2 GPUs (tensor x pipeline x data parallel), and the GPUs field gives 1 (1)"),
    ({}, "tensor-parallel-size=1,2,4\nmax-num-seqs=64,128", "space",
     "needs 4 GPUs (tensor x pipeline x data parallel), and the session sees 2 (0,1) (and 1 more)"),
])
async def test_gpus_the_session_cannot_give_are_refused_on_the_form(
        fields: dict[str, str], space: str | None, field: str, words: str) -> None:
    tables = SlotTables()
    session = session_with(tables.factory, 2)
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    session._tune_part._release = release
    text = form(session, **fields)
    if space is not None:
        text["space"] = space
    with pytest.raises(TuneFormError) as info:
        await session.tune(parse_tune_form(text, schema=session.schema()), settings=SETTINGS)
    assert info.value.field == field and words in str(info.value), str(info.value)
    # Refused before anything: no measurer, the session's server untouched, no search shown.
    assert not tables.made and not released and session.snapshot().tune is None and not session.tune_active


def test_the_form_reads_a_ray_address() -> None:
    pytest.importorskip("ray")
    session = session_with(RecordedMeasurer(LIMITS).factory, 0)
    assert session.tune_form_defaults()["ray"] == ""  # no Ray: trials on this machine
    assert parse_tune_form(form(session, ray="  ")).ray is None
    for address in ("local", "auto", "10.0.0.5:6379", "ray://head.example:10001"):
        got = parse_tune_form(form(session, ray=f" {address} ", parallel="3"))
        assert isinstance(got, TuneRequest) and (got.ray, got.parallel, got.gpus) == (address, 3, None)
        assert got.space.dims == SPACE.dims and got.slo == SLO(ttft_ms=500.0)


@pytest.mark.parametrize(("fields", "field", "words", "hint"), [
    # As `vtui tune` refuses --gpus with --ray: the cluster grants the GPUs.
    ({"ray": "auto", "gpus": "0,1"}, "gpus", "GPUs '0,1' name this machine's GPUs; with Ray the cluster grants them",
     "empty the GPUs field"),
    ({"ray": "head"}, "ray", "Ray 'head': not local, auto or an address such as HEAD:6379", "HEAD:6379"),
    ({"ray": "local please"}, "ray", "Ray 'local please': not local, auto", "empty: no Ray"),
    ({"ray": "local", "parallel": "0"}, "parallel", "parallel '0': must be at least 1", "trials at once"),
])
def test_a_bad_ray_field_names_the_field(fields: dict[str, str], field: str, words: str, hint: str) -> None:
    session = session_with(RecordedMeasurer(LIMITS).factory, 0)
    with pytest.raises(TuneFormError) as info:
        parse_tune_form(form(session, **fields))
    assert info.value.field == field and words in str(info.value) and hint in info.value.hint, info.value


def test_ray_not_installed_is_refused_on_the_ray_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # What Python does when a package is not installed: its import fails and no spec is found.
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    session = session_with(RecordedMeasurer(LIMITS).factory, 0)
    with pytest.raises(TuneFormError) as info:
        parse_tune_form(form(session, ray="local"))
    assert info.value.field == "ray" and "Ray is not installed" in str(info.value)
    assert info.value.hint == "pip install 'vtui[ray]'"


async def test_a_ray_request_the_cluster_cannot_take_is_refused_before_anything_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUs beside Ray given in code, and no cluster at the address (engine.tune.ray.connect
    refusing, as for `vtui tune --ray`: a real unreachable address makes Ray wait minutes):
    refused on the field, the session's server untouched, no search shown."""
    pytest.importorskip("ray")
    from engine.tune import ray as tune_ray

    tables = SlotTables()
    session = session_with(tables.factory, 2)
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    session._tune_part._release = release
    with pytest.raises(TuneFormError) as info:
        await session.tune(TuneRequest(slo=SLO(ttft_ms=500.0), space=SPACE, budget_s=60.0, gpus="0", ray="auto"),
                           settings=SETTINGS)
    assert info.value.field == "gpus"
    monkeypatch.setattr(tune_ray, "connect", lambda address: (_ for _ in ()).throw(
        tune_ray.RayUnavailable("ray", f"no Ray cluster at {address!r}: refused")))
    with pytest.raises(TuneFormError) as info:
        await session.tune(parse_tune_form(form(session, ray="10.0.0.5:6379")), settings=SETTINGS)
    assert info.value.field == "ray" and "no Ray cluster at '10.0.0.5:6379'" in str(info.value)
    assert "ray start --head" in info.value.hint
    assert not tables.made and not released and session.snapshot().tune is None and not session.tune_active


async def test_a_parallel_below_one_given_in_code_names_its_field() -> None:
    session = session_with(SlotTables().factory, 2)
    request = TuneRequest(slo=SLO(ttft_ms=500.0), space=SPACE, budget_s=60.0, parallel=0)
    with pytest.raises(TuneFormError) as info:
        await session.tune(request, settings=SETTINGS)
    assert info.value.field == "parallel" and "parallel 0: must be at least 1" in str(info.value)


async def test_gpus_on_a_box_without_any_are_refused() -> None:
    # No telemetry sample and no NVML here: the session sees no GPU.
    session = session_with(SlotTables().factory, 0)
    with pytest.raises(TuneFormError, match="GPUs 0: no NVIDIA GPU is visible on this machine") as info:
        await session.tune(parse_tune_form(form(session, gpus="0")), settings=SETTINGS)
    assert info.value.field == "gpus"


# ---------------------------------------------------------------------------- the search


async def test_two_slots_find_the_same_winner_as_the_sessions_one_server() -> None:
    # One slot (parallel 1 on the GPUs the session sees): the session's own server, as always.
    one = RecordedMeasurer(LIMITS)
    alone = session_with(one.factory, 2)
    res1 = await alone.tune(parse_tune_form(form(alone, parallel="1")), settings=SETTINGS)
    assert one.kwargs["supervisor"] is alone.supervisor and "supervisor_factory" not in one.kwargs
    assert all(c.slot is None for c in res1.configs)

    # Two slots of one logical GPU each: a measurer per slot, each with its own servers.
    tables = SlotTables(hold=True)
    session = session_with(tables.factory, 2)
    released: list[bool] = []
    release = session._tune_part._release
    assert release is not None

    async def recording_release() -> None:
        released.append(True)
        await release()

    session._tune_part._release = recording_release
    task = asyncio.ensure_future(session.tune(parse_tune_form(form(session)), settings=SETTINGS))
    for _ in range(500):  # both slots inside a step at once
        await asyncio.sleep(0.01)
        if tables.inside == 2 or task.done():
            break
    assert tables.inside == 2, task
    assert released == [True]  # the session's server was stopped before the trials started
    view = session.snapshot().tune
    assert view is not None and view.status == "running"
    running = sorted(view.running, key=lambda tv: tv.trial.slot)
    assert [(tv.trial.slot, tv.trial.gpus) for tv in running] == [(0, (0,)), (1, (1,))]
    # Each row's devices are its slot's GPU only (memory and utilization from the telemetry).
    assert [[d.index for d in tv.devices] for tv in running] == [[0], [1]]
    assert len({tv.trial.key for tv in running}) == 2
    assert any("2 trials at once, each on a server of its own: slot 0 (GPU 0); slot 1 (GPU 1)" in line
               for line in view.lines)
    tables.hold = False
    tables.go.set()
    res2 = await asyncio.wait_for(task, 20)

    assert res1.best is not None and res2.best is not None and res2.best.key == res1.best.key == BEST
    assert {c.slot for c in res2.configs} == {0, 1} and res2.best.alone
    assert {c.key: c.limit_load for c in res2.configs if c.status == DONE}[BEST] == res1.best.limit_load
    # The measurers are vtui tune's: each slot's servers on its GPU, pinned to its cores beside
    # the other (engine.tune.slots.slot_measurers), never the session's server.
    assert len(tables.made) == 2
    slots = search_slots(None, [1], visible=(0, 1))
    for (m, kw), slot in zip(tables.made, slots, strict=True):
        assert "supervisor" not in kw and kw["client_cpus"] == slot.cpus and m.closed
        sup = kw["supervisor_factory"](session.flags)
        assert sup.extra_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(slot.gpus[0])}
        assert not sup.launcher or sup.launcher[1:] == ("-c", ",".join(map(str, slot.cpus)))
        assert kw["workload"] is session._workload and kw["slo"] == SLO(ttft_ms=500.0)
    assert session.snapshot().tune is not None and not session.tune_active


async def test_gpus_named_on_the_form_run_one_slot_on_a_server_of_its_own() -> None:
    # `vtui tune --gpus 1` on a two-GPU box: one trial, on GPU 1, every core (as the CLI).
    tables = SlotTables()
    session = session_with(tables.factory, 2)
    res = await session.tune(parse_tune_form(form(session, gpus="1")), settings=SETTINGS)
    assert res.best is not None and res.best.key == BEST
    [(_, kw)] = tables.made
    assert kw["client_cpus"] is None and "supervisor" not in kw
    sup = kw["supervisor_factory"](session.flags)
    assert sup.extra_env["CUDA_VISIBLE_DEVICES"] == "1" and sup.launcher == ()


def test_slot_measurers_give_each_slot_its_gpus_and_cores() -> None:
    """What `vtui tune` and the Tune screen both build their trials with (the code moved out
    of tui/commands/tune.py): the same slots give the same servers and client cores."""
    made: list[dict[str, Any]] = []

    def factory(workload: Any, slo: Any, **kw: Any) -> dict[str, Any]:
        made.append(kw)
        return kw

    slots = [Slot(0, (0, 1), (0, 1)), Slot(1, (2, 3), (2, 3))]
    wl, slo = WorkloadSpec(input_len=8, output_len=4), SLO(ttft_ms=500.0)
    ms = slot_measurers(slots, wl, slo, mode="concurrency", tokenizer="/m", factory=factory)
    assert ms == made and [m["client_cpus"] for m in made] == [(0, 1), (2, 3)]
    assert all(m["mode"] == "concurrency" and m["tokenizer"] == "/m" and m["arrivals"] is None for m in made)
    base = FlagSet("/m", {})
    envs = [m["supervisor_factory"](base).extra_env["CUDA_VISIBLE_DEVICES"] for m in made]
    assert envs == ["0,1", "2,3"]
    # One slot: on its GPUs, every core; a CPU box alone: the default supervisor, as always.
    [lone] = slot_measurers([Slot(0, (3,), (0, 1))], wl, slo, factory=factory)
    assert lone["client_cpus"] is None and lone["supervisor_factory"](base).launcher == ()
    [cpu] = slot_measurers([Slot(0, (), (0, 1))], wl, slo, factory=factory)
    assert cpu["supervisor_factory"] is None and cpu["client_cpus"] is None


# ---------------------------------------------------------------------------- against a real server


class ConfigServer(ServerStandIn):
    """A started server in front of loadgen.testserver, one per configuration: its URL follows
    the flags it is (re)started with (``urls`` by max-num-seqs), so each configuration is
    measured against its own server's latencies."""

    api_key: str | None = None  # the test server takes any request (ServerMeasurer reads sup.api_key)

    def __init__(self, flags: FlagSet, urls: dict[int, str]) -> None:
        super().__init__(flags, urls[int(str(flags.get("max-num-seqs")))], "test-model", state=ServerState.STOPPED)
        self.urls = urls

    async def start(self, timeout: float) -> StartupFacts:
        self.base_url = self.urls[int(str(self.flags.get("max-num-seqs")))]
        self.state = ServerState.READY
        return StartupFacts()

    async def restart(self, flags: FlagSet, timeout: float) -> RestartResult:
        self.flags = flags
        return RestartResult(0.0, await self.start(timeout))

    async def stop(self) -> None:
        self.state = ServerState.STOPPED


@contextlib.contextmanager
def config_servers() -> Iterator[dict[int, str]]:
    """max-num-seqs=16: a fast server; 32: one whose streams take ~0.4 s (100 ms between tokens)."""
    from loadgen.testserver import ServerConfig, serve_in_thread

    with serve_in_thread(ServerConfig()) as fast, serve_in_thread(ServerConfig(gap_s=0.1)) as slow:
        yield {16: fast, 32: slow}


async def test_two_slots_against_the_test_server_find_the_same_winner_as_one() -> None:
    """Real measurers (engine.tune.search.ServerMeasurer: the load generator, the SLO judged on
    the streams) against loadgen.testserver, one server per configuration; only the vLLM
    process is a stand-in. The fast configuration wins on one slot and on two."""
    from engine.tune.search import ServerMeasurer

    wl = WorkloadSpec(input_len=8, output_len=4)
    settings = TuneSettings(step=StepRule(min_requests=8, max_requests=8, min_step_s=0.1, warmup=0),
                            confirm=False, start_timeout_s=30, step_timeout_s=30, max_load=8.0)
    results = []
    with config_servers() as urls:
        for parallel in ("1", "2"):
            made: list[dict[str, Any]] = []

            def factory(workload: Any, slo: Any, *, supervisor: Any = None, supervisor_factory: Any = None,
                        client_cpus: Any = None, made: list[dict[str, Any]] = made, **kw: Any) -> ServerMeasurer:
                made.append({"session": supervisor is not None, "cpus": client_cpus})
                return ServerMeasurer(wl, slo, mode=kw["mode"], warmup_burst=0, client_cpus=client_cpus,
                                      supervisor_factory=lambda f: ConfigServer(f, urls))

            session = session_with(factory, 2)
            # 8 streams at once, the most there is (max_load): one step per configuration.
            text = form(session, parallel=parallel, mode="concurrency", start_load="8", ttft_ms="",
                        e2el_ms="5000")
            text["space"] = "max-num-seqs=16,32"
            res = await asyncio.wait_for(session.tune(parse_tune_form(text), settings=settings), 30)
            results.append((res, made))
    (one, made1), (two, made2) = results
    assert [m["session"] for m in made1] == [True] and [m["session"] for m in made2] == [False, False]
    assert len({m["cpus"] for m in made2}) == 2  # each trial's client on its own slot's cores
    assert one.best is not None and two.best is not None, [(c.key, c.status, c.reason) for c in two.configs]
    assert one.best.key == two.best.key == "max-num-seqs=16"
    assert {c.slot for c in two.configs} == {0, 1}
    # Measured for real: streams completed, the fast one at more requests per second.
    at = {c.key: c.at for c in two.configs}
    fast, slow = at["max-num-seqs=16"], at["max-num-seqs=32"]
    assert fast is not None and fast.completed == 8
    assert slow is None or (fast.request_throughput or 0) > (slow.request_throughput or 0)


async def test_a_session_error_still_names_no_field_for_other_refusals() -> None:
    # What is not the form's (a tune on an attached server) carries no field to mark.
    from types import SimpleNamespace

    session = session_with(SlotTables().factory, 2)
    session.attach_server(SimpleNamespace(url="http://127.0.0.1:8000", flags=None))
    with pytest.raises(SessionError) as info:
        await session.tune(parse_tune_form(form(session, parallel="2")), settings=SETTINGS)
    assert not isinstance(info.value, TuneFormError) and "attached" in str(info.value)



def test_vtui_tune_still_runs_one_trial_per_slot_on_the_slots_gpus(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`vtui tune` with the measurer building moved to engine.tune.slots: on four logical GPUs
    (tests/fake_nvml.py) a tp 1,2 space is two slots of two, each trial's servers on its slot's
    GPUs and its client on its cores, and the search ends with the right winner. The table
    stand-in answers for the servers; the slots, the measurers' arguments and the search are real."""
    import argparse

    from fake_nvml import FakeNvml

    from engine.telemetry import nvml
    from engine.tune import slots as slots_module
    from tui.commands import tune as tune_cmd

    monkeypatch.setattr(nvml, "_import_pynvml", lambda: FakeNvml(device_count=4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    space = SearchSpace.parse(["tensor-parallel-size=1,2", "max-num-seqs=64,128"])
    table = {space.key(v): limit for v, limit in zip(space.configs(), (3.0, 5.0, 4.0, 9.0), strict=True)}
    built: list[tuple[list[Slot], list[dict[str, Any]]]] = []
    real = slots_module.slot_measurers

    def recording(slots: Any, workload: Any, slo: Any, **kw: Any) -> list[Any]:
        made: list[dict[str, Any]] = []

        def factory(workload: Any, slo: Any, **args: Any) -> RecordedMeasurer:
            made.append(args)
            return RecordedMeasurer(table, space)

        assert kw.get("factory") is None  # the CLI measures with ServerMeasurer: stood in for here
        built.append((list(slots), made))
        return real(slots, workload, slo, **{**kw, "factory": factory})

    monkeypatch.setattr(slots_module, "slot_measurers", recording)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    parser = argparse.ArgumentParser(prog="vtui")
    tune_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune", "--model", str(model), "--slo-ttft-p99-ms", "500", "--min-requests", "10",
                              "--space", "tensor-parallel-size=1,2", "--space", "max-num-seqs=64,128"])
    assert args.func(args) == 0
    [(slots, made)] = built
    assert [s.gpus for s in slots] == [(0, 1), (2, 3)]
    assert [m["client_cpus"] for m in made] == [s.cpus for s in slots]
    base = FlagSet(str(model), {})
    assert [m["supervisor_factory"](base).extra_env["CUDA_VISIBLE_DEVICES"] for m in made] == ["0,1", "2,3"]
    out = capsys.readouterr()
    assert "2 trials at once: slot 0 (GPU 0,1)" in out.err
    assert "best: tensor-parallel-size=2,max-num-seqs=128" in out.out


async def test_the_tune_screen_shows_every_running_trial_and_marks_a_bad_gpus_field() -> None:
    """Issue 19, item 5, end to end: the form's GPUs and parallel reach the search; GPUs the
    session does not see are refused on the field; two slots show two running trials at once,
    each with its slot's GPU."""
    from textual.widgets import Input, Static, TextArea

    from engine.flags import builtin_schema
    from engine.presets import list_presets
    from tui.app import VtuiApp
    from tui.widgets.tune import TuneScreen

    tables = SlotTables(hold=True)
    session = session_with(tables.factory, 2)
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("u")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        screen.query_one("#tune-space", TextArea).text = "max-num-seqs=64,128\nmax-num-batched-tokens=512,2048"
        gpus = screen.query_one("#tune-gpus", Input)
        gpus.value = "0-3"
        await pilot.press("g")
        for _ in range(50):
            await pilot.pause(0.05)
            if gpus.has_class("-invalid"):
                break
        error = str(screen.query_one("#tune-error", Static).render())
        assert "GPUs 0-3: GPU 2, 3 is not visible here" in error and gpus.has_class("-invalid")
        assert not tables.made and session.snapshot().tune is None

        gpus.value = ""
        await pilot.press("g")
        for _ in range(200):
            await pilot.pause(0.05)
            if tables.inside == 2:
                break
        assert tables.inside == 2
        app.refresh_now()
        await pilot.pause()
        lines = str(screen.query_one("#tune-running", Static).render()).splitlines()
        assert len(lines) == 2 and all(" steps" in line for line in lines), lines
        assert lines[0].startswith("▶ GPU 0 max-num-") and lines[1].startswith("▶ GPU 1 max-num-"), lines
        assert lines[0].endswith("[GPU0 10.0/141 GiB 50%]") and lines[1].endswith("[GPU1 11.0/141 GiB 51%]"), lines
        assert not gpus.has_class("-invalid")
        tables.hold = False
        tables.go.set()
        for worker in list(app.workers):
            if worker.group == "tune":
                await worker.wait()
        view = session.snapshot().tune
        assert view is not None and view.best_key == BEST


async def test_the_tune_screen_names_each_ray_trials_actor() -> None:
    """A running trial on a Ray actor (engine.views.TrialView.where): its row names the actor's
    slot, node and GPUs, and shows none of this session's devices."""
    from textual.widgets import Static

    from engine.flags import builtin_schema
    from engine.presets import list_presets
    from engine.tune.search import RunningTrial
    from engine.views import TrialView, TuneView
    from tui.app import VtuiApp
    from tui.widgets.tune import TuneScreen

    session = session_with(SlotTables().factory, 2)
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("u")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        trials = tuple(TrialView(RunningTrial(slot=i, gpus=(), key=f"max-num-seqs={64 * (i + 1)}", phase="measuring",
                                           load=2.0, steps=i), (), where=f"trial slot {i} on node{i} GPU {i}")
                       for i in range(2))
        screen.view = TuneView(id="t1", status="running", mode="rate", slo_label="p99 TTFT <= 500 ms", elapsed_s=1.0,
                               budget_s=60.0, starts=2, steps=1, configs_total=4, lines=(), rows=(), running=trials)
        await pilot.pause()
        lines = str(screen.query_one("#tune-running", Static).render()).splitlines()
        assert lines == ["▶ trial slot 0 on node0 GPU 0 max-num-seqs=64: measuring at 2 req/s, 0 steps",
                         "▶ trial slot 1 on node1 GPU 1 max-num-seqs=128: measuring at 2 req/s, 1 steps"], lines
