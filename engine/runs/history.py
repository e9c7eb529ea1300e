"""Run history in SQLite: every run, its per-request records and telemetry series.

One file, ``engine.paths.data_dir()/history.sqlite``, in WAL mode. A run is written
while it happens by a :class:`RunRecorder`: callers hand it records (cheap, never
blocking on disk) and a writer thread commits them at least every
:data:`COMMIT_INTERVAL_S`, so a crash or ``kill -9`` loses at most the last second.
Each run row carries the writer's pid and process start time (``procs.ProcRef``). A run still
marked ``running`` whose writer is gone (killed, crashed) reads as ``cancelled``, its ``ended``
the last thing stored and its summary's error saying it was cut short, to every reader at once,
read-only ones included (:func:`cut_short`); a writable open also stores that (:meth:`History.recover`).

Disk full, a read-only file or any other SQLite failure becomes a
:class:`HistoryError` naming the file: opening raises it (the caller keeps its
results in memory), a recorder stores it in ``.error`` and stops writing without
disturbing the run.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import json
import math
import os
import queue
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, cast, runtime_checkable

from engine import paths
from engine.runs.status import RunStatus
from engine.runs.summary import RunSummary
from engine.server import procs
from engine.values import JSONObject, JSONValue, stored_int, stored_number, stored_text

if TYPE_CHECKING:
    from engine.telemetry.sampler import TelemetrySnapshot
    from loadgen.records import RequestResult
    from loadgen.stats import StatsWindow

# What is read back is typed where the row is read: a run's summary is parsed once into a RunSummary
# (engine.runs.summary), a request row into a StoredRequest, a sample's data checked to be a JSON
# object (engine.values.JSONObject, which readers narrow). Flags, workload, GPUs and a saved search
# come back as `object` values; what is only written (and goes through to_jsonable) is `object` too.

COMMIT_INTERVAL_S = 0.25
"""How often the writer thread commits; four times inside the one-second promise."""

STATUSES = tuple(s.value for s in RunStatus)  # engine.runs.status: one vocabulary on every path


class HistoryError(Exception):
    """The history file cannot be used: names the file and the reason."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


# --------------------------------------------------------------------------- schema
# MIGRATIONS[i] takes a database from user_version i to i + 1. Never edit a shipped
# step: add a new one, so every older file upgrades the same way.

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: the first schema.
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        preset TEXT,
        started REAL NOT NULL,
        ended REAL,
        status TEXT NOT NULL,
        flags TEXT NOT NULL DEFAULT '{}',
        vllm_version TEXT,
        model TEXT,
        gpus TEXT NOT NULL DEFAULT '[]',
        workload TEXT NOT NULL DEFAULT '{}',
        summary TEXT NOT NULL DEFAULT '{}',
        baseline INTEGER NOT NULL DEFAULT 0,
        writer_pid INTEGER,
        writer_started REAL
    );
    CREATE TABLE requests (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        req_id INTEGER,
        t_start REAL NOT NULL,
        ttft_s REAL,
        e2el_s REAL,
        itl_s TEXT NOT NULL DEFAULT '[]',
        input_tokens INTEGER,
        output_tokens INTEGER,
        ok INTEGER NOT NULL,
        error TEXT,
        cancelled INTEGER NOT NULL DEFAULT 0,
        extra TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE samples (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        t REAL NOT NULL,
        data TEXT NOT NULL
    );
    """,
    # 1 -> 2: free-form tags on runs, and indexes once histories grew past a few runs.
    """
    ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
    CREATE INDEX requests_run ON requests(run_id, t_start);
    CREATE INDEX samples_run ON samples(run_id, kind, t);
    """,
    # 2 -> 3: flag searches (`vtui tune`), saved after every step so they can be resumed.
    """
    CREATE TABLE tunes (
        id TEXT PRIMARY KEY,
        started REAL NOT NULL,
        updated REAL NOT NULL,
        status TEXT NOT NULL,
        model TEXT,
        summary TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL
    );
    """,
    # 3 -> 4: a box's noise floor (`vtui bench --noise-floor K`): each figure's run-to-run spread
    # over K runs of one workload, which single-run comparisons on that box take as their noise.
    """
    CREATE TABLE noise_floors (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        box TEXT NOT NULL,
        measured REAL NOT NULL,
        runs INTEGER NOT NULL,
        run_ids TEXT NOT NULL DEFAULT '[]',
        label TEXT NOT NULL DEFAULT '',
        model TEXT,
        fingerprint TEXT,
        spread TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX noise_floors_box ON noise_floors(box, measured);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RunInfo:
    """One stored run (the ``runs`` row, JSON columns decoded)."""

    id: int
    name: str
    preset: str | None
    started: float
    ended: float | None
    status: str
    flags: Mapping[str, object]
    vllm_version: str | None
    model: str | None
    gpus: Sequence[object]
    workload: Mapping[str, object]
    summary: RunSummary  # the stored document, parsed once (engine.runs.summary)
    baseline: bool
    tags: tuple[str, ...]
    requests: int = 0
    """How many per-request records are stored."""

    @property
    def duration_s(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["flags"] = dict(self.flags)
        out["workload"] = dict(self.workload)
        out["summary"] = self.summary.to_json()
        out["gpus"] = list(self.gpus)
        out["tags"] = list(self.tags)
        return out


@dataclass(frozen=True)
class TuneInfo:
    """One saved flag search (the ``tunes`` row, without its full state)."""

    id: str
    started: float
    updated: float
    status: str
    model: str | None
    summary: Mapping[str, object]


def this_box() -> str:
    """The box a noise floor belongs to: its hostname."""
    return socket.gethostname() or "localhost"


def server_fingerprint(model: str | None, flags: Mapping[str, object]) -> str:
    """Which server a noise floor was measured against: its model and flags, hashed (12 hex digits)."""
    import hashlib

    text = json.dumps({"model": model, "flags": to_jsonable(dict(flags))}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class NoiseFloor:
    """A box's run-to-run noise (the ``noise_floors`` row): ``runs`` runs of one workload
    (``label``) measured one after another, and per figure (engine.runs.noise.FIGURES) the
    spread ``spread_pct``, within which two single runs of one configuration on this box differ
    (engine.runs.noise.floor_spread computes it; a single-run comparison reads it)."""

    box: str
    measured: float  # when (time.time())
    runs: int
    spread_pct: Mapping[str, float]
    label: str = ""
    model: str | None = None
    fingerprint: str | None = None  # the server's model and flags, hashed (which server it was)
    run_ids: tuple[int, ...] = ()
    id: int | None = None

    def pct(self, figure: str) -> float | None:
        """The figure's spread in percent; None where the floor has none."""
        value = self.spread_pct.get(figure)
        return None if value is None or not math.isfinite(value) else float(value)


def _status_text(stored: str) -> str:
    """A stored status in today's words (older histories wrote complete/cut_short)."""
    try:
        return RunStatus.parse(stored).value
    except ValueError:
        return str(stored)  # shown as stored: nothing is lost by reading


@runtime_checkable
class _WritesItself(Protocol):
    """A dataclass with its own JSON form (``to_dict``), which to_jsonable writes instead of its fields."""

    def to_dict(self) -> Mapping[str, object]: ...


def to_jsonable(value: object) -> JSONValue:
    """Dataclasses, enums, tuples, paths and inf/nan into plain JSON values (lists and dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, _WritesItself):
            return to_jsonable(value.to_dict())
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf/nan; None reads as "not measured"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _dumps(value: object) -> str:
    return json.dumps(to_jsonable(value), separators=(",", ":"), allow_nan=False)


def _request_row(run_id: int, record: RequestResult | Mapping[str, object]) -> tuple[object, ...]:
    """A loadgen ``RequestResult`` (or a dict of its fields) as a ``requests`` row."""
    # Every name read below is a RequestResult field: its fields as a dict read the same.
    values = record if isinstance(record, Mapping) else {f.name: getattr(record, f.name)
                                                         for f in dataclasses.fields(record)}
    get = values.get
    extra = {k: v for k, v in values.items() if k not in REQUEST_FIELDS}
    return (
        run_id,
        get("id"),
        float(cast(float, get("t_start"))),
        get("ttft_s"),
        get("e2el_s"),
        _dumps(list(cast(Iterable[object], get("itl_s", ()) or ()))),  # not a list: the TypeError becomes .error
        get("input_tokens"),
        get("output_tokens"),
        1 if get("ok") else 0,
        get("error"),
        1 if get("cancelled", False) else 0,
        _dumps(extra),
    )


REQUEST_FIELDS = ("id", "t_start", "ttft_s", "e2el_s", "itl_s", "input_tokens", "output_tokens", "ok", "error",
                  "cancelled")
"""The ``requests`` table's typed columns (loadgen ``RequestResult`` field names); a record's other
fields are kept in its ``extra`` JSON column."""


def _gaps(value: object) -> tuple[float | None, ...]:
    if not isinstance(value, list):
        raise ValueError(f"itl_s is {value!r}, not a list")
    return tuple(stored_number(v, "an itl_s value") for v in value)


def _json_column(text: object, name: str) -> JSONValue:
    if not isinstance(text, str):
        raise ValueError(f"the {name} column is {text!r}, not JSON text")
    try:
        value: JSONValue = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the {name} column is not JSON ({exc})") from None
    return value


@dataclass(frozen=True)
class StoredRequest:
    """One stored per-request record (a ``requests`` row), its columns typed; ``extra`` holds the
    record's other fields (``worker``, ``queued_s``...) as stored in the ``extra`` JSON column.

    :meth:`to_json` is the record as a JSON object, the columns first then the extra fields (what
    ``vtui history show --format json`` lists as ``requests_detail``). ``itl_s`` holds None where a
    gap was not a finite number (JSON has none; ``to_jsonable``).
    """

    id: int | None
    t_start: float
    ttft_s: float | None
    e2el_s: float | None
    itl_s: tuple[float | None, ...]
    input_tokens: int | None
    output_tokens: int | None
    ok: bool
    error: str | None
    cancelled: bool
    extra: JSONObject = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {
            "id": self.id,
            "t_start": self.t_start,
            "ttft_s": self.ttft_s,
            "e2el_s": self.e2el_s,
            "itl_s": list(self.itl_s),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "ok": self.ok,
            "error": self.error,
            "cancelled": self.cancelled,
        }
        out.update(self.extra)  # merged last, as the row was always read (the writer keeps column names out)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object], where: str = "request") -> StoredRequest:
        """A record as :meth:`to_json` writes it (or a dict of ``RequestResult`` fields): missing
        columns read as None (``ok``/``cancelled`` False, ``itl_s`` empty); ValueError naming ``where``
        for a value of the wrong type."""
        try:
            t_start = stored_number(d.get("t_start"), "t_start")
            if t_start is None:
                raise ValueError("t_start is missing")
            return cls(
                id=stored_int(d.get("id"), "id"), t_start=t_start, ttft_s=stored_number(d.get("ttft_s"), "ttft_s"),
                e2el_s=stored_number(d.get("e2el_s"), "e2el_s"), itl_s=_gaps(list(cast(Iterable[object], d.get("itl_s") or []))),
                input_tokens=stored_int(d.get("input_tokens"), "input_tokens"),
                output_tokens=stored_int(d.get("output_tokens"), "output_tokens"), ok=bool(d.get("ok")),
                error=stored_text(d.get("error"), "error"), cancelled=bool(d.get("cancelled")),
                extra={k: to_jsonable(v) for k, v in d.items() if k not in REQUEST_FIELDS},
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    @classmethod
    def from_row(cls, row: Sequence[object], path: Path, run_id: int) -> StoredRequest:
        """A ``requests`` row (``req_id, t_start, ttft_s, e2el_s, itl_s, input_tokens, output_tokens,
        ok, error, cancelled, extra``); HistoryError naming the run and the request when a column does
        not parse (``extra`` not a JSON object, ``itl_s`` not a JSON list, a number that is text...)."""
        rid, t0, ttft, e2el, itl, n_in, n_out, ok, err, cancelled, extra = row
        try:
            t_start = stored_number(t0, "t_start")
            if t_start is None:
                raise ValueError("t_start is missing")
            fields = _json_column(extra, "extra")
            if not isinstance(fields, Mapping):
                raise ValueError(f"the extra column is {extra!r}, not a JSON object")
            return cls(
                id=stored_int(rid, "req_id"), t_start=t_start, ttft_s=stored_number(ttft, "ttft_s"),
                e2el_s=stored_number(e2el, "e2el_s"), itl_s=_gaps(_json_column(itl, "itl_s")),
                input_tokens=stored_int(n_in, "input_tokens"), output_tokens=stored_int(n_out, "output_tokens"),
                ok=bool(ok), error=stored_text(err, "error"), cancelled=bool(cancelled), extra=fields,
            )
        except ValueError as exc:
            raise HistoryError(path, f"run {run_id}'s request {rid!r} cannot be read: {exc}") from None


def _sample_data(text: object, path: Path, run_id: int, kind: str, t: float) -> JSONObject:
    """A ``samples`` row's data: the JSON object stored, else a HistoryError naming the sample."""
    try:
        data = _json_column(text, "data")
    except ValueError as exc:
        raise HistoryError(path, f"run {run_id}'s {kind} sample at t={t} cannot be read: {exc}") from None
    if not isinstance(data, Mapping):
        raise HistoryError(path, f"run {run_id}'s {kind} sample at t={t} cannot be read: "
                                 f"its data is {text!r}, not a JSON object")
    return data


def _process_start(pid: int) -> float | None:
    """The writer's start, as ``procs.ProcRef`` pins a process (seconds since boot: a VM fork or a
    clock step does not move it; rows of older vtui hold psutil's epoch figure, which
    ``procs.same_start`` still reads)."""
    ref = procs.ProcRef.of(pid)
    return ref.create_time if ref is not None else None


def _writer_alive(pid: int | None, started: float | None) -> bool:
    """Whether the process that wrote a run still exists (same pid AND same start time,
    since pids are reused)."""
    if pid is None:
        return False
    now_started = _process_start(pid)
    if now_started is None:
        return False
    return started is None or procs.same_start(now_started, started)


def cut_short_error(pid: int | None) -> str:
    """What a run whose writer died mid-run says as its error (one wording for every reader)."""
    who = f"the vtui process that ran it (pid {pid})" if pid is not None else "the vtui process that ran it"
    return f"cut short: {who} ended mid-run (killed or crashed); the requests it completed before are kept"


def _last_stored(conn: sqlite3.Connection, run_id: int) -> float | None:
    """The time of the last thing stored for a run: a request's end or a sample."""
    value = conn.execute(
        "SELECT MAX(t) FROM (SELECT MAX(t_start + COALESCE(e2el_s, 0)) AS t FROM requests WHERE run_id = ?"
        " UNION ALL SELECT MAX(t) FROM samples WHERE run_id = ?)",
        (run_id, run_id),
    ).fetchone()[0]
    return None if value is None else float(value)


@dataclass(frozen=True)
class CutShort:
    """How a run left ``running`` by a writer that no longer exists reads: what :func:`cut_short`
    finds and what :meth:`History.recover` stores, the same for every reader."""

    run_id: int
    ended: float
    summary: RunSummary

    status: RunStatus = RunStatus.CANCELLED


def cut_short(conn: sqlite3.Connection, run_id: int, path: Path) -> CutShort | None:
    """The run as cut short when it is still stored as ``running`` and its writer is gone (pid and
    start since boot, ``procs.ProcRef``), else None (finished, or its writer still runs).

    Its status is read again after the writer is found gone: a writer that finished the run and
    exited between a reader's first read and the check is not taken for a killed one."""
    row = conn.execute("SELECT status, writer_pid, writer_started, started, summary FROM runs WHERE id = ?",
                       (int(run_id),)).fetchone()
    if row is None or row[0] != RunStatus.RUNNING.value or _writer_alive(row[1], row[2]):
        return None
    row = conn.execute("SELECT status, writer_pid, writer_started, started, summary FROM runs WHERE id = ?",
                       (int(run_id),)).fetchone()
    if row is None or row[0] != RunStatus.RUNNING.value:
        return None
    _, pid, _, started, text = row
    stored = RunSummary.stored(json.loads(text), f"{path}: run {run_id}'s summary")
    summary = stored if stored.error else dataclasses.replace(stored, error=cut_short_error(pid))
    last = _last_stored(conn, int(run_id))
    return CutShort(int(run_id), last if last is not None else float(started), summary)


# --------------------------------------------------------------------------- store


def default_path() -> Path:
    return paths.data_dir() / "history.sqlite"


_PAGE_SIZE = 4096


def _connect(path: Path, *, read_only: bool = False, max_bytes: int | None = None) -> sqlite3.Connection:
    if read_only:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), timeout=10.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 10000")
    if max_bytes is not None:
        # SQLite answers SQLITE_FULL past this size, exactly as on a full disk.
        conn.execute(f"PRAGMA max_page_count = {max(1, int(max_bytes) // _PAGE_SIZE)}")
    return conn


def _explain(path: Path, exc: BaseException) -> HistoryError:
    text = str(exc)
    lowered = text.lower()
    if "readonly" in lowered or "read-only" in lowered:
        reason = "the history file is read-only; results stay in memory only (check the file's permissions)"
    elif "disk is full" in lowered or "database or disk is full" in lowered:
        reason = "the disk is full; results from here on stay in memory only"
    elif "unable to open" in lowered:
        reason = "cannot open the history file (missing folder or no permission)"
    elif "not a database" in lowered or "malformed" in lowered:
        reason = f"not a vtui history file or damaged ({text}); move it away to start a new one"
    else:
        reason = text
    return HistoryError(path, reason)


# One row of History._SELECT as the schema stores it (its JSON columns still text).
_RunRow: TypeAlias = tuple[int, str, str | None, float, float | None, str, str, str | None, str | None, str, str, str,
                           int, str, int]


class History:
    """The run store. ``History()`` opens the user's file; ``History(path)`` any other.

    ``read_only`` opens without writing anything (no migration, no recovery);
    ``max_bytes`` caps the file's size (past it writes fail as on a full disk).
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False, max_bytes: int | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.read_only = read_only
        self.max_bytes = max_bytes
        try:
            if read_only:
                if not self.path.exists():
                    raise HistoryError(self.path, "no history file yet (no run has been recorded)")
                self._conn = _connect(self.path, read_only=True)
                if self.schema_version != SCHEMA_VERSION:
                    self._migrate_check_only()
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = _connect(self.path, max_bytes=max_bytes)
                self._conn.execute("PRAGMA page_size = 4096")  # before the first table: max_bytes counts these
                self._conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode: a committed transaction survives a process kill
                # (only a power loss can take the last commits back).
                self._conn.execute("PRAGMA synchronous = NORMAL")
                self._migrate()
                self.recover()
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None
        except OSError as exc:
            raise HistoryError(self.path, exc.strerror or str(exc)) from None

    # ------------------------------------------------------------- lifecycle
    def close(self) -> None:
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate_check_only(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise HistoryError(
                self.path, f"schema version {version} is newer than this vtui understands ({SCHEMA_VERSION}); upgrade vtui"
            )
        raise HistoryError(self.path, f"schema version {version} needs an upgrade; open it once writable")

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise HistoryError(
                self.path, f"schema version {version} is newer than this vtui understands ({SCHEMA_VERSION}); upgrade vtui"
            )
        while version < SCHEMA_VERSION:
            # executescript commits first; the whole step and its version bump are one transaction.
            self._conn.executescript(
                f"BEGIN IMMEDIATE;\n{MIGRATIONS[version]}\nPRAGMA user_version = {version + 1};\nCOMMIT;"
            )
            version += 1

    def recover(self) -> list[int]:
        """Store runs left ``running`` by a writer that no longer exists as :func:`cut_short` reads
        them (``cancelled``, ended at the last thing stored, the summary's error saying so).
        Returns the run ids changed."""
        rows = self._conn.execute("SELECT id FROM runs WHERE status = 'running'").fetchall()
        changed = []
        for (run_id,) in rows:
            gone = cut_short(self._conn, int(run_id), self.path)
            if gone is None:
                continue
            self._conn.execute(
                "UPDATE runs SET status = ?, ended = ?, summary = ? WHERE id = ? AND status = 'running'",
                (gone.status.value, gone.ended, _dumps(gone.summary.to_json()), gone.run_id),
            )
            changed.append(gone.run_id)
        return changed

    # ------------------------------------------------------------- writing
    def start_run(
        self,
        name: str,
        *,
        preset: str | None = None,
        flags: Mapping[str, object] | None = None,
        model: str | None = None,
        vllm_version: str | None = None,
        gpus: Sequence[object] = (),
        workload: Mapping[str, object] | None = None,
        tags: Iterable[str] = (),
        started: float | None = None,
    ) -> RunRecorder:
        """Insert a ``running`` run and return the recorder that fills it in."""
        pid = os.getpid()
        row = (
            name,
            preset,
            started if started is not None else time.time(),
            "running",
            _dumps(flags or {}),
            vllm_version,
            model,
            _dumps(list(gpus)),
            _dumps(workload or {}),
            _dumps(sorted(set(tags))),
            pid,
            _process_start(pid),
        )
        try:
            cur = self._conn.execute(
                "INSERT INTO runs (name, preset, started, status, flags, vllm_version, model, gpus, workload, tags,"
                " writer_pid, writer_started) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                row,
            )
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None
        run_id = cur.lastrowid
        assert run_id is not None
        return RunRecorder(self.path, int(run_id), max_bytes=self.max_bytes)

    # ------------------------------------------------------------- reading
    def _row_to_info(self, row: _RunRow) -> RunInfo:
        (rid, name, preset, started, ended, status, flags, vv, model, gpus, workload, summary, baseline, tags, n) = row
        parsed = RunSummary.stored(json.loads(summary), f"{self.path}: run {rid}'s summary")
        # A run whose writer was killed reads as cut short here, to every reader (read-only ones,
        # which cannot store it, included), not only once a writer opens the file.
        gone = cut_short(self._conn, int(rid), self.path) if status == RunStatus.RUNNING.value else None
        if gone is not None:
            status, ended, parsed = gone.status.value, gone.ended, gone.summary
        return RunInfo(
            id=int(rid),
            name=name,
            preset=preset,
            started=float(started),
            ended=None if ended is None else float(ended),
            status=_status_text(status),
            flags=json.loads(flags),
            vllm_version=vv,
            model=model,
            gpus=json.loads(gpus),
            workload=json.loads(workload),
            summary=parsed,
            baseline=bool(baseline),
            tags=tuple(json.loads(tags)),
            requests=int(n),
        )

    _SELECT = (
        "SELECT r.id, r.name, r.preset, r.started, r.ended, r.status, r.flags, r.vllm_version, r.model, r.gpus,"
        " r.workload, r.summary, r.baseline, r.tags, (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.id)"
        " FROM runs r"
    )

    def list_runs(self, limit: int | None = None) -> list[RunInfo]:
        """Newest first."""
        sql = self._SELECT + " ORDER BY r.id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [self._row_to_info(r) for r in self._conn.execute(sql).fetchall()]

    def get_run(self, run_id: int) -> RunInfo:
        row = self._conn.execute(self._SELECT + " WHERE r.id = ?", (int(run_id),)).fetchone()
        if row is None:
            raise HistoryError(self.path, f"no run with id {run_id}")
        return self._row_to_info(row)

    def resolve(self, ref: str | int) -> RunInfo:
        """A run by id, ``last``/``-1`` (newest), ``baseline``, or exact name (newest of that name)."""
        text = str(ref).strip()
        if text.lstrip("-").isdigit() and int(text) > 0:
            return self.get_run(int(text))
        if text in ("last", "latest", "-1"):
            runs = self.list_runs(limit=1)
            if not runs:
                raise HistoryError(self.path, "no runs stored yet")
            return runs[0]
        if text == "baseline":
            base = self.baseline()
            if base is None:
                raise HistoryError(self.path, "no run is tagged as baseline (vtui history baseline ID)")
            return base
        row = self._conn.execute(self._SELECT + " WHERE r.name = ? ORDER BY r.id DESC LIMIT 1", (text,)).fetchone()
        if row is None:
            raise HistoryError(self.path, f"no run with id or name {text!r}")
        return self._row_to_info(row)

    def requests(self, run_id: int) -> list[StoredRequest]:
        """Per-request records of a run, in start order (loadgen ``RequestResult`` field names);
        HistoryError, naming the run and the request, for a row whose columns do not parse."""
        rows = self._conn.execute(
            "SELECT req_id, t_start, ttft_s, e2el_s, itl_s, input_tokens, output_tokens, ok, error, cancelled, extra"
            " FROM requests WHERE run_id = ? ORDER BY t_start, rowid",
            (int(run_id),),
        ).fetchall()
        return [StoredRequest.from_row(row, self.path, int(run_id)) for row in rows]

    def samples(self, run_id: int, kind: str | None = None) -> list[tuple[str, float, JSONObject]]:
        """``(kind, t, data)`` series of a run in time order; kind e.g. ``telemetry`` or ``window``.

        ``data`` is the stored JSON object (readers narrow its values: engine.values); a row whose
        data is not a JSON object is a HistoryError naming the run and the sample."""
        if kind is None:
            rows = self._conn.execute(
                "SELECT kind, t, data FROM samples WHERE run_id = ? ORDER BY t, rowid", (int(run_id),)
            ).fetchall()
        else:
            rows = self._conn.execute(
                "SELECT kind, t, data FROM samples WHERE run_id = ? AND kind = ? ORDER BY t, rowid", (int(run_id), kind)
            ).fetchall()
        return [(k, float(t), _sample_data(d, self.path, int(run_id), k, float(t))) for k, t, d in rows]

    # ------------------------------------------------------------- editing
    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._conn
        except sqlite3.Error as exc:
            raise _explain(self.path, exc) from None

    def delete_run(self, run_id: int) -> None:
        self.get_run(run_id)
        with self._writing() as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM requests WHERE run_id = ?", (int(run_id),))
            conn.execute("DELETE FROM samples WHERE run_id = ?", (int(run_id),))
            conn.execute("DELETE FROM runs WHERE id = ?", (int(run_id),))
            conn.execute("COMMIT")

    def set_baseline(self, run_id: int | None) -> None:
        """Make ``run_id`` the one baseline run (None clears it)."""
        if run_id is not None:
            self.get_run(run_id)
        with self._writing() as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE runs SET baseline = 0 WHERE baseline != 0")
            if run_id is not None:
                conn.execute("UPDATE runs SET baseline = 1 WHERE id = ?", (int(run_id),))
            conn.execute("COMMIT")

    def baseline(self) -> RunInfo | None:
        row = self._conn.execute(self._SELECT + " WHERE r.baseline = 1 ORDER BY r.id DESC LIMIT 1").fetchone()
        return None if row is None else self._row_to_info(row)

    # ------------------------------------------------------------- flag searches
    def save_tune(self, tune_id: str, state: Mapping[str, object], *, status: str, model: str | None = None,
                  summary: Mapping[str, object] | None = None) -> None:
        """Insert or replace a search's state (``engine.tune.search.TuneState.to_json()``), one transaction."""
        now = time.time()
        text = json.dumps(state, separators=(",", ":"), allow_nan=False)
        with self._writing() as conn:
            conn.execute(
                "INSERT INTO tunes (id, started, updated, status, model, summary, state) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET updated = excluded.updated, status = excluded.status, "
                "model = excluded.model, summary = excluded.summary, state = excluded.state",
                (str(tune_id), now, now, status, model, _dumps(summary or {}), text),
            )

    def load_tune(self, tune_id: str) -> dict[str, object]:
        """A saved search's state; HistoryError when there is none or it is not JSON."""
        row = self._conn.execute("SELECT state FROM tunes WHERE id = ?", (str(tune_id),)).fetchone()
        if row is None:
            raise HistoryError(self.path, f"no saved search {tune_id!r} (see `vtui tune --list`)")
        try:
            state = json.loads(row[0])
        except ValueError as exc:
            raise HistoryError(self.path, f"saved search {tune_id!r} is damaged: {exc}") from None
        if not isinstance(state, dict):
            raise HistoryError(self.path, f"saved search {tune_id!r} is damaged: not a JSON object")
        return state

    def list_tunes(self) -> list[TuneInfo]:
        """Saved searches, newest first."""
        rows = self._conn.execute(
            "SELECT id, started, updated, status, model, summary FROM tunes ORDER BY started DESC, id DESC").fetchall()
        out = []
        for row in rows:
            try:
                summary = json.loads(row[5])
            except ValueError:
                summary = {}
            out.append(TuneInfo(str(row[0]), float(row[1]), float(row[2]), str(row[3]), row[4],
                                summary if isinstance(summary, dict) else {}))
        return out

    def delete_tune(self, tune_id: str) -> None:
        self.load_tune(tune_id)
        with self._writing() as conn:
            conn.execute("DELETE FROM tunes WHERE id = ?", (str(tune_id),))

    # ------------------------------------------------------------- noise floors
    def save_noise_floor(self, floor: NoiseFloor) -> NoiseFloor:
        """Store a measured noise floor; returns it with its id."""
        spread = {k: float(v) for k, v in floor.spread_pct.items() if math.isfinite(v)}
        with self._writing() as conn:
            cur = conn.execute(
                "INSERT INTO noise_floors (box, measured, runs, run_ids, label, model, fingerprint, spread) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (floor.box, float(floor.measured), int(floor.runs), _dumps(list(floor.run_ids)), floor.label,
                 floor.model, floor.fingerprint, _dumps(spread)),
            )
        assert cur.lastrowid is not None
        return dataclasses.replace(floor, id=int(cur.lastrowid))

    def noise_floor(self, box: str | None = None) -> NoiseFloor | None:
        """The newest noise floor measured on ``box`` (default: this one), or None."""
        row = self._conn.execute(
            "SELECT id, box, measured, runs, run_ids, label, model, fingerprint, spread FROM noise_floors"
            " WHERE box = ? ORDER BY measured DESC, id DESC LIMIT 1", (box or this_box(),)).fetchone()
        if row is None:
            return None
        fid, where, measured, runs, run_ids, label, model, fingerprint, spread = row
        name = f"noise floor {fid}"
        try:
            ids, pcts = _json_column(run_ids, f"{name}'s run_ids"), _json_column(spread, f"{name}'s spread")
            if not isinstance(ids, list) or not isinstance(pcts, dict):
                raise ValueError("its run_ids is not a list or its spread not an object")
            read = {str(k): stored_number(value, f"{name}'s {k}") for k, value in pcts.items()}
            spread_pct = {k: value for k, value in read.items() if value is not None}
            numbers = tuple(n for n in (stored_int(i, f"{name}'s run id") for i in ids) if n is not None)
        except ValueError as exc:
            raise HistoryError(self.path, f"{name} is damaged: {exc}") from None
        return NoiseFloor(box=str(where), measured=float(measured), runs=int(runs), spread_pct=spread_pct,
                          label=str(label), model=model, fingerprint=fingerprint, run_ids=numbers, id=int(fid))

    def tag(self, run_id: int, *tags: str, remove: bool = False) -> RunInfo:
        info = self.get_run(run_id)
        new = set(info.tags) - set(tags) if remove else set(info.tags) | set(tags)
        with self._writing() as conn:
            conn.execute("UPDATE runs SET tags = ? WHERE id = ?", (_dumps(sorted(new)), int(run_id)))
        return self.get_run(run_id)


# --------------------------------------------------------------------------- recorder

if TYPE_CHECKING:
    # What the writer thread is handed, tagged by its first item.
    _Item: TypeAlias = (tuple[Literal["request"], RequestResult | Mapping[str, object]]
                        | tuple[Literal["sample"], tuple[str, float, object]]
                        | tuple[Literal["update"], dict[str, object]]
                        | tuple[Literal["flush"], threading.Event]
                        | tuple[Literal["stop"], None])

_STOP: tuple[Literal["stop"], None] = ("stop", None)
_live_recorders: weakref.WeakSet[RunRecorder] = weakref.WeakSet()


def finish_open_runs() -> None:
    """Write everything queued by open recorders and mark their runs cancelled.

    Called at interpreter exit (including Ctrl-C) and by the supervisor's SIGTERM/SIGHUP
    handler, which ends the process without running atexit hooks.
    """
    for rec in list(_live_recorders):
        rec.finish(RunStatus.CANCELLED)


@atexit.register
def _close_recorders_at_exit() -> None:
    finish_open_runs()


class RunRecorder:
    """Writes one run as it happens. Every ``add_*`` only queues (microseconds, no disk);
    the writer thread commits at least every :data:`COMMIT_INTERVAL_S`.

    On any SQLite failure ``.error`` holds a :class:`HistoryError` and later records are
    dropped: the run itself goes on, in memory.
    """

    def __init__(self, path: Path, run_id: int, *, max_bytes: int | None = None) -> None:
        self.path = path
        self.run_id = run_id
        self._max_bytes = max_bytes
        self.error: HistoryError | None = None
        self.finished = False
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"history-run-{run_id}", daemon=True)
        self._thread.start()
        _live_recorders.add(self)

    # ------------------------------------------------------------- producer side
    def add_request(self, record: RequestResult | Mapping[str, object]) -> None:
        """A loadgen ``RequestResult`` (or dict with its field names)."""
        if not self.finished:
            self._queue.put(("request", record))

    def add_sample(self, kind: str, t: float, data: object) -> None:
        """A point of a series: ``kind`` e.g. ``telemetry`` or ``window``; ``t`` epoch seconds."""
        if not self.finished:
            self._queue.put(("sample", (kind, float(t), data)))

    def add_window(self, window: StatsWindow) -> None:
        """A loadgen ``StatsWindow`` (its ``t`` is the sample time)."""
        self.add_sample("window", float(window.t or time.time()), window)

    def add_telemetry(self, snapshot: TelemetrySnapshot) -> None:
        """A telemetry ``TelemetrySnapshot`` (its ``t`` is the sample time)."""
        self.add_sample("telemetry", float(snapshot.t or time.time()), snapshot)

    def update(self, **fields: object) -> None:
        """Change run columns while it runs (``summary``, ``vllm_version``, ``gpus``, ``flags``...)."""
        if not self.finished:
            self._queue.put(("update", fields))

    def finish(self, status: str = RunStatus.OK, summary: Mapping[str, object] | None = None,
               timeout: float = 10.0) -> None:
        """Write everything queued, set the status (``engine.runs.status``) and end time, stop the
        writer thread."""
        final = RunStatus.parse(status)
        if final is RunStatus.RUNNING:
            raise ValueError("a finished run cannot be 'running'")
        if self.finished:
            return
        fields: dict[str, object] = {"status": final.value, "ended": time.time()}
        if summary is not None:
            fields["summary"] = summary
        self._queue.put(("update", fields))
        self.finished = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        _live_recorders.discard(self)

    def flush(self, timeout: float = 5.0) -> None:
        """Block until everything queued so far is committed (tests, exports)."""
        event = threading.Event()
        self._queue.put(("flush", event))
        event.wait(timeout)

    # ------------------------------------------------------------- writer thread
    _COLUMNS = {"name", "preset", "status", "ended", "flags", "vllm_version", "model", "gpus", "workload", "summary"}

    def _loop(self) -> None:
        try:
            conn = _connect(self.path, max_bytes=self._max_bytes)
        except sqlite3.Error as exc:
            self.error = _explain(self.path, exc)
            return
        stop = False
        try:
            while not stop:
                batch: list[_Item] = []
                deadline = time.monotonic() + COMMIT_INTERVAL_S
                while True:
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        break
                    try:
                        item = self._queue.get(timeout=wait)
                    except queue.Empty:
                        break
                    if item[0] == "stop":  # _STOP
                        stop = True
                        break
                    batch.append(item)
                    if item[0] == "flush":
                        break
                self._write(conn, batch)
        finally:
            conn.close()

    def _write(self, conn: sqlite3.Connection, batch: list[_Item]) -> None:
        events = [item[1] for item in batch if item[0] == "flush"]
        if self.error is None and batch:
            try:
                conn.execute("BEGIN IMMEDIATE")
                requests = [_request_row(self.run_id, item[1]) for item in batch if item[0] == "request"]
                if requests:
                    conn.executemany(
                        "INSERT INTO requests (run_id, req_id, t_start, ttft_s, e2el_s, itl_s, input_tokens,"
                        " output_tokens, ok, error, cancelled, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        requests,
                    )
                samples = [(self.run_id, k, t, _dumps(d)) for k, t, d in
                           (item[1] for item in batch if item[0] == "sample")]
                if samples:
                    conn.executemany("INSERT INTO samples (run_id, kind, t, data) VALUES (?,?,?,?)", samples)
                for item in batch:
                    if item[0] != "update":
                        continue
                    for column, value in item[1].items():
                        if column not in self._COLUMNS:
                            raise ValueError(f"unknown run column {column!r}")
                        stored = _dumps(value) if column in ("flags", "gpus", "workload", "summary") else value
                        conn.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (stored, self.run_id))
                conn.execute("COMMIT")
            except (sqlite3.Error, OSError) as exc:
                self.error = _explain(self.path, exc)
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            except (ValueError, TypeError) as exc:  # a record we cannot store: keep the run, report it
                self.error = HistoryError(self.path, f"cannot store a record: {exc}")
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
        for event in events:
            event.set()


class Recording:
    """A run's recorder that tolerates a missing or failing history (``None``, a full disk, a
    read-only file): the run goes on and ``finish`` still returns its ``RunInfo``. The keywords
    are :meth:`History.start_run`'s."""

    def __init__(self, history: History | None, name: str, *, preset: str | None = None,
                 flags: Mapping[str, object] | None = None, model: str | None = None,
                 vllm_version: str | None = None, gpus: Sequence[object] = (),
                 workload: Mapping[str, object] | None = None, tags: Iterable[str] = ()) -> None:
        self.recorder: RunRecorder | None = None
        self.error: HistoryError | None = None
        self.started = time.time()
        self.name = name
        self.preset, self.flags, self.model, self.vllm_version = preset, flags, model, vllm_version
        self.gpus, self.workload = gpus, workload
        if history is not None:
            try:
                self.recorder = history.start_run(name, started=self.started, preset=preset, flags=flags, model=model,
                                                  vllm_version=vllm_version, gpus=gpus, workload=workload, tags=tags)
            except HistoryError as exc:
                self.error = exc

    def add_request(self, r: RequestResult | Mapping[str, object]) -> None:
        if self.recorder is not None:
            self.recorder.add_request(r)

    def add_window(self, w: StatsWindow) -> None:
        if self.recorder is not None:
            self.recorder.add_window(w)

    def add_sample(self, kind: str, t: float, data: object) -> None:
        if self.recorder is not None:
            self.recorder.add_sample(kind, t, data)

    def finish(self, history: History | None, status: str, summary: RunSummary | Mapping[str, object], *,
               gpus: Sequence[object] | None = None) -> RunInfo:
        """Store the status and summary (a RunSummary, or its document) and ``gpus`` when given:
        the GPUs the run saw."""
        ended = time.time()
        if not isinstance(summary, RunSummary):
            summary = RunSummary.from_json(summary, f"run {self.name}'s summary")
        if self.recorder is not None:
            if gpus is not None:
                self.recorder.update(gpus=gpus)
            self.recorder.finish(status, summary.to_json())
            self.error = self.error or self.recorder.error
            if history is not None and self.error is None:
                with contextlib.suppress(HistoryError):
                    return history.get_run(self.recorder.run_id)
        return RunInfo(
            id=-1, name=self.name, preset=self.preset, started=self.started, ended=ended,
            status=RunStatus.parse(status).value,
            flags=dict(self.flags or {}), vllm_version=self.vllm_version, model=self.model,
            gpus=list((self.gpus if gpus is None else gpus) or []), workload=dict(self.workload or {}),
            summary=summary, baseline=False, tags=(),
        )


def open_history(say: Callable[[str], None]) -> History | None:
    """The user's run history, or None (said through ``say``) when it cannot be opened:
    a run then goes on and keeps its results in memory."""
    try:
        return History()
    except HistoryError as exc:
        say(f"run history not available ({exc.reason}); results are kept in memory only")
        return None
