"""Turn a ``WorkloadSpec`` into ``PlannedRequest``s (prompts, lengths, trace times).

Everything random comes from ``random.Random(spec.seed)``, so a seed fixes prompts and
lengths. Dataset files are checked line by line; every problem names the file and line.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from loadgen.records import PlannedRequest
from loadgen.spec import WorkloadSpec
from loadgen.tokens import Codec, make_prompt

# Distinct prompts built for a run; longer runs recycle them (index modulo pool size).
DEFAULT_POOL = 2000
# With only the server's /tokenize to build prompts (2-3 round trips each), fewer.
REMOTE_POOL = 256


class DatasetError(ValueError):
    """A bad dataset file: names the file and, when it applies, the line."""

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path = str(path)
        self.line = line
        self.reason = reason


def sample_lengths(spec: WorkloadSpec, rng: random.Random, n: int) -> list[tuple[int, int]]:
    """(input_len, output_len) pairs per ``spec.length_dist``.

    uniform: integers in [floor(L*(1-r)), ceil(L*(1+r))] like vLLM's --random-range-ratio;
    normal: round(gauss(L, std)) clipped to [min_len, max_len or inf].
    """
    out: list[tuple[int, int]] = []
    for _ in range(n):
        if spec.length_dist == "uniform":
            r = spec.range_ratio
            i = rng.randint(math.floor(spec.input_len * (1 - r)), math.ceil(spec.input_len * (1 + r)))
            o = rng.randint(math.floor(spec.output_len * (1 - r)),
                            math.ceil(spec.output_len * (1 + r)))
        elif spec.length_dist == "normal":
            hi = spec.max_len or 1 << 30
            i = min(hi, max(spec.min_len, round(rng.gauss(spec.input_len, spec.input_std))))
            o = min(hi, max(spec.min_len, round(rng.gauss(spec.output_len, spec.output_std))))
        else:
            i, o = spec.input_len, spec.output_len
        out.append((max(1, i), max(1, o)))
    return out


def _read_text(path: Path) -> str:
    if not path.exists():
        raise DatasetError(path, "no such file")
    if not path.is_file():
        raise DatasetError(path, "not a file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(path, f"not UTF-8 text (byte {exc.start})", line) from None
    if not text.strip():
        raise DatasetError(path, "file is empty")
    return text


def _jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, f"malformed JSON: {exc.msg} (column {exc.colno})",
                               lineno) from None
        if not isinstance(obj, dict):
            raise DatasetError(path, f"expected a JSON object, got {type(obj).__name__}", lineno)
        rows.append((lineno, obj))
    return rows


def _int_field(path: Path, lineno: int, obj: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        if k in obj:
            v = obj[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DatasetError(path, f"{k!r} must be a positive integer, got {v!r}", lineno)
            return v
    return None


def load_sharegpt(spec: WorkloadSpec, codec: Codec, max_total: int | None = None,
                  need: int | None = None, rng: random.Random | None = None
                  ) -> list[tuple[str, int, int]]:
    """(prompt, input_len, output_len) of usable conversations, filtered like vLLM
    (input >= min_input_len, output >= 4, lengths within the max filters). With ``need``,
    conversations are visited in ``rng``-shuffled order and tokenizing stops once ``need``
    are found (ShareGPT_V3 has ~90k; a remote tokenizer would take minutes for all)."""
    path = Path(spec.dataset).expanduser()
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(path, f"malformed JSON: {exc.msg} (column {exc.colno})",
                           exc.lineno) from None
    if not isinstance(data, list):
        raise DatasetError(path, "expected a JSON list of conversations")
    order = list(range(len(data)))
    if rng is not None:
        rng.shuffle(order)
    out: list[tuple[str, int, int]] = []
    for k in order:
        if need is not None and len(out) >= need:
            break
        entry = data[k]
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise DatasetError(path, f"entry {k}: no 'conversations' list")
        if len(conv) < 2:
            continue
        try:
            prompt, reply = str(conv[0]["value"]), str(conv[1]["value"])
        except (KeyError, TypeError):
            raise DatasetError(path, f"entry {k}: turns need a 'value'") from None
        i = len(codec.encode(prompt)) + codec.special_offset
        o = len(codec.encode(reply))
        if i < spec.min_input_len or o < 4:
            continue
        if spec.max_input_len and i > spec.max_input_len:
            continue
        if spec.max_output_len and o > spec.max_output_len:
            continue
        if max_total and i + o > max_total:
            continue
        out.append((prompt, i, o))
    if not out:
        raise DatasetError(path, "no conversation passes the length filters")
    return out


def build_requests(spec: WorkloadSpec, codec: Codec | None, n: int,
                   max_model_len: int | None = None, pool: int = DEFAULT_POOL
                   ) -> list[PlannedRequest]:
    """``n`` planned requests (for ``chat``, ``n`` sessions). Random prompts need ``codec``;
    at most ``spec.num_prompts or pool`` distinct prompts are built, then recycled."""
    rng = random.Random(spec.seed)
    pool_n = min(n, spec.num_prompts or pool)
    if spec.kind in ("random", "chat"):
        if codec is None:
            raise ValueError("synthetic prompts need the model's tokenizer")
        prefixes = [make_prompt(codec, rng, spec.prefix_len)[0] if spec.prefix_len else ""
                    for _ in range(spec.num_prefixes)]
        lens = sample_lengths(spec, rng, n)
        off = codec.special_offset
        made: list[PlannedRequest] = []
        for k in range(n):
            i_len, o_len = lens[k]
            if k < pool_n:
                head = prefixes[k % len(prefixes)]
                if spec.kind == "chat":
                    turns = [make_prompt(codec, rng, i_len)[0] for _ in range(spec.num_turns)]
                    turns[0] = head + turns[0]
                    made.append(PlannedRequest(
                        index=k, input_len=0, output_len=o_len,
                        messages=(("user", turns[0]),), session=k,
                        next_turns=tuple(turns[1:])))
                    continue
                text, got = make_prompt(codec, rng, i_len - off, head)
                made.append(PlannedRequest(index=k, input_len=got + off, output_len=o_len,
                                           prompt=text))
            else:
                src = made[k % pool_n]
                made.append(PlannedRequest(
                    index=k, input_len=src.input_len, output_len=src.output_len,
                    prompt=src.prompt, messages=src.messages,
                    session=k if spec.kind == "chat" else -1, next_turns=src.next_turns))
        return made
    if spec.kind == "sharegpt":
        if codec is None:
            raise ValueError("ShareGPT lengths need the model's tokenizer")
        rows = load_sharegpt(spec, codec, max_model_len, need=n, rng=rng)
        return [PlannedRequest(index=k, prompt=rows[k % len(rows)][0],
                               input_len=rows[k % len(rows)][1],
                               output_len=rows[k % len(rows)][2]) for k in range(n)]
    path = Path(spec.dataset).expanduser()
    rows2 = _jsonl(path)
    if not rows2:
        raise DatasetError(path, "file has no records")
    if spec.kind == "jsonl":
        plan: list[PlannedRequest] = []
        for k in range(n):
            lineno, obj = rows2[k % len(rows2)]
            prompt = obj.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise DatasetError(path, "needs a non-empty string 'prompt'", lineno)
            o = _int_field(path, lineno, obj, "output_len", "max_tokens") or spec.output_len
            i = (len(codec.encode(prompt)) + codec.special_offset) if codec else 0
            plan.append(PlannedRequest(index=k, prompt=prompt, input_len=i, output_len=o))
        return plan
    # trace: arrival time, lengths, optional prompt; replayed at time_scale.
    first: float | None = None
    plan = []
    for k, (lineno, obj) in enumerate(rows2):
        if k >= n:
            break
        ts = obj.get("timestamp", obj.get("t"))
        if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
            raise DatasetError(path, f"'timestamp' must be a number >= 0 s, got {ts!r}", lineno)
        if first is None:
            first = float(ts)
        if ts < first:
            raise DatasetError(path, "timestamps must not decrease", lineno)
        out_len = _int_field(path, lineno, obj, "output_len")
        if out_len is None:
            raise DatasetError(path, "missing 'output_len'", lineno)
        o = out_len
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise DatasetError(path, "'prompt' must be a string", lineno)
        in_len = _int_field(path, lineno, obj, "input_len")
        if prompt:
            i = (len(codec.encode(prompt)) + codec.special_offset) if codec else (in_len or 0)
        else:
            if in_len is None:
                raise DatasetError(path, "needs 'input_len' or 'prompt'", lineno)
            if codec is None:
                raise ValueError("trace lines without a prompt need the model's tokenizer")
            prompt, got = make_prompt(codec, rng, in_len - codec.special_offset)
            i = got + codec.special_offset
        plan.append(PlannedRequest(index=k, prompt=prompt, input_len=i, output_len=o,
                                   at_s=(float(ts) - first) * spec.time_scale))
    return plan
