"""How the GPUs run the model: tensor parallel wider than it needs, a decode step bound by kernel
launches, steps past the largest captured CUDA graph."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import TypedDict

from engine.advise.finding import Change, Expectation, Finding
from engine.advise.rules.common import GIB, _completed, _device_bytes, _installed_has, _model_config, _request_tokens
from engine.advise.rules.memory import _plan
from engine.advise.rundata import RunData, _f
from engine.values import as_float, as_int


def rule_tp_oversized(run: RunData) -> list[Finding]:
    """Tensor parallel larger than the model needs: the weights fit on fewer GPUs."""
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    if tp <= 1:
        return []
    mc = _model_config(run)
    total, what = _device_bytes(run)
    if mc is None or not total or what != "GPU":
        return []
    mml = run.flag("max-model-len") or mc.max_position_embeddings
    per_req = _request_tokens(run) or as_float(mml)
    demand_seqs = max([_f(s.get("running")) or 0.0 for s in run.server] + [1.0])
    need_tokens = max(as_float(mml), demand_seqs * per_req)
    cur = _plan(run)
    for smaller in (t for t in (1, 2, 4, 8) if t < tp and mc.num_attention_heads % t == 0):
        p = _plan(run, tensor_parallel_size=smaller)
        if p is None or p.kv_tokens < need_tokens * 1.25:
            continue
        ev = {"tp": tp, "smaller_tp": smaller, "weights_gib": p.weight_bytes_total / GIB,
              "kv_tokens_smaller": p.kv_tokens, "kv_tokens_now": None if cur is None else cur.kv_tokens,
              "needed_kv_tokens": need_tokens, "peak_running": demand_seqs}
        return [Finding(
            "tp_oversized", "medium",
            f"--tensor-parallel-size {tp} for {p.weight_bytes_total / GIB:.1f} GiB of weights; this load held at most "
            f"{demand_seqs:.0f} sequences (~{need_tokens:,.0f} KV tokens)",
            f"by the planner {smaller} GPU(s) of {total / GIB:.0f} GiB hold the weights and "
            f"{p.kv_tokens:,} KV tokens, {p.kv_tokens / need_tokens:.1f}x what this load needs; "
            "extra GPUs only add all-reduce traffic",
            (Change("tensor-parallel-size", tp, smaller),),
            f"throughput per GPU up ({tp // smaller}x the GPUs freed for another replica); similar latency",
            f"fewer KV tokens ({p.kv_tokens:,} instead of {cur.kv_tokens if cur else 0:,}) and a bit more per-token "
            "compute on each GPU",
            ev, expect=(Expectation("throughput_per_gpu", "up", 0.1),))]
    return []


def rule_launch_bound(run: RunData) -> list[Finding]:
    """Decode far slower than the GPU's memory allows at a small batch (engine.server.speedoflight):
    the step waits on kernel launches or scheduling, not on memory."""
    sol = run.telemetry_figures.speed_of_light
    if sol is None or not sol.launch_bound or _completed(run) < 10:
        return []
    step, floor, mbu, batch = _f(sol.step_ms), _f(sol.floor_ms), _f(sol.mbu), _f(sol.batch)
    if step is None or floor is None or mbu is None or batch is None:
        return []
    ev = {"step_ms": step, "floor_ms": floor, "mbu": mbu, "batch": batch, "gpu": sol.gpu}
    symptom = (f"decode step {step:.1f} ms against a floor of {floor:.1f} ms on {sol.gpu} "
               f"(MBU {mbu * 100:.0f}%) at a mean batch of {batch:.1f}")
    if run.flag("enforce-eager"):
        return [Finding(
            "launch_bound", "medium", symptom,
            "--enforce-eager runs every layer's kernels one launch at a time: at a small batch the launches, "
            "not the memory reads, set the step time",
            (Change("enforce-eager", True, False),),
            "CUDA graphs replay the step's kernels at once: the decode step comes closer to the floor",
            "a longer start (graph capture) and some GPU memory for the graphs",
            ev, expect=(Expectation("tpot_p50", "down", 0.1),))]
    if rule_cudagraph_capture(run):
        return []  # the steps ran past the largest CUDA graph: that finding names the cause and its fix
    arr = run.workload.get("arrivals") if isinstance(run.workload.get("arrivals"), Mapping) else {}
    assert isinstance(arr, Mapping)
    if arr.get("mode", "closed") != "closed" or not arr.get("concurrency"):
        return []
    old = int(arr["concurrency"])
    # The scheduler's own share of the step can overlap the model's (vLLM's --async-scheduling).
    overlap = ((Change("async-scheduling", None, True, old_is_default=True),),) \
        if not run.flag("async-scheduling") and _installed_has("async-scheduling") else ()
    return [Finding(
        "launch_bound", "low", symptom,
        "at this batch a step's fixed cost (launches, scheduling, sampling) dominates: the GPU reads the weights "
        "in a fraction of the step",
        (Change("concurrency", old, old * 4, scope="load"),),
        "more sequences per step cost little extra time: output tokens/s rises almost in proportion",
        "each user's stream slows a little as the batch grows",
        ev, alternatives=overlap, expect=(Expectation("output_throughput", "up", 0.3),))]


# vLLM's largest captured CUDA graph where neither the server's log nor a flag says
# (vllm/config/vllm.py, _set_cudagraph_sizes, 0.11 to 0.32): min(2 x max-num-seqs, 512), 1024 on
# data-centre Blackwell (compute capability 10.x), and no more than max-num-batched-tokens.
# It captures 1, 2, 4, then every 8 up to 256, then every 16: a size off that stride is cut down
# to the last one on it.
CUDAGRAPH_DEFAULT_MAX = 512


CUDAGRAPH_BLACKWELL_MAX = 1024


_BLACKWELL = re.compile(r"\bG?B[123]00\b", re.IGNORECASE)  # B100, B200, GB200, B300, GB300


def _capture_stride(size: float) -> int:
    return 8 if size < 256 else 16


def _capture_cover(batch: float) -> int:
    """The smallest size on vLLM's capture list (1, 2, 4, 8, 16, ..., 248, 256, 272, ...) at or
    above ``batch``: a --max-cudagraph-capture-size off that list is cut down to the size below."""
    if batch <= 4:
        return next(n for n in (1, 2, 4) if n >= batch)
    stride = _capture_stride(batch)
    return int(math.ceil(batch / stride) * stride)


def _gpu_name(run: RunData) -> str:
    sol = run.telemetry_figures.speed_of_light
    names = [str(g.get("name")) for g in run.gpus if g.get("name")]
    if sol is not None and sol.gpu:
        names.append(sol.gpu)
    return " ".join(names)


def _top_capture(limit: int, tokens: int | None) -> int:
    """The largest size vLLM captures for a ceiling of ``limit``: 1, 2, 4, every 8 below 256,
    every 16 from there, plus max-num-batched-tokens itself where it is within the ceiling."""
    if tokens is not None and tokens <= limit:
        return tokens
    if limit >= 8:
        return limit - limit % _capture_stride(limit)
    return max((n for n in (1, 2, 4) if n <= limit), default=0)


def _captured_max(run: RunData) -> tuple[int, str] | None:
    """The largest decode batch the server had a CUDA graph for, and where that figure comes
    from: its startup log, else the flag, else vLLM's default. None where the user gave the
    sizes themselves (--cudagraph-capture-sizes or in --compilation-config): a max beside
    such a list that disagrees with it is an error in vLLM, so no single flag fixes it."""
    cc = run.flag("compilation-config")
    if isinstance(cc, str):
        try:
            cc = json.loads(cc)
        except ValueError:
            cc = None
    cc = cc if isinstance(cc, Mapping) else {}
    if run.flag("cudagraph-capture-sizes") or cc.get("cudagraph_capture_sizes") \
            or cc.get("max_cudagraph_capture_size") is not None or "cudagraph_mode" in cc:
        return None
    logged = run.startup_facts.max_cudagraph_capture_size
    if logged is not None:
        return logged, "from the server's startup log"
    tokens_f = _f(run.flag("max-num-batched-tokens"))
    tokens = int(tokens_f) if tokens_f else None
    flag = _f(run.flag("max-cudagraph-capture-size"))
    if flag is not None:
        return _top_capture(int(flag), tokens), f"from --max-cudagraph-capture-size {int(flag)}"
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    ceiling = CUDAGRAPH_BLACKWELL_MAX if _BLACKWELL.search(_gpu_name(run)) else CUDAGRAPH_DEFAULT_MAX
    limit = min(2 * seqs, ceiling)
    top = _top_capture(limit, tokens)
    if seqs <= limit and (tokens is None or seqs <= tokens):
        top = max(top, seqs)  # vLLM adds max-num-seqs to its default sizes where it fits
    return top, f"vLLM's default for these flags: min(2 x max-num-seqs {seqs}, {ceiling})"


class _GraphGap(TypedDict):
    """rule_cudagraph_capture's evidence, as _graph_gap finds it."""

    mean_running: float
    peak_running: float
    captured_max: int
    captured_from: str
    share_above: float


def _graph_gap(run: RunData) -> _GraphGap | None:
    """Evidence that the decode steps of a GPU run with CUDA graphs ran past the largest
    captured graph, or None: the mean of the server's running-requests samples while busy
    (an idle sample has no decode step) above the largest captured size."""
    if _device_bytes(run)[1] != "GPU" or (run.startup_facts.kv_cache_device or "GPU") != "GPU":
        return None
    if run.flag("enforce-eager") or run.flag("speculative-config") or _completed(run) < 10:
        # Eager: no graphs at all (rule_launch_bound weighs that). Speculative decoding: a step
        # carries several tokens per sequence, so the batch in the captured unit is not ``running``.
        return None
    captured = _captured_max(run)
    running = [v for _, v in run.series("running") if v > 0]
    if captured is None or captured[0] <= 0 or len(running) < 3:
        return None  # 0: the server captured no graphs (its own log says so)
    size, source = captured
    mean, peak = sum(running) / len(running), max(running)
    if mean <= size:
        return None
    return {"mean_running": mean, "peak_running": peak, "captured_max": size, "captured_from": source,
            "share_above": sum(v > size for v in running) / len(running)}


def rule_cudagraph_capture(run: RunData) -> list[Finding]:
    """The decode batch outgrew the largest CUDA graph: those steps launch their kernels eagerly."""
    ev = _graph_gap(run)
    if ev is None or not _installed_has("max-cudagraph-capture-size"):
        return []
    size, mean, peak = int(ev["captured_max"]), float(ev["mean_running"]), float(ev["peak_running"])
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    # Cover every batch the run reached (none can exceed max-num-seqs), on vLLM's capture list.
    new = _capture_cover(min(peak, float(seqs)))
    if new <= size:
        return []
    evidence = {**ev, "max_num_seqs": seqs, "suggested": new}
    old = run.flag("max-cudagraph-capture-size")
    return [Finding(
        "cudagraph_capture", "low",
        f"a decode batch of {mean:.1f} running requests on average while busy (peak {peak:.0f}; above {size} "
        f"in {ev['share_above'] * 100:.0f}% of the server's busy samples) against CUDA graphs captured up to {size} "
        f"({ev['captured_from']})",
        "vLLM replays a CUDA graph only for a batch no larger than the largest size it captured; a larger "
        "decode step runs without one, launching every kernel from Python at every step",
        (Change("max-cudagraph-capture-size", old, new, old_is_default=old is None),),
        "every decode step of this load replays a graph: lower TPOT and higher output tokens/s, most where "
        "the step is short (a small model, short contexts)",
        "a longer start (more graph sizes to capture) and GPU memory for the larger graphs, taken from the "
        "KV cache",
        evidence, expect=(Expectation("tpot_p50", "down", 0.05),))]
