"""Attach to a vLLM server vtui did not start (or one a previous vtui left running).

``await attach(url)`` reads ``/version``, ``/v1/models`` and the ``vllm:cache_config_info``
labels of ``/metrics``. When the host is loopback, it finds the process listening on the
port (psutil) and recovers the flags from its command line.

An attached server is only looked at. Restarting it means stopping somebody else's
process, so ``take_over(server, take_over=True)`` is required, after the caller has asked
the user; it stops only that pid's process group (pid and start time checked) and starts
a supervised server with the recovered (or given) flags on the same port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import psutil

from engine.flags import FlagError, FlagSet, load_schema, parse_argv
from engine.server import procs
from engine.server.livehook import strip_launch_args

# is_loopback: one test of "this machine only", the bind policy's
from engine.server.supervisor import Supervisor, is_loopback, list_registered


class AttachError(Exception):
    """The URL does not answer like a vLLM server."""

    def __init__(self, url: str, reason: str, hint: str = "") -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.hint = hint or "Check the URL (scheme, host, port) and that the server is up."


@dataclass(frozen=True)
class AttachedServer:
    """What an attached server says about itself (and, when local, what its process says)."""

    url: str
    version: str | None
    models: tuple[str, ...]
    max_model_len: int | None
    cache_config: Mapping[str, str] = field(default_factory=dict)
    local: bool = False
    pid: int | None = None
    create_time: float | None = None
    pgid: int | None = None
    cmdline: tuple[str, ...] = ()
    flags: FlagSet | None = None  # recovered from the command line
    flags_error: str | None = None  # why the flags could not be recovered
    started_by_vtui: bool = False  # a vtui registry file names this process

    @property
    def model(self) -> str | None:
        return self.models[0] if self.models else None

    @property
    def kv_cache_tokens(self) -> int | None:
        return _int(self.cache_config.get("kv_cache_size_tokens"))

    @property
    def max_concurrency(self) -> float | None:
        try:
            return float(self.cache_config["kv_cache_max_concurrency"])
        except (KeyError, ValueError):
            return None


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    """Labels of ``vllm:cache_config_info`` from a /metrics page ({} when absent or unreadable)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name in ("vllm:cache_config_info", "vllm:cache_config"):
                for sample in family.samples:
                    return dict(sample.labels)
    except Exception:  # garbage in /metrics must not stop an attach
        return {}
    return {}


async def attach(url: str, *, timeout: float = 5.0, api_key: str | None = None) -> AttachedServer:
    """Read what a running server says about itself; raises ``AttachError`` when it is not vLLM."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if not parts.hostname or parts.scheme not in ("http", "https"):
        raise AttachError(url, "not an http(s) URL with a host")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(trust_env=False, timeout=timeout, headers=headers) as client:
        try:
            models_r = await client.get(url + "/v1/models")
        except httpx.HTTPError as exc:
            raise AttachError(url, f"cannot reach /v1/models ({type(exc).__name__})") from exc
        if models_r.status_code == 401:
            raise AttachError(url, "/v1/models needs an API key", "Pass the server's --api-key.")
        if models_r.status_code != 200:
            raise AttachError(url, f"/v1/models answered {models_r.status_code}")
        try:
            data = models_r.json().get("data") or []
            models = tuple(str(m["id"]) for m in data)
            max_len = _int(data[0].get("max_model_len")) if data else None
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise AttachError(url, "/v1/models did not return an OpenAI model list") from exc
        version = None
        try:
            v = await client.get(url + "/version")
            if v.status_code == 200:
                version = str(v.json().get("version")) or None
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        cache: dict[str, str] = {}
        try:
            m = await client.get(url + "/metrics")
            if m.status_code == 200:
                cache = cache_config_labels(m.text)
        except httpx.HTTPError:
            pass
    server = AttachedServer(url=url, version=version, models=models, max_model_len=max_len, cache_config=cache)
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if is_loopback(host):
        server = await asyncio.to_thread(_local_details, server, port)
    return server


def listening_pid(port: int) -> int | None:
    """The topmost process listening on a TCP ``port`` on a loopback or wildcard address, if visible.

    Processes that inherit a listening socket hold it too: ``vllm serve --api-server-count 2``
    listens in the ``vllm serve`` process, and its ``VLLM::APIServer_N`` children (command line
    ``python3 -c from multiprocessing.spawn ...``) accept on the same socket. psutil names one
    pid per socket (the last one it scans, often such a child), so the pid kept is the
    listener none of whose ancestors also listens on that port: the one whose command line
    carries the server's flags and whose tree holds all its processes.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    found: list[int] = []
    for c in conns:
        if c.pid is not None and _is_listener(c, port) and int(c.pid) not in found:
            found.append(int(c.pid))
    tops: list[int] = []
    for pid in found:
        top = pid
        try:
            ancestors = psutil.Process(pid).parents()  # nearest first, up to init
        except psutil.Error:
            ancestors = []
        for parent in ancestors:
            if parent.pid in found or _holds_listener(parent, port):
                top = parent.pid
        if top not in tops:
            tops.append(top)
    return tops[0] if tops else None


def _is_listener(conn: object, port: int) -> bool:
    """Whether a psutil connection listens on ``port`` on a loopback or wildcard address."""
    laddr = getattr(conn, "laddr", None)
    if getattr(conn, "status", None) != psutil.CONN_LISTEN or not laddr or laddr.port != port:
        return False
    ip = laddr.ip
    return ip in ("0.0.0.0", "::") or is_loopback(ip)


def _holds_listener(proc: psutil.Process, port: int) -> bool:
    """Whether ``proc`` holds a socket listening on ``port`` (False when it cannot be read)."""
    try:
        return any(_is_listener(c, port) for c in proc.net_connections(kind="tcp"))
    except (psutil.Error, OSError):
        return False


def _local_details(server: AttachedServer, port: int) -> AttachedServer:
    from dataclasses import replace

    pid = listening_pid(port)
    if pid is None:
        return replace(server, local=True, flags_error="no visible process listens on that port")
    try:
        proc = psutil.Process(pid)
        cmdline = tuple(proc.cmdline())
        create_time = procs.started(proc)
        import os

        pgid = os.getpgid(pid)
    except (psutil.Error, ProcessLookupError, PermissionError) as exc:
        return replace(server, local=True, pid=pid, flags_error=f"cannot read process {pid}: {exc}")
    flags: FlagSet | None = None
    flags_error: str | None = None
    try:
        # Never wait for the installed vLLM's schema here (a first start reads it in the
        # background, 10-100 s on a busy 2-core box): the built-in one reads any command line.
        flags = parse_argv(strip_launch_args(list(cmdline)), load_schema(wait=False))
    except FlagError as exc:
        flags_error = f"cannot read its command line: {exc}"

    registered = any(e.pid == pid and procs.same_start(e.create_time, create_time) for e in list_registered(prune=False))
    return replace(
        server,
        local=True,
        pid=pid,
        create_time=create_time,
        pgid=pgid,
        cmdline=cmdline,
        flags=flags,
        flags_error=flags_error,
        started_by_vtui=registered,
    )


async def stop_attached(server: AttachedServer, *, take_over: bool = False, timeout: float = 15.0) -> None:
    """Stop an attached local server. Refuses unless ``take_over=True`` (the user confirmed).

    Only the process that was found listening (same pid and start time) and its group and
    descendants are signalled: SIGTERM, then SIGKILL after ``timeout``.
    """
    if not take_over:
        raise PermissionError("stopping a server vtui did not start needs take_over=True (ask the user first)")
    if server.pid is None or server.create_time is None:
        raise AttachError(server.url, "no local process is known for this server", "vtui can only stop local servers.")
    root = procs.ProcRef(server.pid, server.create_time)
    if not root.alive():
        return  # already gone, or the pid now belongs to another process: touch nothing
    # Its group only if it leads one (started in its own session); else just its tree.
    pgid = server.pgid if server.pgid == server.pid else None
    left = await asyncio.to_thread(procs.terminate_tree, root, pgid, timeout=timeout)
    if left:
        raise AttachError(server.url, f"processes survived SIGKILL: {[r.pid for r in left]}")


async def take_over(
    server: AttachedServer, flags: FlagSet | None = None, *, take_over: bool = False, timeout: float = 300.0
) -> Supervisor:
    """Stop the attached server and start a supervised one on the same port; returns the Supervisor.

    ``flags`` defaults to the ones recovered from its command line.
    """
    flags = flags if flags is not None else server.flags
    if flags is None:
        raise AttachError(server.url, server.flags_error or "its flags are unknown", "Pass the flags to start it with.")
    parts = urlsplit(server.url)
    await stop_attached(server, take_over=take_over)
    sup = Supervisor(flags, host=parts.hostname or "127.0.0.1", port=parts.port)
    await sup.start(timeout=timeout)
    return sup


def _int(value: object) -> int | None:
    try:
        return int(str(value).replace(",", "")) if value is not None else None
    except ValueError:
        return None


def listening_pid_of_url(url: str) -> int | None:
    """The pid of the server listening on a loopback URL (its process tree is sampled:
    GPU memory share, RSS), None when it is elsewhere or psutil may not say."""
    parts = urlsplit(url)
    if not (parts.hostname and is_loopback(parts.hostname) and parts.port):
        return None
    try:
        return listening_pid(parts.port)
    except Exception:  # noqa: BLE001 - psutil may refuse (permissions): samples without the tree
        return None
