"""The served model's tokenizer, so synthetic prompts have exact token lengths.

``LocalTokenizer`` runs a model folder's tokenizer, as transformers' AutoTokenizer builds it
(what vLLM loads), with the ``tokenizers`` package alone: transformers builds it once in a
child process, so neither it nor torch is imported by the process that builds prompts.
``RemoteTokenizer`` asks the server itself (vLLM's ``POST /tokenize`` and
``/detokenize``) when only a URL is known. ``make_prompts`` builds texts whose encodings
have exactly the asked numbers of tokens, the way vLLM's random dataset does: random ids,
decode, re-encode, cut the re-encoded ids at the target, decode, check; all prompts of a
workload go through each step together (``encode_many``/``decode_many``), so a local
tokenizer encodes them on all cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import string
import subprocess
import sys
import threading
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

if TYPE_CHECKING:
    import tokenizers
    from transformers import PreTrainedTokenizerBase

# The tokenizers package spreads a batch over a thread pool of its own (rayon) unless told not to,
# and each of its threads keeps a C heap that grows with what it tokenized: building 2,000 prompts
# three times held 10 MB more of live heap (RSS 64 -> 74 MB, against 47 MB flat without the pool),
# and the pool saved 0.13 s of 2 s on 1,500 prompts of 1,024 tokens on 2 cores. A value
# the user set stands.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TokenizerError(RuntimeError):
    """No tokenizer could be loaded or reached; the message says where it looked."""


class Codec(Protocol):
    """What prompt building needs from a tokenizer.

    Optional, found with ``getattr``: ``encode_batch(texts)``/``decode_batch(ids)`` (many
    items per call; ``encode_many``/``decode_many`` fall back to one call per item) and
    ``cache_key`` (a hashable name of the exact tokenizer, so built prompts can be reused
    by later runs; without it nothing is cached)."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def pool(self) -> list[int]: ...
    @property
    def special_offset(self) -> int: ...


def encode_many(codec: Codec, texts: Sequence[str]) -> list[list[int]]:
    """``codec.encode`` of each text, in one ``encode_batch`` call where the codec has one."""
    batch = getattr(codec, "encode_batch", None)
    if batch is not None and len(texts) > 1:
        out: list[list[int]] = batch(list(texts))
        return out
    return [codec.encode(t) for t in texts]


def decode_many(codec: Codec, seqs: Sequence[list[int]]) -> list[str]:
    """``codec.decode`` of each id list, in one ``decode_batch`` call where the codec has one."""
    batch = getattr(codec, "decode_batch", None)
    if batch is not None and len(seqs) > 1:
        out: list[str] = batch(list(seqs))
        return out
    return [codec.decode(ids) for ids in seqs]


def codec_key(codec: Codec | None) -> Hashable | None:
    """The codec's ``cache_key``, or None when it has none (then nothing is cached)."""
    key: Hashable | None = getattr(codec, "cache_key", None)
    return key


def _file_stamps(p: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, mtime and size of a tokenizer file, or of a model folder's small files (the
    tokenizer's: tokenizer.json, vocab, merges, configs; weights are skipped)."""
    files = [p] if p.is_file() else sorted(p.iterdir()) if p.is_dir() else []
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        if f.is_file() and st.st_size < 64 << 20:
            out.append((f.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


# Checks that the Rust tokenizer's ids are transformers' ids (with decoded runs of ids).
_PROBE = "Hello, world!  It's 2026:\n\tnaïve café, 東京, emoji 🚀 and    spaces."


def _load_file(file: Path) -> tokenizers.Tokenizer:
    import tokenizers

    try:
        tok = tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers error types are not exported
        raise TokenizerError(f"{file}: cannot load tokenizer: {exc}") from None
    # transformers' encode neither truncates nor pads unless asked; a tokenizer.json may.
    tok.no_truncation()
    tok.no_padding()
    return tok


@dataclass(frozen=True)
class _Exported:
    """The Rust tokenizer transformers built for a folder, as JSON, and what the pool needs."""

    tokenizer: str
    vocab_size: int
    special_ids: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps({"tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                           "special_ids": list(self.special_ids)})

    @classmethod
    def from_json(cls, text: str) -> _Exported | str:
        """The export in ``text``, or the child's reason (``unfit``) as a string."""
        reply = json.loads(text)
        if not isinstance(reply, Mapping):
            raise ValueError("not a JSON object")
        if "unfit" in reply:
            return str(reply["unfit"])
        ids = reply["special_ids"]
        if not isinstance(ids, list):
            raise ValueError("special_ids is not a list")
        return cls(str(reply["tokenizer"]), int(reply["vocab_size"]), tuple(int(i) for i in ids))


# Exports by folder and its files' stamps, for this process; on disk by the hash of the
# folder's tokenizer files and the transformers version, so a later vtui starts its first
# run without the child (4 s of CPU to import transformers and torch).
_exports: dict[Hashable, _Exported | str] = {}
_EXPORT_TIMEOUT_S = 600.0


def _export_cache_dir() -> Path:
    """Where exports are kept: under ``$VTUI_HOME`` when set (engine/paths' rule, which
    loadgen cannot import), else the user's cache folder. Entries are named by content, so
    one never stands for another tokenizer."""
    home = os.environ.get("VTUI_HOME")
    if home:
        return Path(home).expanduser() / "cache" / "tokenizers"
    import platformdirs

    return Path(platformdirs.user_cache_dir("vtui")) / "tokenizers"


def _content_key(folder: Path) -> str | None:
    """sha256 of the folder's small files (tokenizer, configs, vocabularies; not weights)
    and the installed transformers' version; None without transformers."""
    from importlib import metadata

    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None
    h = hashlib.sha256(f"recipe 1\0transformers {version}\0".encode())
    for name, _mtime, _size in _file_stamps(folder):
        try:
            data = (folder / name).read_bytes()
        except OSError:
            continue
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _export(folder: Path) -> _Exported | str:
    """``folder``'s tokenizer as transformers' AutoTokenizer builds it (what vLLM loads),
    made in a child process that checks its Rust tokenizer gives AutoTokenizer's own ids
    and texts; a string saying why not otherwise. transformers (and the torch it imports)
    never enters this process."""
    key = (str(folder.resolve()), _file_stamps(folder))
    got = _exports.get(key)
    if got is not None:
        return got
    content = _content_key(folder)
    if content is None:
        return "transformers is not installed"
    cached = _export_cache_dir() / f"{content}.json"
    try:
        got = _Exported.from_json(cached.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        got = _export_in_child(folder)
        if isinstance(got, _Exported) or not got.startswith("child: "):
            with contextlib.suppress(OSError):
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
                tmp.write_text(got.to_json() if isinstance(got, _Exported) else json.dumps({"unfit": got}))
                os.replace(tmp, cached)
    if len(_exports) >= 8:
        _exports.pop(next(iter(_exports)))
    _exports[key] = got
    return got


def _export_in_child(folder: Path) -> _Exported | str:
    """Run ``_export_main`` for ``folder`` in a new Python; why it failed starts "child: "."""
    root = str(Path(__file__).resolve().parents[1])
    # torch marked missing: transformers then loads only its tokenizer code (1.1 s of CPU, not
    # 3.5 s); a tokenizer's pipeline does not depend on it (tests/loadgen/test_tokens_local.py compares
    # with AutoTokenizer loaded beside torch).
    code = ("import sys; sys.modules['torch'] = None; "
            f"sys.path.insert(0, {root!r}); from loadgen.tokens import _export_main; _export_main()")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                              timeout=_EXPORT_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"child: {exc}"
    lines = proc.stdout.strip().splitlines()
    try:
        return _Exported.from_json(lines[-1])
    except (IndexError, ValueError, KeyError, TypeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return f"child: {tail[0][:300]}"


def _export_main() -> None:
    """The child of ``_export``: prints one JSON line, the tokenizer or why it is unfit."""
    folder = sys.argv[1]
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:
        print(json.dumps({"unfit": f"transformers cannot load it: {exc}"}))
        return
    rust = getattr(hf, "backend_tokenizer", None) if getattr(hf, "is_fast", False) else None
    if rust is None:
        print(json.dumps({"unfit": "no Rust tokenizer (a slow tokenizer class)"}))
        return
    rust.no_truncation()
    rust.no_padding()
    # Texts as prompt building makes them: the probe and decoded runs of ids from across the
    # vocabulary (consecutive, as make_prompts draws them, and scattered).
    size = int(hf.vocab_size)
    special = set(hf.all_special_ids)
    pool = [i for i in range(size) if i not in special] or list(range(size))
    rng = random.Random(0)
    seqs = [pool[s : s + 48] for s in range(0, len(pool), max(1, len(pool) // 24))]
    seqs += [rng.choices(pool, k=48) for _ in range(24)] + [[*pool[:8], *sorted(special)[:4], *pool[8:16]]]
    for ids in seqs:
        if rust.decode(ids, skip_special_tokens=True) != hf.decode(ids, skip_special_tokens=True):
            print(json.dumps({"unfit": "its Rust tokenizer decodes otherwise than transformers"}))
            return
    for text in [_PROBE, *(hf.decode(ids, skip_special_tokens=True) for ids in seqs)]:
        for add in (False, True):
            if list(rust.encode(text, add_special_tokens=add).ids) != list(hf.encode(text, add_special_tokens=add)):
                print(json.dumps({"unfit": "its Rust tokenizer encodes otherwise than transformers"}))
                return
    print(_Exported(rust.to_str(), size, tuple(sorted(special))).to_json())


class LocalTokenizer:
    """A tokenizer from a local model folder (or a tokenizer.json path), with the ids vLLM's
    tokenizer (transformers' AutoTokenizer) gives, run by the ``tokenizers`` package alone:
    transformers and the torch it imports (400 MB resident) stay out of this process, the
    TUI's.

    A folder's tokenizer.json alone is not enough: AutoTokenizer picks its class by the
    model's type as well (the tiny model's "PreTrainedTokenizerFast" loads as Qwen2Tokenizer),
    and in transformers 5 such a class rebuilds its normalizer and pre-tokenizer in code, so
    the file's own pipeline can count otherwise than the server. So a folder is loaded by
    AutoTokenizer once in a child process, which checks that its Rust tokenizer gives
    AutoTokenizer's ids and texts and hands it back as JSON (kept on disk by content, so only
    the first use of a tokenizer pays the child). Only where that check fails (a slow
    tokenizer, a rule in Python) is AutoTokenizer loaded in this process, the one fallback
    that imports transformers here; where transformers is missing, tokenizer.json is read
    as it is, as is a tokenizer.json path. ``source`` says which it was."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path).expanduser()
        self._hf: PreTrainedTokenizerBase | None = None
        self._tok: tokenizers.Tokenizer | None = None
        self._special: set[int] | None = None
        self._vocab_size = 0
        if p.is_file():
            self._tok = _load_file(p)
            self.source = "tokenizer.json"
        elif p.is_dir():
            self._load_folder(p)
        else:
            raise TokenizerError(f"{p}: no tokenizer found (no such file or folder)")
        self._pool: list[int] | None = None
        self._offset = len(self._encode("hello", True)) - len(self._encode("hello", False))
        self._key = ("local", str(p.resolve()), _file_stamps(p))

    def _load_folder(self, p: Path) -> None:
        import tokenizers

        got = _export(p)
        if isinstance(got, _Exported):
            self._tok = tokenizers.Tokenizer.from_str(got.tokenizer)
            self._special, self._vocab_size = set(got.special_ids), got.vocab_size
            self.source = "transformers' tokenizer, exported"
            return
        try:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(p))
            self.source = f"transformers, in this process ({got})"
            return
        except Exception as exc:  # missing package, odd folder: try tokenizer.json
            hf_error: Exception = exc
        if not (p / "tokenizer.json").is_file():
            raise TokenizerError(f"{p}: no tokenizer found (transformers: {hf_error})")
        self._tok = _load_file(p / "tokenizer.json")
        self.source = f"tokenizer.json (transformers: {hf_error})"

    def _encode(self, text: str, special: bool) -> list[int]:
        if self._tok is not None:
            return list(self._tok.encode(text, add_special_tokens=special).ids)
        assert self._hf is not None  # one of the two is loaded
        return list(self._hf.encode(text, add_special_tokens=special))

    def encode(self, text: str) -> list[int]:
        """Token ids without special tokens."""
        return self._encode(text, False)

    def decode(self, ids: list[int]) -> str:
        if self._tok is not None:
            return str(self._tok.decode(ids, skip_special_tokens=True))
        assert self._hf is not None
        return str(self._hf.decode(ids, skip_special_tokens=True))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of many texts in one call (parallel in the Rust tokenizer)."""
        if self._tok is None:
            return [self.encode(t) for t in texts]
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets we do not use.
        fn = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        return [e.ids for e in fn(texts, add_special_tokens=False)]  # .ids makes a new list

    def decode_batch(self, seqs: list[list[int]]) -> list[str]:
        """``decode`` of many id lists in one call."""
        if self._tok is None:
            return [self.decode(ids) for ids in seqs]
        out: list[str] = self._tok.decode_batch(seqs, skip_special_tokens=True)
        return out

    @property
    def cache_key(self) -> Hashable:
        """The folder (or file) and its files' stamps: a changed tokenizer is a new key."""
        return self._key

    @property
    def special_offset(self) -> int:
        """Tokens the server adds to a completions prompt (a BOS, for Llama-style models)."""
        return self._offset

    def pool(self) -> list[int]:
        """Ids that random prompts draw from: the vocabulary less special/added tokens."""
        if self._pool is None:
            if self._special is not None:  # exported: transformers' own figures
                special, size = self._special, self._vocab_size
            elif self._tok is not None:
                special = set(self._tok.get_added_tokens_decoder())
                size = self._tok.get_vocab_size(with_added_tokens=False)
            else:
                assert self._hf is not None
                special = set(self._hf.all_special_ids)
                size = int(self._hf.vocab_size)
            self._pool = [i for i in range(size) if i not in special]
        return self._pool


_SHARED: dict[tuple[str, tuple[tuple[str, int, int], ...]], LocalTokenizer] = {}
_SHARED_LOCK = threading.Lock()
_SHARED_MAX = 4


def shared_local_tokenizer(path: str | Path) -> LocalTokenizer:
    """One ``LocalTokenizer`` per tokenizer (its path and its files' names, mtimes and sizes) for
    the whole process: a session's runs reuse it instead of building it again each run (each
    build left ~7 MB resident behind in the TUI process). Thread-safe; the newest few
    are kept."""
    p = Path(path).expanduser().resolve()
    key = (str(p), _file_stamps(p))
    with _SHARED_LOCK:
        found = _SHARED.get(key)
    if found is not None:
        return found
    made = LocalTokenizer(p)
    with _SHARED_LOCK:
        _SHARED.setdefault(key, made)
        while len(_SHARED) > _SHARED_MAX:
            del _SHARED[next(iter(_SHARED))]
        return _SHARED[key]


class RemoteTokenizer:
    """vLLM's /tokenize and /detokenize endpoints (synchronous; used before a run)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                    timeout=timeout)
        self._model = model
        self._pool: list[int] | None = None
        self.max_model_len: int | None = None
        self._offset = len(self._tokenize("hello", True)) - len(self._tokenize("hello", False))
        # The server names its model, not its tokenizer: the probe's ids tell two apart.
        self._key = ("remote", str(self._client.base_url), model, self._offset,
                     tuple(self._tokenize(_PROBE, False)))

    def _post(self, path: str, body: dict[str, object], want: str) -> tuple[Mapping[str, object], object]:
        """The server's JSON reply and its ``want`` field; TokenizerError naming the endpoint
        when the reply is not JSON or lacks the field."""
        try:
            r = self._client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise TokenizerError(f"{self._client.base_url}{path}: {exc}") from None
        if r.status_code != 200:
            raise TokenizerError(
                f"{self._client.base_url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        try:
            data: object = r.json()
        except ValueError:
            data = None
        if not isinstance(data, Mapping) or want not in data:
            raise TokenizerError(f"{self._client.base_url}{path}: the reply has no {want!r}: {r.text[:200]}")
        return data, data[want]

    def _tokenize(self, text: str, special: bool) -> list[int]:
        data, tokens = self._post("/tokenize", {"model": self._model, "prompt": text,
                                                "add_special_tokens": special}, "tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise TokenizerError(f"{self._client.base_url}/tokenize: 'tokens' is not a list of token ids: "
                                 f"{str(tokens)[:200]}")
        longest = data.get("max_model_len")
        if self.max_model_len is None and isinstance(longest, int) and longest > 0:
            self.max_model_len = longest
        return tokens

    def encode(self, text: str) -> list[int]:
        return self._tokenize(text, False)

    def decode(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", {"model": self._model, "tokens": ids}, "prompt")[1])

    # The endpoints take one item per request; a few requests in flight hide the round trips.
    _PARALLEL = 8

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        with ThreadPoolExecutor(self._PARALLEL) as ex:
            return list(ex.map(self.encode, texts))

    def decode_batch(self, seqs: list[list[int]]) -> list[str]:
        with ThreadPoolExecutor(self._PARALLEL) as ex:
            return list(ex.map(self.decode, seqs))

    @property
    def cache_key(self) -> Hashable:
        return self._key

    @property
    def special_offset(self) -> int:
        return self._offset

    def pool(self) -> list[int]:
        """The server has no vocabulary endpoint: ids seen when tokenizing random text."""
        if self._pool is None:
            rng = random.Random(1234)
            letters = string.ascii_letters + string.digits
            words = [
                "".join(rng.choice(letters) for _ in range(rng.randint(1, 8)))
                for _ in range(4000)
            ]
            self._pool = sorted(set(self.encode(" ".join(words))))
        return self._pool

    def close(self) -> None:
        self._client.close()


# Check rounds per start, and fresh random starts, before a prompt keeps its closest length.
# With the tiny model's tokenizer nearly every prompt is exact after the first cut
# (tests/perf/prompt_build.py prints the share).
_ROUNDS = 6
_STARTS = 4
# Words tried as padding: one token each, also after other text and repeated.
_PAD_WORDS = (" the", " of", " and", " to", " a", " is", " in", "x", " ")
# The longest character in tokens, for a byte-level BPE (4 UTF-8 bytes).
_CHAR_TOKENS = 4


def _pad_token(codec: Codec) -> int | None:
    """A token that adds exactly one token wherever it is appended, or None."""
    texts = ["a"] + ["a" + w * 3 for w in _PAD_WORDS]
    base, *tried = encode_many(codec, texts)
    for ids in tried:
        if len(ids) == len(base) + 3 and ids[: len(base)] == base and ids[-1] == ids[-2] == ids[-3]:
            return ids[-1]
    return None


def _random_ids(rng: random.Random, pool: list[int], n: int) -> list[int]:
    """``n`` consecutive vocabulary ids from a random offset, as vLLM's random dataset
    takes them (ids drawn one by one decode to mostly broken UTF-8 in byte-level BPEs);
    every 8th is random, so two prompts never coincide in a small vocabulary."""
    start = rng.randrange(len(pool))
    ids = (pool * (n // len(pool) + 2))[start : start + n]
    ids[::8] = rng.choices(pool, k=len(ids[::8]))
    return ids


# Tokens per random id once decoded and re-encoded, by length bucket and codec: 1.54 with
# the tiny model's tokenizer, whose byte tokens decode to U+FFFD (3 tokens), so n random ids
# re-encode to 1.5n tokens. Starting from n / ratio ids, the first encode reads about n
# tokens, not 1.5n (a fifth less encoding in all). The least of a few samples, so most
# prompts still come out long and are cut; a short one is padded.
_ratios: dict[tuple[Hashable, int], float] = {}
_RATIO_SAMPLES = 8


def _start_len(codec: Codec, pool: list[int], n: int) -> int:
    """How many random ids to start a prompt of ``n`` tokens from."""
    bucket = min(2048, max(16, 1 << (n - 1).bit_length()))
    key = (codec_key(codec), bucket)
    ratio = _ratios.get(key) if key[0] is not None else None
    if ratio is None:
        rng = random.Random(bucket)
        seqs = [_random_ids(rng, pool, bucket) for _ in range(_RATIO_SAMPLES)]
        ratio = max(1.0, min(len(ids) for ids in encode_many(codec, decode_many(codec, seqs))) / bucket)
        if key[0] is not None:
            _ratios[key] = ratio
    return max(1, min(n, math.ceil(n / ratio)))


def _whole_char_cuts(codec: Codec, items: list[tuple[list[int], int]]) -> list[int]:
    """For each (ids, cut): the largest of cut, cut - 1, ..., cut - 3 that does not split a
    character between tokens, else cut. A byte-level BPE spells a character it has no token
    for in up to 4 byte tokens; cut between them, each half decodes to U+FFFD, which encodes
    longer than what it replaced, so the cut text misses its length (1 in 3 first cuts with
    the tiny model's tokenizer). A split shows as one character too many when the two sides
    of the cut are decoded apart."""
    windows: list[list[int]] = []
    tried: list[list[int]] = []
    for ids, cut in items:
        cuts = [c for c in range(cut, cut - _CHAR_TOKENS, -1) if 0 < c < len(ids)]
        tried.append(cuts)
        for c in cuts:
            lo = max(0, c - _CHAR_TOKENS)
            windows += [ids[lo:c], ids[c : c + _CHAR_TOKENS], ids[lo : c + _CHAR_TOKENS]]
    texts = iter(decode_many(codec, windows))
    out = []
    for (_ids, cut), cuts in zip(items, tried, strict=True):
        # (A decoder that drops a leading space from a piece makes the sum one short: fine.)
        whole = [c for c in cuts if len(next(texts)) + len(next(texts)) <= len(next(texts))]
        out.append(whole[0] if whole else cut)
    return out


def make_prompts(codec: Codec, rng: random.Random, lens: Sequence[int],
                 heads: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """For each ``n`` in ``lens``: text ``head + tail`` whose encoding is ``len(encode(head))
    + n`` tokens, and that count (the real one: as close as the tokenizer allows, when a
    prompt never settles). ``head`` stays byte-identical, so shared prefixes stay cacheable.

    Like vLLM's random dataset: random ids, decode, re-encode, keep the first n of the
    re-encoded ids, decode, check; a cut that lands inside a character is moved back and
    padded, a short one padded or extended. Each step runs for all prompts in one batch.
    Each prompt draws from its own generator, seeded from ``rng`` in order, so a prompt
    depends only on its place, length and head: not on the other prompts, nor on whether
    the codec batches (the first k of a longer list are the k prompts of a shorter one)."""
    k = len(lens)
    hs = list(heads) if heads is not None else [""] * k
    if len(hs) != k:
        raise ValueError("one head per prompt")
    rngs = [random.Random(rng.getrandbits(64)) for _ in range(k)]
    if not k:
        return []
    pool = codec.pool()
    distinct = list(dict.fromkeys(h for h in hs if h))
    head_ids: dict[str, list[int]] = {"": [], **dict(zip(distinct, encode_many(codec, distinct), strict=True))}
    ns = [max(0, n) for n in lens]
    target = [len(head_ids[h]) + n for h, n in zip(hs, ns, strict=True)]
    best: list[tuple[str, int] | None] = [
        (h, len(head_ids[h])) if n == 0 else None for h, n in zip(hs, ns, strict=True)]
    left = [i for i in range(k) if ns[i] > 0]
    pad = _pad_token(codec) if left else None
    for _start in range(_STARTS):
        if not left:
            break
        cand = {i: _random_ids(rngs[i], pool, _start_len(codec, pool, ns[i])) for i in left}
        fresh = dict.fromkeys(left, True)  # cand holds random ids not yet re-encoded
        backs = dict.fromkeys(left, 0)
        for _round in range(_ROUNDS):
            if not left:
                break
            tails = decode_many(codec, [cand[i] for i in left])
            texts = [hs[i] + t for i, t in zip(left, tails, strict=True)]
            missed: list[tuple[int, list[int], int]] = []
            for i, text, ids in zip(left, texts, encode_many(codec, texts), strict=True):
                d = len(ids) - target[i]
                b = best[i]
                if b is None or abs(d) < abs(b[1] - target[i]):
                    best[i] = (text, len(ids))
                if d:
                    missed.append((i, ids, d))
            # The tail's ids: the whole text's after the head's, unless the tail's first
            # token merged into the head's last (then its own; the count stays the whole's).
            tail_text = dict(zip(left, tails, strict=True))
            lost = [i for i, ids, _ in missed if ids[: len(head_ids[hs[i]])] != head_ids[hs[i]]]
            own = dict(zip(lost, encode_many(codec, [tail_text[i] for i in lost]), strict=True))
            tail = {i: own[i] if i in own else ids[len(head_ids[hs[i]]) :] for i, ids, _ in missed}
            # First cuts of re-encoded random ids, kept to whole characters. Only text with
            # non-ASCII characters has characters of several tokens.
            firsts = [(i, len(tail[i]) - d) for i, _, d in missed
                      if d > 0 and fresh[i] and not tail_text[i].isascii()]
            cuts = dict(zip((i for i, _ in firsts),
                            _whole_char_cuts(codec, [(tail[i], c) for i, c in firsts]), strict=True))
            left = []
            for i, _ids, d in missed:
                t = tail[i]
                if d > 0:
                    # Too long: keep as many ids as the target wants. After the first cut an
                    # overshoot is a split character or a merge at the head: cut one more each
                    # time.
                    want = max(0, len(t) - d)
                    if fresh[i]:
                        keep = min(want, cuts.get(i, want))
                    else:
                        backs[i] += 1
                        keep = max(0, want - backs[i])
                    short = want - keep
                    t = t[:keep]
                else:
                    short = -d
                fresh[i] = False
                if pad is not None and short <= max(4, ns[i] // 16):
                    cand[i] = t + [pad] * short
                elif short:
                    # Far too short (ids that merged when re-encoded), or no padding word: more
                    # random ids, and the next re-encoding is cut again.
                    cand[i] = t + rngs[i].choices(pool, k=short + short // 8 + (d < 0))
                    fresh[i] = True
                else:
                    cand[i] = t
                left.append(i)
    out: list[tuple[str, int]] = []
    for b in best:
        assert b is not None
        out.append(b)
    return out
