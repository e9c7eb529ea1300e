"""What the JSON-lines formats share: a row's fields checked, the block size of its hash ids,
the time unit, and the rows put on one clock from the first.

A JSON-lines format names its fields and units in a ``Layout`` and calls ``read_lines`` with its
request lines (``requests``, filtered or sorted as the format needs), the conversation each row
belongs to, and notes of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadgen.traceformats.base import TIME_UNITS, JSONObject, Source, TraceError, TraceFile, TraceRow, infer_block_size

# A row's conversation and turn (None, 0: it has none), given its JSON object; made fresh per file.
Sessions = Callable[[JSONObject], tuple[str | None, int]]
_BLOCK_RULE = "the first of 16..512 for which every line has ceil(input tokens / size) hash ids"


@dataclass(frozen=True)
class Layout:
    """How a JSON-lines format names its fields and what its publisher defines.

    ``name``: the format's (``TraceFile.format``; capitalized in notes). ``input_key``/``output_key``:
    its token counts. ``unit``: its timestamps' unit; ``defined``: those timestamps in the
    publisher's words (None: the format is vtui's own and needs no note). ``block``: its published block size
    (None: none published). ``zero_output``: a row may ask for 0 tokens (replayed as 1).
    ``prompt_input``: a row's ``prompt`` may stand in for its input count."""

    name: str
    input_key: str
    output_key: str
    unit: str
    defined: str | None = None
    block: int | None = None
    zero_output: bool = True
    prompt_input: bool = False


@dataclass(frozen=True, slots=True)
class _Raw:
    line: int
    t: float
    input_len: int
    output_len: int
    hash_ids: tuple[int | str, ...]
    obj: JSONObject


def requests(source: Source, skip: int = 0) -> list[tuple[int, JSONObject]]:
    """The file's request lines (after ``skip`` header lines), the first ``limit`` of them.
    Raises TraceError when there is none."""
    objs = list(source.lines[skip:])
    if not objs:
        raise TraceError(source.path, "file has no requests")
    return objs if source.limit is None else objs[: source.limit]


def pairs(objs: Sequence[tuple[int, JSONObject]], input_key: str) -> list[tuple[int, int]]:
    """(input tokens, number of hash ids) of the lines that have both, as a detector reads them
    (a bad value is left to ``read_lines`` to name)."""
    out: list[tuple[int, int]] = []
    for _, obj in objs:
        i, h = obj.get(input_key), obj.get("hash_ids")
        if isinstance(i, int | float) and not isinstance(i, bool) and float(i).is_integer() and i > 0 \
                and isinstance(h, list) and h:
            out.append((int(i), len(h)))
    return out


def no_sessions(_obj: JSONObject) -> tuple[str | None, int]:
    """A format without conversations."""
    return None, 0


def read_lines(source: Source, layout: Layout, objs: Sequence[tuple[int, JSONObject]], *,
               sessions: Sessions = no_sessions, declared: tuple[int, str] | None = None,
               notes: Sequence[str] = ()) -> TraceFile:
    """``objs`` (from ``requests``) as ``source``'s TraceFile in ``layout``'s format. ``declared``:
    a block size the file states and where (an override beats it, it beats inference);
    ``notes``: the format's own, put before the block size's and the time unit's.
    Raises TraceError naming the line of a missing or bad field or of a time going back."""
    raws = [_row(source.path, layout, lineno, obj) for lineno, obj in objs]
    if not raws:
        raise TraceError(source.path, "file has no requests with prompt tokens")
    said = list(notes)
    bs = _block_size(source, layout, raws, declared, said)
    unit = _time_unit(source, layout, said)
    scale = TIME_UNITS[unit]
    t0 = prev = raws[0].t
    rows: list[TraceRow] = []
    for r in raws:
        if r.t < prev:
            raise TraceError(source.path, "timestamps must not decrease", r.line)
        prev = r.t
        session, turn = sessions(r.obj)
        ep, outcome, ans, prompt = (r.obj.get(k) for k in ("endpoint", "outcome", "answer_tokens", "prompt"))
        rows.append(TraceRow(line=r.line, at_s=(r.t - t0) * scale, input_len=r.input_len, output_len=r.output_len,
                             hash_ids=r.hash_ids, prompt=prompt if isinstance(prompt, str) and prompt else None,
                             session=session, turn=turn, endpoint=ep if isinstance(ep, str) else None,
                             outcome=outcome if isinstance(outcome, str) else "ok",
                             answer_len=ans if isinstance(ans, int) and not isinstance(ans, bool) and ans >= 0
                             else None))
    return TraceFile(str(source.path), layout.name, tuple(rows), bs, unit, tuple(said))


def _row(p: Path, layout: Layout, lineno: int, obj: JSONObject) -> _Raw:
    ts = obj.get("timestamp", obj.get("t"))
    if ts is None:
        raise TraceError(p, "missing 'timestamp'", lineno)
    t = _number(p, lineno, ts, "timestamp")
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise TraceError(p, "'prompt' must be a string", lineno)
    has_input = obj.get(layout.input_key) is not None
    if not has_input and not prompt:
        raise TraceError(p, f"needs {layout.input_key!r}" + (" or 'prompt'" if layout.prompt_input else ""), lineno)
    i = _pos_int(p, lineno, obj, layout.input_key) if has_input else 0
    o = _pos_int(p, lineno, obj, layout.output_key, zero=layout.zero_output)
    return _Raw(lineno, t, i, max(1, o), _hash_ids(p, lineno, obj), obj)


def _block_size(source: Source, layout: Layout, raws: list[_Raw], declared: tuple[int, str] | None,
                notes: list[str]) -> int | None:
    """The override, else the size the file declares, else the one the hash ids imply (rule above)."""
    if source.block_size is not None:
        notes.append(f"block size {source.block_size} tokens per hash id (--trace-block-size)")
        return source.block_size
    if declared is not None:
        notes.append(f"block size {declared[0]} tokens per hash id ({declared[1]})")
        return declared[0]
    inferred = infer_block_size([(r.input_len, len(r.hash_ids)) for r in raws if r.hash_ids and r.input_len])
    if inferred is None:
        return None
    if layout.block is not None and inferred != layout.block:
        notes.append(f"block size {inferred} tokens per hash id, inferred ({_BLOCK_RULE}); "
                     f"{layout.name.capitalize()}'s published size is {layout.block}: --trace-block-size to override")
    else:
        notes.append(f"block size {inferred} tokens per hash id (inferred: {_BLOCK_RULE})")
    return inferred


def _time_unit(source: Source, layout: Layout, notes: list[str]) -> str:
    if source.time_unit is not None:
        notes.append(f"timestamps in {source.time_unit} (--trace-time-unit)")
        return source.time_unit
    if layout.defined is not None:
        notes.append(f"timestamps in {layout.unit} ({layout.name.capitalize()}'s definition: {layout.defined}; "
                     "--trace-time-unit to override)")
    return layout.unit


def _pos_int(path: Path, line: int, obj: JSONObject, key: str, *, zero: bool = False) -> int:
    v = obj.get(key)
    if v is None:
        raise TraceError(path, f"missing {key!r}", line)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero else 1):
        raise TraceError(path, f"{key!r} must be a {'non-negative' if zero else 'positive'} integer, got {v!r}",
                         line)
    return v


def _number(path: Path, line: int, v: object, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise TraceError(path, f"{key!r} must be a number >= 0, got {v!r}", line)
    return float(v)


def _hash_ids(path: Path, line: int, obj: JSONObject) -> tuple[int | str, ...]:
    v = obj.get("hash_ids")
    if v is None:
        return ()
    if not isinstance(v, list) or not all(
            (isinstance(h, int) and not isinstance(h, bool)) or isinstance(h, str) for h in v):
        raise TraceError(path, "'hash_ids' must be a list of integers or strings", line)
    return tuple(v)
