"""Read request traces as they are published: vtui's own trace and recordings, Mooncake and
Alibaba Bailian JSONL, the Azure LLM inference CSV and BurstGPT CSV.

``read_trace`` opens the file in its container (JSON lines when its first line is an object,
else CSV), asks each format of ``READERS`` of that container in turn whether the file is its
own (``detect``), and has the first that claims it read it: every row a ``TraceRow`` (arrival
time in seconds from the first row, prompt and output tokens, block hash ids, conversation),
and ``TraceFile.notes`` saying which format it found and every unit it assumed, with the rule it
used, so a replay never rests on a silent guess. Each problem names the file and line.

A new format is one module here (``NAME``, ``KIND``, ``EXPECTS``, ``detect``, ``read``: the
interface ``base.TraceFormat`` describes), its test, and its line in ``READERS``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loadgen.datafile import read_text
from loadgen.traceformats import azure, bailian, burstgpt, mooncake, recording, vtui
from loadgen.traceformats.base import (
    KNOWN_BLOCK_SIZES,
    TIME_UNITS,
    Source,
    TraceError,
    TraceFile,
    TraceFormat,
    TraceRow,
    conversation_chains,
    infer_block_size,
)

# Asked in this order: the first whose detect claims a file reads it (Bailian before Mooncake,
# whose keys it shares).
READERS: tuple[TraceFormat, ...] = (recording, vtui, bailian, mooncake, azure, burstgpt)
FORMATS = tuple(f.NAME for f in READERS)
_CONTAINERS = {"jsonl": "a JSON-lines trace", "csv": "a CSV"}


def detect(source: Source) -> tuple[TraceFormat, str]:
    """The format of ``source`` and why (a note), from ``READERS`` in order. Raises TraceError
    naming the first line when no format claims it."""
    for fmt in READERS:
        if source.kind == fmt.KIND and (why := fmt.detect(source)) is not None:
            return fmt, why
    wanted = " or ".join(f.EXPECTS for f in READERS if source.kind == f.KIND)
    line, holds = source.first()
    raise TraceError(source.path, f"not a trace vtui knows: {_CONTAINERS[source.kind]} needs {wanted}; {holds}", line)


def read_trace(path: str | Path, *, block_size: int | None = None, time_unit: str | None = None,
               limit: int | None = None) -> TraceFile:
    """Read ``path`` in whichever published format it is. ``block_size``/``time_unit``
    override what the file says or what is inferred; ``limit``: read only the first rows.
    Raises TraceError naming the file (and the line) of what cannot be read."""
    p = Path(path).expanduser()
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise TraceError(p, f"time unit {time_unit!r}: must be one of {', '.join(TIME_UNITS)}")
    if block_size is not None and block_size < 1:
        raise TraceError(p, f"block size {block_size}: must be at least 1")
    source = Source.open(p, read_text(p, TraceError), block_size=block_size, time_unit=time_unit, limit=limit)
    fmt, why = detect(source)
    tf = fmt.read(source)
    return replace(tf, notes=(why, *tf.notes))


__all__ = ["FORMATS", "KNOWN_BLOCK_SIZES", "READERS", "TIME_UNITS", "Source", "TraceError", "TraceFile", "TraceFormat",
           "TraceRow", "conversation_chains", "detect", "infer_block_size", "read_trace"]
