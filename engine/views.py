"""The views the screen reads: one frozen SessionSnapshot, built from the rooms' own views.

A :class:`~engine.session.Session` publishes ONE :class:`SessionSnapshot` a few times a
second. Its parts are defined in the rooms that make them, as plain frozen data those rooms
and the session's parts may import without reaching up to the screen's layer: the server and
its log lines (engine.server.view), the devices and the server's own figures
(engine.telemetry.view), the runs, Live's figures and the comparison (engine.runs.view), the
flag search (engine.tune.view), and what the parts report to the session (engine.events). This
module holds the snapshot and names every view again, so the TUI, a script or a test reads them
from one place. Nothing here holds state or imports the session (views are below it) or
Textual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.events import (
    CHANGED,
    Changed,
    Emit,
    FlagsRecovered,
    LimitsSetLive,
    Notice,
    ServerTookFlags,
    SessionEvent,
    TuneEnded,
    TuneTookFlags,
)
from engine.runs.view import (
    LIVE_METRICS,
    ComparisonView,
    LiveFigures,
    RunProgress,
    RunRecord,
    StoredRun,
    beside_line,
    compare_view,
    live_figures,
    run_figures,
    run_info,
    window_figures,
)
from engine.server.view import LogLine, ServerView
from engine.telemetry.view import DeviceView, ServerMetricsView, devices_view, server_metrics_view
from engine.tune.view import TrialView, TuneRequest, TuneView, frontier_points, slo_label, space_lines

if TYPE_CHECKING:
    # For the annotations only.
    from engine.flags import FlagSet, FlagValue
    from engine.runs.compare import LoadPoint, RunPoint
    from loadgen.stats import StatsWindow

__all__ = [
    "CHANGED",
    "LIVE_METRICS",
    "Changed",
    "ComparisonView",
    "DeviceView",
    "Emit",
    "FlagsRecovered",
    "LimitsSetLive",
    "LiveFigures",
    "LogLine",
    "Notice",
    "RunProgress",
    "RunRecord",
    "ServerMetricsView",
    "ServerTookFlags",
    "ServerView",
    "SessionEvent",
    "SessionSnapshot",
    "StoredRun",
    "TrialView",
    "TuneEnded",
    "TuneRequest",
    "TuneTookFlags",
    "TuneView",
    "beside_line",
    "compare_view",
    "devices_view",
    "frontier_points",
    "live_figures",
    "run_figures",
    "run_info",
    "server_metrics_view",
    "slo_label",
    "space_lines",
    "window_figures",
]


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
    # Per sparkline, the live limit changes within its points: (points since, words).
    series_marks: Mapping[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    # Flags a server vtui started takes without a restart (engine.server.livehook.LIVE): flag
    # name -> how it changes there.
    live_flags: Mapping[str, str] = field(default_factory=dict)

    @property
    def figures(self) -> LiveFigures | None:
        """Live's throughput and latency: the run's rolling window while it goes, the last
        run's own figures once it ended (see :func:`live_figures`)."""
        return live_figures(self.window, self.run is not None, self.runs)
