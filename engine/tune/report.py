"""What a search reports: :class:`TuneResult` (every configuration, the best, the Pareto points,
the trials running now), the steps per configuration for the charts, and the plain-text table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.flags import FlagSet
from engine.runs.compare import pareto_frontier
from engine.runs.status import SPOILED_TRIES
from engine.tune.ranking import TIE_RULE, Decision, Rival
from engine.tune.trial import CUT_SHORT, DONE, OBJECTIVE_UNITS, ConfigResult, Measurement, RunningTrial, config_score
from engine.values import as_float


@dataclass(frozen=True)
class ParetoPoint:
    """One SLO-meeting step: output tokens/s per user against output tokens/s per GPU."""

    key: str
    load: float
    tokens_per_user: float
    tokens_per_gpu: float
    goodput: float
    frontier: bool


@dataclass(frozen=True)
class TuneResult:
    """What a search found. ``status``: ``done`` (space covered), ``budget`` (stopped at
    the budget), ``interrupted`` (stopped while it measured), ``stopped`` (stopped before it
    started: the Tune screen's x while it joined a Ray cluster)."""

    id: str
    status: str
    mode: str
    best: ConfigResult | None
    best_flags: FlagSet | None
    configs: tuple[ConfigResult, ...]
    pareto: tuple[ParetoPoint, ...]
    elapsed_s: float
    budget_s: float
    starts: int
    steps: int
    state_path: Path | None
    objective: str = "goodput"
    measurements: Mapping[str, tuple[Measurement, ...]] = dataclasses.field(default_factory=dict)
    """Every step of every configuration, in the order measured (the state file keeps them too)."""
    running: tuple[RunningTrial, ...] = ()
    """The configurations being measured now, by slot (empty once the search ended)."""
    decision: Decision | None = None
    """Why the best is the best (engine.tune.ranking): the configurations tied with it within the
    noise and the rule that chose among them, or the runner-up beyond the noise; the runs each
    limit rests on."""
    time_split: Mapping[str, object] | None = None
    """Where the wall time went (engine.tune.halving.TimeSplit.to_dict): starts, settling, measuring,
    checks, the rest; windows and the rounds under one load, with who dropped out of each."""
    time_words: str = ""
    round_words: tuple[str, ...] = ()
    """Each round under one load in a line: the group, the load, configurations, windows, who dropped out."""
    estimate: Mapping[str, object] | None = None
    """What the tune was expected to cost at its start (engine.tune.halving.Estimate.to_dict)."""

    def score(self, c: ConfigResult) -> float | None:
        """``c``'s figure for this search's objective at its limit."""
        return config_score(c, self.objective)

    @property
    def stopped_by_user(self) -> bool:
        return self.status in ("interrupted", "stopped")

    def outcome(self) -> str:
        """What it came to, in a few words: the best, or why there is none (a search the user
        stopped did not find that no configuration meets the SLO)."""
        if self.best is not None:
            tied = self.decision.tied if self.decision is not None else ()
            if tied:
                return (f"best {self.best.key}, tied with {', '.join(r.key for r in tied)} within noise:"
                        " the cheaper by the rule")
            return f"best {self.best.key}"
        if self.stopped_by_user:
            return "stopped before any configuration met the SLO"
        return "no configuration met the SLO"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "status": self.status, "mode": self.mode, "objective": self.objective,
            "best_score": self.score(self.best) if self.best else None,
            "best": self.best.to_dict() if self.best else None,
            "best_flags": self.best_flags.to_dict() if self.best_flags else None,
            "best_serve_line": self.best_flags.to_serve_line() if self.best_flags else None,
            "decision": _decision_json(self.decision),
            "configs": [c.to_dict() for c in self.configs],
            "pareto": [dataclasses.asdict(p) | {"load": _jsonable_load(p.load)} for p in self.pareto],
            "elapsed_s": self.elapsed_s, "budget_s": self.budget_s, "starts": self.starts,
            "steps": self.steps, "state_path": str(self.state_path) if self.state_path else None,
            "time": dict(self.time_split) if self.time_split is not None else None,
            "estimate": dict(self.estimate) if self.estimate is not None else None,
        }


def config_words(c: ConfigResult, mode: str, objective: str) -> str:
    """A configuration's line as the search says it when it is done with it."""
    unit = "req/s" if mode == "rate" else "concurrent"
    if c.status in (DONE, CUT_SHORT) and c.limit_load is not None:
        lim = "any load" if math.isinf(c.limit_load) else f"{c.limit_load:.3g} {unit}"
        score = config_score(c, objective)
        extra = "" if objective == "goodput" else (
            f", {objective} {score:.3g} {OBJECTIVE_UNITS[objective]}" if score is not None
            else f", {objective} n/a (no power reading)")
        return (f"{c.key}: limit {lim}, goodput {c.goodput or 0:.3g} req/s{extra} ({c.steps} steps)"
                + (" [cut short]" if c.status == CUT_SHORT else "") + (" [limit measured twice]" if c.confirmed else ""))
    return f"{c.key}: {c.status}: {c.reason}"


def step_words(key: str, m: Measurement, mode: str, n: int, seconds: float, *, again: bool = False) -> str:
    """One step's line as the search says it."""
    unit = "req/s" if mode == "rate" else "concurrent"
    shown = "all at once" if math.isinf(m.load) else f"{m.load:.3g} {unit}"
    return (f"  {key}: {shown}{' again' if again else ''}: "
            + ("meets SLO" if m.ok else f"violates ({m.reason})")
            + f", goodput {m.goodput:.3g} req/s, {m.completed}/{max(n, m.requests)} done in {seconds:.0f} s"
            + (" (stopped early)" if m.stopped_early else "")
            + (" (client- or box-bound at first: measured again)" if m.remeasured else "")
            + (" (client-bound: the load generator set this pace, not the server)" if m.client_bound else "")
            + (f" (box-bound after {SPOILED_TRIES} tries: the busy box delayed the load generator)"
               if m.box_bound else ""))


def _decision_json(d: Decision | None) -> dict[str, object] | None:
    if d is None:
        return None

    def rival(r: Rival) -> dict[str, object]:
        iv = r.difference.interval
        return {"key": r.key, "figure": r.difference.figure, "difference": r.difference.value,
                "low": iv.low, "high": iv.high, "kind": iv.kind, "verdict": r.difference.verdict,
                "runs": list(r.runs), "cheaper": r.cheaper, "unchecked": r.unchecked}

    return {"best": d.best, "value": d.value, "runs": d.runs, "rule": TIE_RULE, "tied": [rival(r) for r in d.tied],
            "runner_up": rival(d.runner_up) if d.runner_up is not None else None, "words": d.words()}


def _jsonable_load(load: float) -> float | str:
    return "inf" if math.isinf(load) else load


StepPoint = tuple[float, float | None, float | None, bool]  # load, TTFT, TPOT (at the SLO's percentile), met


def step_series(measurements: Mapping[str, Sequence[Measurement]]) -> tuple[tuple[str, tuple[StepPoint, ...]], ...]:
    """Each configuration's steps as (load, TTFT, TPOT, met) points, by load; a step at
    "all at once" (infinite load) has no place on a load axis and is left out."""
    out = []
    for key, ms in measurements.items():
        pts = sorted((m.load, m.ttft_ms, m.tpot_ms, bool(m.ok)) for m in ms if math.isfinite(m.load))
        if pts:
            out.append((key, tuple(pts)))
    return tuple(out)


def pareto_points(measurements: Mapping[str, Sequence[Measurement]], gpus: Mapping[str, int]) -> list[ParetoPoint]:
    """Every SLO-meeting step of every configuration, with the frontier marked (no other
    point is at least as good on both axes and better on one)."""
    pts = []
    for key, ms in measurements.items():
        for m in ms:
            if m.ok and m.output_throughput > 0:
                pts.append((key, m, m.tokens_per_user, m.output_throughput / max(1, gpus.get(key, 1))))

    marks = pareto_frontier([(x, y) for _, _, x, y in pts])
    out = [ParetoPoint(key, m.load, x, y, m.goodput, front) for (key, m, x, y), front in zip(pts, marks, strict=True)]
    out.sort(key=lambda p: (-p.tokens_per_user, -p.tokens_per_gpu))
    return out


def format_table(result: TuneResult) -> str:
    """Every configuration tried, best first among the measured, as plain text."""
    unit = "req/s" if result.mode == "rate" else "conc"
    energy = result.objective != "goodput"
    head: tuple[str, ...] = ("", "configuration", "status", f"limit {unit}", "goodput req/s", "runs", "steps",
                             "reason")
    if energy:
        head = (*head[:5], "GPU W", f"{result.objective} {OBJECTIVE_UNITS[result.objective]}", *head[5:])
    rows = [head]
    best_key = result.best.key if result.best else None
    tied = {r.key for r in result.decision.tied} if result.decision is not None else set()
    for c in result.configs:
        lim = "" if c.limit_load is None else ("any" if math.isinf(c.limit_load) else f"{c.limit_load:.3g}")
        status = c.status_words(how=True)
        mark = "*" if c.key == best_key else "=" if c.key in tied else ""
        row: tuple[str, ...] = (mark, c.key, status, lim, "" if c.goodput is None else f"{c.goodput:.3g}",
                                str(c.runs) if c.runs else "", str(c.steps), c.reason[:90])
        if energy:
            watts = c.at.mean_power_w if c.at is not None else None
            score = result.score(c)
            row = (*row[:5], "" if watts is None else f"{watts:.0f}", "" if score is None else f"{score:.3g}",
                   *row[5:])
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if result.decision is not None:
        lines.append("")
        lines.append("* best" + (", = tied with it within noise" if tied else "")
                     + "; runs: the steps at its limit that met the SLO (what its figure rests on)")
        lines.append(result.decision.words())
    return "\n".join(lines)


def format_pareto(result: TuneResult) -> str:
    """The frontier of tokens/s per user against tokens/s per GPU (SLO-meeting steps)."""
    pts = [p for p in result.pareto if p.frontier]
    if not pts:
        return "no step met the SLO: no Pareto frontier"
    lines = ["Pareto frontier (output tokens/s per user = mean output tokens / mean E2EL;"
             " per GPU = output tokens/s / (tp x pp x dp)):"]
    for p in pts:
        load = "all at once" if math.isinf(p.load) else f"{p.load:.3g}"
        lines.append(f"  {p.tokens_per_user:8.1f} tok/s/user  {p.tokens_per_gpu:9.1f} tok/s/GPU  "
                     f"{p.key} at {load}")
    return "\n".join(lines)


def saved_search_rows(states: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per saved search (engine.tune.state.list_states): id, status, configurations done,
    minutes, model and the best so far."""
    rows: list[str] = []
    for st in states:
        if st["status"] == "unreadable":
            rows.append(f"{st['id']}: unreadable ({st.get('error', '')})")
            continue
        best = ""
        if st.get("best") and st.get("score") is not None:
            objective = str(st.get("objective") or "goodput")
            best = f"  best {st['best']} ({st['score']:.3g} {OBJECTIVE_UNITS.get(objective, '')})"
        elif st.get("best") and st.get("goodput"):  # saved by a vtui before summaries had a score
            best = f"  best {st['best']} ({st['goodput']:.3g} req/s)"
        rows.append(f"{st['id']}  {st['status']:<11} {st.get('done', 0)}/{st.get('total', 0)} configs  "
                    f"{as_float(st.get('elapsed_s') or 0) / 60:.1f} min  {st.get('model') or ''}{best}")
    return rows


def outcome_lines(result: TuneResult) -> list[str]:
    """What `vtui tune` prints at its end: the table, the winner (its serve and docker lines and the
    Pareto frontier), the status, where the time went and the rounds."""
    out = [format_table(result), ""]
    if result.best is not None and result.best_flags is not None:
        lim = result.best.limit_load or 0.0
        unit = "req/s" if result.mode == "rate" else "concurrent requests"
        out.append(f"best: {result.best.key}: goodput {result.best.goodput or 0:.3g} req/s at "
                   + ("any load" if math.isinf(lim) else f"{lim:.3g} {unit}"))
        out += [result.best_flags.to_serve_line(), result.best_flags.to_docker_line(), "", format_pareto(result)]
    else:
        out.append("no configuration met the SLO")
    out.append(f"\n{result.status}: {result.elapsed_s / 60:.1f} of {result.budget_s / 60:.1f} min, "
               f"{result.starts} starts, {result.steps} steps; saved in the run history as {result.id}"
               f" (`vtui tune --resume {result.id}`)")
    if result.time_words:
        out.append(result.time_words)
    out += [f"  {line}" for line in result.round_words]
    return out
