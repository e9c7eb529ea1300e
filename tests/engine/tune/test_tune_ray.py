"""A search's trials as Ray actors (issue 19, item 4), on a Ray cluster started in the test.

The cluster is real (``ray.init`` here, with 4 logical GPUs: these machines have none), and so
are its actors, the GPUs it grants them (CUDA_VISIBLE_DEVICES) and the search. What runs in each
actor is tests/ray_trials.TableTrial, a stand-in for a vLLM server on a GPU (see there).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_trials import TableTrial
from test_tune import BASE, SCHEMA, SLO_TTFT, keys, space_of

from engine.tune.search import DIED, DOMINATED, DONE, StepRule, Tuner, TuneResult, TuneSettings

ray = pytest.importorskip("ray")

from engine.tune.ray import RayMeasurer  # noqa: E402  (after the skip: it needs ray)

HERE = Path(__file__).resolve().parent  # this file's tests import each other by name, in Ray workers too
TESTS = Path(__file__).resolve().parents[2]
SPACE = space_of(max_num_seqs=(16, 32, 64, 128))
TABLE = dict(zip(keys(SPACE), (4.0, 7.0, 10.0, 6.0), strict=True))


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), str(TESTS), str(TESTS.parent)])}})
    yield
    ray.shutdown()


def factory() -> TableTrial:
    return TableTrial(SPACE, TABLE, step_s=0.15)


def search(measurers: list[Any], lines: list[str]) -> Tuner:
    settings = TuneSettings(budget_s=1e9, step=StepRule(min_requests=50), exhaustive=True)
    return Tuner(measurers[0], slots=measurers[1:], base_flags=BASE, space=SPACE, slo=SLO_TTFT, settings=settings,
                 schema=SCHEMA, max_request_len=192, say=lines.append)


def limits(res: TuneResult) -> dict[str, float | None]:
    return {c.key: c.limit_load for c in res.configs if c.status == DONE}


def same_limits(alone: TuneResult, res: TuneResult) -> bool:
    """Where one slot measured a configuration fully, the cluster measured it fully too (side by
    side a trial can start before the best so far would have ruled it out: more rows may be done),
    and found the same limit: the table's, within the search's tolerance, as one slot did.

    The same to the search's tolerance, not to the bit: where a bisection ends depends on its
    path, and side by side a running neighbour's pass can set the path (it anchors the bracket:
    engine.tune.bracket.bracket), which depends on when each actor came up and what its neighbour had met by
    then. A Ray worker process takes seconds to start on a loaded box: with slot 0's actor 0.5 s
    behind slot 1's, max-num-seqs=64 (limit 10) ended at 9.81 or 9.91 req/s, one slot at 9.75."""
    one, many = limits(alone), limits(res)
    tolerance = TuneSettings().tolerance

    def found(key: str, limit: float | None) -> bool:
        return limit is not None and TABLE[key] * (1 - tolerance) <= limit <= TABLE[key]

    return set(one) <= set(many) and all(found(k, one[k]) and found(k, many[k]) for k in one)


async def reference() -> TuneResult:
    """The same search with one slot in this process: what the cluster must find."""
    return await search([factory()], []).run()


# ---------------------------------------------------------------------------- an address that is no head
# These run before the cluster fixture joins this process to the test cluster (it joins once per
# process, and a joined process does not dial again): real sockets on this machine's loopback.


def closed_port() -> int:
    """A loopback port nobody listens on: bound, then closed (the kernel refuses a connect)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def listener(answer: bytes | None) -> Iterator[int]:
    """A loopback port where something that is not Ray listens: it accepts, reads, and says
    ``answer`` (an HTTP/1.1 server's refusal, say) or nothing at all (None)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                held.append(conn)
                conn.recv(64)
                if answer is not None:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        srv.close()
        for conn in held:
            conn.close()


def test_a_closed_port_is_refused_within_seconds_naming_the_address() -> None:
    """ray.init on an address nobody listens on waited over 2 minutes; connect refuses it at once,
    before ray.init (run in a fresh process: this one may have joined the test cluster), and
    `vtui tune --ray` says so as one error line and a hint."""
    import subprocess
    import sys

    port = closed_port()
    script = ("import time, ray; from engine.tune.ray import RayUnavailable, connect\n"
              "t = time.monotonic()\n"
              f"try: connect('127.0.0.1:{port}')\n"
              "except RayUnavailable as exc: print(round(time.monotonic() - t, 2), exc)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=TESTS.parent, capture_output=True, text=True,
                         timeout=120)
    took, _, said = out.stdout.strip().partition(" ")
    assert said == f"ray: nothing listens at 127.0.0.1:{port} (Connection refused): no Ray head there", \
        out.stdout + out.stderr
    assert float(took) < 1.0, took
    cli = subprocess.run([sys.executable, "-c", "import sys; from tui.cli import main; sys.exit(main(sys.argv[1:]))",
                          "tune", "--ray", f"127.0.0.1:{port}", "--slo-ttft-p99-ms", "500",
                          "--space", "max-num-seqs=16,32"],
                         cwd=TESTS.parent, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert f"error: ray: nothing listens at 127.0.0.1:{port} (Connection refused)" in cli.stderr, cli.stderr
    assert "hint: start one with `ray start --head`" in cli.stderr, cli.stderr


@pytest.mark.parametrize(("answer", "said"), [
    (None, "it said nothing in 1 s, not gRPC"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "it said b'HTTP/1.1 ', not gRPC"),
])
def test_a_port_where_something_else_listens_is_refused_within_its_timeout(answer: bytes | None, said: str) -> None:
    """Something that accepts but is no Ray head (ray.init would retry it for minutes): refused
    once it did not answer as a gRPC server does within the timeout, naming the address."""
    from engine.tune.ray import RayUnavailable, check_listening

    with listener(answer) as port:
        t0 = time.monotonic()
        with pytest.raises(RayUnavailable) as info:
            check_listening(f"127.0.0.1:{port}", timeout=1.0)
        took = time.monotonic() - t0
    assert f"something listens at 127.0.0.1:{port}, but not a Ray head ({said}" in str(info.value), info.value
    assert took < 2.0, took


def test_ray_client_and_auto_addresses_are_dialled_where_ray_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray://HOST:PORT (Ray Client) dials its client server at HOST:PORT; auto is what Ray's own
    lookup finds (here RAY_ADDRESS, which it reads first); local dials nothing."""
    from engine.tune.ray import RayUnavailable, check_listening, dial_address

    port = closed_port()
    assert dial_address("local") is None
    assert dial_address(f"ray://head.example:{port}") == ("head.example", port)
    with pytest.raises(RayUnavailable, match=rf"nothing listens at 127\.0\.0\.1:{port} \(ray://127\.0\.0\.1:{port}\)"):
        check_listening(f"ray://127.0.0.1:{port}")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    found = dial_address("auto")  # Ray puts this machine's address for 127.0.0.1, as ray.init dials it
    assert found is not None and found[1] == port, found
    with pytest.raises(RayUnavailable, match=rf"nothing listens at {re.escape(found[0])}:{port} \(auto\)"):
        check_listening("auto")


async def test_x_stops_a_search_still_joining_its_cluster() -> None:
    """x while the Tune screen's search joins its Ray cluster (here a port that accepts and says
    nothing: the join takes its whole timeout): the search ends as "stopped" at once, nothing
    measured nor saved, the session's server not stopped (it is stopped only once the cluster
    gave its actors), and no second search starts while the first join is going."""
    from test_tune_live_slots import SlotTables, form, session_with

    from engine.errors import SessionError
    from engine.session import parse_tune_form
    from engine.tune import ray as tune_ray
    from engine.views import SessionEvent, TuneEnded

    assert not ray.is_initialized(), "runs before the cluster fixture joins this process"
    tables = SlotTables()
    session = session_with(tables.factory, 0)
    released: list[bool] = []

    async def release() -> None:
        released.append(True)

    session._tune_part._release = release
    ended: list[bool] = []
    emit = session._tune_part._emit

    def spy(event: SessionEvent) -> None:  # the search's end, as the session hears it
        if isinstance(event, TuneEnded):
            ended.append(True)
        emit(event)

    session._tune_part._emit = spy
    before = session.snapshot().server.state
    with listener(None) as port:
        request = parse_tune_form(form(session, ray=f"127.0.0.1:{port}"))
        task = asyncio.create_task(session.tune(request))
        while (view := session.snapshot().tune) is None:
            await asyncio.sleep(0.01)
        assert view.status == "joining" and session.tune_active and not view.id, view
        assert view.lines == (f"joining the Ray cluster at 127.0.0.1:{port} (x stops)",)
        with pytest.raises(SessionError, match="a tune is already running"):
            await session.tune(request)
        t0 = time.monotonic()
        assert session.stop_tune()
        result = await asyncio.wait_for(task, 1.0)
        assert time.monotonic() - t0 < 0.5
        assert result.status == "stopped" and result.best is None and not result.configs and result.state_path is None
        view = session.snapshot().tune
        assert view is not None and view.status == "stopped" and not session.tune_active
        assert view.lines[-1] == (f"stopped while joining the Ray cluster at 127.0.0.1:{port}: nothing was "
                                  "measured, and the session's server was not stopped")
        assert not tables.made and not released and ended == [True]
        assert session.snapshot().server.state == before
        assert not session.stop_tune()  # nothing runs now
        # The join goes on in its thread until its dial gives up; a second join meanwhile is refused.
        with pytest.raises(tune_ray.RayUnavailable, match="an earlier search is still joining the Ray cluster"):
            tune_ray.connect(f"127.0.0.1:{port}")
        assert tune_ray._joining.acquire(timeout=tune_ray.DIAL_TIMEOUT_S + 5)
        tune_ray._joining.release()
    assert not ray.is_initialized()


async def test_closing_the_session_while_its_search_joins_a_cluster_ends_the_search() -> None:
    """Quitting vtui while the Tune screen's search joins its Ray cluster (no search task yet)
    stops the join: the search ends as "stopped" and close() does not wait for the join."""
    from test_tune_live_slots import SlotTables, form, session_with

    from engine.session import parse_tune_form
    from engine.tune import ray as tune_ray

    assert not ray.is_initialized(), "runs before the cluster fixture joins this process"
    session = session_with(SlotTables().factory, 0)
    with listener(None) as port:
        task = asyncio.create_task(session.tune(parse_tune_form(form(session, ray=f"127.0.0.1:{port}"))))
        while session.snapshot().tune is None:
            await asyncio.sleep(0.01)
        assert session.tune_active and session._tune_part.task is None
        t0 = time.monotonic()
        await asyncio.wait_for(session.close(stop_server=False), 2.0)
        result = await asyncio.wait_for(task, 1.0)
        assert time.monotonic() - t0 < 1.0 and result.status == "stopped" and not session.tune_active
        assert result.outcome() == "stopped before any configuration met the SLO"
        assert tune_ray._joining.acquire(timeout=tune_ray.DIAL_TIMEOUT_S + 5)  # the join's thread gives up
        tune_ray._joining.release()


async def test_the_tune_screen_shows_the_join_and_x_stops_it() -> None:
    """On the Tune screen: while the search joins its cluster the head says "joining" (no search
    id yet), Stop is enabled and Start is not; x ends it as "stopped" and says so."""
    from test_tune_live_slots import SlotTables, session_with
    from textual.widgets import Button, Input, Static

    from engine.flags import builtin_schema
    from engine.presets import list_presets
    from engine.tune import ray as tune_ray
    from tui.app import VtuiApp
    from tui.widgets.tune import TuneScreen

    assert not ray.is_initialized(), "runs before the cluster fixture joins this process"
    session = session_with(SlotTables().factory, 0)
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)
    with listener(None) as port:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("u")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, TuneScreen)
            screen.query_one("#tune-ray", Input).value = f"127.0.0.1:{port}"
            await pilot.press("g")
            while screen.view is None or screen.view.status != "joining":
                await pilot.pause(0.05)
            head = str(screen.query_one("#tune-head", Static).render())
            assert head.startswith("Tune: joining  ") and "resume" not in head, head
            assert str(screen.query_one("#tune-log", Static).render()) == \
                f"joining the Ray cluster at 127.0.0.1:{port} (x stops)"
            assert not screen.query_one("#tune-stop", Button).disabled
            assert screen.query_one("#tune-start", Button).disabled
            await pilot.press("x")
            for worker in list(app.workers):
                if worker.group == "tune":
                    await worker.wait()
            app.refresh_now()
            await pilot.pause()
            assert screen.view is not None and screen.view.status == "stopped"
            assert str(screen.query_one("#tune-head", Static).render()).startswith("Tune: stopped  ")
            assert "stopped while joining the Ray cluster" in str(screen.query_one("#tune-log", Static).render())
            assert screen.query_one("#tune-stop", Button).disabled and not screen.query_one("#tune-start", Button).disabled
        assert tune_ray._joining.acquire(timeout=tune_ray.DIAL_TIMEOUT_S + 5)  # the join's thread gave up
        tune_ray._joining.release()


async def test_two_ray_actors_on_their_own_gpus_find_what_one_slot_finds(cluster: Any) -> None:
    alone = await reference()
    lines: list[str] = []
    ms = [RayMeasurer(factory, num_gpus=2, num_cpus=0.5, label=f"slot {i}") for i in range(2)]
    tuner = search(ms, lines)
    where: list[str] = []

    async def watch() -> None:
        while not where:
            if len(tuner.result().running) == 2 and all(m.actor is not None for m in ms):
                where.extend([await m.actor.where.remote() for m in ms])  # type: ignore[attr-defined]
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    res = await tuner.run()
    watcher.cancel()
    assert res.best is not None and alone.best is not None and res.best.key == alone.best.key == keys(SPACE)[2]
    assert same_limits(alone, res)
    # Side by side, each actor on the two logical GPUs Ray granted it.
    assert len(where) == 2 and sorted(w.split("GPU ")[1] for w in where) == ["0,1", "2,3"], where
    assert {c.slot for c in res.configs} == {0, 1} and res.best.alone


async def test_an_actor_killed_mid_step_puts_its_trial_on_a_new_actor_and_nothing_is_lost(cluster: Any) -> None:
    alone = await reference()
    lines: list[str] = []
    ms = [RayMeasurer(factory, num_gpus=2, num_cpus=0.5, label=f"slot {i}", say=lines.append) for i in range(2)]
    tuner = search(ms, lines)
    killed: list[tuple[str, int]] = []

    def on_update(result: TuneResult) -> None:
        for t in result.running:
            if not killed and t.slot == 1 and t.phase == "measuring" and t.steps >= 1 and ms[1].actor is not None:
                killed.append((t.key, len(result.measurements.get(t.key, ()))))
                ray.kill(ms[1].actor)  # the node or actor dies while this step runs

    tuner.on_update = on_update
    res = await tuner.run()
    assert killed, "no step of slot 1 was seen running"
    key, before = killed[0]
    assert ms[1].actors_started >= 2
    assert any("slot 1: its Ray actor died" in line and "new actor" in line for line in lines), lines
    rows = {c.key: c for c in res.configs}
    # Re-queued and finished: its limit measured, or ruled out against a better neighbour.
    assert rows[key].status in (DONE, DOMINATED), (rows[key].status, rows[key].reason)
    assert len(res.measurements[key]) > before  # the steps before the kill are kept, and more came
    assert res.best is not None and alone.best is not None and res.best.key == alone.best.key
    assert same_limits(alone, res)


def test_vtui_tune_ray_sizes_the_actors_from_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """`vtui tune --ray ADDRESS`: one actor per trial at once, with the GPUs the largest configuration needs."""
    import argparse

    from engine.tune import ray as tune_ray
    from engine.tune.search import SearchSpace
    from tui.cli import UserError
    from tui.commands.tune import _ray_measurers

    monkeypatch.setattr(tune_ray, "connect", lambda address: {"GPU": 8.0, "CPU": 64.0})
    space = SearchSpace.parse(["tensor-parallel-size=1,2", "max-num-seqs=64,128"])
    lines: list[str] = []

    def args(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"ray": "auto", "gpus": None, "parallel": None, **kw})

    ms = _ray_measurers(args(), BASE, space, lines.append, factory)
    assert [m.num_gpus for m in ms] == [2, 2, 2, 2]  # tp 2 is the largest: four actors of two GPUs
    assert lines == ["Ray cluster at auto: 8 GPUs, 64 CPUs; 4 trials at once, 2 GPUs each"]
    assert len(_ray_measurers(args(parallel=3), BASE, space, lines.append, factory)) == 3
    with pytest.raises(UserError, match="with --ray the cluster grants them"):
        _ray_measurers(args(gpus="0,1"), BASE, space, lines.append, factory)
    monkeypatch.setattr(tune_ray, "connect", lambda address: (_ for _ in ()).throw(
        tune_ray.RayUnavailable("ray", f"no Ray cluster at {address!r}: refused")))
    with pytest.raises(UserError, match="no Ray cluster at 'auto'"):
        _ray_measurers(args(), BASE, space, lines.append, factory)


async def test_a_trial_whose_actors_keep_dying_ends_as_died_and_the_search_goes_on(cluster: Any) -> None:
    lines: list[str] = []
    ms = [RayMeasurer(factory, num_gpus=2, num_cpus=0.5, label=f"slot {i}", say=lines.append, retries=0)
          for i in range(2)]
    tuner = search(ms, lines)
    killed: list[str] = []

    def on_update(result: TuneResult) -> None:
        for t in result.running:
            if not killed and t.slot == 1 and t.phase == "measuring" and ms[1].actor is not None:
                killed.append(t.key)
                ray.kill(ms[1].actor)

    tuner.on_update = on_update
    res = await tuner.run()
    assert killed
    rows = {c.key: c for c in res.configs}
    assert rows[killed[0]].status == DIED and "slot 1: lost 1 Ray actors in a row" in rows[killed[0]].reason
    assert res.best is not None  # the others were measured
    others = [c for c in res.configs if c.key != killed[0]]
    assert others and all(c.status in (DONE, DOMINATED) for c in others), [(c.key, c.status) for c in others]


# ---------------------------------------------------------------------------- from the Tune screen


class ServerTrials:
    """The session's measurer factory, called in each Ray actor (a module-level class: Ray pickles
    it by reference): a real ServerMeasurer (the load generator, the SLO judged on the streams)
    against loadgen.testserver servers started in the test, one per configuration
    (tests/engine/tune/test_tune_live_slots.ConfigServer); only the vLLM process is a stand-in."""

    def __init__(self, urls: dict[int, str]) -> None:
        self.urls = urls

    def __call__(self, workload: Any, slo: Any, *, mode: str, client_cpus: Any = None, **kw: Any) -> Any:
        from test_tune_live_slots import ConfigServer

        from engine.tune.search import ServerMeasurer
        from loadgen.spec import WorkloadSpec

        urls = self.urls
        return ServerMeasurer(WorkloadSpec(input_len=8, output_len=4), slo, mode=mode, warmup_burst=0,
                              client_cpus=client_cpus, supervisor_factory=lambda f: ConfigServer(f, urls))


async def test_the_tune_screens_ray_field_runs_each_trial_on_an_actor_and_finds_the_same_winner(
        cluster: Any) -> None:
    """Issue 19: the Tune form's Ray field, end to end in the core: the same search as the
    session's own server, each trial a Ray actor on the cluster started here (4 logical GPUs,
    its GPU granted by Ray), the session's server stopped first, the running rows naming the
    actors; the same winner."""
    from test_tune_live_slots import config_servers, form, session_with

    from engine.session import parse_tune_form
    from engine.views import TrialView

    settings = TuneSettings(step=StepRule(min_requests=8, max_requests=8, min_step_s=0.1, warmup=0),
                            confirm=False, start_timeout_s=30, step_timeout_s=30, max_load=8.0)
    results: list[TuneResult] = []
    seen: list[TrialView] = []
    with config_servers() as urls:
        for ray_field, parallel in (("", "1"), ("local", "2")):
            session = session_with(ServerTrials(urls), 0)
            released: list[bool] = []
            release = session._tune_part._release
            assert release is not None

            async def recording_release(release: Any = release, released: list[bool] = released) -> None:
                released.append(True)
                await release()

            session._tune_part._release = recording_release
            text = form(session, parallel=parallel, mode="concurrency", start_load="8", ttft_ms="", e2el_ms="5000",
                        ray=ray_field)
            text["space"] = "max-num-seqs=16,32"
            request = parse_tune_form(text)
            assert request.ray == (ray_field or None)

            async def watch(session: Any = session) -> None:
                while True:
                    view = session.snapshot().tune
                    seen.extend(tv for tv in (view.running if view is not None else ()) if tv.where)
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            try:
                res = await asyncio.wait_for(session.tune(request, settings=settings), 60)
            finally:
                watcher.cancel()
            assert released == ([True] if ray_field else [])
            results.append(res)
            lines = session.snapshot().tune.lines  # type: ignore[union-attr]
    one, on_ray = results
    assert one.best is not None and on_ray.best is not None, [(c.key, c.status, c.reason) for c in on_ray.configs]
    assert one.best.key == on_ray.best.key == "max-num-seqs=16"
    assert {c.slot for c in on_ray.configs} == {0, 1}
    assert "Ray cluster at local: 4 GPUs, 4 CPUs; 2 trials at once, 1 GPU each" in lines, lines
    assert any("2 trials at once, each a Ray actor (local)" in line for line in lines), lines
    # The running rows: each a Ray actor on its node's GPU, none of this session's devices.
    wheres = {tv.trial.slot: tv.where for tv in seen}
    assert set(wheres) == {0, 1} and all(not tv.devices for tv in seen), wheres
    assert all(wheres[i].startswith(f"trial slot {i} on ") and " GPU " in wheres[i] for i in wheres), wheres
    # Measured for real, in the actors: streams completed against the test servers.
    fast = {c.key: c.at for c in on_ray.configs}["max-num-seqs=16"]
    assert fast is not None and fast.completed == 8


def test_a_process_joined_to_one_cluster_refuses_another_address(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second search of the same session asking for another cluster is told, not silently put
    on the first one (Ray joins one cluster per process)."""
    from engine.tune import ray as tune_ray

    monkeypatch.setattr(tune_ray, "_joined", "local")
    assert tune_ray.connect("local")["GPU"] == 4.0
    with pytest.raises(tune_ray.RayUnavailable, match=r"joined the Ray cluster at 'local' already, not '10\.0\.0\.5:6379'"):
        tune_ray.connect("10.0.0.5:6379")


def test_a_real_heads_address_passes_the_dial(cluster: Any) -> None:
    """The test cluster's GCS (what HEAD:6379 names on a real cluster) answers the dial as gRPC
    does, at once: a live head is never refused by it."""
    from engine.tune.ray import check_listening

    address = ray.get_runtime_context().gcs_address
    t0 = time.monotonic()
    check_listening(address)
    assert time.monotonic() - t0 < 1.0


# ---------------------------------------------------------------------------- in a terminal

TERMINAL_CHILD = '''
import asyncio, sys, time
from textual.widgets import Input, Static, TextArea
from test_tune_live_slots import config_servers, session_with
from test_tune_ray import ServerTrials
from engine.flags import builtin_schema
from engine.presets import list_presets
from tui.app import VtuiApp

printed = []  # what reached sys.stderr/stdout while the app ran: Textual's capture
_print = VtuiApp._print
VtuiApp._print = lambda self, text, stderr=False: (printed.append(text), _print(self, text, stderr))[1]
with config_servers() as urls:
    session = session_with(ServerTrials(urls), 0)
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)
    said = {}

    async def drive() -> None:
        await asyncio.sleep(0.5)
        app.action_tune()
        await asyncio.sleep(0.5)
        screen = app.screen
        screen.query_one("#tune-ray", Input).value = "local"
        screen.query_one("#tune-parallel", Input).value = "1"
        screen.query_one("#tune-space", TextArea).text = "max-num-seqs=16,32"
        screen.action_start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            await asyncio.sleep(0.2)
            view = session.snapshot().tune
            if view is not None and view.status != "joining" or str(screen.query_one("#tune-error").render()).strip():
                break
        await asyncio.sleep(1.0)
        view = session.snapshot().tune
        said["lines"] = list(view.lines) if view is not None else []
        said["error"] = str(screen.query_one("#tune-error").render())
        said["log"] = [line.text for line in session.snapshot().logs]
        said["screen"] = "\\n".join(str(w.render()) for w in screen.query(Static))
        screen.action_stop()
        await asyncio.sleep(1.0)
        app.exit()

    app.call_later(lambda: app.run_worker(drive(), group="drive"))
    app.run()
import json, ray
ray.shutdown()
said["printed"] = printed
print("\\nSAID " + json.dumps(said), file=sys.__stderr__)
'''


def test_the_ray_field_joins_from_a_terminal_and_rays_warnings_stay_off_the_screen(tmp_path: Path) -> None:
    """vtui in a real terminal (a pty, not headless), the Tune screen's Ray field set to local, in
    a fresh process (this one joined the test cluster already). Two things seen there: ray.init
    failed under the TUI (faulthandler on Textual's stderr capture, fileno -1) until connect
    turned faulthandler on first; and what Ray prints while joining from a thread (the warning
    'SIGTERM handler is not set ...', the token line) goes to sys.stderr, which Textual captures
    and drops in a terminal: it is not in the terminal's bytes, on the screen or in the log,
    so it is left as Ray says it (nothing of Ray's logging is muted)."""
    import json
    import pty
    import select
    import subprocess
    import sys

    child = tmp_path / "child.py"
    child.write_text(TERMINAL_CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(TESTS), str(TESTS.parent)]), "TERM": "xterm-256color",
           "COLUMNS": "140", "LINES": "45"}
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(child)], stdin=sub, stdout=sub, stderr=sub, env=env,
                            cwd=TESTS.parent, start_new_session=True)
    os.close(sub)
    out = b""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(main)
    terminal, _, tail = out.partition(b"\r\nSAID ")
    assert proc.returncode == 0 and tail, out[-2000:]
    said = json.loads(tail.decode().replace("\r\n", "\n"))
    assert not said["error"], said["error"]
    assert "Ray cluster at local: " in "\n".join(said["lines"]), said["lines"]  # joined
    printed = "".join(said["printed"])
    assert "SIGTERM handler is not set" in printed, printed  # Ray said it, to sys.stderr
    for words in ("SIGTERM handler", "Token authentication"):
        assert words.encode() not in terminal, words  # never written on the terminal
        assert words not in said["screen"] and not any(words in line for line in said["log"]), words
    assert "Ray cluster at local: " in said["screen"]  # the Tune screen's own lines are there
