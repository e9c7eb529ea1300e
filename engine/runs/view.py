"""The session's runs as the screen reads them: the run in progress (RunProgress), each run
measured (RunRecord), Live's figures (LiveFigures: the rolling window while a run goes, the
stored run's own figures after), the history's runs as the Runs tab lists them (StoredRun) and
the comparison formatted for display (ComparisonView, over engine.runs.compare). Frozen data and
the pure functions that build it; engine.runs.part keeps the state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.flags import recordable_values
from engine.runs.compare import cell_text, compare, fmt_runs, noise_legend
from engine.runs.flagchange import changes_text, flag_changes_of
from engine.runs.history import NoiseFloor, RunInfo, StoredRequest
from engine.runs.noise import RunNoise
from engine.runs.status import RunStatus
from engine.runs.summary import CrossCheck, RunSummary, ServerWindow
from loadgen.stats import DEFAULT_CAP, rank_error

if TYPE_CHECKING:
    # For the annotations only.
    from engine.flags import FlagSet
    from loadgen.run import RunResult
    from loadgen.stats import StatsWindow


@dataclass(frozen=True)
class RunProgress:
    """The load run in progress."""

    label: str
    started_t: float
    elapsed_s: float
    completed: int
    planned: int | None  # planned request count, when the workload stops on a count
    duration_s: float | None  # planned duration, when it stops on time
    fraction: float | None  # 0..1, None when open-ended
    # Flags changed live while it goes (engine.runs.flagchange.changes_text; None: none): the run
    # measures two configurations from then on
    changes: str | None = None


# Live's latency rows: (label, metric) as LoadSummary and StatsWindow name them.
LIVE_METRICS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el"))


@dataclass(frozen=True)
class LiveFigures:
    """Live's throughput and latency lines, with what they cover (``scope``).

    While a run goes they are its rolling window (``last 10 s``, loadgen's StatsWindow); once it
    ended they are the run's own figures, the stored summary that Runs, the history, compare,
    ``vtui bench`` and the result file show (``whole run``), so one run reads the same
    everywhere."""

    scope: str  # "last 10 s" (the rolling window) or "whole run"
    whole_run: bool
    req_s: float | None
    out_tok_s: float | None
    # (label, (p50, p90, p99) in ms, None where there is no figure), in LIVE_METRICS' order
    latency: tuple[tuple[str, tuple[float | None, float | None, float | None]], ...]
    in_flight: int | None = None  # the window's; None for a whole run (it ended)
    completed: int | None = None  # the whole run's; None for a window
    slo_met: float | None = None  # 0..1 of completions that met the SLO; None without one
    goodput: float | None = None  # good requests/s
    failed: int = 0  # failures so far in the run / in the whole run
    client_bound: bool = False
    client_lag_ms: float | None = None  # the window's worst loop lag (client-bound windows)
    # Where the percentiles are read from a sample (a run past loadgen.stats' cap): the bound.
    note: str | None = None
    # A whole run's server side over its own window (engine.runs.summary.ServerWindow): p50/p99 per
    # LIVE_METRICS label where /metrics has that histogram (TTFT, ITL, E2EL); empty for a window
    # (the panel then shows the live scrapes').
    server_latency: tuple[tuple[str, tuple[float | None, float | None]], ...] = ()
    # The client beside the server over the run (engine.runs.crosscheck): one line of means, and
    # the cross-check's warnings (a disagreement past 10%, the reason named).
    beside: str | None = None
    warnings: tuple[str, ...] = ()
    status: str | None = None  # the run's status where it is not plainly ok (box-bound, ...)
    changes: str | None = None  # flags changed live during the whole run (engine.runs.flagchange), None: none


def window_figures(w: StatsWindow) -> LiveFigures:
    """A load run's rolling window as Live shows it (``last N s``)."""

    def row(metric: str) -> tuple[float | None, float | None, float | None]:
        pcts = getattr(w, metric)
        if pcts.count == 0:
            return (None, None, None)
        return (pcts.p50, pcts.p90, pcts.p99)

    return LiveFigures(
        scope=f"last {w.window_s:g} s", whole_run=False, req_s=w.req_s, out_tok_s=w.output_tok_s,
        latency=tuple((label, row(metric)) for label, metric in LIVE_METRICS), in_flight=w.in_flight,
        slo_met=w.slo_attainment, goodput=w.goodput, failed=w.total_failed, client_bound=w.client_bound,
        client_lag_ms=w.client_lag_ms)


def run_figures(record: RunRecord) -> LiveFigures | None:
    """A finished run's own figures (its stored summary, read as every other view reads it);
    None when it measured none."""
    summary = record.summary
    if summary.load is None:
        return None
    fig = summary.figure

    def row(metric: str) -> tuple[float | None, float | None, float | None]:
        if not fig("completed"):
            return (None, None, None)
        p50 = fig(f"median_{metric}_ms")
        return (fig(f"p50_{metric}_ms") if p50 is None else p50, fig(f"p90_{metric}_ms"), fig(f"p99_{metric}_ms"))

    req_s, goodput = fig("request_throughput"), fig("request_goodput")
    note = None
    result = record.result
    if result is not None and result.extra.get("percentiles_exact") is False:
        note = (f"percentiles from a {DEFAULT_CAP:,}-sample reservoir: p99 +-{rank_error(99, DEFAULT_CAP):.2f}, "
                f"p50 +-{rank_error(50, DEFAULT_CAP):.2f} percentile points")
    window = summary.server or ServerWindow()
    hists = {"TTFT": window.server_ttft, "ITL": window.server_itl, "E2EL": window.server_e2e}
    server_latency = tuple((label, (h.p50_ms, h.p99_ms) if h is not None else (None, None))
                           for label, _ in LIVE_METRICS for h in (hists.get(label),))
    check = summary.cross_check
    return LiveFigures(
        scope="whole run", whole_run=True, req_s=req_s, out_tok_s=fig("output_throughput"),
        latency=tuple((label, row(metric)) for label, metric in LIVE_METRICS),
        completed=int(fig("completed") or 0),
        slo_met=(goodput / req_s if req_s else None) if goodput is not None else None, goodput=goodput,
        failed=int(fig("failed") or 0), client_bound=summary.client_bound, note=note,
        server_latency=server_latency if any(h is not None for h in hists.values()) else (),
        beside=beside_line(check) if check is not None else None,
        warnings=check.warnings if check is not None else (),
        status=None if record.status == RunStatus.OK else str(record.status),
        changes=changes_text(flag_changes_of(summary)) or None)


def beside_line(check: CrossCheck) -> str | None:
    """The client's means beside the server's over one run, as Live shows them after it; None
    where the server's window was not read (no exact scrapes at the run's edges)."""
    if check.server_mean_ttft_ms is None and check.server_tpot_ms is None:
        return None

    def pair(client: float | None, server: float | None, fmt: str) -> str:
        return f"{'-' if client is None else fmt.format(client)} / {'-' if server is None else fmt.format(server)}"

    parts = [f"TTFT {pair(check.client_mean_ttft_ms, check.server_mean_ttft_ms, '{:.1f}')}",
             f"TPOT {pair(check.client_mean_tpot_ms, check.server_tpot_ms, '{:.2f}')}"]
    if check.server_mean_queue_ms is not None:
        parts.append(f"queue {check.server_mean_queue_ms:.1f}")
    if check.prefix_hit_rate is not None:
        parts.append(f"prefix hit {check.prefix_hit_rate:.0%}")
    return "client / server means, ms: " + "  ".join(parts)


def live_figures(window: StatsWindow | None, active: bool, runs: Sequence[RunRecord]) -> LiveFigures | None:
    """What Live's figures show: the rolling window while a run goes; after it, the last run's
    own figures; a window with no run of this session behind it (a replay) as a window."""
    if not active and runs:
        figures = run_figures(runs[-1])
        if figures is not None:
            return figures
    return window_figures(window) if window is not None else None


@dataclass(frozen=True)
class RunRecord:
    """A run measured in this session."""

    index: int  # 1-based, in the order runs were started
    label: str
    flags: FlagSet
    started_t: float
    status: RunStatus  # engine.runs.status: the same words as the history and every path
    # The run's stored document (engine.runs.measure), parsed: its load figures, telemetry,
    # server window, cross-check, stream, SLO verdict, ... (engine.runs.summary.RunSummary).
    summary: RunSummary
    result: RunResult | None = None  # None when the run failed before measuring
    history_id: int | None = None  # the run's id in the history, None when it was not stored
    error: str | None = None
    ended_t: float | None = None
    # The index of the first run of the repeats this one belongs to (one comparison column);
    # None: a column of its own.
    group: int | None = None
    superseded: bool = False  # spoiled by the box and measured again (a sweep): out of the comparison


@dataclass(frozen=True)
class StoredRun:
    """One run of the history, as the Runs tab lists it (any path, any session)."""

    id: int
    name: str
    preset: str | None
    model: str | None
    started: float
    status: str
    req_s: float | None
    ttft_p50_ms: float | None
    compared: bool  # shown in the comparison beside this session's runs
    changed: str | None = None  # flags changed live during it ("at 12.3 s: max-num-seqs 128 -> 2"), None: none


@dataclass(frozen=True)
class ComparisonView:
    """Runs side by side: one column per run, best value and baseline delta per row."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[str, ...], frozenset[int]], ...]  # label, cells, best columns
    baseline: int | None  # column index
    flag_rows: int = 0  # the first rows are the flags that differ between runs
    counts: tuple[int, ...] = ()  # how many runs each column holds
    notes: tuple[str, ...] = ()  # what the "within noise" verdicts rest on (engine.runs.compare.noise_legend)
    statuses: tuple[str, ...] = ()  # how each column's runs ended ("ok", "box-bound", "ok x2, box-bound")


def run_info(record: RunRecord, *, baseline: bool = False, vllm_version: str | None = None) -> RunInfo:
    """A session run as engine.runs.history's RunInfo, so engine.runs.compare can lay it out."""
    return RunInfo(
        id=record.history_id if record.history_id is not None else record.index,
        name=record.label,
        preset=None,
        started=record.started_t,
        ended=record.ended_t,
        status=str(record.status),
        flags=recordable_values(record.flags),
        vllm_version=vllm_version,
        model=str(record.flags.model) if record.flags is not None else None,
        gpus=(),
        workload={},
        summary=record.summary,
        baseline=baseline,
        tags=(),
    )


def _column_label(runs: Sequence[RunRecord]) -> str:
    """A column's name: its run's label; for repeats, the first's without its "(1/N)", and how many."""
    first = runs[0].label
    if len(runs) == 1:
        return first
    name, _, _ = first.rpartition(" (")
    return f"{name or first} x{len(runs)}"


def compare_view(records: Sequence[RunRecord], baseline: int | None, stored: Sequence[RunInfo] = (),
                 requests: Mapping[int, Sequence[StoredRequest]] | None = None, *,
                 noises: Mapping[int, RunNoise] | None = None, floor: NoiseFloor | None = None,
                 pending: int = 0) -> ComparisonView:
    """engine.runs.compare's table of ``records`` (this session's runs) and ``stored`` runs of the
    history (``RunInfo``, after them), formatted for display (strings only). ``requests`` (history
    run id -> its stored requests) or ``noises`` (-> its requests bootstrapped, kept by the
    caller) give each run its within-run noise; ``floor`` is the box's measured noise floor;
    ``pending`` runs are still being bootstrapped (a note says so)."""
    # One column per run, or per repeats of one configuration (RunRecord.group), in run order.
    groups: dict[int, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(r.group if r.group is not None else r.index, []).append(r)
    columns = list(groups.values())
    base_col = next((i for i, g in enumerate(columns) if any(r.index == baseline for r in g)), 0)
    own = {r.history_id for r in records}
    extra = [s for s in stored if s.id not in own]
    infos: list[Sequence[RunInfo]] = [[run_info(r, baseline=i == base_col) for r in g]
                                      for i, g in enumerate(columns)]
    infos += [[s] for s in extra]
    unstored = {r.index for r in records if r.history_id is None}  # their ids are not the history's
    cmp = compare(infos, base_col, requests={k: v for k, v in (requests or {}).items() if k not in unstored},
                  noises={k: v for k, v in (noises or {}).items() if k not in unstored}, floor=floor)
    rows: list[tuple[str, tuple[str, ...], frozenset[int]]] = []
    flag_rows = 0
    for row in cmp.rows:
        if row.kind == "flag":
            rows.append((row.label, tuple(str(v) for v in row.values), frozenset()))
            flag_rows += 1
            continue
        arrow = {"lower": " ↓", "higher": " ↑"}.get(row.better or "", "")
        unit = f" {row.unit}" if row.unit and row.unit not in row.label else ""
        cells = tuple(cell_text(row, i) for i in range(len(row.values)))  # "within noise" where it is
        rows.append((f"{row.label}{unit}{arrow}", cells, row.best))
    labels = [_column_label(g) for g in columns] + [f"stored #{s.id} {s.name}" for s in extra]
    return ComparisonView(
        # a run during which flags changed live measured two configurations: its column says so
        columns=tuple(f"{label} (changed live)" if i in cmp.straddled else label for i, label in enumerate(labels)),
        rows=tuple(rows), baseline=base_col, flag_rows=flag_rows,
        counts=tuple(cmp.count(i) for i in range(len(infos))),
        statuses=cmp.statuses,
        notes=tuple(noise_legend(cmp)) + ((f"intervals of {fmt_runs(pending)} being computed "
                                          "(their requests bootstrapped)",) if pending else ()),
    )
