"""The server as the screen reads it: its state and facts (ServerView) and its log lines
(LogLine). Plain frozen data that engine.server.part builds and engine.views' SessionSnapshot
holds."""

from __future__ import annotations

from dataclasses import dataclass


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
    live_changes: tuple[tuple[float, str], ...] = ()  # (session clock, what changed) per live change
    error_line: str | None = None
    error_hint: str | None = None
    log_path: str | None = None
    starting_s: float | None = None  # while STARTING: seconds since the launch
    expected_start_s: float | None = None  # the last start of the same model and flags, to ready
