"""Turn a ``WorkloadSpec`` into ``PlannedRequest``s (prompts, lengths, trace times).

Everything random comes from the seed (lengths and dataset order from
``random.Random(spec.seed)``, synthetic prompts from a stream of their own), so a seed fixes
prompts and lengths. Dataset files are checked line by line; every problem names the file
and line. Built plans are kept in a small in-process cache, so a tune step or a repeated run
of the same workload with the same tokenizer does not build its prompts again.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path

from loadgen.datafile import DatasetError as DatasetError  # raised here, re-exported for its readers
from loadgen.datafile import read_text
from loadgen.records import PlannedRequest
from loadgen.spec import WorkloadSpec
from loadgen.tokens import Codec, codec_key, encode_many, make_prompts
from loadgen.traceformats import TraceError, TraceFile, TraceRow, conversation_chains, read_trace

# Distinct prompts built for a run; longer runs recycle them (index modulo pool size).
DEFAULT_POOL = 2000
# With only the server's /tokenize to build prompts (2-3 round trips each), fewer.
REMOTE_POOL = 256
# A trace run with no count nor duration: every row (a trace is read to this many rows).
ALL_ROWS = 10**9


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


def _jsonl(path: Path) -> list[tuple[int, dict[str, object]]]:
    rows: list[tuple[int, dict[str, object]]] = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
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


def _int_field(path: Path, lineno: int, obj: dict[str, object], *keys: str) -> int | None:
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
    text = read_text(path)
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
    # Conversations are tokenized a chunk at a time (one batch call each), in order, so the
    # result is the one-by-one result; a bad entry counts only once the rows before it did
    # not suffice, as when they were read one by one.
    chunk = 256
    for c0 in range(0, len(order), chunk):
        if need is not None and len(out) >= need:
            break
        pairs: list[tuple[str, str]] = []
        bad: DatasetError | None = None
        for k in order[c0 : c0 + chunk]:
            entry = data[k]
            conv = entry.get("conversations") if isinstance(entry, dict) else None
            if not isinstance(conv, list):
                bad = DatasetError(path, f"entry {k}: no 'conversations' list")
                break
            if len(conv) < 2:
                continue
            try:
                pairs.append((str(conv[0]["value"]), str(conv[1]["value"])))
            except (KeyError, TypeError):
                bad = DatasetError(path, f"entry {k}: turns need a 'value'")
                break
        ids = encode_many(codec, [t for pair in pairs for t in pair])
        for j, (prompt, _reply) in enumerate(pairs):
            if need is not None and len(out) >= need:
                break
            i = len(ids[2 * j]) + codec.special_offset
            o = len(ids[2 * j + 1])
            if i < spec.min_input_len or o < 4:
                continue
            if spec.max_input_len and i > spec.max_input_len:
                continue
            if spec.max_output_len and o > spec.max_output_len:
                continue
            if max_total and i + o > max_total:
                continue
            out.append((prompt, i, o))
        if bad is not None and (need is None or len(out) < need):
            raise bad
    if not out:
        raise DatasetError(path, "no conversation passes the length filters")
    return out


# Plans built before, newest last. A tune step or sweep point plans the same workload again,
# and 1,500 prompts of 1,024 tokens still cost about 4 s of CPU to build (2 encodes each);
# bounded by the prompt text held (1 to 4 bytes a character: 32 MB to 128 MB at most).
_CACHE_PLANS = 8
_CACHE_CHARS = 32_000_000
_cache: OrderedDict[Hashable, tuple[tuple[PlannedRequest, ...], int]] = OrderedDict()
_cache_lock = threading.Lock()


def clear_plan_cache() -> None:
    """Forget every built plan (tests; a tokenizer changed in place keeps its cache key)."""
    with _cache_lock:
        _cache.clear()


def _plan_key(spec: WorkloadSpec, codec: Codec | None, max_model_len: int | None,
              pool: int) -> Hashable | None:
    """What a plan depends on besides its length; None when it cannot be named (a codec
    without ``cache_key``, a dataset file that cannot be read)."""
    ck = codec_key(codec)
    if codec is not None and ck is None:
        return None
    stamp: tuple[str, int, int, int] | None = None
    if spec.kind in ("sharegpt", "jsonl", "trace"):
        try:
            path = Path(spec.dataset).expanduser().resolve()
            st = path.stat()
        except OSError:
            return None
        stamp = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    # Only ShareGPT's filter reads the server's max_model_len: other plans can be built (and
    # cached) before the server is up to say it.
    return (ck, spec, max_model_len if spec.kind == "sharegpt" else None, pool, stamp)


def _chars(plan: tuple[PlannedRequest, ...]) -> int:
    seen: dict[int, int] = {}  # recycled requests share their strings: count each once
    for p in plan:
        for t in (p.prompt, *(m[1] for m in p.messages), *p.next_turns):
            seen[id(t)] = len(t)
    return sum(seen.values())


def build_requests(spec: WorkloadSpec, codec: Codec | None, n: int,
                   max_model_len: int | None = None, pool: int = DEFAULT_POOL
                   ) -> list[PlannedRequest]:
    """``n`` planned requests (for ``chat``, ``n`` sessions). Random prompts need ``codec``;
    at most ``spec.num_prompts or pool`` distinct prompts are built, then recycled.

    The first ``n`` requests of a plan do not depend on how many were asked for, so a plan
    built before, for as many or more requests with the same spec and tokenizer, is reused
    (its first ``n``)."""
    # A seed drawn for one run (every run without a seed of its own) is never asked for again.
    key = None if spec.seed_drawn else _plan_key(spec, codec, max_model_len, pool)
    if key is not None:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None and len(hit[0]) >= n:
                _cache.move_to_end(key)
                return list(hit[0][:n])
    plan = tuple(_build(spec, codec, n, max_model_len, pool))
    if key is not None:
        size = _chars(plan)
        with _cache_lock:
            old = _cache.get(key)
            if size <= _CACHE_CHARS and (old is None or len(old[0]) < len(plan)):
                _cache[key] = (plan, size)
                _cache.move_to_end(key)
                while len(_cache) > _CACHE_PLANS or sum(v[1] for v in _cache.values()) > _CACHE_CHARS:
                    _cache.popitem(last=False)
    return list(plan)


def _build(spec: WorkloadSpec, codec: Codec | None, n: int, max_model_len: int | None,
           pool: int) -> list[PlannedRequest]:
    seed = 0 if spec.seed is None else spec.seed  # a run has its own (LoadRun: with_run_seed)
    rng = random.Random(seed)
    # Synthetic prompts draw from a stream of their own, so a request's prompt does not depend
    # on how many lengths were drawn before it (a shorter plan is the start of a longer one).
    prompt_rng = random.Random(f"vtui-prompts/{seed}")
    pool_n = min(n, spec.num_prompts or pool)
    if spec.kind in ("random", "chat"):
        if codec is None:
            raise ValueError("synthetic prompts need the model's tokenizer")
        prefixes = ([t for t, _ in make_prompts(codec, prompt_rng, [spec.prefix_len] * spec.num_prefixes)]
                    if spec.prefix_len else [""] * spec.num_prefixes)
        lens = sample_lengths(spec, rng, n)
        off = codec.special_offset
        made: list[PlannedRequest] = []
        if spec.kind == "chat":
            turns_n = spec.num_turns
            built = make_prompts(codec, prompt_rng, [lens[k][0] for k in range(pool_n) for _ in range(turns_n)])
            for k in range(pool_n):
                turns = [t for t, _ in built[k * turns_n : (k + 1) * turns_n]]
                turns[0] = prefixes[k % len(prefixes)] + turns[0]
                made.append(PlannedRequest(index=k, input_len=0, output_len=lens[k][1],
                                           messages=(("user", turns[0]),), session=k,
                                           next_turns=tuple(turns[1:])))
        else:
            heads = [prefixes[k % len(prefixes)] for k in range(pool_n)]
            built = make_prompts(codec, prompt_rng, [lens[k][0] - off for k in range(pool_n)], heads)
            for k, (text, got) in enumerate(built):
                made.append(PlannedRequest(index=k, input_len=got + off, output_len=lens[k][1],
                                           prompt=text))
        for k in range(pool_n, n):
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
    if spec.kind == "trace":
        return _build_trace(spec, codec, n, seed)
    path = Path(spec.dataset).expanduser()
    rows2 = _jsonl(path)
    if not rows2:
        raise DatasetError(path, "file has no records")
    if spec.kind == "jsonl":
        used = rows2[: min(n, len(rows2))]
        prompts: list[str] = []
        outs: list[int] = []
        for lineno, obj in used:
            prompt = obj.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise DatasetError(path, "needs a non-empty string 'prompt'", lineno)
            prompts.append(prompt)
            outs.append(_int_field(path, lineno, obj, "output_len", "max_tokens") or spec.output_len)
        ins = ([len(ids) + codec.special_offset for ids in encode_many(codec, prompts)]
               if codec else [0] * len(prompts))
        return [PlannedRequest(index=k, prompt=prompts[k % len(used)], input_len=ins[k % len(used)],
                               output_len=outs[k % len(used)]) for k in range(n)]
    raise AssertionError(f"unplanned kind {spec.kind}")  # trace is built above


def has_sessions(spec: WorkloadSpec, turns: tuple[int, float] | None = None) -> bool:
    """Whether ``spec``'s requests include multi-turn sessions (a later turn is sent when the answer
    before it ends, not on its own arrival), which loadgen.worker numbers by arrival and turn: ``chat``
    of several turns or on the chat endpoint, or a trace whose rows chain into conversations
    (``conversation_chains``). ``turns``: its :func:`session_turns`, where already read. A trace that
    cannot be read raises DatasetError."""
    most = (turns or session_turns(spec))[0]
    return most > 1 or (spec.kind == "chat" and spec.endpoint == "chat")


def session_turns(spec: WorkloadSpec) -> tuple[int, float]:
    """The most and the mean requests one arrival sends (1, 1.0 without sessions): a chat session's
    turns, a trace's conversations' (one read of the trace; a bad one raises DatasetError). What n
    arrivals can send is at most n times the first."""
    if spec.kind == "chat":
        return max(1, spec.num_turns), float(max(1, spec.num_turns))
    if spec.kind != "trace":
        return 1, 1.0
    chains = conversation_chains(read_spec_trace(spec).rows)
    if not chains:
        return 1, 1.0
    return max(len(c) for c in chains), sum(len(c) for c in chains) / len(chains)


def read_spec_trace(spec: WorkloadSpec, limit: int | None = None) -> TraceFile:
    """The trace file ``spec`` names, read with its overrides (``trace_block_size``,
    ``trace_time_unit``); a bad file raises DatasetError naming the file and line.
    ``TraceFile.describe()`` says which format it is and what was assumed."""
    try:
        return read_trace(spec.dataset, block_size=spec.trace_block_size or None,
                          time_unit=spec.trace_time_unit or None, limit=limit)
    except TraceError as exc:
        raise DatasetError(exc.path, exc.reason, exc.line) from None


# Words that are one token in most BPE and SentencePiece vocabularies (with their leading
# space), and single characters for byte-level tokenizers: trace prompts are built of such
# units, so a block of B hash-id tokens is exactly B units, and blocks concatenate exactly.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world still own "
    "see men work long here get both between life being under never day same another know while last might "
    "us great old year off come since against go came right used take three").split()
_UNIT_SETS = ([" " + w for w in _WORDS], list("abcdefghijklmnopqrstuvwxyz0123456789"))
_units_cache: dict[Hashable, list[str] | None] = {}


def _units(codec: Codec) -> list[str] | None:
    """Texts of one token each whose concatenations tokenize as the sum of their parts (checked on
    a random run of 256), or None when neither set works for this tokenizer."""
    key = codec_key(codec)
    if key is not None and key in _units_cache:
        return _units_cache[key]
    found: list[str] | None = None
    for cands in _UNIT_SETS:
        one = [u for u, ids in zip(cands, encode_many(codec, cands), strict=True) if len(ids) == 1]
        if len(one) < 16:
            continue
        rng = random.Random(7)
        runs = ["".join(rng.choice(one) for _ in range(256)) for _ in range(2)]
        if all(len(ids) == 256 for ids in encode_many(codec, runs)):
            found = one
            break
    if key is not None:
        _units_cache[key] = found
    return found


def _build_trace(spec: WorkloadSpec, codec: Codec | None, n: int, seed: int) -> list[PlannedRequest]:
    """A trace's rows as planned requests at their (scaled) times. A row's prompt is its own
    where the trace has one; else built of token blocks, one per hash id, the same ids giving
    the same blocks (so the server's prefix cache sees the trace's reuse); rows without ids get
    prompts of their own. A conversation's later turns (``conversation_chains``) ride on its
    first as one session: each carries the replayed earlier prompts and the server's answers
    to them, then tokens of its own (its recorded length less the earlier prompt and answer),
    and is sent at its recorded time or when the answer before it ends, whichever is later."""
    tf = read_spec_trace(spec, limit=n)
    rows = tf.rows[:n]
    if codec is None:
        if any(r.prompt is None for r in rows):
            raise ValueError("trace lines without a prompt need the model's tokenizer")
        return [PlannedRequest(index=k, prompt=r.prompt or "", input_len=r.input_len, output_len=r.output_len,
                               at_s=r.at_s * spec.time_scale) for k, r in enumerate(rows)]
    chains = conversation_chains(rows)
    off = codec.special_offset
    texts: dict[int, tuple[str, int]] = {}
    given = [k for k, r in enumerate(rows) if r.prompt]
    for k, ids in zip(given, encode_many(codec, [rows[k].prompt or "" for k in given]), strict=True):
        texts[k] = (rows[k].prompt or "", len(ids) + off)
    prompt_rng = random.Random(f"vtui-trace-prompts/{seed}")
    firsts = [c[0] for c in chains]
    hashed = [k for k in firsts if k not in texts and rows[k].hash_ids and tf.block_size]
    if hashed:
        assert tf.block_size is not None
        texts.update(_block_prompts(codec, [(k, rows[k]) for k in hashed], tf.block_size, seed))
    plain = [k for k in firsts if k not in texts]
    made = make_prompts(codec, prompt_rng, [rows[k].input_len - off for k in plain])
    for k, (text, got) in zip(plain, made, strict=True):
        texts[k] = (text, got + off)
    # A later turn's own tokens: what its prompt holds past the turn before and its answer.
    later = [(a, b) for c in chains for a, b in itertools.pairwise(c)]
    turn_rng = random.Random(f"vtui-trace-turns/{seed}")
    tails = make_prompts(codec, turn_rng, [rows[b].input_len - rows[a].carried_len for a, b in later])
    tail = {b: text for (_, b), (text, _) in zip(later, tails, strict=True)}
    out: list[PlannedRequest] = []
    for c in chains:
        k, r = c[0], rows[c[0]]
        out.append(PlannedRequest(
            index=len(out), prompt=texts[k][0], input_len=texts[k][1], output_len=r.output_len,
            at_s=r.at_s * spec.time_scale, session=len(out) if len(c) > 1 else -1,
            next_turns=tuple(tail[b] for b in c[1:]),
            turn_plan=tuple((rows[b].at_s * spec.time_scale, rows[b].output_len) for b in c[1:])))
    return out


def _block_prompts(codec: Codec, rows: list[tuple[int, TraceRow]], bs: int, seed: int
                   ) -> dict[int, tuple[str, int]]:
    """Prompts of ``bs``-token blocks, one per hash id (the last one cut to the row's length;
    tokens past the ids' blocks are the row's own)."""
    off = codec.special_offset
    units = _units(codec)
    out: dict[int, tuple[str, int]] = {}
    if units is not None:
        blocks: dict[int | str, list[str]] = {}
        for k, r in rows:
            need = max(1, r.input_len - off)
            parts: list[str] = []
            left = need
            for h in r.hash_ids:
                if left <= 0:
                    break
                b = blocks.get(h)
                if b is None:
                    rng = random.Random(f"vtui-block/{seed}/{h!r}")
                    b = blocks[h] = [rng.choice(units) for _ in range(bs)]
                take = min(bs, left)
                parts.append("".join(b[:take]))
                left -= take
            if left > 0:  # past the ids' blocks (a row longer than its ids say): its own tokens
                rng = random.Random(f"vtui-tail/{seed}/{k}")
                parts.append("".join(rng.choice(units) for _ in range(left)))
            out[k] = ("".join(parts), need + off)
        return out
    # No clean units for this tokenizer: one exact prompt a block, joined (a join may merge two
    # tokens at a boundary; every block after the first shared one is still shared).
    rng = random.Random(f"vtui-blocks/{seed}")
    distinct = list(dict.fromkeys(h for _, r in rows for h in r.hash_ids))
    made = dict(zip(distinct, make_prompts(codec, rng, [bs] * len(distinct)), strict=True))
    for k, r in rows:
        n_ids = min(len(r.hash_ids), max(1, math.ceil((r.input_len - off) / bs)))
        text = "".join(made[h][0] for h in r.hash_ids[:n_ids])
        got = sum(made[h][1] for h in r.hash_ids[:n_ids])
        out[k] = (text, got + off)
    return out
