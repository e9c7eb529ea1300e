"""A ``vtui record`` recording: a header line ``{"vtui_recording": 1, "block_size": B, ...}``, then
one vtui trace row per request, written as it ends (``hash_ids`` salted, chained block hashes;
``input_len`` 0 where the server could not tokenize the prompt). ``loadgen.record`` writes it.
"""

from __future__ import annotations

from loadgen.traceformats._jsonl import Layout, read_lines, requests
from loadgen.traceformats.base import JSONObject, Kind, Source, TraceFile
from loadgen.traceformats.vtui import OWN, sessions

NAME = "vtui-recording"
KIND: Kind = "jsonl"
EXPECTS = "a vtui recording's header"
HEADER_KEY = "vtui_recording"
LAYOUT = Layout(NAME, "input_len", "output_len", "s", prompt_input=True)


def detect(source: Source) -> str | None:
    """A first line with ``vtui_recording``."""
    return OWN if HEADER_KEY in source.lines[0][1] else None


def read(source: Source) -> TraceFile:
    """The requests in arrival order, those without prompt tokens (the server could not tokenize
    the prompt, or it never reached one) skipped and counted; the header's block size."""
    header = source.lines[0][1]
    # Lines are written as requests end: arrival order is by timestamp.
    objs = sorted(requests(source, skip=1), key=_stamp)
    tokenized = [(n, o) for n, o in objs if o.get("input_len") or o.get("prompt")]
    untokenized = len(objs) - len(tokenized)
    bs = header.get("block_size")
    return read_lines(source, LAYOUT, tokenized, sessions=sessions,
                      declared=(bs, "the recording's header") if isinstance(bs, int) else None,
                      notes=[f"{untokenized} recorded requests without prompt tokens skipped"] if untokenized else [])


def _stamp(row: tuple[int, JSONObject]) -> float:
    t = row[1].get("timestamp")
    return float(t) if isinstance(t, int | float) else 0.0
