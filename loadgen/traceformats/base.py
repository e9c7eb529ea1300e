"""The vocabulary every trace format shares: the row (``TraceRow``), the read file (``TraceFile``),
the error (``TraceError``), the file as a format sees it (``Source``) and the interface a format
module keeps (``TraceFormat``).

A format module has four names: ``NAME`` (what ``TraceFile.format`` says), ``KIND`` (``"jsonl"``
or ``"csv"``: which container it lives in), ``EXPECTS`` (what it looks for, in words, for the
error a file no format claims gets) and two functions: ``detect(source)`` returns why the file is
in this format (a note, the first of the file's notes) or None, and ``read(source)`` returns the
``TraceFile`` with every other note (units, block size, skipped rows).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from loadgen.datafile import DatasetError

Kind = Literal["jsonl", "csv"]
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# The block sizes the publishers use, tried in order when a file does not say its own.
KNOWN_BLOCK_SIZES = (16, 32, 64, 128, 256, 512)


class TraceError(DatasetError):
    """A bad trace file: names the file and, when it applies, the line."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace. ``at_s``: seconds after the trace's first row (not scaled);
    ``output_len``: tokens to ask for; ``hash_ids``: one per ``block_size`` prompt tokens
    (the last block may be partial), equal leading ids = a shared prefix; ``session``: the
    conversation it belongs to, when the file can tell."""

    line: int
    at_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int | str, ...] = ()
    prompt: str | None = None
    session: str | None = None
    turn: int = 0
    endpoint: str | None = None
    outcome: str = "ok"
    # the answer's text tokenized again (a recording's chat rows): what the next turn's prompt grew by
    answer_len: int | None = None

    @property
    def carried_len(self) -> int:
        """The tokens this request's prompt and answer add to its conversation's next turn."""
        return self.input_len + (self.answer_len if self.answer_len is not None else self.output_len)


@dataclass(frozen=True)
class TraceFile:
    """A read trace: its format, its rows (in file order, times from the first row), the
    block size of its hash ids (None: it has none) and what was assumed, in words."""

    path: str
    format: str
    rows: tuple[TraceRow, ...]
    block_size: int | None
    time_unit: str
    notes: tuple[str, ...] = field(default=())

    def conversations(self) -> tuple[int, int]:
        """(conversations of more than one turn, their later turns), by ``conversation_chains``."""
        chains = [c for c in conversation_chains(self.rows) if len(c) > 1]
        return len(chains), sum(len(c) - 1 for c in chains)

    def describe(self) -> str:
        """One line for a user: the format, every assumption, and the conversations it replays."""
        notes = list(self.notes)
        convs, later = self.conversations()
        if convs:
            many = "s" * (convs != 1)
            notes.append(f"{later} requests replayed as later turns of {convs} conversation{many}, each "
                         "carrying the turns before and the server's answers to them (a turn whose recorded prompt "
                         "holds the one before and its answer)")
        return f"{self.path}: {self.format} trace, {len(self.rows)} requests; " + "; ".join(notes)


def conversation_chains(rows: tuple[TraceRow, ...] | list[TraceRow]) -> list[list[int]]:
    """The rows as chains of indexes: a conversation's turns, in order, each later one carrying
    the one before. A row continues its conversation (same ``session``) when it is the next turn
    (``turn`` one more than the chain's last, or every turn 0: file order) and its prompt can hold
    that turn's prompt and answer (``input_len`` above the two together): only then was the
    earlier answer part of it. A row with its own prompt text is replayed as it was, on its own.
    Every other row is a chain of its own. Chains come in the order of their first rows."""
    chains: list[list[int]] = []
    open_: dict[str, list[list[int]]] = {}  # session -> the chains whose last row may yet be continued
    for k, r in enumerate(rows):
        if r.session is not None and r.prompt is None:
            for c in open_.get(r.session, ()):
                last = rows[c[-1]]
                if (r.turn == last.turn + 1 or r.turn == last.turn == 0) and r.input_len > last.carried_len:
                    c.append(k)
                    break
            else:
                chains.append([k])
                open_.setdefault(r.session, []).append(chains[-1])
            continue
        chains.append([k])
    return chains


def infer_block_size(pairs: list[tuple[int, int]]) -> int | None:
    """The block size of hash ids from (input tokens, number of ids) pairs: the first of the
    publishers' sizes (16 ... 512) for which every row has ceil(input / size) ids; else the
    largest ceil(input / ids) (a size no row contradicts less). None without pairs."""
    pairs = [(i, k) for i, k in pairs if k > 0]
    if not pairs:
        return None
    for b in KNOWN_BLOCK_SIZES:
        if all(math.ceil(i / b) == k for i, k in pairs):
            return b
    return max(math.ceil(i / k) for i, k in pairs)


JSONObject = dict[str, object]


@dataclass(frozen=True)
class Source:
    """A trace file read once and opened in its container, with the user's overrides.

    ``kind``: ``"jsonl"`` when its first line is a JSON object, else ``"csv"``. ``lines``: a
    JSON-lines file's objects with their line numbers (every line, a header line included);
    ``columns``: a CSV file's header, stripped (``records()`` gives the rows after it).
    ``block_size``/``time_unit``: the user's overrides (None: the file's or its format's);
    ``limit``: read only the first requests."""

    path: Path
    text: str
    kind: Kind
    lines: tuple[tuple[int, JSONObject], ...] = ()
    columns: tuple[str, ...] = ()
    block_size: int | None = None
    time_unit: str | None = None
    limit: int | None = None

    @classmethod
    def open(cls, path: Path, text: str, *, block_size: int | None = None, time_unit: str | None = None,
             limit: int | None = None) -> Source:
        """Parse ``text`` as its container. Raises TraceError for a line that is not a JSON
        object (in a JSON-lines file) or a CSV without a header."""
        first = text.lstrip().split("\n", 1)[0].strip()
        if first.startswith("{"):
            return cls(path, text, "jsonl", lines=_objects(path, text), block_size=block_size,
                       time_unit=time_unit, limit=limit)
        try:
            header = next(csv.reader(io.StringIO(text)))
        except StopIteration:
            raise TraceError(path, "file is empty") from None
        return cls(path, text, "csv", columns=tuple(h.strip() for h in header), block_size=block_size,
                   time_unit=time_unit, limit=limit)

    def records(self) -> Iterator[tuple[int, list[str]]]:
        """A CSV file's rows after its header, each with the line it ends on."""
        reader = csv.reader(io.StringIO(self.text))
        next(reader, None)
        for rec in reader:
            yield reader.line_num, rec

    def first(self) -> tuple[int, str]:
        """The first line and what it holds, for an error: a JSON object's keys (8 at most) or the CSV header."""
        if self.kind == "csv":
            return 1, f"the header is {','.join(self.columns)}"
        line, obj = self.lines[0]
        return line, "the line has " + ", ".join(sorted(obj)[:8])


def _objects(path: Path, text: str) -> tuple[tuple[int, JSONObject], ...]:
    rows: list[tuple[int, JSONObject]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(path, f"malformed JSON: {exc.msg} (column {exc.colno})", lineno) from None
        if not isinstance(obj, dict):
            raise TraceError(path, f"expected a JSON object, got {type(obj).__name__}", lineno)
        rows.append((lineno, obj))
    return tuple(rows)


class TraceFormat(Protocol):
    """One trace format: a module in ``loadgen/traceformats/`` listed in its ``READERS``."""

    NAME: str
    KIND: Kind
    EXPECTS: str

    def detect(self, source: Source) -> str | None:
        """Why ``source`` is in this format (the file's first note), or None when it is not."""
        ...

    def read(self, source: Source) -> TraceFile:
        """The file's requests; raises TraceError naming the line of a bad row."""
        ...
