"""The Azure LLM inference trace (AzurePublicDataset 2023/2024): CSV ``TIMESTAMP,ContextTokens,
GeneratedTokens``, TIMESTAMP an absolute date and time (100 ns digits, maybe an offset; UTC without one).
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from loadgen.traceformats._csv import has_columns, read_table
from loadgen.traceformats.base import Kind, Source, TraceError, TraceFile

NAME = "azure"
KIND: Kind = "csv"
EXPECTS = "Azure's TIMESTAMP,ContextTokens,GeneratedTokens"
COLUMNS = ("timestamp", "contexttokens", "generatedtokens")
_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?$")


def detect(source: Source) -> str | None:
    """A CSV header with TIMESTAMP, ContextTokens and GeneratedTokens (any case)."""
    if not has_columns(source, *COLUMNS):
        return None
    return ("detected the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); "
            "TIMESTAMP read as an absolute date and time (UTC unless it carries an offset)")


def read(source: Source) -> TraceFile:
    """The rows with tokens, times from the first row's date and time (a time unit given is not used)."""
    return read_table(source, NAME, COLUMNS, seconds)


def seconds(path: Path, line: int, v: str) -> float:
    """A TIMESTAMP as seconds since the epoch (its offset applied; UTC without one)."""
    m = _STAMP.match(v.strip())
    if not m:
        raise TraceError(path, f"TIMESTAMP {v!r} is not a date and time like 2023-11-16 18:15:46.6805900", line)
    day, clock, frac, tz = m.groups()
    try:
        base = _dt.datetime.fromisoformat(f"{day} {clock}")
    except ValueError:
        raise TraceError(path, f"TIMESTAMP {v!r} is not a valid date and time", line) from None
    off = 0.0
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        off = sign * (hh * 3600 + mm * 60)
    return base.replace(tzinfo=_dt.UTC).timestamp() - off + (float("0." + frac) if frac else 0.0)
