"""A ``vtui record`` recording: a header line ``{"vtui_recording": 1, "block_size": B, ...}``, then
one vtui trace row per request, written as it ends (``hash_ids`` salted, chained block hashes;
``input_len`` 0 where the server could not tokenize the prompt). Both halves are here: ``header``
and ``row`` write it (``loadgen.record`` calls them as requests end), ``detect`` and ``read`` read it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.traceformats._jsonl import Layout, read_lines, requests
from loadgen.traceformats.base import JSONObject, Kind, Source, TraceFile
from loadgen.traceformats.vtui import OWN, sessions

NAME = "vtui-recording"
KIND: Kind = "jsonl"
EXPECTS = "a vtui recording's header"
HEADER_KEY = "vtui_recording"
LAYOUT = Layout(NAME, "input_len", "output_len", "s", prompt_input=True)


def header(block_size: int, **about: object) -> dict[str, object]:
    """The recording's first line: the format's mark, its block size, then ``about`` (when it was
    started, the upstream, where token counts come from, whether prompts are kept)."""
    return {HEADER_KEY: 1, "block_size": block_size, **about}


def chained_hashes(ids: Sequence[int], block: int, salt: bytes) -> list[str]:
    """One hash a ``block`` tokens (the last block may be partial), each covering every token
    before it: equal prefixes give equal leading hashes. 16 hex digits each (64 bits)."""
    out: list[str] = []
    prev = b""
    for k in range(0, len(ids), block):
        h = hashlib.blake2b(salt + prev + b"|" + ",".join(map(str, ids[k : k + block])).encode(),
                            digest_size=8)
        prev = h.digest()
        out.append(h.hexdigest())
    return out


def row(request: Mapping[str, Any], *, endpoint: str, t: float, ids: list[int] | None, produced: int | None,
        answer: int | None, status: int | None, outcome: str, ttft_s: float | None, e2el_s: float,
        block_size: int, salt: bytes, keep_prompts: bool) -> dict[str, object]:
    """One request's line: ``request`` is the client's JSON body, ``ids`` its prompt's token ids
    (None: not tokenized), ``produced`` the output tokens the response said or had, ``answer`` a
    chat answer's re-tokenized length (what the conversation's next prompt grew by). No text
    unless ``keep_prompts``; a chat's conversation is a salted hash of its opening messages."""
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    out_len = produced if produced else (max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 16)
    line: dict[str, object] = {
        "timestamp": round(t, 6), "endpoint": endpoint, "stream": bool(request.get("stream")),
        "input_len": len(ids) if ids else 0, "output_len": out_len, "output_tokens": produced,
        "max_tokens": max_tokens, "n": request.get("n", 1), "ignore_eos": bool(request.get("ignore_eos", False)),
        "temperature": request.get("temperature"),
        "hash_ids": chained_hashes(ids, block_size, salt) if ids else [],
        "status": status, "outcome": outcome,
        "ttft_s": round(ttft_s, 6) if ttft_s is not None else None, "e2el_s": round(e2el_s, 6),
    }
    messages = request.get("messages") if endpoint == "chat" else None
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        first_user = next((k for k, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                          len(messages) - 1)
        opening = json.dumps(messages[: first_user + 1], sort_keys=True).encode()
        line["conversation"] = hashlib.blake2b(salt + opening, digest_size=8).hexdigest()
        line["turn"] = len(users)
        if answer is not None:
            line["answer_tokens"] = answer
    if keep_prompts:
        if isinstance(request.get("prompt"), str):
            line["prompt"] = request["prompt"]
        elif isinstance(messages, list):
            line["messages"] = messages
    return line


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
