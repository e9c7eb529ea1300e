"""What the CSV formats share: the columns found by name, token counts checked, the rows put on
one clock from the first, and the rows with 0 tokens skipped (said so).

A CSV format names its three columns and how a timestamp becomes seconds, and calls ``read_table``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from loadgen.traceformats.base import Source, TraceError, TraceFile, TraceRow

# A timestamp cell as seconds, given the file and its line (raises TraceError for a bad one).
Clock = Callable[[Path, int, str], float]


def has_columns(source: Source, *names: str) -> bool:
    """Whether the header has every column of ``names`` (lowercase, any case in the file)."""
    low = [c.lower() for c in source.columns]
    return all(n in low for n in names)


def read_table(source: Source, name: str, columns: tuple[str, str, str], clock: Clock, notes: Sequence[str] = ()) -> TraceFile:
    """``source`` as a TraceFile of format ``name``: ``columns`` (lowercase) name the timestamp, the
    prompt tokens and the output tokens; a ``Session ID`` column, when there is one, gives each
    row's conversation. ``notes`` come first. Rows with 0 prompt or output tokens are skipped
    (a failed request; an empty prompt cannot be sent). Raises TraceError naming the line of a
    short row, a token count that is not a non-negative integer, a bad time or a time going back."""
    path, header = source.path, source.columns
    low = [c.lower() for c in header]
    cols = tuple(low.index(c) for c in columns)
    session_col = low.index("session id") if "session id" in low else None
    rows: list[TraceRow] = []
    skipped = 0
    t0: float | None = None
    prev = -math.inf
    need = max(cols) + 1
    for lineno, rec in source.records():
        if not rec or not any(c.strip() for c in rec):
            continue
        if source.limit is not None and len(rows) >= source.limit:
            break
        if len(rec) < need:
            raise TraceError(path, f"{len(rec)} columns, the header has {len(header)}", lineno)
        ts_s, in_s, out_s = (rec[c].strip() for c in cols)
        try:
            i, o = int(in_s), int(out_s)
        except ValueError:
            raise TraceError(path, f"token counts must be integers, got {in_s!r} and {out_s!r}", lineno) from None
        if i < 0 or o < 0:
            raise TraceError(path, "token counts must be >= 0", lineno)
        t = clock(path, lineno, ts_s)
        if t < prev:
            raise TraceError(path, "timestamps must not decrease", lineno)
        prev = t
        if i == 0 or o == 0:
            skipped += 1
            continue
        if t0 is None:
            t0 = t
        sess = rec[session_col].strip() if session_col is not None and len(rec) > session_col else ""
        rows.append(TraceRow(line=lineno, at_s=t - t0, input_len=i, output_len=o, session=sess or None))
    if not rows:
        raise TraceError(path, "file has no requests" + (f" with tokens ({skipped} rows with 0)" if skipped else ""))
    said = list(notes)
    if skipped:
        said.append(f"{skipped} rows with 0 request or response tokens skipped (failed requests)")
    said.append("no block hashes in this format: prompts share nothing")
    return TraceFile(str(path), name, tuple(rows), None, source.time_unit or "s", tuple(said))
