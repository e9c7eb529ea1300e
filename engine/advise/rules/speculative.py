"""Speculative decoding where few sequences decode at once: n-gram lookup or a draft model."""

from __future__ import annotations

import json
from collections.abc import Mapping

from engine.advise.finding import Change, Expectation, Finding
from engine.advise.rules.common import _completed, _device_bytes, _installed_has, _mean_running, _workload
from engine.advise.rundata import RunData, _f

# Speculative decoding pays when few sequences decode at once (spare compute per step).
SPEC_MAX_BATCH = 4.0


SPEC_MIN_OUTPUT = 64


def _spec_room(run: RunData, *, text_only: bool) -> dict[str, float] | None:
    """Evidence that speculative decoding has room on this run, or None: a GPU decoding a
    mean of SPEC_MAX_BATCH or fewer sequences at once, SPEC_MIN_OUTPUT+ output tokens per
    request, no speculative decoding yet, where the installed vLLM has --speculative-config.
    ``text_only``: also text a prompt lookup can match (n-gram proposals), not random tokens."""
    if run.flag("speculative-config") or _completed(run) < 10 or not _installed_has("speculative-config"):
        return None
    if _device_bytes(run)[1] != "GPU" or (text_only and _workload(run).get("kind", "random") == "random"):
        # A CPU has no idle compute per step to spend; random token prompts give n-gram
        # lookup nothing to find in them (a draft model needs no such text).
        return None
    batch = _mean_running(run)
    done = _f(run.load.get("completed")) or 0.0
    out_per_req = (_f(run.load.get("total_output_tokens")) or 0.0) / done if done else 0.0
    tpot = _f(run.load.get("median_tpot_ms"))
    if batch is None or batch > SPEC_MAX_BATCH or out_per_req < SPEC_MIN_OUTPUT or not tpot:
        return None
    return {"mean_running": batch, "output_tokens_per_request": out_per_req, "tpot_p50_ms": tpot}


def _spec_symptom(ev: Mapping[str, float]) -> str:
    return (f"a mean of {ev['mean_running']:.1f} sequences decoding at once, {ev['output_tokens_per_request']:.0f} "
            f"output tokens per request, TPOT p50 {ev['tpot_p50_ms']:.1f} ms")


def rule_speculative_ngram(run: RunData) -> list[Finding]:
    """Few sequences decode at once and outputs are long: n-gram speculative decoding can emit
    several tokens per step where the output repeats the prompt."""
    if run.draft_model:
        return []  # the caller gave a draft model: rule_speculative_draft suggests it on the same evidence
    ev = _spec_room(run, text_only=True)
    if ev is None:
        return []
    config = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    return [Finding(
        "speculative_ngram", "low", _spec_symptom(ev),
        "at so small a batch each decode step leaves most of the GPU's compute idle; speculative decoding "
        "spends it proposing several tokens per step and verifying them in one pass",
        (Change("speculative-config", None, config),),
        "lower TPOT where outputs repeat spans of the prompt (code edits, quoting RAG answers); "
        "little change on free-form text",
        "verification costs compute at every step: at larger batches it can lower throughput",
        ev, expect=(Expectation("tpot_p50", "down", 0.1),))]


SPEC_DRAFT_TOKENS = 4


def rule_speculative_draft(run: RunData) -> list[Finding]:
    """rule_speculative_ngram's evidence where the caller gave a draft model (RunData.draft_model):
    the draft proposes the tokens, so the prompts need not hold text the output repeats."""
    if not run.draft_model:
        return []
    ev = _spec_room(run, text_only=False)
    if ev is None:
        return []
    draft = str(run.draft_model)
    config = json.dumps({"model": draft, "num_speculative_tokens": SPEC_DRAFT_TOKENS})
    return [Finding(
        "speculative_draft", "low", _spec_symptom(ev),
        "at so small a batch each decode step leaves most of the GPU's compute idle; the draft model "
        f"{draft} can spend it proposing {SPEC_DRAFT_TOKENS} tokens a step for the target to verify in one pass",
        (Change("speculative-config", None, config),),
        "lower TPOT, by how many of the draft's proposed tokens the target accepts (more for a smaller model "
        "of the same family, trained on similar text)",
        "the draft's weights and KV cache take GPU memory from the target's KV cache; it must use the target's "
        "tokenizer; every step also runs the draft, so at larger batches it can lower throughput",
        {**ev, "draft_model": draft}, expect=(Expectation("tpot_p50", "down", 0.1),))]
