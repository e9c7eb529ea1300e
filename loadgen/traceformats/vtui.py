"""vtui's own trace: JSON lines ``{"timestamp": s, "input_len", "output_len", "prompt"?, "hash_ids"?,
"conversation"?, "turn"?}``; ``t`` stands for ``timestamp``, a ``prompt`` for ``input_len``.
"""

from __future__ import annotations

from loadgen.traceformats._jsonl import Layout, read_lines, requests
from loadgen.traceformats.base import JSONObject, Kind, Source, TraceFile

NAME = "vtui"
KIND: Kind = "jsonl"
EXPECTS = "vtui's input_len/output_len"
LAYOUT = Layout(NAME, "input_len", "output_len", "s", zero_output=False, prompt_input=True)
OWN = "vtui's own format: timestamp in s (its definition)"


def detect(source: Source) -> str | None:
    """A first line with ``input_len`` or ``output_len``."""
    head = source.lines[0][1]
    return OWN if "input_len" in head or "output_len" in head else None


def read(source: Source) -> TraceFile:
    """The rows in file order, times in s; a row needs ``input_len`` or a ``prompt``, and 1+ output tokens."""
    return read_lines(source, LAYOUT, requests(source), sessions=sessions)


def sessions(obj: JSONObject) -> tuple[str | None, int]:
    """A row's ``conversation`` and ``turn`` (0 when it has none)."""
    c, tv = obj.get("conversation"), obj.get("turn", 0)
    return (str(c) if c is not None else None), (int(tv) if isinstance(tv, int) and not isinstance(tv, bool) else 0)
