"""A search's trials on a Ray cluster: one actor per slot, with the trial's GPUs.

``RayMeasurer`` is a :class:`engine.tune.search.Measurer` for the search's slots: each one asks
Ray for an actor with ``num_gpus`` GPUs (the trial's size), and that actor runs the search's
ordinary measurer (``ServerMeasurer``: the vLLM server and the load generator) on the node Ray
placed it, so the client sits beside its server and no network time is counted as server
latency. Ray sets ``CUDA_VISIBLE_DEVICES`` to the GPUs it granted; the server inherits it.

The search itself (``Tuner``) runs in the driver: it orders the configurations, keeps every
step and writes the history there; an actor only starts servers and measures steps. When an
actor or its node dies during a call, the driver starts a new actor (Ray places it where GPUs
are free), starts the same flags there and repeats the call: the trial goes back in the queue
at the step it was on, and nothing measured before is lost, since the driver holds it.

Ray is an optional extra (``pip install vtui[ray]``); nothing here is imported without it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import importlib.util
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from engine.flags import FlagSet
from engine.tune.search import Measurement, StartOutcome, TuneError
from engine.tune.slots import slot_size

if TYPE_CHECKING:
    from engine.tune.search import Measurer

# The inner measurer, built in the actor (so it must pickle: a module-level function or a
# functools.partial of one, not a lambda of the driver's).
MeasurerFactory = Callable[[], "Measurer"]

# How many times one call is carried to a new actor before the trial is given up.
RETRIES = 3


@dataclass(frozen=True)
class RayTrials:
    """How a search uses a Ray cluster: ``trials`` actors at once, ``gpus_each`` GPUs per actor
    (0 on a cluster without GPUs), out of the cluster's ``gpus`` and ``cpus``."""

    trials: int
    gpus_each: int
    gpus: int
    cpus: float


def ray_trials(resources: Mapping[str, float], needs: Iterable[int], *, parallel: int | None = None) -> RayTrials:
    """One actor per trial at once: each asks for the GPUs the largest configuration that fits
    the cluster needs (engine.tune.slots.slot_size over ``needs``, each configuration's), as
    many as the cluster's GPUs hold, at most ``parallel``; one when it has no GPU."""
    gpus = int(resources.get("GPU", 0))
    size = slot_size(needs, gpus) if gpus else 0
    n = max(1, gpus // size) if size else 1
    n = min(n, parallel) if parallel else n
    return RayTrials(n, size, gpus, float(resources.get("CPU", 0)))


class RayUnavailable(TuneError):
    """Ray is not installed, or no cluster answered at the address."""


def ray_installed() -> bool:
    """Whether Ray can be imported here, without importing it (it takes seconds)."""
    return importlib.util.find_spec("ray") is not None


class _ActorsLost(Exception):
    """Every actor a call was carried to died (RETRIES + 1 of them)."""


@dataclass(frozen=True)
class FlagsMessage:
    """A FlagSet as it crosses to an actor (its schema stays behind: the actor reads its own)."""

    model: str
    values: Mapping[str, object]

    @classmethod
    def of(cls, flags: FlagSet) -> FlagsMessage:
        return cls(flags.model, dict(flags.values))

    def flags(self) -> FlagSet:
        return FlagSet(self.model, dict(self.values))


class TrialActor:
    """What runs in a Ray actor: the search's measurer for one slot (see the module's text)."""

    def __init__(self, factory: MeasurerFactory) -> None:
        self.measurer = factory()

    async def start(self, flags: FlagsMessage, timeout: float) -> StartOutcome:
        return await self.measurer.start(flags.flags(), timeout=timeout)

    async def measure(self, load: float, requests: int, timeout: float, warmup: int) -> Measurement:
        return await self.measurer.measure(load, requests=requests, timeout=timeout, warmup=warmup)

    async def close(self) -> None:
        await self.measurer.close()

    def where(self) -> str:
        """The node and GPUs this actor runs on (for the progress lines)."""
        return f"{socket.gethostname()} GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}"


def _ray() -> tuple[ModuleType, type[Exception]]:
    """The ``ray`` module (as a plain module: its stubs are partial) and its actor-death error."""
    try:
        import ray
        from ray.exceptions import RayActorError
    except ImportError:
        raise RayUnavailable("ray", "Ray is not installed: pip install 'vtui[ray]'") from None
    return ray, RayActorError


# The address this process joined a cluster at (a process joins one; the Tune screen may ask twice).
_joined: str | None = None
# One join at a time: a search stopped while joining leaves its ray.init running in its thread
# (a thread cannot be cancelled), and a second ray.init beside it would race it.
_joining = threading.Lock()
_asked: str | None = None  # the address of the join holding it
# How long the cluster's address may take to accept a TCP connection: a head answers in
# milliseconds (a round trip), while ray.init on an address nobody listens on waits over two
# minutes before it fails (measured): so dial it first, and say so at once.
DIAL_TIMEOUT_S = 3.0


def dial_address(address: str) -> tuple[str, int] | None:
    """The host and port ``ray.init(address)`` dials first, or None when it dials nothing
    ("local" starts a cluster here). "auto" is what Ray's own lookup finds (RAY_ADDRESS, else
    the latest ``ray start`` on this machine, else a running GCS process): RayUnavailable when
    it finds none. ``ray://HOST:PORT`` (Ray Client) dials its client server at HOST:PORT
    (10001 by default); HOST:PORT a head's GCS (6379 by default)."""
    if address == "local":
        return None
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address("auto")
        except ConnectionError as exc:  # nothing found: Ray says so at once
            raise RayUnavailable("ray", f"no Ray cluster at 'auto': {exc}") from None
        if found is None:
            return None
        address = found
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise RayUnavailable("ray", f"Ray address {address!r}: not HOST:PORT") from None


# What an HTTP/2 client sends first (RFC 9113, 3.4): the preface, then an empty SETTINGS frame.
# Ray's GCS and its client server are gRPC servers, so they answer with a SETTINGS frame (type 4)
# at once (2 ms against the test cluster's GCS); ray.init against a port where something else
# listens, and says nothing, retries for minutes.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
H2_SETTINGS = 4


def check_listening(address: str, timeout: float = DIAL_TIMEOUT_S) -> None:
    """RayUnavailable naming the address when what ``ray.init(address)`` would dial
    (:func:`dial_address`) does not accept a TCP connection within ``timeout`` seconds (at once
    for a closed port on a host that answers), or accepts it but does not answer as a gRPC
    server does (a SETTINGS frame) within ``timeout``: not a Ray head, or not its GCS port.
    With RAY_USE_TLS set, the gRPC answer is not asked for (the port speaks TLS first)."""
    where = dial_address(address)
    if where is None:
        return
    host, port = where
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    named = "" if address == shown else f" ({address})"  # ray://, auto: what was asked
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("", "0", "false"):
                conn.sendall(H2_PREFACE)
                answer = _read(conn, 9, timeout)  # a frame's header: length (3), type (1), flags, stream id
                if len(answer) < 9 or answer[3] != H2_SETTINGS:
                    said = f"it said {answer[:16]!r}" if answer else f"it said nothing in {timeout:g} s"
                    raise RayUnavailable("ray", f"something listens at {shown}{named}, but not a Ray head ({said}, "
                                                "not gRPC): a head's port is 6379 unless `ray start --head --port` "
                                                "says otherwise, a Ray Client's (ray://) 10001")
    except TimeoutError:
        raise RayUnavailable("ray", f"nothing answers at {shown}{named} within {timeout:g} s: no Ray head there, "
                                    "or a firewall drops the connection") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RayUnavailable("ray", f"nothing listens at {shown}{named} ({reason}): no Ray head there") from None


def _read(conn: socket.socket, n: int, timeout: float) -> bytes:
    """Up to ``n`` bytes from ``conn`` within ``timeout`` seconds in all (fewer: it closed or went quiet)."""
    data = b""
    end = time.monotonic() + timeout
    while len(data) < n:
        left = end - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(n - len(data))
        except (TimeoutError, ConnectionError):
            break
        if not chunk:
            break
        data += chunk
    return data


def connect(address: str) -> dict[str, float]:
    """Join the Ray cluster at ``address`` ("auto": the one this machine belongs to; "local":
    start one here) and return its resources ({"GPU": 8.0, "CPU": 128.0, ...}). Joined already
    (an earlier search of this session, or ``ray.init`` by the caller): that cluster, unless
    this process joined another address here (RayUnavailable: Ray joins one per process).
    An address nobody listens on is refused within seconds (:func:`check_listening`), where
    ``ray.init`` would wait minutes; an earlier join still going (a search stopped while it
    joined) is refused, not raced."""
    global _joined, _asked
    ray, _ = _ray()
    if not _joining.acquire(blocking=False):
        raise RayUnavailable("ray", f"an earlier search is still joining the Ray cluster at {_asked!r} (a thread "
                                    "cannot be stopped): wait for it to fail or join, or restart vtui")
    try:
        _asked = address
        if not ray.is_initialized():
            check_listening(address)
            _faulthandler_on_the_terminal()
            try:
                if address == "local":
                    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
                else:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RayUnavailable("ray", f"no Ray cluster at {address!r}: {exc}") from None
            _joined = address
        elif _joined is not None and address != _joined:
            raise RayUnavailable("ray", f"this process joined the Ray cluster at {_joined!r} already, not "
                                        f"{address!r} (Ray joins one cluster per process): restart vtui to use another")
        return {k: float(v) for k, v in ray.cluster_resources().items()}
    finally:
        _joining.release()


def _faulthandler_on_the_terminal() -> None:
    """ray.init turns faulthandler on (fatal errors' tracebacks) on ``sys.stderr``; under the TUI
    that is Textual's capture, whose fileno() is -1, so faulthandler.enable raised RuntimeError
    and ray.init failed ("file.fileno() is not a valid file descriptor": the Tune screen's Ray
    field joined no cluster in a terminal). Turned on here on the process's own stderr, as Ray
    does outside the TUI, ray.init leaves it be."""
    if faulthandler.is_enabled() or sys.__stderr__ is None:
        return
    try:
        faulthandler.enable(file=sys.__stderr__, all_threads=False)
    except (RuntimeError, ValueError, OSError):
        pass  # no usable stderr at all: ray.init says what it makes of that


def ray_measurers(address: str, needs: Iterable[int], factory: MeasurerFactory, *, parallel: int | None = None,
                  say: Callable[[str], None] = lambda line: None) -> list[RayMeasurer]:
    """The search's trials on the Ray cluster at ``address`` (``vtui tune --ray`` and the Tune
    screen's Ray field both build them here): joins it (:func:`connect`), sizes one actor per
    trial at once (:func:`ray_trials` over ``needs``, each configuration's GPUs, at most
    ``parallel``), says so, and returns one :class:`RayMeasurer` per actor, each running
    ``factory``'s measurer: the first is the ``Tuner``'s measurer, the rest its ``slots``.
    RayUnavailable when Ray is not installed or no cluster answers at ``address``."""
    plan = ray_trials(connect(address), needs, parallel=parallel)
    size = plan.gpus_each
    say(f"Ray cluster at {address}: {plan.gpus} GPUs, {plan.cpus:g} CPUs; {plan.trials} trials at once, "
        f"{size} GPU{'s' if size != 1 else ''} each")
    return [RayMeasurer(factory, num_gpus=size, label=f"trial slot {i}", say=say) for i in range(plan.trials)]


class RayMeasurer:
    """One slot of a search, as a Ray actor with ``num_gpus`` GPUs (see the module's text).

    ``say``: a progress line when an actor is lost and its trial carried to a new one."""

    def __init__(self, factory: MeasurerFactory, *, num_gpus: float, num_cpus: float = 1.0,
                 label: str = "", say: Callable[[str], None] = lambda line: None,
                 retries: int = RETRIES) -> None:
        self.factory = factory
        self.num_gpus = num_gpus
        self.num_cpus = num_cpus
        self.label = label or f"{num_gpus:g}-GPU actor"
        self.say = say
        self.retries = retries
        self.actor: object | None = None
        self.actors_started = 0
        self._started: tuple[FlagsMessage, float] | None = None  # the trial's flags and start timeout
        self._ready_actor: object | None = None  # the actor whose server runs them
        self.placed = ""  # where its actor runs: "node GPU 2,3" (TrialActor.where), once started

    def where(self) -> str:
        """This slot for the Tune screen's running trials: its label and its actor's node and GPUs."""
        return f"{self.label} on {self.placed}" if self.placed else self.label

    def _new_actor(self) -> object:
        ray, _ = _ray()
        cls = ray.remote(TrialActor).options(num_gpus=self.num_gpus, num_cpus=self.num_cpus,
                                             max_concurrency=4)
        self.actor = cls.remote(self.factory)
        self.actors_started += 1
        return self.actor

    async def _call(self, name: str, *args: object) -> object:
        _, actor_error = _ray()
        for attempt in range(self.retries + 1):
            actor = self.actor if self.actor is not None else self._new_actor()
            try:
                if name != "start" and self._started is not None and actor is not self._ready_actor:
                    # A new actor after a loss: bring its server up with the trial's flags first.
                    await self._remote(actor, "start", *self._started)
                return await self._remote(actor, name, *args)
            except actor_error as exc:
                self.actor = self._ready_actor = None
                if attempt == self.retries:
                    raise _ActorsLost(f"{self.label}: lost {self.retries + 1} Ray actors in a row "
                                      f"({type(exc).__name__})") from None
                self.say(f"{self.label}: its Ray actor died ({type(exc).__name__}); the trial goes on "
                         "on a new actor, from the step it was on")
        raise AssertionError("unreachable")

    async def _remote(self, actor: object, name: str, *args: object) -> object:
        result: object = await getattr(actor, name).remote(*args)
        if name == "start":
            self._ready_actor = actor  # its server runs the trial's flags now
            self.placed = str(await self._remote(actor, "where"))
        return result

    async def start(self, flags: FlagSet, *, timeout: float) -> StartOutcome:
        message = FlagsMessage.of(flags)
        self._started = (message, timeout)
        try:
            outcome = await self._call("start", message, timeout)
        except _ActorsLost as exc:
            return StartOutcome(False, reason=str(exc), hint="see `ray status`: a node may be down")
        assert isinstance(outcome, StartOutcome)
        return outcome

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        try:
            m = await self._call("measure", load, requests, timeout, warmup)
        except _ActorsLost as exc:
            # The trial ends as a server death would (the search goes on with the others).
            return Measurement(load, False, str(exc), requests=requests, fatal=str(exc))
        assert isinstance(m, Measurement)
        return m

    async def close(self) -> None:
        actor, self.actor, self._ready_actor, self._started = self.actor, None, None, None
        if actor is None:
            return
        ray, actor_error = _ray()
        try:
            await asyncio.wait_for(self._remote(actor, "close"), 60)
        except (TimeoutError, actor_error):
            pass  # gone already, or stuck: killed below either way
        ray.kill(actor)
