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

The parts beside it: the file, its schema and SQLite's failures in ``engine.runs.historyfile``;
what a row holds and how it is read back (``RunInfo``, ``StoredRequest``, ``NoiseFloor``, a run cut
short) in ``engine.runs.rows``; the writer thread (``RunRecorder``) in ``engine.runs.writer``.
Their public names are importable from here too, as they were before the split.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from engine.runs.historyfile import MIGRATIONS, SCHEMA_VERSION, HistoryError, connect, default_path, explain
from engine.runs.rows import (
    REQUEST_FIELDS,
    CutShort,
    NoiseFloor,
    RequestColumns,
    RunInfo,
    StoredRequest,
    TuneInfo,
    cut_short,
    cut_short_error,
    dumps,
    json_column,
    process_start,
    sample_data,
    server_fingerprint,
    status_text,
    this_box,
    to_jsonable,
)
from engine.runs.status import RunStatus
from engine.runs.summary import RunSummary
from engine.runs.writer import COMMIT_INTERVAL_S, RunRecorder, finish_open_runs
from engine.values import JSONObject, stored_int, stored_number

if TYPE_CHECKING:
    from loadgen.records import RequestResult
    from loadgen.stats import StatsWindow


# What is read back is typed where the row is read: a run's summary is parsed once into a RunSummary
# (engine.runs.summary), a request row into a StoredRequest, a sample's data checked to be a JSON
# object (engine.values.JSONObject, which readers narrow). Flags, workload, GPUs and a saved search
# come back as `object` values; what is only written (and goes through to_jsonable) is `object` too.

STATUSES = tuple(s.value for s in RunStatus)  # engine.runs.status: one vocabulary on every path
# The runs a learned noise floor reads (History.repeated_runs): measured to the end, not spoiled by
# the box or the client; "complete" and "done" are what older histories wrote for ok.
REPEAT_STATUSES = tuple(s.value for s in RunStatus if s.measured and not s.spoiled) + ("complete", "done")
_REPEAT_KEPT = ", ".join("?" for _ in REPEAT_STATUSES)  # their placeholders in a query
REPEATS_READ = 500  # the newest this many such runs: a box's recent noise, a bounded read


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
                self._conn = connect(self.path, read_only=True)
                if self.schema_version != SCHEMA_VERSION:
                    self._migrate_check_only()
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = connect(self.path, max_bytes=max_bytes)
                self._conn.execute("PRAGMA page_size = 4096")  # before the first table: max_bytes counts these
                self._conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode: a committed transaction survives a process kill
                # (only a power loss can take the last commits back).
                self._conn.execute("PRAGMA synchronous = NORMAL")
                self._migrate()
                self.recover()
        except sqlite3.Error as exc:
            raise explain(self.path, exc) from None
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
                (gone.status.value, gone.ended, dumps(gone.summary.to_json()), gone.run_id),
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
            dumps(flags or {}),
            vllm_version,
            model,
            dumps(list(gpus)),
            dumps(workload or {}),
            dumps(sorted(set(tags))),
            pid,
            process_start(pid),
        )
        try:
            cur = self._conn.execute(
                "INSERT INTO runs (name, preset, started, status, flags, vllm_version, model, gpus, workload, tags,"
                " writer_pid, writer_started) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                row,
            )
        except sqlite3.Error as exc:
            raise explain(self.path, exc) from None
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
            status=status_text(status),
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

    _COLUMNS = ("SELECT r.id, r.name, r.preset, r.started, r.ended, r.status, r.flags, r.vllm_version, r.model,"
                " r.gpus, r.workload, r.summary, r.baseline, r.tags,")
    _SELECT = _COLUMNS + " (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.id) FROM runs r"
    _SELECT_UNCOUNTED = _COLUMNS + " 0 FROM runs r"  # without the requests' count (a query per run)

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

    def request_columns(self, run_id: int) -> RequestColumns:
        """A run's completed requests as columns (engine.runs.rows.RequestColumns: what a within-run
        interval reads, the figures :meth:`requests` gives it to the bit), read row by row from a
        cursor: no Python object per request is kept, so reading a finished run back leaves the
        session's memory as it was. HistoryError, naming the run and the request, for a
        row whose columns do not parse."""
        out = RequestColumns()
        try:
            for row in self._conn.execute(RequestColumns.QUERY, (int(run_id),)):
                out.add_row(row, self.path, int(run_id))
        except sqlite3.Error as exc:
            raise explain(self.path, exc) from None
        return out

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
        return [(k, float(t), sample_data(d, self.path, int(run_id), k, float(t))) for k, t, d in rows]

    # ------------------------------------------------------------- editing
    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._conn
        except sqlite3.Error as exc:
            raise explain(self.path, exc) from None

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
                (str(tune_id), now, now, status, model, dumps(summary or {}), text),
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
                (floor.box, float(floor.measured), int(floor.runs), dumps(list(floor.run_ids)), floor.label,
                 floor.model, floor.fingerprint, dumps(spread)),
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
            ids, pcts = json_column(run_ids, f"{name}'s run_ids"), json_column(spread, f"{name}'s spread")
            if not isinstance(ids, list) or not isinstance(pcts, dict):
                raise ValueError("its run_ids is not a list or its spread not an object")
            read = {str(k): stored_number(value, f"{name}'s {k}") for k, value in pcts.items()}
            spread_pct = {k: value for k, value in read.items() if value is not None}
            numbers = tuple(n for n in (stored_int(i, f"{name}'s run id") for i in ids) if n is not None)
        except ValueError as exc:
            raise HistoryError(self.path, f"{name} is damaged: {exc}") from None
        return NoiseFloor(box=str(where), measured=float(measured), runs=int(runs), spread_pct=spread_pct,
                          label=str(label), model=model, fingerprint=fingerprint, run_ids=numbers, id=int(fid))

    def repeats_key(self) -> tuple[object, ...]:
        """What changes whenever :meth:`repeated_runs` may read differently: the newest and the
        count of the runs it could read (one indexed query)."""
        try:
            row = self._conn.execute(f"SELECT MAX(id), COUNT(*) FROM runs WHERE status IN ({_REPEAT_KEPT})",
                                     REPEAT_STATUSES).fetchone()
        except sqlite3.Error as exc:
            raise explain(self.path, exc) from None
        return tuple(row)

    def repeated_runs(self, limit: int = REPEATS_READ) -> list[list[RunInfo]]:
        """The history's repeats: runs of one configuration (the same model, flags, workload, vLLM
        version and GPUs; the workload's per-run seed aside) that ended measured and unspoiled,
        grouped, each group two runs or more (oldest first), from the newest ``limit`` such runs.
        Runs whose flags are unknown (an attached server's) are left out: their configurations
        cannot be told apart. A damaged row is left out too, so one bad run never takes every
        comparison's floor with it. The runs come without their request counts (``requests`` 0):
        only their figures are read."""
        valid = " AND ".join(f"json_valid({c})" for c in ("flags", "workload", "summary", "gpus", "tags"))
        try:
            keys = self._conn.execute(
                "SELECT id, model, flags, json_remove(workload, '$.workload.seed'), vllm_version, gpus FROM runs"
                f" WHERE status IN ({_REPEAT_KEPT}) AND flags NOT IN ('{{}}', 'null') AND {valid}"
                f" ORDER BY id DESC LIMIT {int(limit)}", REPEAT_STATUSES).fetchall()
            by_key: dict[tuple[object, ...], list[int]] = {}
            for run_id, *key in keys:
                by_key.setdefault(tuple(key), []).append(int(run_id))
            ids = sorted(i for group in by_key.values() if len(group) >= 2 for i in group)
            rows = {row[0]: row for row in self._conn.execute(
                self._SELECT_UNCOUNTED + f" WHERE r.id IN ({', '.join(str(i) for i in ids)})").fetchall()} if ids else {}
        except sqlite3.Error as exc:
            raise explain(self.path, exc) from None
        groups = []
        for group in by_key.values():
            runs = []
            for i in sorted(group):
                try:
                    runs.append(self._row_to_info(rows[i]))
                except (KeyError, ValueError):  # gone since, or a summary that does not parse: not a repeat
                    continue
            if len(runs) >= 2:
                groups.append(runs)
        return groups

    def tag(self, run_id: int, *tags: str, remove: bool = False) -> RunInfo:
        info = self.get_run(run_id)
        new = set(info.tags) - set(tags) if remove else set(info.tags) | set(tags)
        with self._writing() as conn:
            conn.execute("UPDATE runs SET tags = ? WHERE id = ?", (dumps(sorted(new)), int(run_id)))
        return self.get_run(run_id)


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


# Names defined beside the store (historyfile, rows, writer) that callers import from here.
__all__ = [
    "COMMIT_INTERVAL_S",
    "MIGRATIONS",
    "REQUEST_FIELDS",
    "SCHEMA_VERSION",
    "STATUSES",
    "CutShort",
    "History",
    "HistoryError",
    "NoiseFloor",
    "Recording",
    "RequestColumns",
    "RunInfo",
    "RunRecorder",
    "StoredRequest",
    "TuneInfo",
    "cut_short",
    "cut_short_error",
    "default_path",
    "finish_open_runs",
    "open_history",
    "server_fingerprint",
    "this_box",
    "to_jsonable",
]
