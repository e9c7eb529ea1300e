"""What a row of the run history holds, and how it is written and read back: a run (``RunInfo``),
a saved search (``TuneInfo``), a box's noise floor (``NoiseFloor``), a per-request record
(``StoredRequest``, ``request_row``), a sample's data, JSON columns (``to_jsonable``, ``dumps``),
and how a run whose writer died reads (``cut_short``: the same for every reader).

The store that reads and writes these rows is ``engine.runs.history.History``; the writer thread
that fills a run while it happens is ``engine.runs.writer.RunRecorder``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import socket
import sqlite3
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from engine.runs.historyfile import HistoryError
from engine.runs.status import RunStatus
from engine.runs.summary import RunSummary
from engine.server import procs
from engine.values import JSONObject, JSONValue, stored_int, stored_number, stored_text

if TYPE_CHECKING:
    from loadgen.records import RequestResult


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


LEARNED_LABEL = "learned from repeats"  # a NoiseFloor's label when engine.runs.noise.learned_floor made it


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
    # How many configurations the runs came from: 1 for a measured floor (K runs of one workload);
    # more for one learned from the history's repeats (engine.runs.noise.learned_floor), never stored.
    groups: int = 1
    # Per figure, the degrees of freedom its spread rests on where they are fewer than ``df`` (a
    # figure some runs lack, as goodput without an SLO); learned floors fill it, stored ones not.
    dfs: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def learned(self) -> bool:
        """Learned from the history's repeats, not measured with ``vtui bench --noise-floor``."""
        return self.label == LEARNED_LABEL

    @property
    def df(self) -> int:
        """The degrees of freedom its spread rests on: the runs less one per configuration."""
        return self.runs - self.groups

    def df_of(self, figure: str) -> int:
        """The degrees of freedom ``figure``'s spread rests on."""
        return self.dfs.get(figure, self.df)

    def pct(self, figure: str) -> float | None:
        """The figure's spread in percent; None where the floor has none."""
        value = self.spread_pct.get(figure)
        return None if value is None or not math.isfinite(value) else float(value)


def status_text(stored: str) -> str:
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


def dumps(value: object) -> str:
    return json.dumps(to_jsonable(value), separators=(",", ":"), allow_nan=False)


def request_row(run_id: int, record: RequestResult | Mapping[str, object]) -> tuple[object, ...]:
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
        dumps(list(cast(Iterable[object], get("itl_s", ()) or ()))),  # not a list: the TypeError becomes .error
        get("input_tokens"),
        get("output_tokens"),
        1 if get("ok") else 0,
        get("error"),
        1 if get("cancelled", False) else 0,
        dumps(extra),
    )


REQUEST_FIELDS = ("id", "t_start", "ttft_s", "e2el_s", "itl_s", "input_tokens", "output_tokens", "ok", "error",
                  "cancelled")
"""The ``requests`` table's typed columns (loadgen ``RequestResult`` field names); a record's other
fields are kept in its ``extra`` JSON column."""


def _gaps(value: object) -> tuple[float | None, ...]:
    if not isinstance(value, list):
        raise ValueError(f"itl_s is {value!r}, not a list")
    return tuple(stored_number(v, "an itl_s value") for v in value)


def json_column(text: object, name: str) -> JSONValue:
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
            fields = json_column(extra, "extra")
            if not isinstance(fields, Mapping):
                raise ValueError(f"the extra column is {extra!r}, not a JSON object")
            return cls(
                id=stored_int(rid, "req_id"), t_start=t_start, ttft_s=stored_number(ttft, "ttft_s"),
                e2el_s=stored_number(e2el, "e2el_s"), itl_s=_gaps(json_column(itl, "itl_s")),
                input_tokens=stored_int(n_in, "input_tokens"), output_tokens=stored_int(n_out, "output_tokens"),
                ok=bool(ok), error=stored_text(err, "error"), cancelled=bool(cancelled), extra=fields,
            )
        except ValueError as exc:
            raise HistoryError(path, f"run {run_id}'s request {rid!r} cannot be read: {exc}") from None


@dataclass(frozen=True)
class RequestColumns:
    """A run's completed requests (ok, not cancelled, with a TTFT and an E2EL: what a within-run
    interval reads, engine.runs.noise.RunNoise) as columns of machine numbers, in start order as
    stored: no Python object per request. Read row by row from the history
    (:meth:`History.request_columns`) a run of 18,000 requests takes ~5 MB here, where as
    StoredRequests (each a tuple of ~31 float objects and its ``extra`` dict) it took ~18 MB of
    small objects alive at once, whose churn left pymalloc's arenas fragmented after every
    finished run the Runs tab bootstrapped (+5-8 MB of RSS a run).

    ``itl_s`` holds every request's gaps one after another (gaps stored as None left out);
    request ``i``'s are ``itl_s[itl_ends[i - 1]:itl_ends[i]]``. ``output_tokens`` reads None as 0.
    """

    t_start: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    ttft_s: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    e2el_s: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    output_tokens: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    itl_s: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    itl_ends: array[int] = dataclasses.field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.t_start)

    def _add(self, t_start: float, ttft_s: float, e2el_s: float, output_tokens: int | None,
             gaps: Iterable[float | None]) -> None:
        self.t_start.append(t_start)
        self.ttft_s.append(ttft_s)
        self.e2el_s.append(e2el_s)
        self.output_tokens.append(output_tokens or 0)
        self.itl_s.extend(g for g in gaps if g is not None)
        self.itl_ends.append(len(self.itl_s))

    @classmethod
    def of(cls, requests: Iterable[StoredRequest]) -> RequestColumns:
        """The completed ones of ``requests``, in their order."""
        out = cls()
        for r in requests:
            if r.ok and not r.cancelled and r.ttft_s is not None and r.e2el_s is not None:
                out._add(r.t_start, r.ttft_s, r.e2el_s, r.output_tokens, r.itl_s)
        return out

    # The rows History.request_columns reads: those :meth:`of` keeps, only the columns it reads
    # (not ``extra``, ``error``, ``input_tokens``), in requests()'s order.
    QUERY = ("SELECT req_id, t_start, ttft_s, e2el_s, itl_s, output_tokens FROM requests WHERE run_id = ?"
             " AND ok AND NOT cancelled AND ttft_s IS NOT NULL AND e2el_s IS NOT NULL ORDER BY t_start, rowid")

    def add_row(self, row: Sequence[object], path: Path, run_id: int) -> None:
        """One row of :attr:`QUERY`, checked as :meth:`StoredRequest.from_row` checks those columns;
        HistoryError naming the run and the request when one does not parse."""
        rid, t0, ttft, e2el, itl, n_out = row
        try:
            stored_int(rid, "req_id")
            t_start, ttft_s, e2el_s = (stored_number(t0, "t_start"), stored_number(ttft, "ttft_s"),
                                       stored_number(e2el, "e2el_s"))
            if t_start is None:
                raise ValueError("t_start is missing")
            if ttft_s is None or e2el_s is None:  # the query keeps none such: a row changed under it
                raise ValueError("ttft_s or e2el_s is missing")
            self._add(t_start, ttft_s, e2el_s, stored_int(n_out, "output_tokens"), _gaps(json_column(itl, "itl_s")))
        except ValueError as exc:
            raise HistoryError(path, f"run {run_id}'s request {rid!r} cannot be read: {exc}") from None


def sample_data(text: object, path: Path, run_id: int, kind: str, t: float) -> JSONObject:
    """A ``samples`` row's data: the JSON object stored, else a HistoryError naming the sample."""
    try:
        data = json_column(text, "data")
    except ValueError as exc:
        raise HistoryError(path, f"run {run_id}'s {kind} sample at t={t} cannot be read: {exc}") from None
    if not isinstance(data, Mapping):
        raise HistoryError(path, f"run {run_id}'s {kind} sample at t={t} cannot be read: "
                                 f"its data is {text!r}, not a JSON object")
    return data


def process_start(pid: int) -> float | None:
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
    now_started = process_start(pid)
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
