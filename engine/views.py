"""The views the screen reads: frozen, typed, built from the engine's objects.

A :class:`~engine.session.Session` publishes ONE :class:`SessionSnapshot` a few times a
second; this module owns its parts (the server, the devices, the server's own figures, the
runs, the comparison, the flag search) and the pure functions that build them from the
other core modules' objects (a TelemetrySnapshot, a ServerSample, a TuneResult's Pareto
points, this session's RunRecords). Nothing here holds state or imports the session (views
are below it) or Textual: the TUI, a script or a test reads the same objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from engine.flags import recordable_values
from engine.runs.compare import cell_text, compare, fmt_runs, noise_legend
from engine.runs.history import NoiseFloor, RunInfo, StoredRequest
from engine.runs.noise import RunNoise
from engine.runs.status import RunStatus
from engine.runs.summary import CrossCheck, RunSummary, ServerWindow
from loadgen.stats import DEFAULT_CAP, rank_error

if TYPE_CHECKING:
    # For the annotations only.
    from engine.flags import FlagSet, FlagValue
    from engine.runs.compare import LoadPoint, RunPoint
    from engine.telemetry.metrics import Quantiles, ServerSample
    from engine.telemetry.sampler import TelemetrySnapshot
    from engine.tune.search import ConfigResult, LiveTrial, ParetoPoint, SearchSpace, StepPoint
    from loadgen.run import RunResult
    from loadgen.spec import SLO
    from loadgen.stats import StatsWindow


# --------------------------------------------------------------------------- snapshot


@dataclass(frozen=True)
class LogLine:
    """One line of the server's output. ``n`` numbers lines from 1 for incremental display."""

    n: int
    t: float
    text: str
    level: str  # engine.server.logparse.LEVELS: "error" | "warning" | "info" | "debug"
    poll: bool = False  # vtui's own polling (a log view hides these by default)


@dataclass(frozen=True)
class ServerView:
    """What the Server panel shows: state, phase, facts and the planner's prediction."""

    state: str = "STOPPED"  # engine.server.supervisor.ServerState name, or "ATTACHED"
    phase: str = ""
    base_url: str | None = None
    model: str | None = None  # the served model name (what requests ask for)
    version: str | None = None
    pid: int | None = None
    attached: bool = False
    started_here: bool = False
    kv_tokens: int | None = None
    max_concurrency: float | None = None
    predicted_kv_tokens: int | None = None
    predicted_concurrency: float | None = None
    restart_downtime_s: float | None = None
    error_line: str | None = None
    error_hint: str | None = None
    log_path: str | None = None
    starting_s: float | None = None  # while STARTING: seconds since the launch
    expected_start_s: float | None = None  # the last start of the same model and flags, to ready


@dataclass(frozen=True)
class DeviceView:
    """One row of the resource table: a GPU, or the host when no GPU is visible."""

    name: str
    mem_used_gib: float | None
    mem_total_gib: float | None
    vllm_mem_gib: float | None  # the vLLM process tree's share (RSS on the CPU backend)
    util_pct: float | None  # GPU utilization, or host CPU percent
    power_w: float | None = None  # the GPU's draw now (None for the host row)
    index: int | None = None  # NVML's index of the GPU (None for the host row)


@dataclass(frozen=True)
class ServerMetricsView:
    """The server's own figures from /metrics over the last window."""

    running: float | None = None
    waiting: float | None = None
    kv_usage_pct: float | None = None
    preemptions_per_s: float | None = None
    prefix_hit_pct: float | None = None
    ttft_ms: Mapping[str, float] = field(default_factory=dict)  # "p50"/"p90"/"p99"
    itl_ms: Mapping[str, float] = field(default_factory=dict)
    e2el_ms: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None  # why the scrape failed, when it did
    # vLLM's busiest API server process, % of one core (engine.telemetry.host): the frontend
    # that streams every sequence's tokens; near 100 it, not the GPU, sets the pace.
    api_server_cpu_pct: float | None = None
    api_servers: int | None = None  # how many API server processes (vllm serve --api-server-count)


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


# Live's latency rows: (label, metric) as LoadSummary and StatsWindow name them.
LIVE_METRICS = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el"))


@dataclass(frozen=True)
class LiveFigures:
    """Live's throughput and latency lines, with what they cover (``scope``).

    While a run goes they are its rolling window (``last 10 s``, loadgen's StatsWindow); once it
    ended they are the run's own figures, the stored summary that Runs, the history, compare,
    ``vtui bench`` and the result file show (``whole run``), so one run reads the same
    everywhere (issue 32, item 3)."""

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
        status=None if record.status == RunStatus.OK else str(record.status))


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


# --------------------------------------------------------------------------- what the parts report
# The session's parts (engine.server.live, engine.runs.live, engine.tune.live, engine.telemetry.live)
# report to the session through one typed stream: each is handed ``emit`` and calls it with one of
# these; engine.session.Session._on_event is the one place that acts on them. What a part asks of
# the session (the edited flags, whether a run goes) stays a plain query it is handed.


@dataclass(frozen=True)
class Changed:
    """Something a snapshot shows changed: the next publish sends a new one."""


@dataclass(frozen=True)
class Notice:
    """A line for the status bar's notice."""

    text: str


@dataclass(frozen=True)
class ServerTookFlags:
    """A start or an apply made the server run ``flags``: what "dirty" compares against moves."""

    flags: FlagSet


@dataclass(frozen=True)
class FlagsRecovered:
    """An attached server's flags were read back from its command line: they go into the editor."""

    flags: FlagSet


@dataclass(frozen=True)
class TuneTookFlags:
    """The search's winner (or a configuration the user picked) goes into the editor."""

    flags: FlagSet


@dataclass(frozen=True)
class TuneEnded:
    """The search ended, whatever the outcome: the server runs its last configuration, or nothing."""


SessionEvent: TypeAlias = Changed | Notice | ServerTookFlags | FlagsRecovered | TuneTookFlags | TuneEnded
Emit: TypeAlias = Callable[[SessionEvent], None]
CHANGED = Changed()


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


@dataclass(frozen=True)
class SessionSnapshot:
    """Everything the screen shows, frozen. Built a few times a second."""

    t: float
    seq: int  # grows whenever something changed; a renderer may skip equal seqs
    model: str
    flags: FlagSet  # the edited flags
    running_flags: FlagSet | None  # the flags the server runs with, None when no server
    flag_errors: Mapping[str, str]  # flag name -> reason, as typed
    dirty: bool  # edited flags differ from the preset or run they were loaded from
    workload_label: str
    repeats: int  # how many runs `r` makes of the workload
    preset_name: str | None
    server: ServerView
    window: StatsWindow | None  # the latest load-run window
    devices: tuple[DeviceView, ...]
    gpu_unavailable: str | None  # the reason, shown once
    server_metrics: ServerMetricsView
    series: Mapping[str, tuple[float, ...]]  # sparkline name -> last points
    logs: tuple[LogLine, ...]
    run: RunProgress | None
    runs: tuple[RunRecord, ...]
    baseline: int | None  # RunRecord.index of the baseline
    comparison: ComparisonView | None
    notice: str | None  # the last thing that happened worth a line (run stopped, ...)
    busy: str | None  # the action in progress ("starting", "restarting", ...)
    tune: TuneView | None = None  # the flag search of this session (running or last), None before one
    # Flag -> the value the running or attached server reports it resolved (its /metrics'
    # vllm:*_config_info labels, engine.telemetry.configinfo): block-size 128 where the flag
    # was left out. Empty without a server or before its first answer.
    server_config: Mapping[str, FlagValue] = field(default_factory=dict)
    # Flags vLLM takes but that will not do what they say (engine.flags.validation_warnings): flag
    # name -> why, shown under the editor; a start is not refused for them.
    flag_warnings: Mapping[str, str] = field(default_factory=dict)
    # The Runs tab's lists: the history (every path's runs, newest first, filtered by
    # ``stored_filter``), the compared runs on the latency-against-load plane, the stored runs
    # on the throughput-latency plane. Read again when a run ends, the filter or the compared
    # runs change, or the screen asks (Session.refresh_stored), not at every publish.
    stored: tuple[StoredRun, ...] = ()
    stored_filter: str = ""
    load_points: tuple[LoadPoint, ...] = ()
    run_points: tuple[RunPoint, ...] = ()

    @property
    def figures(self) -> LiveFigures | None:
        """Live's throughput and latency: the run's rolling window while it goes, the last
        run's own figures once it ended (see :func:`live_figures`)."""
        return live_figures(self.window, self.run is not None, self.runs)


@dataclass(frozen=True)
class TuneRequest:
    """What a flag search is asked for: SLO limits, the space, the budget, the load axis."""

    slo: SLO  # at least one limit
    space: SearchSpace
    budget_s: float
    mode: str = "rate"  # "rate" (open loop, req/s) or "concurrency" (closed loop)
    start_load: float | None = None  # first load probed; None: a saturation step decides
    # Where the trials run, as `vtui tune --gpus --parallel` says it (engine.tune.slots):
    gpus: str | None = None  # "0,1,2,3" or "0-3"; None: every GPU the session sees
    parallel: int | None = None  # at most this many trials at once; None: one per slot
    # The Ray cluster the trials run on as actors, as `vtui tune --ray` says it (engine.tune.ray):
    ray: str | None = None  # "local", "auto" or an address such as HEAD:6379; None: no Ray


@dataclass(frozen=True)
class TrialView:
    """A configuration being measured now (engine.tune.search.LiveTrial) with its slot's
    devices as the resource table shows them: its GPUs, or the host where there are none.
    A trial on a Ray actor has no devices here (they are its node's, not the ones this
    session samples) and says where it runs in ``where``."""

    trial: LiveTrial
    devices: tuple[DeviceView, ...]
    # A Ray trial's slot and its actor's node and GPUs ("trial slot 0 on node GPU 2",
    # engine.tune.ray.RayMeasurer.where); empty for a trial on this machine.
    where: str = ""


@dataclass(frozen=True)
class TuneView:
    """What the Tune screen shows: the search's progress and what it found so far."""

    id: str
    status: str  # "running" | "done" | "budget" | "interrupted" | "failed"
    mode: str
    slo_label: str  # "p99 TTFT <= 500 ms, p99 TPOT <= 50 ms"
    elapsed_s: float
    budget_s: float
    starts: int
    steps: int
    configs_total: int  # configurations in the space
    lines: tuple[str, ...]  # the latest progress lines, oldest first
    rows: tuple[ConfigResult, ...]  # in the order tried
    best_key: str | None = None
    best_goodput: float | None = None  # req/s meeting every limit at the best's limit load
    best_limit: float | None = None  # req/s or concurrency; inf: met with all requests at once
    best_flags: FlagSet | None = None  # the winner's
    best_serve_line: str | None = None
    best_docker_line: str | None = None  # on one line (the export has the multi-line form)
    pareto: tuple[ParetoPoint, ...] = ()  # the points on the frontier
    # Latency against load, per configuration: (key, ((load, TTFT pX ms, TPOT pX ms, met), ...)),
    # finite loads in increasing order (the capacity probe at "all at once" has no place on the axis).
    step_series: tuple[tuple[str, tuple[StepPoint, ...]], ...] = ()  # engine.tune.search.step_series
    state_path: str | None = None
    resume_command: str = ""  # how to carry on headless: "vtui tune --resume ID"
    running: tuple[TrialView, ...] = ()  # what each slot measures now, with its devices
    error: str | None = None  # why it failed (status "failed")


# --------------------------------------------------------------------------- tune


def space_lines(space: SearchSpace) -> str:
    """A search space as the editable text ``SearchSpace.parse`` reads back, one flag a line."""
    return "\n".join(space.lines())


def frontier_points(points: Sequence[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """The Pareto points on the frontier, once each (a limit measured twice gives twins)."""
    seen: set[tuple[str, float, float, float]] = set()
    out = []
    for p in points:
        twin = (p.key, p.load, round(p.tokens_per_user, 6), round(p.tokens_per_gpu, 6))
        if p.frontier and twin not in seen:
            seen.add(twin)
            out.append(p)
    return tuple(out)


def slo_label(slo: SLO) -> str:
    """``p99 TTFT <= 500 ms, p99 TPOT <= 50 ms``."""
    parts = []
    for key, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2el", slo.e2el_ms)):
        if limit is not None:
            parts.append(f"p{slo.percentile:g} {key.upper()} <= {limit:g} ms")
    return ", ".join(parts)


# --------------------------------------------------------------------------- adapters
# These translate the other core modules' objects into the snapshot's views; a figure the
# object does not have (None) shows as "-".


def _gib(value: float | None) -> float | None:
    return None if value is None else float(value) / 2**30


def devices_view(snap: TelemetrySnapshot | None) -> tuple[tuple[DeviceView, ...], str | None]:
    """GPU rows from a TelemetrySnapshot, or the host row when NVML gave none."""
    if snap is None:
        return (), None
    unavailable = snap.gpu_unavailable.reason if snap.gpu_unavailable is not None else None
    rows: list[DeviceView] = []
    for g in snap.gpus:
        name = f"GPU{g.index}" + ("" if g.available else f" ({g.reason or 'lost'})")
        rows.append(
            DeviceView(
                name=name,
                mem_used_gib=_gib(g.mem_used_bytes),
                mem_total_gib=_gib(g.mem_total_bytes),
                vllm_mem_gib=_gib(g.server_mem_bytes),
                util_pct=g.util_gpu_pct,
                power_w=g.power_w,
                index=g.index,
            )
        )
    host = snap.host
    if not rows and host is not None:
        rows.append(
            DeviceView(
                name="host",
                mem_used_gib=_gib(host.mem_used_bytes),
                mem_total_gib=_gib(host.mem_total_bytes),
                vllm_mem_gib=_gib(host.proc_rss_bytes),
                util_pct=host.cpu_percent,
            )
        )
    return tuple(rows), unavailable


def _ms(q: Quantiles | None) -> dict[str, float]:
    """Server Quantiles (seconds) to {"p50": ms, ...}."""
    if q is None:
        return {}
    return {k: v * 1000.0 for k, v in (("p50", q.p50), ("p90", q.p90), ("p99", q.p99)) if v is not None}


def server_metrics_view(s: ServerSample | None, telemetry: TelemetrySnapshot | None = None) -> ServerMetricsView:
    """The Live panel's server figures from the latest ServerSample, with the API server's
    CPU from the latest telemetry's host sample."""
    host = telemetry.host if telemetry is not None else None
    front = host.proc_front_cpu_percent if host is not None else None
    servers = host.proc_front_procs if host is not None else None
    if s is None:
        return ServerMetricsView(api_server_cpu_pct=front, api_servers=servers)
    if s.stale:
        return ServerMetricsView(error=s.reason or "no answer", api_server_cpu_pct=front, api_servers=servers)
    return ServerMetricsView(
        api_server_cpu_pct=front, api_servers=servers,
        running=s.running,
        waiting=s.waiting,
        kv_usage_pct=None if s.kv_cache_usage is None else s.kv_cache_usage * 100,
        preemptions_per_s=s.preemptions_per_s,
        prefix_hit_pct=None if s.prefix_hit_rate is None else s.prefix_hit_rate * 100,
        ttft_ms=_ms(s.ttft),
        itl_ms=_ms(s.itl),
        e2el_ms=_ms(s.e2e),
    )


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
    return ComparisonView(
        columns=tuple(_column_label(g) for g in columns) + tuple(f"stored #{s.id} {s.name}" for s in extra),
        rows=tuple(rows), baseline=base_col, flag_rows=flag_rows,
        counts=tuple(cmp.count(i) for i in range(len(infos))),
        statuses=cmp.statuses,
        notes=tuple(noise_legend(cmp)) + ((f"intervals of {fmt_runs(pending)} being computed "
                                          "(their requests bootstrapped)",) if pending else ()),
    )
