"""A model plus typed flag values (FlagSet), and the command lines written from it:
argv for exec, a ``vllm serve`` line, a ``docker run`` line (DockerRun, CommandLine)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Protocol, TypeVar, cast

from engine.flags.schema import Schema, _current_schema, installed_vllm_version
from engine.flags.spec import (
    _CONTAINER_HF_CACHE,
    _CONTAINER_MODELS,
    _DEFAULT_IMAGE,
    _ENV_REF,
    SECRET_FLAGS,
    FlagError,
    FlagSpec,
    _flag_value,
    _looks_like_option,
    _norm,
)

# docker run options that take a value (the rest are switches such as --rm, -d, -it).
_DOCKER_VALUE_OPTS = {
    "-a", "--attach", "--add-host", "--annotation", "--blkio-weight", "--cap-add", "--cap-drop",
    "--cgroup-parent", "--cgroupns", "--cidfile", "--cpu-period", "--cpu-quota", "--cpu-shares",
    "-c", "--cpus", "--cpuset-cpus", "--cpuset-mems", "--device", "--device-cgroup-rule",
    "--dns", "--dns-option", "--dns-search", "--domainname", "--entrypoint", "-e", "--env",
    "--env-file", "--expose", "--gpus", "--group-add", "--health-cmd", "--health-interval",
    "--health-retries", "--health-start-period", "--health-timeout", "-h", "--hostname", "--ip",
    "--ip6", "--ipc", "--isolation", "--kernel-memory", "-l", "--label", "--label-file", "--link",
    "--log-driver", "--log-opt", "--mac-address", "-m", "--memory", "--memory-reservation",
    "--memory-swap", "--memory-swappiness", "--mount", "--name", "--network", "--net",
    "--network-alias", "--pid", "--pids-limit", "--platform", "-p", "--publish", "--pull",
    "--restart", "--runtime", "--security-opt", "--shm-size", "--stop-signal", "--stop-timeout",
    "--storage-opt", "--sysctl", "--tmpfs", "-u", "--user", "--ulimit", "--userns", "--uts",
    "-v", "--volume", "--volumes-from", "-w", "--workdir",
}


def _freeze(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


_N = TypeVar("_N", int, float)


class FlagsLike(Protocol):
    """What a server's supervisor (``engine.server.supervisor.Supervisor``) needs of a
    :class:`FlagSet`: the argv and the record without secrets, and the secrets apart (handed
    to the child in its environment only). Here, below the supervisor, so that the flags
    (``FlagSet.same_launch``, ``validate.recordable_values``) can take a Supervisor's flags too."""

    @property
    def model(self) -> str: ...

    def to_argv(self, *, include_secrets: bool = False) -> list[str]: ...

    def to_dict(self, *, include_secrets: bool = False) -> dict[str, object]: ...

    def secret_env(self) -> dict[str, str]: ...

    def get(self, name: str, default: object = None) -> object: ...


@dataclass(frozen=True)
class FlagSet:
    """A model plus typed ``vllm serve`` flag values (canonical names, no dashes).

    Immutable: ``set``/``unset`` return new sets. ``schema`` types new values and
    formats booleans; it is not part of equality.
    """

    model: str
    values: Mapping[str, object] = field(default_factory=dict)
    schema: Schema | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType({k: _freeze(v) for k, v in self.values.items()}))

    def __repr__(self) -> str:
        shown = {k: ("***" if k in SECRET_FLAGS and not _is_env_ref(v) else v) for k, v in self.values.items()}
        return f"FlagSet(model={self.model!r}, values={shown!r})"

    def _schema(self) -> Schema:
        return self.schema or _current_schema()

    def _spec(self, name: str) -> FlagSpec | None:
        return self._schema().get(name)

    def get(self, name: str, default: object = None) -> object:
        """The value of ``name`` (any spelling), or ``default`` when not set."""
        spec = self._spec(name)
        return self.values.get(spec.name if spec else _norm(name), default)

    def get_int(self, name: str) -> int | None:
        """The value of an integer flag, or None when unset; FlagError when it is not one."""
        return self._number(name, "an integer", int)

    def get_float(self, name: str) -> float | None:
        """The value of a numeric flag, or None when unset; FlagError when it is not one."""
        return self._number(name, "a number", float)

    def _number(self, name: str, what: str, convert: Callable[[int | float | str], _N]) -> _N | None:
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, bool) and isinstance(value, (int, float, str)):
            try:
                return convert(value)
            except ValueError:
                pass
        raise FlagError(name, f"expected {what}, got {value!r}")

    def get_str(self, name: str) -> str | None:
        """The value of a flag as text, or None when unset."""
        value = self.get(name)
        return None if value is None else str(value)

    def set(self, name: str, value: object) -> FlagSet:
        """A copy with ``name`` set. Text is parsed as vLLM would; typed values are
        checked. None unsets. A flag the schema does not know is kept as given
        (validate() reports it). Raises FlagError for a value of the wrong type.
        """
        if _norm(name) == "model":
            return FlagSet(str(value), self.values, self.schema)
        spec = self._spec(name)
        key = spec.name if spec else _norm(name)
        typed = spec.coerce(value) if spec else value
        values = dict(self.values)
        if typed is None:
            values.pop(key, None)
        else:
            values[key] = typed
        return FlagSet(self.model, values, self.schema)

    def unset(self, name: str) -> FlagSet:
        """A copy without ``name``."""
        spec = self._spec(name)
        values = dict(self.values)
        values.pop(spec.name if spec else _norm(name), None)
        return FlagSet(self.model, values, self.schema)

    def with_schema(self, schema: Schema) -> FlagSet:
        """The same values, typed and formatted by ``schema`` from now on."""
        return FlagSet(self.model, self.values, schema)

    # -- argv and lines ----------------------------------------------------------

    def _chunks(self, *, secrets: Literal["value", "ref", "omit"], skip: Iterable[str] = ()) -> list[list[str]]:
        """One argv chunk per flag. With secrets="ref" a secret chunk holds a raw
        shell fragment (``"$VLLM_API_KEY"``) marked by a leading NUL."""
        out: list[list[str]] = []
        skipped = set(skip)
        for name, value in self.values.items():
            if name in skipped:
                continue
            spec = self._spec(name) or _guess_spec(name, value)
            if name in SECRET_FLAGS or spec.secret:
                if secrets == "omit":
                    continue
                if secrets == "ref":
                    var = _env_ref_name(value) or SECRET_FLAGS.get(name, _env_name(name))
                    out.append([f"--{name}", f'\0"${var}"'])
                    continue
                value = _resolve_secret(name, value)
            chunk = spec.to_argv(value)
            if chunk:
                out.append(chunk)
        return out

    def to_argv(self, *, include_secrets: bool = False) -> list[str]:
        """Flags after the model, for exec (never through a shell).

        Secrets are left out by default: pass :meth:`secret_env` to the child instead, so
        they show in no ``ps``, log line or screen. ``include_secrets=True`` resolves them
        (``$VLLM_API_KEY`` references read from the environment): only to compare two
        launches, never to show or exec.
        """
        return [tok for chunk in self._chunks(secrets="value" if include_secrets else "omit") for tok in chunk]

    def display_argv(self) -> list[str]:
        """The argv as it may be shown (a preview, a progress line): secrets as
        ``$VLLM_API_KEY``-style references, never their values."""
        return [tok.lstrip("\0") for chunk in self._chunks(secrets="ref") for tok in chunk]

    def same_launch(self, other: FlagSet | FlagsLike) -> bool:
        """Whether ``other`` launches the same server (model and every flag, secrets included).

        ``other``: a FlagSet, or a Supervisor's flags (FlagsLike)."""
        return bool(str(self.model) == str(other.model)
                    and self.to_argv(include_secrets=True) == other.to_argv(include_secrets=True))

    def secret_env(self) -> dict[str, str]:
        """Environment variables that carry the secret flags (VLLM_API_KEY, HF_TOKEN)."""
        env: dict[str, str] = {}
        for name, var in SECRET_FLAGS.items():
            if name in self.values:
                value = _resolve_secret(name, self.values[name])
                env[var] = value[0] if isinstance(value, tuple) and value else str(value)
        return env

    def to_serve_line(self, *, multiline: bool = False, program: str = "vllm serve") -> str:
        """A ``vllm serve MODEL --flag value ...`` line, quoted with shlex.

        Secrets appear as ``"$VLLM_API_KEY"``-style references, never as values.
        """
        head = program.split()
        if self.model and _looks_like_option(self.model):
            head += [f"--model={self.model}"]  # a positional "-x" would read as a flag
        elif self.model:
            head.append(self.model)
        return _join_line([head, *self._chunks(secrets="ref")], multiline=multiline)

    def to_docker_line(
        self,
        *,
        host_port: int | None = None,
        gpus: str | int | Sequence[int] | None = None,
        image: str | None = None,
        version: str | None = None,
        hf_cache: str = "~/.cache/huggingface",
        env: Sequence[str] = ("HF_TOKEN",),
        multiline: bool = True,
        name: str | None = None,
        docker: DockerRun | None = None,
    ) -> str:
        """A ``docker run ... vllm/vllm-openai:v<version> --model ... --flags`` line.

        GPUs: ``"all"`` (the default), a count, or device ids (``[0, 1]`` -> ``--gpus
        '"device=0,1"'``). A local model folder is mounted read-only under /models and
        ``--model`` points there. Environment variables are passed by name only (``-e
        HF_TOKEN``). The server listens on all interfaces inside the container (``--host``
        is dropped) and ``-p HOST_PORT:PORT`` publishes it.

        ``docker``: the options and image of an imported ``docker run`` line. They are kept
        as the user wrote them, in order, image tag included; ``host_port``, ``gpus``,
        ``image`` and ``version`` replace theirs only when given, and vtui adds only what the
        line needs to work (a mount for a local model folder, ``-e`` for a secret in use).
        """
        if docker is not None:
            return self._docker_line_from(docker, host_port=host_port, gpus=gpus, image=image,
                                          version=version, multiline=multiline)
        port = _port(self.values)
        hp = port if host_port is None else host_port
        img = image or default_image(version)
        chunks: list[list[str]] = [["docker", "run"], ["--runtime", "nvidia", "--gpus", _gpus_arg(gpus)]]
        if name:
            chunks.append(["--name", name])
        chunks.append(["--ipc=host"])
        chunks.append(["-p", f"{hp}:{port}"])
        if hf_cache.startswith("~/"):
            # "~/" stays unquoted so the shell expands it; the rest is quoted.
            hf_mount = "\0~/" + shlex.quote(f"{hf_cache[2:]}:{_CONTAINER_HF_CACHE}")
        else:
            hf_mount = f"{hf_cache}:{_CONTAINER_HF_CACHE}"
        chunks.append(["-v", hf_mount])
        model = self._docker_model(chunks, None)
        env_names = list(dict.fromkeys([*env, *(SECRET_FLAGS[k] for k in SECRET_FLAGS if k in self.values)]))
        for var in env_names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
                raise FlagError("", f"environment variable name {var!r} is not valid")
            chunks.append(["-e", var])
        chunks.append([img])
        if model:
            chunks.append(_flag_value("--model", model))
        # Secrets travel as -e VAR: vLLM reads VLLM_API_KEY, huggingface_hub HF_TOKEN.
        chunks += self._chunks(secrets="omit", skip=("host",))
        return _join_line(chunks, multiline=multiline)

    def _docker_model(self, chunks: list[list[str]], docker: DockerRun | None) -> str:
        """The model as the container sees it: a local folder is mounted read-only under
        /models (appended to ``chunks``) unless ``docker``'s own mounts already hold it."""
        local = _local_dir(self.model)
        if local is None:
            return self.model
        host = str(local.resolve())
        inside = docker.container_path(host) if docker is not None else None
        if inside is None:
            if ":" in host or "," in host:
                raise FlagError("model", f"folder {host!r} contains ':' or ',', which docker -v cannot mount")
            inside = str(_CONTAINER_MODELS / (local.resolve().name or "model"))
            chunks.append(["-v", f"{host}:{inside}:ro"])
        return inside

    def _docker_line_from(self, docker: DockerRun, *, host_port: int | None, gpus: str | int | Sequence[int] | None,
                          image: str | None, version: str | None, multiline: bool) -> str:
        port = _port(self.values)
        chunks: list[list[str]] = [[docker.program, "run"]]
        gpus_done = False
        for opt, val in docker.options:
            if val is not None and opt in ("-p", "--publish") and host_port is not None \
                    and _published_port(val) == port:
                val = f"{host_port}:{port}"
            elif opt == "--gpus" and gpus is not None:
                if gpus_done:
                    continue
                val, gpus_done = _gpus_arg(gpus), True
            if val is None:
                chunks.append([opt])
            elif opt in _DOCKER_VALUE_OPTS:
                chunks.append([opt, val])
            else:
                chunks.append([f"{opt}={val}"])  # a switch written with a value: --rm=false
        if gpus is not None and not gpus_done:
            chunks.append(["--gpus", _gpus_arg(gpus)])
        if host_port is not None and not docker.publishes():
            chunks.append(["-p", f"{host_port}:{port}"])
        model = self._docker_model(chunks, docker)
        for var in (SECRET_FLAGS[k] for k in SECRET_FLAGS if k in self.values):
            if var not in docker.env_names():
                chunks.append(["-e", var])
        chunks.append([image or docker.image_tagged(version)])
        if model:
            chunks.append(_flag_value("--model", model))
        chunks += self._chunks(secrets="omit", skip=("host",))
        return _join_line(chunks, multiline=multiline)

    # -- dict form ------------------------------------------------------------------

    def to_dict(self, *, include_secrets: bool = False) -> dict[str, object]:
        """Flat JSON/TOML-friendly form: ``{"model": ..., "max-num-seqs": 128, ...}``.

        Secrets become ``$VLLM_API_KEY``-style references unless include_secrets.
        """
        out: dict[str, object] = {"model": self.model}
        for name, value in self.values.items():
            if name in SECRET_FLAGS and not include_secrets and not _is_env_ref(value):
                value = f"${SECRET_FLAGS[name]}"
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object], schema: Schema | None = None) -> FlagSet:
        """Inverse of to_dict(); keys may use dashes or underscores. Raises FlagError.

        Also accepts the nested form ``{"model": ..., "values": {...}}``.
        """
        sch = schema or _current_schema()
        nested = data.get("values")
        if isinstance(nested, Mapping) and sch.get("values") is None:
            data = {"model": data.get("model", ""), **nested}
        model = data.get("model", "")
        if not isinstance(model, str):
            raise FlagError("model", f"expected text, got {model!r}")
        fs = cls(model, {}, sch)
        for key, value in data.items():
            if key == "model":
                continue
            fs = fs.set(str(key), value)
        return fs

    def diff(self, other: FlagSet) -> dict[str, tuple[object, object]]:
        """``{name: (self's value, other's value)}`` for every difference (None = unset)."""
        out: dict[str, tuple[object, object]] = {}
        if self.model != other.model:
            out["model"] = (self.model, other.model)
        for name in [*self.values, *(k for k in other.values if k not in self.values)]:
            a, b = self.values.get(name), other.values.get(name)
            if a != b:
                out[name] = (a, b)
        return out


def devices_needed(values: Mapping[str, object]) -> int:
    """GPUs one server with these flag values uses: tensor x pipeline x data parallel sizes."""
    n = 1
    for name in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        v = values.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            n *= v
    return n


def _port(values: Mapping[str, object]) -> int:
    """The port the server listens on: --port (an int flag), else vLLM's 8000."""
    # Typed int by the schema; int() raises on anything else, as it always did.
    return int(cast("int | str", values.get("port", 8000)))


def _local_dir(model: str) -> Path | None:
    """The model as an existing local folder, or None (a Hugging Face id, say)."""
    if not model:
        return None
    try:
        path = Path(os.path.expanduser(model))  # "~nosuchuser" stays as it is
        return path if path.is_dir() else None
    except (OSError, ValueError):
        return None


def _guess_spec(name: str, value: object) -> FlagSpec:
    """Formatting spec for a flag the schema does not know, from its value's type."""
    if isinstance(value, bool):
        return FlagSpec(name, "bool")
    if isinstance(value, tuple):
        return FlagSpec(name, "list")
    if isinstance(value, (dict, list)):
        return FlagSpec(name, "json")
    return FlagSpec(name, "str")


def _is_env_ref(value: object) -> bool:
    return _env_ref_name(value) is not None


def _env_ref_name(value: object) -> str | None:
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        m = _ENV_REF.match(value)
        if m:
            return m.group(1) or m.group(2)
    return None


def _env_name(flag: str) -> str:
    return "VLLM_" + flag.upper().replace("-", "_")


def _resolve_secret(name: str, value: object) -> object:
    var = _env_ref_name(value)
    if var is None:
        return value
    if var not in os.environ:
        raise FlagError(name, f"refers to ${var}, which is not set in the environment")
    resolved = os.environ[var]
    return (resolved,) if isinstance(value, tuple) else resolved


def _join_line(chunks: Sequence[Sequence[str]], *, multiline: bool) -> str:
    def q(tok: str) -> str:
        # A leading NUL marks a fragment that is already shell syntax (a "$VAR"
        # reference we want the shell to expand); everything else is quoted.
        return tok[1:] if tok.startswith("\0") else shlex.quote(tok)

    parts = [" ".join(q(t) for t in chunk) for chunk in chunks if chunk]
    return (" \\\n  " if multiline else " ").join(parts)


def default_image(version: str | None = None) -> str:
    """vllm/vllm-openai:v<version>, the installed vLLM's when ``version`` is None."""
    ver = version if version is not None else installed_vllm_version()
    tag = f"v{ver}" if ver and ver != "unknown" and not ver.startswith("v") else (ver or "latest")
    return f"{_DEFAULT_IMAGE}:{tag}"


def _gpus_arg(gpus: str | int | Sequence[int] | None) -> str:
    """docker's --gpus value: "all" (None too), a count, or '"device=0,1"' for ids."""
    if gpus is None or gpus == "all":
        return "all"
    if isinstance(gpus, str):
        return gpus
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        return str(gpus)
    return f'"device={",".join(str(int(g)) for g in cast(Sequence[int], gpus))}"'


def _published_port(value: str) -> int | None:
    """The container port of a ``-p`` value: ``8000``, ``9000:8000``, ``0.0.0.0:9000:8000/tcp``."""
    last = value.rsplit(":", 1)[-1].split("/", 1)[0]
    return int(last) if last.isdigit() else None


def _has_tag(image: str) -> bool:
    """Whether ``image`` names a tag (``repo:tag``; a registry port such as ``host:5000/x`` is not one)."""
    name = image.split("@", 1)[0]
    return ":" in name.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DockerRun:
    """What a ``docker run`` line holds besides vLLM's flags: the options before the image in
    the user's order (each option as written, with its value or None for a switch), the
    image with its tag, and the program (docker, podman, nvidia-docker)."""

    options: tuple[tuple[str, str | None], ...] = ()
    image: str = ""
    program: str = "docker"

    def image_tagged(self, version: str | None) -> str:
        """The image as written, or with vLLM ``version``'s tag (v0.x.y) when one is given."""
        if version is None:
            return self.image
        repo = self.image.split("@", 1)[0]
        if _has_tag(repo):
            repo = repo.rsplit(":", 1)[0]
        return f"{repo}:{default_image(version).rsplit(':', 1)[1]}"

    def values(self, *names: str) -> list[str]:
        """The values given to any of ``names``, in order."""
        return [v for o, v in self.options if o in names and v is not None]

    def has(self, *names: str) -> bool:
        return any(o in names for o, _ in self.options)

    def publishes(self) -> bool:
        """Whether the line already makes the server reachable (-p, -P, or the host's network)."""
        return self.has("-p", "--publish", "-P", "--publish-all") or any(
            v == "host" for v in self.values("--network", "--net"))

    def env_names(self) -> set[str]:
        """Variables passed with -e/--env (by name or NAME=value)."""
        return {v.split("=", 1)[0] for v in self.values("-e", "--env")}

    def mounts(self) -> list[tuple[str, str]]:
        """(host source, container path) of every -v/--volume/--mount."""
        found: list[tuple[str, str]] = []
        for opt, val in self.options:
            if val is None:
                continue
            if opt in ("-v", "--volume"):
                parts = val.split(":")
                if len(parts) >= 2:
                    found.append((parts[0], parts[1]))
            elif opt == "--mount":
                kv = dict(p.partition("=")[::2] for p in val.split(","))
                src = kv.get("source") or kv.get("src")
                dst = kv.get("target") or kv.get("destination") or kv.get("dst")
                if src and dst:
                    found.append((src, dst))
        return found

    def host_path(self, inside: str) -> str | None:
        """The host path mounted at container path ``inside`` (the HF cache aside), or None."""
        for src, dst in sorted(self.mounts(), key=lambda m: -len(m[1])):
            if dst.rstrip("/") == _CONTAINER_HF_CACHE:
                continue  # the HF cache holds downloads, not a model folder passed by path
            dst_clean = dst.rstrip("/") or "/"
            if inside == dst_clean or inside.startswith(dst_clean + "/"):
                if src.startswith("/") or src.startswith("~"):
                    return src.rstrip("/") + inside[len(dst_clean):] if inside != dst_clean else src
                return None
        return None

    def container_path(self, host: str) -> str | None:
        """Where host path ``host`` is mounted in the container, or None."""
        for src, dst in sorted(self.mounts(), key=lambda m: -len(m[0])):
            src_clean = os.path.expanduser(src).rstrip("/") or "/"
            if dst.rstrip("/") == _CONTAINER_HF_CACHE or not src_clean.startswith("/"):
                continue
            if host == src_clean or host.startswith(src_clean + "/"):
                return dst.rstrip("/") + host[len(src_clean):] if host != src_clean else dst
        return None


@dataclass(frozen=True)
class CommandLine:
    """A command line as vtui read it: the flags, the docker part of a ``docker run`` line,
    and ``notes`` saying what vtui changed in reading it (a legacy entry point written as
    ``vllm serve``, a secret's value dropped from ``-e``). Show the notes to the user."""

    flags: FlagSet
    form: Literal["serve", "module", "docker"] = "serve"
    docker: DockerRun | None = None
    notes: tuple[str, ...] = ()
