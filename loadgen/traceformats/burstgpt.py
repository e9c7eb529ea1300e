"""BurstGPT: CSV ``Timestamp,[Session ID,Elapsed time,]Model,Request tokens,Response tokens,Total
tokens,Log Type``, Timestamp in seconds from the first day's midnight. Rows with 0 response tokens
are failed requests (the publisher's words): skipped, and said so.
"""

from __future__ import annotations

import math
from pathlib import Path

from loadgen.traceformats._csv import has_columns, read_table
from loadgen.traceformats.base import TIME_UNITS, Kind, Source, TraceError, TraceFile

NAME = "burstgpt"
KIND: Kind = "csv"
EXPECTS = "BurstGPT's Timestamp,...,Request tokens,Response tokens"
COLUMNS = ("timestamp", "request tokens", "response tokens")


def detect(source: Source) -> str | None:
    """A CSV header with Timestamp, Request tokens and Response tokens (any case)."""
    if not has_columns(source, *COLUMNS):
        return None
    return "detected BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,...)"


def read(source: Source) -> TraceFile:
    """The rows with tokens (0 response tokens: a failed request, skipped), each in its Session ID's
    conversation when the file has that column."""
    unit = source.time_unit
    scale = TIME_UNITS[unit or "s"]
    said = (f"timestamps in {unit} (--trace-time-unit)" if unit else
            "timestamps in s (BurstGPT's definition: seconds from the first day's midnight; --trace-time-unit "
            "to override)")

    def seconds(path: Path, line: int, v: str) -> float:
        try:
            t = float(v) * scale
        except ValueError:
            raise TraceError(path, f"Timestamp must be a number, got {v!r}", line) from None
        if not math.isfinite(t) or t < 0:
            raise TraceError(path, f"Timestamp must be a number >= 0, got {v!r}", line)
        return t

    return read_table(source, NAME, COLUMNS, seconds, notes=[said])
