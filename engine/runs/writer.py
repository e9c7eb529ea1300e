"""The writer of one run while it happens (:class:`RunRecorder`): callers hand it records (cheap,
never blocking on disk) and its thread commits them at least every :data:`COMMIT_INTERVAL_S`, so a
crash or ``kill -9`` loses at most the last second. On an SQLite failure it keeps a
``HistoryError`` in ``.error`` and stops writing without disturbing the run.

``engine.runs.history.History.start_run`` opens one; :func:`finish_open_runs` writes and closes
what is still open when the process ends (at exit, and from the supervisor's signal handler).
"""

from __future__ import annotations

import atexit
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from engine.runs.historyfile import HistoryError, connect, explain
from engine.runs.rows import dumps, request_row
from engine.runs.status import RunStatus

if TYPE_CHECKING:
    from engine.telemetry.sampler import TelemetrySnapshot
    from loadgen.records import RequestResult
    from loadgen.stats import StatsWindow

COMMIT_INTERVAL_S = 0.25
"""How often the writer thread commits; four times inside the one-second promise."""

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
            conn = connect(self.path, max_bytes=self._max_bytes)
        except sqlite3.Error as exc:
            self.error = explain(self.path, exc)
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
                requests = [request_row(self.run_id, item[1]) for item in batch if item[0] == "request"]
                if requests:
                    conn.executemany(
                        "INSERT INTO requests (run_id, req_id, t_start, ttft_s, e2el_s, itl_s, input_tokens,"
                        " output_tokens, ok, error, cancelled, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        requests,
                    )
                samples = [(self.run_id, k, t, dumps(d)) for k, t, d in
                           (item[1] for item in batch if item[0] == "sample")]
                if samples:
                    conn.executemany("INSERT INTO samples (run_id, kind, t, data) VALUES (?,?,?,?)", samples)
                for item in batch:
                    if item[0] != "update":
                        continue
                    for column, value in item[1].items():
                        if column not in self._COLUMNS:
                            raise ValueError(f"unknown run column {column!r}")
                        stored = dumps(value) if column in ("flags", "gpus", "workload", "summary") else value
                        conn.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (stored, self.run_id))
                conn.execute("COMMIT")
            except (sqlite3.Error, OSError) as exc:
                self.error = explain(self.path, exc)
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
