"""Read request traces as they are published: vtui's own trace and recordings, Mooncake and
Alibaba Bailian JSONL, the Azure LLM inference CSV and BurstGPT CSV.

``read_trace`` detects the format, converts every row to a ``TraceRow`` (arrival time in
seconds from the first row, prompt and output tokens, block hash ids, conversation) and says in
``TraceFile.notes`` which format it found and every unit it assumed, with the rule it used, so
a replay never rests on a silent guess. Each problem names the file and line.

Formats, as their publishers define them (checked against AIPerf's loaders and the publishers'
pages, 2026-12-05):

- vtui trace: JSONL ``{"timestamp": s, "input_len", "output_len", "prompt"?, "hash_ids"?}``.
- vtui recording (``vtui record``): a header line ``{"vtui_recording": 1, "block_size": B, ...}``,
  then one vtui trace row per request (``hash_ids`` are salted, chained block hashes).
- Mooncake (FAST'25): ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``,
  each id one block of 512 prompt tokens.
- Bailian (alibaba-edu/qwen-bailian-usagetraces-anon): ``{"chat_id", "parent_chat_id",
  "timestamp": s, "input_length", "output_length", "type", "turn", "hash_ids"}``, 16-token
  blocks (ids hash each block on its own, not chained: equal ids at the same place still mean
  equal blocks, which is all a replay needs).
- Azure LLM inference (AzurePublicDataset 2023/2024): CSV ``TIMESTAMP,ContextTokens,
  GeneratedTokens``, TIMESTAMP an absolute date and time (100 ns digits, maybe an offset).
- BurstGPT: CSV ``Timestamp,[Session ID,Elapsed time,]Model,Request tokens,Response tokens,
  Total tokens,Log Type``, Timestamp in s; rows with 0 response tokens are failed requests
  (the publisher's words) and are skipped, and said so.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from loadgen.datafile import DatasetError, read_text

FORMATS = ("vtui", "vtui-recording", "mooncake", "bailian", "azure", "burstgpt")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# The block sizes the publishers use, tried in order when a file does not say its own.
KNOWN_BLOCK_SIZES = (16, 32, 64, 128, 256, 512)
MOONCAKE_BLOCK = 512
BAILIAN_BLOCK = 16
# Keys only Bailian rows carry (Mooncake has timestamp/input_length/output_length/hash_ids).
_BAILIAN_KEYS = ("chat_id", "parent_chat_id", "turn", "type")


class TraceError(DatasetError):
    """A bad trace file: names the file and, when it applies, the line."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace. ``at_s``: seconds after the trace's first row (not scaled);
    ``output_len``: tokens to ask for; ``hash_ids``: one per ``block_size`` prompt tokens
    (the last block may be partial), equal leading ids = a shared prefix; ``session``: the
    conversation it belongs to, when the file can tell."""

    line: int
    at_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int | str, ...] = ()
    prompt: str | None = None
    session: str | None = None
    turn: int = 0
    endpoint: str | None = None
    outcome: str = "ok"
    # the answer's text tokenized again (a recording's chat rows): what the next turn's prompt grew by
    answer_len: int | None = None

    @property
    def carried_len(self) -> int:
        """The tokens this request's prompt and answer add to its conversation's next turn."""
        return self.input_len + (self.answer_len if self.answer_len is not None else self.output_len)


@dataclass(frozen=True)
class TraceFile:
    """A read trace: its format, its rows (in file order, times from the first row), the
    block size of its hash ids (None: it has none) and what was assumed, in words."""

    path: str
    format: str
    rows: tuple[TraceRow, ...]
    block_size: int | None
    time_unit: str
    notes: tuple[str, ...] = field(default=())

    def conversations(self) -> tuple[int, int]:
        """(conversations of more than one turn, their later turns), by ``conversation_chains``."""
        chains = [c for c in conversation_chains(self.rows) if len(c) > 1]
        return len(chains), sum(len(c) - 1 for c in chains)

    def describe(self) -> str:
        """One line for a user: the format, every assumption, and the conversations it replays."""
        notes = list(self.notes)
        convs, later = self.conversations()
        if convs:
            many = "s" * (convs != 1)
            notes.append(f"{later} requests replayed as later turns of {convs} conversation{many}, each "
                         "carrying the turns before and the server's answers to them (a turn whose recorded prompt "
                         "holds the one before and its answer)")
        return f"{self.path}: {self.format} trace, {len(self.rows)} requests; " + "; ".join(notes)


def _pos_int(path: Path, line: int, obj: dict[str, object], key: str, *, zero: bool = False) -> int:
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


def infer_block_size(pairs: list[tuple[int, int]]) -> int | None:
    """The block size of hash ids from (input tokens, number of ids) pairs: the first of the
    publishers' sizes (16 ... 512) for which every row has ceil(input / size) ids; else the
    largest ceil(input / ids) (a size no row contradicts less). None without pairs."""
    pairs = [(i, k) for i, k in pairs if k > 0]
    if not pairs:
        return None
    for b in KNOWN_BLOCK_SIZES:
        if all(math.ceil(i / b) == k for i, k in pairs):
            return b
    return max(math.ceil(i / k) for i, k in pairs)


def _hash_ids(path: Path, line: int, obj: dict[str, object]) -> tuple[int | str, ...]:
    v = obj.get("hash_ids")
    if v is None:
        return ()
    if not isinstance(v, list) or not all(
            (isinstance(h, int) and not isinstance(h, bool)) or isinstance(h, str) for h in v):
        raise TraceError(path, "'hash_ids' must be a list of integers or strings", line)
    return tuple(v)


def read_trace(path: str | Path, *, block_size: int | None = None, time_unit: str | None = None,
               limit: int | None = None) -> TraceFile:
    """Read ``path`` in whichever published format it is. ``block_size``/``time_unit``
    override what the file says or what is inferred; ``limit``: read only the first rows."""
    p = Path(path).expanduser()
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise TraceError(p, f"time unit {time_unit!r}: must be one of {', '.join(TIME_UNITS)}")
    if block_size is not None and block_size < 1:
        raise TraceError(p, f"block size {block_size}: must be at least 1")
    text = read_text(p, TraceError)
    first = text.lstrip().split("\n", 1)[0].strip()
    if not first.startswith("{"):
        return _read_csv(p, text, time_unit, limit)
    return _read_jsonl(p, text, block_size, time_unit, limit)


def _objects(path: Path, text: str) -> list[tuple[int, dict[str, object]]]:
    rows: list[tuple[int, dict[str, object]]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(path, f"malformed JSON: {exc.msg} (column {exc.colno})", lineno) from None
        if not isinstance(obj, dict):
            raise TraceError(path, f"expected a JSON object, got {type(obj).__name__}", lineno)
        rows.append((lineno, obj))
    return rows


def _stamp(row: tuple[int, dict[str, object]]) -> float:
    t = row[1].get("timestamp")
    return float(t) if isinstance(t, int | float) else 0.0


def _read_jsonl(path: Path, text: str, block_size: int | None, time_unit: str | None,
                limit: int | None) -> TraceFile:
    objs = _objects(path, text)
    header: dict[str, object] | None = None
    if objs and "vtui_recording" in objs[0][1]:
        header = objs.pop(0)[1]
    if not objs:
        raise TraceError(path, "file has no requests")
    if limit is not None:
        objs = objs[:limit]
    head = objs[0][1]
    notes: list[str] = []
    if header is not None or "input_len" in head or "output_len" in head:
        fmt = "vtui-recording" if header is not None else "vtui"
        in_key, out_key, unit = "input_len", "output_len", "s"
        notes.append("vtui's own format: timestamp in s (its definition)")
    elif "input_length" in head or "output_length" in head:
        bailian_keys = [k for k in _BAILIAN_KEYS if k in head]
        in_key, out_key = "input_length", "output_length"
        fmt = "bailian" if bailian_keys else "mooncake"
        unit = "s" if fmt == "bailian" else "ms"
        why = (f"it has {', '.join(bailian_keys)}" if bailian_keys
               else "timestamp/input_length/output_length/hash_ids and no chat_id")
        notes.append(f"detected {fmt.capitalize()} JSONL ({why})")
    else:
        keys = ", ".join(sorted(head)[:8])
        raise TraceError(path, "not a trace vtui knows: expected vtui's input_len/output_len, or Mooncake's or "
                         f"Bailian's input_length/output_length; the line has {keys}", objs[0][0])
    rows_raw: list[tuple[int, float, int, int, tuple[int | str, ...], dict[str, object]]] = []
    untokenized = 0
    if header is not None:
        # A recording's lines are written as requests end: arrival order is by timestamp.
        objs.sort(key=_stamp)
    for lineno, obj in objs:
        if header is not None and not obj.get("input_len") and not obj.get("prompt"):
            untokenized += 1  # the server could not tokenize its prompt (or it never reached one)
            continue
        ts = obj.get("timestamp", obj.get("t"))
        if ts is None:
            raise TraceError(path, "missing 'timestamp'", lineno)
        t = _number(path, lineno, ts, "timestamp")
        in_len = obj.get(in_key)
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise TraceError(path, "'prompt' must be a string", lineno)
        if in_len is None and not prompt:
            raise TraceError(path, f"needs {in_key!r}" + (" or 'prompt'" if fmt.startswith("vtui") else ""), lineno)
        i = _pos_int(path, lineno, obj, in_key) if in_len is not None else 0
        o = _pos_int(path, lineno, obj, out_key, zero=fmt not in ("vtui",))
        rows_raw.append((lineno, t, i, max(1, o), _hash_ids(path, lineno, obj), obj))
    if untokenized:
        notes.append(f"{untokenized} recorded requests without prompt tokens skipped")
    if not rows_raw:
        raise TraceError(path, "file has no requests with prompt tokens")
    # Block size: given, else the recording's header, else the format's, checked by the rule.
    pairs = [(i, len(h)) for _, _, i, _, h, _ in rows_raw if h and i]
    inferred = infer_block_size(pairs)
    if block_size is not None:
        bs: int | None = block_size
        notes.append(f"block size {block_size} tokens per hash id (--trace-block-size)")
    elif header is not None and isinstance(header.get("block_size"), int):
        bs = int(header["block_size"])  # type: ignore[call-overload]
        notes.append(f"block size {bs} tokens per hash id (the recording's header)")
    elif not pairs:
        bs = None
    else:
        published = {"mooncake": MOONCAKE_BLOCK, "bailian": BAILIAN_BLOCK}.get(fmt)
        bs = inferred
        rule = "the first of 16..512 for which every line has ceil(input tokens / size) hash ids"
        if published is not None and inferred != published:
            notes.append(f"block size {inferred} tokens per hash id, inferred ({rule}); "
                         f"{fmt.capitalize()}'s published size is {published}: --trace-block-size to override")
        else:
            notes.append(f"block size {inferred} tokens per hash id (inferred: {rule})")
        if fmt == "mooncake" and inferred == BAILIAN_BLOCK:
            # Bailian's files without its extra keys: its block size names it.
            fmt, unit = "bailian", "s"
            notes[0] = "detected Bailian JSONL (no chat_id, but 16-token blocks)"
    if time_unit is not None:
        unit = time_unit
        notes.append(f"timestamps in {unit} (--trace-time-unit)")
    elif not fmt.startswith("vtui"):
        defined = "milliseconds since the first request" if unit == "ms" else "seconds"
        notes.append(f"timestamps in {unit} ({fmt.capitalize()}'s definition: {defined}; "
                     "--trace-time-unit to override)")
    scale = TIME_UNITS[unit]
    t0 = rows_raw[0][1]
    out: list[TraceRow] = []
    prev = t0
    roots: dict[str, str] = {}  # Bailian: chat_id -> its conversation's first chat_id
    for lineno, t, i, o, h, obj in rows_raw:
        if t < prev:
            raise TraceError(path, "timestamps must not decrease", lineno)
        prev = t
        session: str | None = None
        turn = 0
        if fmt == "bailian":
            # parent_chat_id names the turn before, not the first: follow the chain.
            chat, parent = str(obj.get("chat_id")), str(obj.get("parent_chat_id", -1))
            session = chat if parent in ("-1", "None") else roots.get(parent, parent)
            roots[chat] = session
            tv = obj.get("turn", 1)
            turn = int(tv) if isinstance(tv, int) and not isinstance(tv, bool) else 0
        elif fmt.startswith("vtui"):
            c = obj.get("conversation")
            session = str(c) if c is not None else None
            tv = obj.get("turn", 0)
            turn = int(tv) if isinstance(tv, int) and not isinstance(tv, bool) else 0
        ep = obj.get("endpoint")
        outcome = obj.get("outcome", "ok")
        ans = obj.get("answer_tokens")
        prompt = obj.get("prompt")
        out.append(TraceRow(line=lineno, at_s=(t - t0) * scale, input_len=i, output_len=o, hash_ids=h,
                            prompt=prompt if isinstance(prompt, str) and prompt else None,
                            session=session, turn=turn,
                            endpoint=ep if isinstance(ep, str) else None,
                            outcome=outcome if isinstance(outcome, str) else "ok",
                            answer_len=ans if isinstance(ans, int) and not isinstance(ans, bool) and ans >= 0
                            else None))
    return TraceFile(str(path), fmt, tuple(out), bs, unit, tuple(notes))


def conversation_chains(rows: tuple[TraceRow, ...] | list[TraceRow]) -> list[list[int]]:
    """The rows as chains of indexes: a conversation's turns, in order, each later one carrying
    the one before. A row continues its conversation (same ``session``) when it is the next turn
    (``turn`` one more than the chain's last, or every turn 0: file order) and its prompt can hold
    that turn's prompt and answer (``input_len`` above the two together): only then was the
    earlier answer part of it. A row with its own prompt text is replayed as it was, on its own.
    Every other row is a chain of its own. Chains come in the order of their first rows."""
    chains: list[list[int]] = []
    open_: dict[str, list[list[int]]] = {}  # session -> the chains whose last row may yet be continued
    for k, r in enumerate(rows):
        if r.session is not None and r.prompt is None:
            for c in open_.get(r.session, ()):
                last = rows[c[-1]]
                if (r.turn == last.turn + 1 or r.turn == last.turn == 0) and r.input_len > last.carried_len:
                    c.append(k)
                    break
            else:
                chains.append([k])
                open_.setdefault(r.session, []).append(chains[-1])
            continue
        chains.append([k])
    return chains


_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?$")


def _azure_time(path: Path, line: int, v: str) -> float:
    m = _AZURE_TS.match(v.strip())
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


def _read_csv(path: Path, text: str, time_unit: str | None, limit: int | None) -> TraceFile:
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise TraceError(path, "file is empty") from None
    low = [h.lower() for h in header]
    notes: list[str] = []
    if "contexttokens" in low and "generatedtokens" in low and "timestamp" in low:
        fmt = "azure"
        cols = (low.index("timestamp"), low.index("contexttokens"), low.index("generatedtokens"))
        notes.append("detected the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); "
                     "TIMESTAMP read as an absolute date and time (UTC unless it carries an offset)")
    elif "request tokens" in low and "response tokens" in low and "timestamp" in low:
        fmt = "burstgpt"
        cols = (low.index("timestamp"), low.index("request tokens"), low.index("response tokens"))
        unit = time_unit or "s"
        notes.append("detected BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,...); timestamps in "
                     + (f"{unit} (--trace-time-unit)" if time_unit else
                        "s (BurstGPT's definition: seconds from the first day's midnight; --trace-time-unit "
                        "to override)"))
    else:
        raise TraceError(path, "not a trace vtui knows: a CSV needs Azure's TIMESTAMP,ContextTokens,GeneratedTokens "
                         f"or BurstGPT's Timestamp,...,Request tokens,Response tokens; the header is {','.join(header)}",
                         1)
    session_col = low.index("session id") if "session id" in low else None
    rows: list[TraceRow] = []
    skipped = 0
    t0: float | None = None
    prev = -math.inf
    need = max(cols) + 1
    for rec in reader:
        lineno = reader.line_num
        if not rec or not any(c.strip() for c in rec):
            continue
        if limit is not None and len(rows) >= limit:
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
        if fmt == "azure":
            t = _azure_time(path, lineno, ts_s)
        else:
            try:
                t = float(ts_s) * TIME_UNITS[time_unit or "s"]
            except ValueError:
                raise TraceError(path, f"Timestamp must be a number, got {ts_s!r}", lineno) from None
            if not math.isfinite(t) or t < 0:
                raise TraceError(path, f"Timestamp must be a number >= 0, got {ts_s!r}", lineno)
        if t < prev:
            raise TraceError(path, "timestamps must not decrease", lineno)
        prev = t
        if i == 0 or o == 0:
            skipped += 1  # BurstGPT's failed requests (0 response tokens); an empty prompt cannot be sent
            continue
        if t0 is None:
            t0 = t
        sess = rec[session_col].strip() if session_col is not None and len(rec) > session_col else ""
        rows.append(TraceRow(line=lineno, at_s=t - t0, input_len=i, output_len=o, session=sess or None))
    if not rows:
        raise TraceError(path, "file has no requests" + (f" with tokens ({skipped} rows with 0)" if skipped else ""))
    if skipped:
        notes.append(f"{skipped} rows with 0 request or response tokens skipped (failed requests)")
    notes.append("no block hashes in this format: prompts share nothing")
    return TraceFile(str(path), fmt, tuple(rows), None, time_unit or "s", tuple(notes))


__all__ = ["FORMATS", "TIME_UNITS", "TraceError", "TraceFile", "TraceRow", "conversation_chains", "infer_block_size",
           "read_trace"]
