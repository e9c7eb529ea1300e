"""Alibaba Bailian (alibaba-edu/qwen-bailian-usagetraces-anon): JSON lines ``{"chat_id",
"parent_chat_id", "timestamp": s, "input_length", "output_length", "type", "turn", "hash_ids"}``,
16-token blocks. Its ids hash each block on its own, not chained: equal ids at the same place
still mean equal blocks, which is all a replay needs.
"""

from __future__ import annotations

from loadgen.traceformats._jsonl import Layout, pairs, read_lines, requests
from loadgen.traceformats.base import JSONObject, Kind, Source, TraceFile, infer_block_size

NAME = "bailian"
KIND: Kind = "jsonl"
EXPECTS = "Bailian's input_length/output_length"
LAYOUT = Layout(NAME, "input_length", "output_length", "s", defined="seconds", block=16)
# Keys only Bailian rows carry (Mooncake has timestamp/input_length/output_length/hash_ids).
OWN_KEYS = ("chat_id", "parent_chat_id", "turn", "type")


def detect(source: Source) -> str | None:
    """Mooncake's keys and one of Bailian's own, or Mooncake's keys alone with 16-token blocks (the
    ids' block size, unless the user gives one, names the family)."""
    head = source.lines[0][1]
    if "input_length" not in head and "output_length" not in head:
        return None
    own = [k for k in OWN_KEYS if k in head]
    if own:
        return f"detected Bailian JSONL (it has {', '.join(own)})"
    if source.block_size is None and infer_block_size(pairs(requests(source), "input_length")) == 16:
        return "detected Bailian JSONL (no chat_id, but 16-token blocks)"
    return None


def read(source: Source) -> TraceFile:
    """The rows in file order, times in s, each in the conversation of its first turn."""
    return read_lines(source, LAYOUT, requests(source), sessions=_Chains())


class _Chains:
    """A row's conversation: ``parent_chat_id`` names the turn before, not the first, so the chain
    is followed back to its first ``chat_id``."""

    def __init__(self) -> None:
        self.roots: dict[str, str] = {}  # chat_id -> its conversation's first chat_id

    def __call__(self, obj: JSONObject) -> tuple[str | None, int]:
        chat, parent = str(obj.get("chat_id")), str(obj.get("parent_chat_id", -1))
        session = chat if parent in ("-1", "None") else self.roots.get(parent, parent)
        self.roots[chat] = session
        tv = obj.get("turn", 1)
        return session, int(tv) if isinstance(tv, int) and not isinstance(tv, bool) else 0
