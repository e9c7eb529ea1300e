"""Side-by-side comparison of stored runs: one column per configuration (one run, or the
repeats of one configuration: their median), one row per differing flag and per metric, the
delta to the baseline in percent, "within noise" where the interval of that difference holds
zero (engine.runs.noise: over the repeats, else within each run's requests, the weaker kind),
and the best value per row marked only where it is beyond the noise of every other column.

Latency numbers use ``vllm bench serve``'s definitions (see loadgen): TTFT to the first
chunk carrying ``choices``; TPOT = (E2EL - TTFT) / (output tokens - 1) per request;
ITL = gaps between chunks. A run's stored summary is an ``engine.runs.summary.RunSummary``: its
load figures (a flat vLLM-bench document is read as ``load``) and its telemetry, typed
(``RunSummary.telemetry``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine.flags import devices_needed
from engine.runs.flagchange import TWO_CONFIGURATIONS, changed_during, changes_text, flag_changes_of, when_text
from engine.runs.history import NoiseFloor, RunInfo, StoredRequest
from engine.runs.noise import (
    BOX_FLOOR,
    REPEATS,
    SINGLE_RUN_LEVEL,
    WITHIN_NOISE,
    WITHIN_RUN,
    Configuration,
    Difference,
    RunNoise,
    difference,
    run_noise,
    verdict_floor,
)
from engine.runs.status import RunStatus
from engine.runs.summary import CrossCheck, RunSummary, SpeedOfLightFigures, TelemetryFigures

GIB = 1024**3
FORMATS = ("text", "markdown", "csv", "json")

# A metric's reader: a run's summary to its value. Load figures come from RunSummary.figure (None
# where the run lacks one); telemetry figures from its typed telemetry (None where it has none);
# either is a number only where finite (_number).
Reader = Callable[[RunSummary], float | None]


@dataclass(frozen=True)
class Metric:
    """One metric row: how to read it from a summary and which way is better."""

    key: str
    label: str
    unit: str
    better: str | None  # "lower", "higher", or None (informative: no best, no judgement)
    read: Reader
    figure: str | None = None  # the load figure's name, where engine.runs.noise gives its noise


def _number(value: object, scale: float = 1.0) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) * scale


def _load(key: str, scale: float = 1.0) -> Reader:
    return lambda summary: _number(summary.figure(key), scale)


def _tel(field: Callable[[TelemetryFigures], float | None], scale: float = 1.0) -> Reader:
    """A figure of the run's telemetry (None for a flat vLLM-bench summary, or none)."""
    return lambda summary: (None if summary.telemetry is None
                            else _number(field(summary.telemetry), scale))


def _failure_rate(summary: RunSummary) -> float | None:
    done, failed = _number(summary.figure("completed")), _number(summary.figure("failed"))
    if done is None or failed is None or done + failed == 0:
        return None
    return 100.0 * failed / (done + failed)


def _j_per(load_key: str) -> Reader:
    """Joules over the window (the telemetry's energy) per the load figure ``load_key``."""

    def read(summary: RunSummary) -> float | None:
        joules = _tel(lambda t: t.energy.joules if t.energy is not None else None)(summary)
        count = _number(summary.figure(load_key))
        return None if joules is None or not count else joules / count

    return read


def _sol(field: Callable[[SpeedOfLightFigures], float | None], scale: float = 1.0) -> Reader:
    """A figure of the run's speed of light (engine.advise.speedoflight), kept in its telemetry."""
    return _tel(lambda t: field(t.speed_of_light) if t.speed_of_light is not None else None, scale)


_power = _tel(lambda t: t.energy.mean_power_w if t.energy is not None else None)


def _server(field: Callable[[CrossCheck], float | None], scale: float = 1.0) -> Reader:
    """The server's own figure over the run's window, from its cross-check (engine.runs.crosscheck):
    None where the scrapes at the run's edges were not exact."""
    return lambda summary: (None if summary.cross_check is None
                            else _number(field(summary.cross_check), scale))


METRICS: tuple[Metric, ...] = (
    *(
        Metric(f"{name}_{p}", f"{name.upper()} {p}", "ms", "lower", _load(f"{'median' if p == 'p50' else p}_{name}_ms"),
               f"{'median' if p == 'p50' else p}_{name}_ms")
        for name in ("ttft", "tpot", "itl", "e2el")
        for p in ("p50", "p99")
    ),
    # The client's means beside the server's own over the same window: TTFT, TPOT
    # against the server's (E2E - TTFT)/(n - 1), the time requests queued, the prefix cache's hits.
    Metric("ttft_mean", "TTFT mean", "ms", "lower", _load("mean_ttft_ms"), "mean_ttft_ms"),
    Metric("server_ttft_mean", "server TTFT mean", "ms", "lower", _server(lambda c: c.server_mean_ttft_ms)),
    Metric("tpot_mean", "TPOT mean", "ms", "lower", _load("mean_tpot_ms"), "mean_tpot_ms"),
    Metric("server_tpot_mean", "server TPOT mean", "ms", "lower", _server(lambda c: c.server_tpot_ms)),
    Metric("server_queue_mean", "server queue mean", "ms", "lower", _server(lambda c: c.server_mean_queue_ms)),
    Metric("prefix_hit", "prefix-cache hits", "%", None, _server(lambda c: c.prefix_hit_rate, 100.0)),
    Metric("request_throughput", "requests/s", "req/s", "higher", _load("request_throughput"), "request_throughput"),
    Metric("output_throughput", "output tokens/s", "tok/s", "higher", _load("output_throughput"), "output_throughput"),
    Metric("request_goodput", "goodput", "req/s", "higher", _load("request_goodput"), "request_goodput"),
    Metric("failure_rate", "failure rate", "%", "lower", _failure_rate),
    Metric("peak_gpu_mem", "peak GPU memory", "GiB", "lower", _tel(lambda t: t.peak_gpu_mem_bytes, 1 / GIB)),
    Metric("mean_gpu_util", "mean GPU utilization", "%", "higher", _tel(lambda t: t.mean_gpu_util_pct)),
    Metric("j_per_token", "energy per output token", "J/tok", "lower", _j_per("total_output_tokens")),
    Metric("j_per_request", "energy per request", "J/req", "lower", _j_per("completed")),
    Metric("mean_power", "mean GPU power", "W", None, _power),
    Metric("decode_floor", "decode step floor", "ms", None, _sol(lambda s: s.floor_ms)),
    Metric("mbu", "decode MBU", "%", "higher", _sol(lambda s: s.mbu, 100.0)),
    Metric("prefill_mfu", "prefill MFU (lower bound)", "%", "higher", _sol(lambda s: s.prefill_mfu, 100.0)),
    Metric("peak_kv_usage", "peak KV cache usage", "%", None, _tel(lambda t: t.peak_kv_cache_usage, 100.0)),
    Metric("preemptions", "preemptions", "", "lower", _tel(lambda t: t.preemptions)),
    Metric("server_peak_rss", "peak server RSS", "GiB", None, _tel(lambda t: t.server_peak_rss_bytes, 1 / GIB)),
)


@dataclass(frozen=True)
class Row:
    """One row: ``values[i]`` belongs to run ``i``; ``best`` holds the winning indexes."""

    kind: str  # "flag" or "metric"
    key: str
    label: str
    unit: str
    better: str | None
    # A flag row holds str per run, a metric row float | None (fmt_number lays out either).
    values: tuple[str, ...] | tuple[float | None, ...]
    best: frozenset[int]
    deltas: tuple[float | None, ...]  # percent against the baseline column; None where meaningless
    # Per column, its difference to the baseline column with the interval and the verdict; None
    # for the baseline, a flag row, or where no interval can be had (no requests, no repeats).
    noise: tuple[Difference | None, ...] = ()

    def within_noise(self, i: int) -> bool | None:
        """Whether column ``i``'s difference to the baseline is within noise; None: unknown."""
        d = self.noise[i] if i < len(self.noise) else None
        return None if d is None else d.within_noise


@dataclass(frozen=True)
class Comparison:
    runs: tuple[RunInfo, ...]  # each column's first run (its only one without repeats)
    baseline: int  # index into runs
    rows: tuple[Row, ...]
    columns: tuple[tuple[RunInfo, ...], ...] = ()  # each column's runs: the repeats of one configuration
    floor: NoiseFloor | None = None  # the box's noise floor (measured or learned), which single-run verdicts read
    statuses: tuple[str, ...] = ()  # how each column's runs ended (status_text: "ok", "ok x2, box-bound")
    # Columns holding a run during which flags changed live: two configurations measured,
    # so no verdict involves them (no "within noise" against the baseline, no best mark)
    straddled: frozenset[int] = frozenset()

    def count(self, i: int) -> int:
        """How many runs column ``i`` holds."""
        return len(self.columns[i]) if self.columns else 1

    @property
    def noise_kinds(self) -> frozenset[str]:
        """The kinds of interval the verdicts rest on (engine.runs.noise.REPEATS, WITHIN_RUN)."""
        return frozenset(d.interval.kind for row in self.rows for d in row.noise if d is not None)

    @property
    def unjudged(self) -> bool:
        """Whether some metric row's columns differ with no interval to judge them by: it marks no
        best (no verdict from noise); a row whose values are all equal, as a failure rate of 0
        everywhere, says nothing either way."""
        if self.baseline in self.straddled:
            return False  # no verdict against such a baseline at all, and the legend says why
        judged = [i for i in range(len(self.runs)) if i not in self.straddled]
        return any(row.kind == "metric" and row.better is not None and len(judged) > 1
                   and len({row.values[i] for i in judged if row.values[i] is not None}) > 1
                   and all(row.noise[i] is None for i in judged if i < len(row.noise)) for row in self.rows)

    def row(self, key: str) -> Row:
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(key)


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (x, y), bigger being better on both: True when no other point is at least as
    good on both axes and better on one."""
    return [not any(x2 >= x and y2 >= y and (x2 > x or y2 > y) for x2, y2 in points) for x, y in points]


def slo_met(run: RunInfo) -> bool | None:
    """Whether a stored run met its SLO (its ``slo_verdict``); None when it had none."""
    return run.summary.slo_met


@dataclass(frozen=True)
class RunPoint:
    """A stored run on the throughput-latency plane: output tokens/s per user (mean output
    tokens / mean E2EL, what one stream delivers) against output tokens/s per GPU."""

    run_id: int
    name: str
    tokens_per_user: float
    tokens_per_gpu: float
    slo_met: bool | None  # None: the run had no SLO
    frontier: bool  # on the Pareto frontier of the runs that met their SLO (or had none)


def run_points(runs: Sequence[RunInfo]) -> list[RunPoint]:
    """The runs that completed requests, with the frontier marked among those not missing an SLO.
    A run during which flags changed live is left out: its point would speak for one configuration."""
    found: list[tuple[RunInfo, float, float, bool | None]] = []
    for run in runs:
        if changed_during(run.summary):
            continue
        figure = run.summary.figure
        done, out = _number(figure("completed")), _number(figure("total_output_tokens"))
        e2el, thr = _number(figure("mean_e2el_ms")), _number(figure("output_throughput"))
        if not (done and out and e2el and thr):
            continue
        found.append((run, out / done / (e2el / 1000), thr / devices_needed(run.flags), slo_met(run)))
    eligible = [(u, g) for _, u, g, met in found if met is not False]
    marks = iter(pareto_frontier(eligible))
    return [RunPoint(r.id, r.name, u, g, met, next(marks) if met is not False else False)
            for r, u, g, met in found]


@dataclass(frozen=True)
class LoadPoint:
    """A run on the latency-against-load plane: the requests/s it achieved against its p99
    TTFT and TPOT (what a sweep of loads or presets is read by)."""

    run_id: int
    name: str
    load: float  # requests/s completed over the run
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    slo_met: bool | None  # None: the run had no SLO


def load_points(runs: Sequence[RunInfo]) -> list[LoadPoint]:
    """The runs that completed requests, by achieved load (lowest first); not one during which
    flags changed live (a point of a curve speaks for one configuration)."""
    found: list[LoadPoint] = []
    for run in runs:
        if changed_during(run.summary):
            continue
        figure = run.summary.figure
        rps = _number(figure("request_throughput"))
        if not rps or not _number(figure("completed")):
            continue
        found.append(LoadPoint(run.id, run.name, rps, _number(figure("p99_ttft_ms")), _number(figure("p99_tpot_ms")),
                               slo_met(run)))
    return sorted(found, key=lambda p: (p.load, p.run_id))


def delta_pct(value: float | None, base: float | None) -> float | None:
    """(value - base) / |base| in percent; None when either is missing or base is 0 (0 vs 0 is 0)."""
    if value is None or base is None:
        return None
    if base == 0:
        return 0.0 if value == 0 else None
    return (value - base) / abs(base) * 100.0


def best_indexes(values: Sequence[float | None], better: str | None) -> frozenset[int]:
    """Indexes holding the best value; empty when there is no judgement or nothing differs."""
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    if better is None or len(present) < 2:
        return frozenset()
    pick = min if better == "lower" else max
    target = pick(v for _, v in present)
    if all(v == target for _, v in present):
        return frozenset()  # all equal: no winner
    return frozenset(i for i, v in present if v == target)


_DEFAULT = "(default)"


Column = RunInfo | Sequence[RunInfo]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _column_value(metric: Metric, column: Sequence[RunInfo]) -> float | None:
    """A metric over a column's runs: the median of the runs that have it."""
    values = [v for v in (metric.read(run.summary) for run in column) if v is not None]
    return _median(values) if values else None


def compare(columns: Sequence[Column], baseline: int | None = None, *, all_flags: bool = False,
            requests: Mapping[int, Sequence[StoredRequest]] | None = None, floor: NoiseFloor | None = None,
            noises: Mapping[int, RunNoise] | None = None) -> Comparison:
    """Build the comparison. Each of ``columns`` is a run, or the runs of one configuration
    (its repeats: the column shows their median). ``baseline`` is an index into ``columns``; by
    default the column holding a run tagged baseline in the history, else the first.
    ``requests`` (run id -> its stored requests) gives each run its within-run noise where a
    column has no repeats to read it from; without them such rows are not judged against noise.
    ``noises`` (run id -> its RunNoise, bootstrapped once) stand in for a run's requests: a caller
    that compares the same runs again (the Runs tab) keeps them. ``floor`` is the box's measured
    noise floor (engine.runs.noise.box_floor: measured, else learned from the history's repeats):
    single-run verdicts take it as what moves between runs, and judge by it alone where no requests
    are at hand; without it single runs are never called beyond noise, only within it where even
    their within-run interval holds zero (engine.runs.noise.difference)."""
    if not columns:
        raise ValueError("nothing to compare: give at least one run")
    groups = tuple((c,) if isinstance(c, RunInfo) else tuple(c) for c in columns)
    if any(not g for g in groups):
        raise ValueError("a column of the comparison holds no run")
    runs = tuple(g[0] for g in groups)
    if baseline is None:
        baseline = next((i for i, g in enumerate(groups) if any(r.baseline for r in g)), 0)
    if not 0 <= baseline < len(runs):
        raise ValueError(f"baseline index {baseline} outside 0..{len(runs) - 1}")
    rows: list[Row] = []
    none = tuple(None for _ in runs)

    models = tuple(r.model or "" for r in runs)
    if all_flags or len(set(models)) > 1:
        rows.append(Row("flag", "model", "model", "", None, models, frozenset(), none))
    names: list[str] = []
    for run in runs:
        for name in run.flags:
            if name not in names:
                names.append(name)
    for name in sorted(names):
        values = tuple(_flag_text(run.flags[name]) if name in run.flags else _DEFAULT for run in runs)
        if all_flags or len(set(values)) > 1:
            rows.append(Row("flag", name, f"--{name}", "", None, values, frozenset(), none))

    # How each column's runs ended, where any did not end plainly ok (a box-bound repeat among
    # them). A column whose figure rests on spoiled runs (its run, or most of its repeats: their
    # median) carries the client's delay, so it never takes the best mark.
    statuses = tuple(status_text(g) for g in groups)
    if any(_parsed_status(run.status) is not RunStatus.OK for g in groups for run in g):  # "ok x3" is plainly ok
        rows.append(Row("flag", "status", "status", "", None, statuses, frozenset(), none))
    spoiled = frozenset(i for i, g in enumerate(groups)
                        if 2 * sum(_parsed_status(r.status).spoiled for r in g) > len(g))
    # A column holding a run during which flags changed live measured two configurations: it is
    # shown (its figures, its change against the baseline) but takes part in no verdict.
    changed = tuple(_changes_cell(g) for g in groups)
    straddled = frozenset(i for i, text in enumerate(changed) if text)
    if straddled:
        rows.append(Row("flag", "changed_live", "changed live", "", None, tuple(t or "-" for t in changed),
                        frozenset(), none))

    given, stored = noises or {}, requests or {}
    noise_of = {run.id: given[run.id] if run.id in given else run_noise(stored[run.id], run.workload, key=run.id)
                for g in groups for run in g if run.id in given or run.id in stored}
    for metric in METRICS:
        values_m = tuple(_column_value(metric, g) for g in groups)
        if all(v is None for v in values_m):
            continue  # e.g. GPU rows on a CPU box: say nothing rather than a row of n/a
        base = values_m[baseline]
        deltas = tuple(None if i == baseline else delta_pct(v, base) for i, v in enumerate(values_m))

        def diff(i: int, j: int, metric: Metric = metric) -> Difference | None:
            if i in straddled or j in straddled:
                return None  # two configurations on one side: no verdict
            return _difference(metric, groups[i], groups[j], noise_of, floor)

        noise = tuple(None if i == baseline else diff(baseline, i) for i in range(len(groups)))
        judged = tuple(None if i in straddled else v for i, v in enumerate(values_m))
        best = _beyond_noise(best_indexes(judged, metric.better), judged, diff) - spoiled
        rows.append(Row("metric", metric.key, metric.label, metric.unit, metric.better, values_m, best, deltas, noise))
    return Comparison(runs, baseline, tuple(rows), groups, floor, statuses, straddled)


def _changes_cell(group: Sequence[RunInfo]) -> str:
    """A column's flags changed live during its runs (its repeats: each named by id), "" for none."""
    found = [(run, changes) for run in group if (changes := flag_changes_of(run.summary))]
    if len(group) == 1:
        return when_text(found[0][1]) if found else ""
    return "; ".join(f"#{run.id} {when_text(changes)}" for run, changes in found)


def straddle_notes(cmp: Comparison) -> list[str]:
    """A line for each run of the comparison during which flags changed live, and why it has no verdict."""
    out = []
    for i in sorted(cmp.straddled):
        for run in cmp.columns[i] if cmp.columns else (cmp.runs[i],):
            changes = flag_changes_of(run.summary)
            if changes:
                out.append(f"#{run.id} {run.name}: {changes_text(changes)}; {TWO_CONFIGURATIONS}, so no verdict "
                           "(within noise, beyond it, best) involves "
                           + ("it." if cmp.count(i) == 1 else "its column."))
    return out


def _parsed_status(text: str) -> RunStatus:
    try:
        return RunStatus.parse(text)
    except ValueError:
        return RunStatus.FAILED  # an unknown word: judged as nothing measured


def status_text(group: Sequence[RunInfo]) -> str:
    """A column's status: its run's, or its repeats' counted ('ok x2, box-bound')."""
    counts: dict[str, int] = {}
    for run in group:
        word = _parsed_status(run.status).value if run.status else "unknown"
        counts[word] = counts.get(word, 0) + 1
    return ", ".join(word if n == 1 else f"{word} x{n}" for word, n in counts.items())


def _difference(metric: Metric, a: Sequence[RunInfo], b: Sequence[RunInfo],
                noises: Mapping[int, RunNoise], floor: NoiseFloor | None) -> Difference | None:
    """``b - a`` for one metric with its interval (engine.runs.noise); None where there are
    no repeats and no floor of the box (measured or learned) to judge single runs by, unless their
    within-run interval alone holds zero (within noise). A metric with no within-run model (the
    telemetry and server rows: GPU utilization, energy, the server's means) is judged over
    repeats alone, where both columns have two runs or more."""

    def configuration(column: Sequence[RunInfo]) -> Configuration | None:
        found = [(v, noises.get(run.id)) for run in column if (v := metric.read(run.summary)) is not None]
        if not found:
            return None
        return Configuration(tuple(v for v, _ in found), tuple(n for _, n in found))

    ca, cb = configuration(a), configuration(b)
    if ca is None or cb is None:
        return None
    if metric.figure is None:
        if len(ca.values) < 2 or len(cb.values) < 2:
            return None
        return difference(metric.key, Configuration(ca.values), Configuration(cb.values))
    box_floor: float | None = None
    if floor is not None and (pct := floor.pct(metric.figure)) is not None:
        box_floor = verdict_floor(pct, floor.df_of(metric.figure))  # as a single-run verdict reads it: at SINGLE_RUN_LEVEL
    return difference(metric.figure, ca, cb, box_floor_pct=box_floor)


def _beyond_noise(best: frozenset[int], values: Sequence[float | None],
                  diff: Callable[[int, int], Difference | None]) -> frozenset[int]:
    """The best columns, kept only where beyond the noise of every other column that has a value.
    A pair without an interval (single runs of a row with no within-run model, such as the
    server's means, and no repeats) takes the mark away too: a best resting on nothing that says
    the difference is more than noise is no verdict."""
    if not best:
        return best
    others = [j for j, v in enumerate(values) if v is not None and j not in best]
    for i in best:
        for j in others:
            d = diff(i, j)
            if d is None or d.within_noise:
                return frozenset()
    return best


def _flag_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    if isinstance(value, (dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


# --------------------------------------------------------------------------- rendering


def fmt_number(value: float | str | None) -> str:
    """Three significant figures or so: 0.0123, 1.23, 12.3, 123, 12345 (text, a flag row's
    value, as it is)."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if float(value).is_integer() and magnitude < 1e15:
        return f"{int(value):,}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def fmt_delta(delta: float | None) -> str:
    if delta is None:
        return ""
    return f"{delta:+.1f}%"


def fmt_runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def run_header(run: RunInfo, is_baseline: bool, count: int | None = None) -> str:
    """A column's header: its (first) run, the baseline mark and, given ``count``, how many runs it holds."""
    label = f"#{run.id} {run.name}" + (" (baseline)" if is_baseline else "")
    return label if count is None else f"{label} [{fmt_runs(count)}]"


def column_header(cmp: Comparison, i: int) -> str:
    return run_header(cmp.runs[i], i == cmp.baseline, cmp.count(i))


def cell_text(row: Row, i: int, mark: str = "{}") -> str:
    """Column ``i``'s cell: the value (``mark`` around it where best), the change against the
    baseline and, where the interval of that change holds zero, the words "within noise"."""
    if row.kind == "flag":
        return str(row.values[i])
    text = fmt_number(row.values[i])
    if i in row.best:
        text = mark.format(text)
    notes = [n for n in (fmt_delta(row.deltas[i]), WITHIN_NOISE if row.within_noise(i) else "") if n]
    return f"{text} ({', '.join(notes)})" if notes else text


def _cell(cmp: Comparison, row: Row, i: int, mark: str) -> str:
    return cell_text(row, i, mark)


# The figures a floor's one-line note names, with their short labels.
FLOOR_NOTE_FIGURES = (("median_ttft_ms", "TTFT p50"), ("median_tpot_ms", "TPOT p50"), ("median_e2el_ms", "E2EL p50"),
                      ("request_throughput", "req/s"))


def floor_note(floor: NoiseFloor) -> str:
    """``noise floor of this box (host): TTFT p50 ±12%, ... measured 2026-12-05 14:02, 5 runs (label)``;
    a learned one says what it was learned from."""
    parts = [f"{label} ±{pct:.0f}%" for key, label in FLOOR_NOTE_FIGURES if (pct := floor.pct(key)) is not None]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(floor.measured))
    if floor.learned:
        return (f"noise floor of this box ({floor.box}): {', '.join(parts) or 'no figure'}, learned from the "
                f"history's repeats ({fmt_runs(floor.runs)} of {floor.groups} configuration"
                f"{'' if floor.groups == 1 else 's'}, the newest {when}).")
    what = f" of {floor.label}" if floor.label else ""
    return (f"noise floor of this box ({floor.box}): {', '.join(parts) or 'no figure'}, measured {when}, "
            f"{fmt_runs(floor.runs)}{what}.")


def _single_runs(cmp: Comparison) -> bool:
    """Whether some column of a comparison of two or more holds a single run."""
    return len(cmp.runs) > 1 and any(cmp.count(i) < 2 for i in range(len(cmp.runs)))


def noise_legend(cmp: Comparison) -> list[str]:
    """What the verdicts rest on, in words (a line each)."""
    kinds = cmp.noise_kinds
    out = straddle_notes(cmp)
    if REPEATS in kinds:
        out.append("within noise: the 95% interval of the difference to the baseline, over the repeats (Welch's t), "
                   "holds zero.")
    if WITHIN_RUN in kinds:
        out.append("within noise (within-run, the weaker kind): a block bootstrap over each run's requests, "
                   "widened for what moves between runs; repeat runs (vtui bench --repeat N) to know more.")
    if BOX_FLOOR in kinds:
        out.append("within noise (box floor): single runs without stored requests, judged by the box's "
                   "noise floor alone.")
    if cmp.floor is not None:
        why = "" if cmp.floor.learned else " (runs far apart spread more than the floor's, which came one after another)"
        out.append(floor_note(cmp.floor) + f" Single runs differ within it when nothing changed; a single-run "
                   f"verdict reads it at {SINGLE_RUN_LEVEL:.0%}{why}.")
    elif _single_runs(cmp):
        # Within noise is still said where a run's own interval holds zero (noise.WITHIN_RUN_ONLY):
        # no line of its own, the Runs tab's legend must not grow (its load chart falls off 36 rows).
        out.append("single runs are not judged beyond noise, only within it: no noise floor for this box yet. "
                   "`vtui bench --noise-floor 5` measures one; 3+ runs of one configuration vtui started teach one "
                   "(n then r in the TUI, --repeat, or the same flags and workload again).")
    if cmp.unjudged:
        out.append("no best mark where no interval could be had (single runs of rows the box's noise floor lacks "
                   "or with no within-run model, such as the server's means and the GPU's): repeat runs "
                   "(vtui bench --repeat N) to judge them.")
    return out


def _label(row: Row) -> str:
    if row.kind == "flag":
        return row.label
    arrow = {"lower": " ↓", "higher": " ↑"}.get(row.better or "", "")
    unit = f" ({row.unit})" if row.unit else ""
    return f"{row.label}{unit}{arrow}"


def render(cmp: Comparison, fmt: str = "text") -> str:
    """The comparison as ``text`` (aligned table), ``markdown``, ``csv`` or ``json``."""
    if fmt == "text":
        return render_text(cmp)
    if fmt == "markdown":
        return render_markdown(cmp)
    if fmt == "csv":
        return render_csv(cmp)
    if fmt == "json":
        return json.dumps(to_json(cmp), indent=2) + "\n"
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def render_text(cmp: Comparison) -> str:
    headers = ["", *(column_header(cmp, i) for i in range(len(cmp.runs)))]
    body = [[_label(row), *(_cell(cmp, row, i, "*{}") for i in range(len(cmp.runs)))] for row in cmp.rows]
    widths = [max(len(line[c]) for line in [headers, *body]) for c in range(len(headers))]
    out = []

    def line(cells: list[str]) -> str:
        return "  ".join(cells[0].ljust(widths[0]) if c == 0 else cells[c].rjust(widths[c]) for c in range(len(cells))).rstrip()

    out.append(line(headers))
    out.append("  ".join("-" * w for w in widths))
    previous = None
    for row, cells in zip(cmp.rows, body, strict=True):
        if previous == "flag" and row.kind == "metric":
            out.append("")
        out.append(line(cells))
        previous = row.kind
    out.append("")
    out.append("* best per row, beyond the noise of every other column; ↓ lower is better, ↑ higher is better; "
               "(±%) against the baseline.")
    out.extend(noise_legend(cmp))
    out.append("TPOT = (E2EL - TTFT) / (output tokens - 1) per request; ITL = gaps between streamed chunks.")
    return "\n".join(out) + "\n"


def render_markdown(cmp: Comparison) -> str:
    headers = ["", *(column_header(cmp, i) for i in range(len(cmp.runs)))]

    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "|".join(["---"] + ["---:"] * len(cmp.runs)) + "|"]
    for row in cmp.rows:
        label = f"`{row.label}`" if row.kind == "flag" else _label(row)
        cells = [esc(label), *(esc(_cell(cmp, row, i, "**{}**")) for i in range(len(cmp.runs)))]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Bold: best per row, beyond the noise of every other column. ↓ lower is better, ↑ higher is better. "
               "(±%): against the baseline.")
    out.extend(noise_legend(cmp))
    return "\n".join(out) + "\n"


def render_csv(cmp: Comparison) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    header = ["kind", "key", "label", "unit", "better"]
    for run in cmp.runs:
        header += [f"run{run.id}", f"run{run.id}_delta_pct", f"run{run.id}_best"]
    for run in cmp.runs:
        header += [f"run{run.id}_runs", f"run{run.id}_noise", f"run{run.id}_diff_low", f"run{run.id}_diff_high"]
    writer.writerow(header)
    for row in cmp.rows:
        cells: list[object] = [row.kind, row.key, row.label, row.unit, row.better or ""]
        for i in range(len(cmp.runs)):
            value = row.values[i]
            cells += [
                "" if value is None else value,
                "" if row.deltas[i] is None else round(row.deltas[i] or 0.0, 3),
                "1" if i in row.best else "",
            ]
        for i in range(len(cmp.runs)):
            d = row.noise[i] if i < len(row.noise) else None
            cells += [cmp.count(i), "" if d is None else d.verdict, "" if d is None else d.interval.low,
                      "" if d is None else d.interval.high]
        writer.writerow(cells)
    return buf.getvalue()


def to_json(cmp: Comparison) -> dict[str, object]:
    return {
        "runs": [
            {"id": r.id, "name": r.name, "preset": r.preset, "model": r.model, "status": r.status,
             "started": r.started, "baseline": i == cmp.baseline, "runs": cmp.count(i),
             "run_ids": [x.id for x in cmp.columns[i]] if cmp.columns else [r.id],
             "changed_live": i in cmp.straddled,
             "flag_changes": [c.to_json() for x in (cmp.columns[i] if cmp.columns else (r,))
                              for c in flag_changes_of(x.summary)]}
            for i, r in enumerate(cmp.runs)
        ],
        "baseline_run": cmp.runs[cmp.baseline].id,
        "rows": [
            {
                "kind": row.kind,
                "key": row.key,
                "label": row.label,
                "unit": row.unit,
                "better": row.better,
                "values": list(row.values),
                "best_runs": sorted(cmp.runs[i].id for i in row.best),
                "delta_pct": list(row.deltas),
                "noise": [None if d is None else {"verdict": d.verdict, "difference": d.value, "low": d.interval.low,
                                                  "high": d.interval.high, "kind": d.interval.kind,
                                                  "level": d.interval.level}
                          for d in (row.noise or tuple(None for _ in cmp.runs))],
            }
            for row in cmp.rows
        ],
    }
