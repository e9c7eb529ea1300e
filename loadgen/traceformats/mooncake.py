"""Mooncake (FAST'25): JSON lines ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``,
timestamps in milliseconds since the first request, each hash id one block of 512 prompt tokens.
"""

from __future__ import annotations

from loadgen.traceformats._jsonl import Layout, read_lines, requests
from loadgen.traceformats.base import Kind, Source, TraceFile

NAME = "mooncake"
KIND: Kind = "jsonl"
EXPECTS = "Mooncake's input_length/output_length"
LAYOUT = Layout(NAME, "input_length", "output_length", "ms",
                       defined="milliseconds since the first request", block=512)


def detect(source: Source) -> str | None:
    """A first line with ``input_length`` or ``output_length`` (asked after Bailian, which shares them)."""
    head = source.lines[0][1]
    if "input_length" in head or "output_length" in head:
        return "detected Mooncake JSONL (timestamp/input_length/output_length/hash_ids and no chat_id)"
    return None


def read(source: Source) -> TraceFile:
    """The rows in file order, times in ms, the block size inferred from the hash ids (512 published)."""
    return read_lines(source, LAYOUT, requests(source))
