"""The scheduler's batch and step: the server's queue, prefill against decode in a step
(TTFT, the TPOT tail, chunked and partial prefills), headroom for the tail."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypedDict

from engine import flags as flagmod  # flagmod.load_schema, looked up when called (tests replace it)
from engine.advise.finding import Change, Expectation, Finding
from engine.advise.rules.client import rule_client_bound
from engine.advise.rules.common import (
    _completed,
    _installed_has,
    _pow2_at_least,
    _preemptions,
    _quantile,
    _rank_corr,
    _rel,
    _request_tokens,
    _when,
)
from engine.advise.rundata import RunData, _f
from engine.values import as_int


def rule_queue(run: RunData) -> list[Finding]:
    """Requests wait in the server's queue while the GPU (or the cache) has room."""
    if rule_client_bound(run):
        return []  # the client's numbers cannot be trusted: that finding comes first
    waiting = run.series("waiting")
    running = dict(run.series("running"))
    if len(waiting) < 3:
        return []
    queued = [(t, v) for t, v in waiting if v >= 1]
    if len(queued) < max(3, 0.5 * len(waiting)):
        return []
    kv_peak = max((v for _, v in run.series("kv_cache_usage")), default=0.0)
    if kv_peak >= 0.8 or (_preemptions(run) or 0) >= 1:
        return []  # the cache is the limit: kv_saturation speaks for it
    util = run.mean_gpu_util
    if util is not None and util >= 70:
        return []  # the GPU is busy: the queue is real demand, not a scheduler limit
    seqs = as_int(run.flag_or_default("max-num-seqs"))
    run_when_queued = [running.get(t) for t, _ in queued if running.get(t) is not None]
    at_cap = [r for r in run_when_queued if r is not None and r >= seqs - 0.5]
    mean_wait = sum(v for _, v in queued) / len(queued)
    peak_wait = max(v for _, v in queued)
    span = (queued[0][0], queued[-1][0])
    when = _when(run, *span)
    proc_cpu = [v for _, v in run.series("proc_cpu_percent", "host")]
    busy = f"GPU utilization {util:.0f} %" if util is not None else (
        f"no GPU readings; server CPU {sum(proc_cpu) / len(proc_cpu):.0f} % of a core" if proc_cpu else "no GPU readings")
    ev: dict[str, object] = {"mean_waiting": mean_wait, "peak_waiting": peak_wait, "max_num_seqs": seqs,
                             "running_at_cap_fraction": len(at_cap) / max(1, len(run_when_queued)),
                             "peak_kv_usage": kv_peak, "mean_gpu_util": util}
    per_req = _request_tokens(run)
    fit = int(run.kv_tokens // per_req) if run.kv_tokens and per_req else None
    if run_when_queued and len(at_cap) >= 0.6 * len(run_when_queued):
        peak_running = max(r for r in run_when_queued if r is not None)
        want = int(peak_running + peak_wait)
        new = max(seqs * 2, want)
        if fit is not None:
            new = max(seqs + 1, min(new, fit))
            ev["sequences_that_fit"] = fit
        return [Finding(
            "queue_scheduler_bound", "medium",
            f"{mean_wait:.0f} requests waiting on average (peak {peak_wait:.0f}) {when} while {seqs} ran, "
            f"KV cache at most {kv_peak:.0%}, {busy}",
            f"--max-num-seqs {seqs} caps the batch: requests queue although the cache and compute have room",
            (Change("max-num-seqs", seqs, new, old_is_default=run.flag("max-num-seqs") is None),),
            "shorter queue, lower TTFT and higher throughput at this load",
            "bigger batches: each decode step takes longer (TPOT up) and KV usage rises",
            ev, window=(_rel(run, span[0]), _rel(run, span[1])),
            expect=(Expectation("mean_waiting", "down", 0.3), Expectation("request_throughput", "up", 0.05)))]
    budget = run.flag("max-num-batched-tokens")
    old = as_int(budget) if budget else 2048
    return [Finding(
        "queue_scheduler_bound", "medium",
        f"{mean_wait:.0f} requests waiting on average (peak {peak_wait:.0f}) {when} with fewer than "
        f"{seqs} running, KV cache at most {kv_peak:.0%}, {busy}",
        "the per-step token budget (--max-num-batched-tokens) admits new prompts too slowly",
        (Change("max-num-batched-tokens", budget, old * 2, old_is_default=budget is None),),
        "new requests start sooner: shorter queue and lower TTFT",
        "longer steps: decodes wait longer behind prefills (TPOT p99 up)",
        ev, window=(_rel(run, span[0]), _rel(run, span[1])),
        expect=(Expectation("mean_waiting", "down", 0.3), Expectation("ttft_p50", "down", 0.1)))]


def _prompt_mix(run: RunData) -> dict[str, float] | None:
    rows = [(i, t) for i, t in ((r[0], r[2]) for r in run.requests) if i is not None and t is not None]
    if len(rows) < 12:
        return None
    ins = [float(i) for i, _ in rows]
    ttft = [float(t) for _, t in rows]
    p10, p90 = _quantile(ins, 0.1), _quantile(ins, 0.9)
    q1, q3 = _quantile(ins, 0.25), _quantile(ins, 0.75)
    short = [t for i, t in zip(ins, ttft, strict=True) if i <= q1]
    long_ = [t for i, t in zip(ins, ttft, strict=True) if i >= q3]
    return {"input_p10": p10, "input_p50": _quantile(ins, 0.5), "input_p90": p90,
            "spread": p90 / max(p10, 1.0), "corr": _rank_corr(ins, ttft),
            "ttft_short_p50": _quantile(short, 0.5), "ttft_short_p90": _quantile(short, 0.9),
            "ttft_long_p50": _quantile(long_, 0.5), "ttft_p50": _quantile(ttft, 0.5),
            "ttft_p99": _quantile(ttft, 0.99)}


def _chunked(run: RunData) -> bool:
    return bool(run.flag_or_default("enable-chunked-prefill"))


def rule_prefill_ttft(run: RunData) -> list[Finding]:
    """TTFT grows with the prompt under a mix of long and short prompts: whole prefills
    hold the step (chunked prefill off) or the prefill budget is too small for the long ones."""
    mix = _prompt_mix(run)
    if mix is None or mix["spread"] < 3.0:
        return []
    # Two signs of prefill-dominated TTFT: it grows with the prompt (rank correlation), or
    # short prompts' tail is far above their median (they wait behind long prefills).
    blocked = mix["ttft_short_p90"] / max(mix["ttft_short_p50"], 1e-9)
    mix["short_p90_over_p50"] = blocked
    if mix["corr"] < 0.3 and blocked < 3.0:
        return []
    tpot = _f(run.load.get("median_tpot_ms"))
    # Prefill dominates when the first token waits many decode steps' worth of time.
    if tpot is None or mix["ttft_p50"] < 5 * tpot:
        return []
    ev = {**mix, "median_tpot_ms": tpot}
    q1 = _quantile([float(r[0]) for r in run.requests if r[0] is not None], 0.25)
    symptom = (f"prompts of {mix['input_p10']:.0f}-{mix['input_p90']:.0f} tokens (p10-p90): the shortest quarter "
               f"(<= {q1:.0f} tokens) has TTFT p50 {mix['ttft_short_p50']:.0f} ms but p90 {mix['ttft_short_p90']:.0f} ms "
               f"({blocked:.1f}x), the longest quarter p50 {mix['ttft_long_p50']:.0f} ms (rank correlation with "
               f"prompt length {mix['corr']:.2f}); TTFT p99 {mix['ttft_p99']:.0f} ms vs TPOT p50 {tpot:.1f} ms")
    budget = run.flag("max-num-batched-tokens")
    if not _chunked(run):
        new_budget = 256 if (mix["input_p90"] <= 4096) else 2048
        changes = (Change("enable-chunked-prefill", False, True),
                   Change("max-num-batched-tokens", budget, new_budget, old_is_default=budget is None))
        return [Finding(
            "prefill_ttft", "medium", symptom,
            "chunked prefill is off: every long prompt is prefilled whole in one step, and short requests "
            "(and running decodes) wait behind it",
            changes,
            f"prefills cut into {new_budget}-token chunks mixed with decodes: short prompts' TTFT and TPOT p99 "
            "fall",
            "long prompts take a few more steps to their first token (their TTFT can rise)",
            ev, expect=(Expectation("ttft_short_p90", "down", 0.1), Expectation("tpot_p99", "down", 0.1)))]
    if budget is not None and as_int(budget) < mix["input_p90"] / 4:
        new = _pow2_at_least(mix["input_p90"] / 2)
        return [Finding(
            "prefill_ttft", "low", symptom,
            f"the chunked-prefill budget ({as_int(budget)} tokens a step) splits a long prompt into many steps",
            (Change("max-num-batched-tokens", as_int(budget), new),),
            "long prompts reach their first token in fewer steps: TTFT p99 falls",
            "bigger steps: running decodes wait longer (TPOT p99 up)",
            ev, expect=(Expectation("ttft_p99", "down", 0.1),))]
    # The budget is big enough: whether short prompts wait behind long prefills within it is
    # rule_partial_prefills' question (it defers to this rule's findings above).
    return []


def rule_tpot_tail(run: RunData) -> list[Finding]:
    """TPOT p99 far above p50: decodes interrupted by prefills."""
    p50, p99 = _f(run.load.get("median_tpot_ms")), _f(run.load.get("p99_tpot_ms"))
    if p50 is None or p99 is None or p50 <= 0 or _completed(run) < 20:
        return []
    ratio = p99 / p50
    if ratio < 2.5:
        return []
    if (_preemptions(run) or 0) >= 1:
        return []  # recomputation after preemption explains it: kv_saturation speaks for it
    mean_in = None
    if run.requests:
        mean_in = sum((r[0] or 0) for r in run.requests) / len(run.requests)
    ev = {"tpot_p50_ms": p50, "tpot_p99_ms": p99, "ratio": ratio, "mean_input_tokens": mean_in}
    symptom = f"TPOT p99 {p99:.1f} ms is {ratio:.1f}x the p50 {p50:.1f} ms over {_completed(run)} requests"
    budget = run.flag("max-num-batched-tokens")
    changes: tuple[Change, ...]
    if not _chunked(run):
        changes = (Change("enable-chunked-prefill", False, True),
                   Change("max-num-batched-tokens", budget, 256 if (mean_in or 0) < 4096 else 2048,
                          old_is_default=budget is None))
        cause = "chunked prefill is off: a step that prefills a whole prompt stalls every running decode"
    else:
        old = as_int(budget) if budget else 8192
        new = max(256, _pow2_at_least(old / 4) if old > 256 else 256)
        if new >= old:
            return []
        changes = (Change("max-num-batched-tokens", budget, new, old_is_default=budget is None),)
        cause = f"each step carries up to {old} prefill tokens, and the decodes in that step wait for them"
    return [Finding(
        "tpot_tail", "medium", symptom, cause, changes,
        "smaller prefill slices per step: TPOT p99 closer to p50",
        "long prompts take more steps to prefill (their TTFT rises) and peak throughput may drop a little",
        ev, expect=(Expectation("tpot_p99", "down", 0.1),))]


def rule_tail_headroom(run: RunData) -> list[Finding]:
    """P99 three to five (or more) times the mean: the load runs at the edge, leave headroom."""
    if _completed(run) < 20:
        return []
    worst = None
    for metric, label in (("e2el", "E2EL"), ("ttft", "TTFT")):
        mean, p99 = _f(run.load.get(f"mean_{metric}_ms")), _f(run.load.get(f"p99_{metric}_ms"))
        if mean and p99 and mean > 0 and p99 / mean >= 3.0 and (worst is None or p99 / mean > worst[3]):
            worst = (metric, label, mean, p99 / mean, p99)
    if worst is None:
        return []
    metric, label, mean, ratio, p99 = worst
    lag = max((_f(w.get("client_lag_ms")) or 0.0 for w in run.windows), default=0.0)
    if lag >= p99 - mean:
        return []  # the load generator's own stall is as long as the tail: not the server's
    arr = run.workload.get("arrivals") if isinstance(run.workload.get("arrivals"), Mapping) else {}
    assert isinstance(arr, Mapping)
    ev = {"metric": metric, "mean_ms": mean, "p99_ms": p99, "ratio": ratio}
    if arr.get("mode", "closed") == "closed" and arr.get("concurrency"):
        old: float = int(arr["concurrency"])
        change = Change("concurrency", old, max(1, math.floor(old * 0.7)), scope="load")
    elif _f(arr.get("rate")):
        old = float(arr["rate"])
        change = Change("rate", old, round(old * 0.7, 2), scope="load")
    else:
        seqs = as_int(run.flag_or_default("max-num-seqs"))
        change = Change("max-num-seqs", seqs, max(1, math.floor(seqs * 0.7)),
                        old_is_default=run.flag("max-num-seqs") is None)
    return [Finding(
        "tail_headroom", "low",
        f"{label} p99 {p99:.0f} ms is {ratio:.1f}x the mean {mean:.0f} ms",
        "the server runs at the edge of its capacity: a few requests queue far longer than the typical one",
        (change,), f"at about 70 % of this load the {label} p99 comes closer to the mean: plan capacity there",
        "less throughput per server at that load (more replicas for the same traffic)",
        ev, expect=(Expectation(f"{metric}_p99_over_mean", "down", 0.1),))]


# Short prompts behind long prefills (chunked prefill on). vLLM's V1 scheduler gives each
# running request its remaining tokens up to the step's --max-num-batched-tokens, running ones
# first, so a prompt longer than the step takes all of several steps while a short one that
# arrived behind it waits; --long-prefill-token-threshold T caps what a request takes of one step
# at T tokens (vllm/v1/core/sched/scheduler.py), leaving the rest to the others.
# --max-num-partial-prefills (with T as where "long" starts) is the V0 engine's form of it: from
# 0.8 the default V1 engine has no concurrent partial prefills (0.8-0.10 fall back to V0 for a value
# above 1; 0.11 on, V0 gone, refuse to start: "Concurrent Partial Prefill is not supported"), and
# vLLM 0.32 has no such flag. So it is offered only where the installed vLLM's default engine is V0.
PARTIAL_MIN_GROUP = 5  # requests on each side (short and long) for a percentile to mean something


PARTIAL_V1_DEFAULT = (0, 8)


def _step_budget(run: RunData) -> tuple[int, str] | None:
    """The run's --max-num-batched-tokens and where the figure comes from (the flag, else the
    server's startup log), or None: its default depends on the device and the vLLM version."""
    flag = _f(run.flag("max-num-batched-tokens"))
    if flag:
        return int(flag), "--max-num-batched-tokens"
    logged = run.startup_facts.max_num_batched_tokens
    if logged:
        return logged, "from the server's startup log"
    return None


class _ShortBehindLong(TypedDict):
    """rule_partial_prefills' evidence, as _short_behind_long finds it."""

    step_tokens: int
    step_from: str
    short_max_tokens: int
    short_count: int
    long_count: int
    requests: int
    short_input_p50: float
    long_input_p50: float
    ttft_short_p50: float
    ttft_short_p90: float
    ttft_long_p50: float
    ttft_p50: float
    ttft_p99: float
    mean_waiting: float | None
    tpot_p50_ms: float | None
    long_steps: int


def _short_behind_long(run: RunData) -> _ShortBehindLong | None:
    """Evidence that short prompts waited behind long prefills within the step budget, or None.

    With chunked prefill on and a step budget B: at least PARTIAL_MIN_GROUP requests with prompts
    of B/2 tokens or fewer (short: one fits beside a long prompt's capped chunk) and as many above
    B (long: several steps of prefill each), the long ones' median prompt 3x the short ones' or
    more; the short ones' TTFT p90 at or above the long ones' TTFT p50 (a short prompt waited as
    long as a typical long prompt took, its own prefill included), TTFT p99 3x the p50 or more,
    the short tail longer than 5 decode steps, and the server's queue small (a mean of 1 or fewer
    waiting, where sampled): the wait is behind the step's prefills, not in the queue."""
    if not _chunked(run):
        return None  # whole prefills: rule_prefill_ttft suggests chunking
    budget = _step_budget(run)
    if budget is None or budget[0] < 2:
        return None
    step, step_from = budget
    half = step // 2
    # _f(v) is float(v) where it is not None.
    rows = [(i, t) for i, t in ((_f(r[0]), _f(r[2])) for r in run.requests) if i is not None and t is not None]
    if len(rows) < 12:
        return None
    short = [(i, t) for i, t in rows if i <= half]
    long_ = [(i, t) for i, t in rows if i > step]
    if len(short) < PARTIAL_MIN_GROUP or len(long_) < PARTIAL_MIN_GROUP:
        return None
    short_in, long_in = _quantile([i for i, _ in short], 0.5), _quantile([i for i, _ in long_], 0.5)
    if long_in < 3 * short_in:
        return None
    s50, s90 = _quantile([t for _, t in short], 0.5), _quantile([t for _, t in short], 0.9)
    l50 = _quantile([t for _, t in long_], 0.5)
    p50, p99 = _quantile([t for _, t in rows], 0.5), _quantile([t for _, t in rows], 0.99)
    if s90 < l50 or p99 < 3 * p50:
        return None
    tpot = _f(run.load.get("median_tpot_ms"))
    if tpot and s90 < 5 * tpot:
        return None  # a wait of a few decode steps: nothing to win
    waiting = [v for _, v in run.series("waiting")]
    mean_waiting = sum(waiting) / len(waiting) if waiting else None
    if mean_waiting is not None and mean_waiting > 1:
        return None  # requests queued in the server: the queue, not the step, held them
    return {"step_tokens": step, "step_from": step_from, "short_max_tokens": half, "short_count": len(short),
            "long_count": len(long_), "requests": len(rows), "short_input_p50": short_in,
            "long_input_p50": long_in, "ttft_short_p50": s50, "ttft_short_p90": s90, "ttft_long_p50": l50,
            "ttft_p50": p50, "ttft_p99": p99, "mean_waiting": mean_waiting, "tpot_p50_ms": tpot,
            "long_steps": math.ceil(long_in / step)}


def _installed_runs_partial_prefills() -> bool:
    """Whether the installed vLLM has --max-num-partial-prefills and its default engine runs a
    value above 1 (V0, before 0.8): see the note above PARTIAL_MIN_GROUP."""
    schema = flagmod.load_schema(wait=False)
    return schema.get("max-num-partial-prefills") is not None and schema.release is not None \
        and schema.release < PARTIAL_V1_DEFAULT


def rule_partial_prefills(run: RunData) -> list[Finding]:
    """Short prompts waited behind long prefills with chunked prefill on: cap what one long
    prompt takes of a step (--long-prefill-token-threshold), so short ones share the step."""
    threshold_set = run.flag("long-prefill-token-threshold")
    if threshold_set or (_f(run.flag("max-num-partial-prefills")) or 1) > 1:
        return []  # already set: the user tuned it
    ev = _short_behind_long(run)
    if ev is None or not _installed_has("long-prefill-token-threshold"):
        return []
    if rule_client_bound(run) or rule_queue(run) or rule_prefill_ttft(run) or rule_tpot_tail(run):
        # The client's numbers include its own delay; requests queued in the server; or the
        # step budget itself changes first (rule_prefill_ttft raises it, rule_tpot_tail lowers
        # it): a threshold sized to half of today's step means nothing once the step is smaller
        # (both fired on the prefill-chunked-256 run at a 1,024-token step: 1,024 -> 256 and a
        # threshold of 512), so those findings come first and this one waits for a new run.
        return []
    step, half = int(ev["step_tokens"]), int(ev["short_max_tokens"])
    new = half  # long prompts take at most half a step; the other half is left to short ones
    steps = int(ev["long_steps"])
    evidence = {**ev, "suggested_threshold": new}
    changes: tuple[Change, ...] = (
        Change("long-prefill-token-threshold", threshold_set, new, old_is_default=threshold_set is None),)
    schema = flagmod.load_schema(wait=False)
    partial = run.flag("max-num-partial-prefills")
    if _installed_runs_partial_prefills():
        changes = (Change("max-num-partial-prefills", partial, 2, old_is_default=partial is None),) + changes
        how = (f"a prompt above {new:,} tokens counts as long: one long and one short prompt are prefilled "
               "at once, so a short one no longer waits for the long one to finish")
    else:
        how = (f"a prompt above {new:,} tokens is prefilled at most {new:,} tokens a step, leaving at least "
               f"{step - new:,} of each {step:,}-token step to the short ones")
        if schema.get("max-num-partial-prefills") is not None:
            how += (f" (--max-num-partial-prefills stays 1: vLLM {schema.vllm_version}'s V1 engine refuses "
                    "any other value at startup)")
    from_ = "" if ev["step_from"] == "--max-num-batched-tokens" else f" ({ev['step_from']})"
    waiting = ev["mean_waiting"]
    queue = "" if waiting is None else f", {waiting:.1f} requests waiting in the server on average"
    return [Finding(
        "partial_prefills", "low",
        f"short requests waited behind long prefills: the {ev['short_count']} of {ev['requests']} requests with "
        f"prompts of {half:,} tokens or fewer (median {ev['short_input_p50']:,.0f}) had TTFT p90 "
        f"{ev['ttft_short_p90']:,.0f} ms (p50 {ev['ttft_short_p50']:,.0f} ms), at or above the TTFT p50 "
        f"{ev['ttft_long_p50']:,.0f} ms of the {ev['long_count']} prompts longer than the {step:,}-token step{from_} "
        f"(median {ev['long_input_p50']:,.0f} tokens, {steps} steps of prefill each); TTFT p99 "
        f"{ev['ttft_p99']:,.0f} ms is {ev['ttft_p99'] / ev['ttft_p50']:.1f}x the p50 {ev['ttft_p50']:,.0f} ms{queue}",
        "with chunked prefill a prompt longer than the step takes the whole --max-num-batched-tokens budget of "
        "each step until its prefill is done, so a short prompt that arrives behind it waits those steps for "
        "its first token",
        changes,
        f"{how}: short prompts' TTFT p90 comes down toward their p50",
        f"long prompts' prefill spreads over more steps ({math.ceil(ev['long_input_p50'] / new)} instead of "
        f"{steps} for the median long prompt): their TTFT rises",
        evidence, expect=(Expectation("ttft_short_p90", "down", 0.1),))]
