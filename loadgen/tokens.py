"""The served model's tokenizer, so synthetic prompts have exact token lengths.

``LocalTokenizer`` reads a model folder's ``tokenizer.json`` with the ``tokenizers``
package (transformers' AutoTokenizer as a fallback for folders without one).
``RemoteTokenizer`` asks the server itself (vLLM's ``POST /tokenize`` and
``/detokenize``) when only a URL is known. ``make_prompt`` builds text whose encoding
has exactly the asked number of tokens, the way vLLM's random dataset does: random ids,
decode, re-encode, trim or pad, repeat.
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any, Protocol

import httpx


class TokenizerError(RuntimeError):
    """No tokenizer could be loaded or reached; the message says where it looked."""


class Codec(Protocol):
    """What prompt building needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def pool(self) -> list[int]: ...
    @property
    def special_offset(self) -> int: ...


class LocalTokenizer:
    """A tokenizer from a local model folder (or a tokenizer.json path).

    A folder is loaded with transformers' AutoTokenizer, as vLLM loads it: for some
    models (Qwen2 in transformers 5) the tokenizer class rebuilds its own normalizer and
    pre-tokenizer instead of tokenizer.json's, so tokenizer.json alone can count a
    different number of tokens than the server does. The ``tokenizers`` package is the
    fallback (a bare tokenizer.json, or transformers missing)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path).expanduser()
        self._hf: Any = None
        self._tok: Any = None
        hf_error: Exception | None = None
        if p.is_dir():
            try:
                from transformers import AutoTokenizer

                self._hf = AutoTokenizer.from_pretrained(str(p))
            except Exception as exc:  # missing package, odd folder: try tokenizer.json
                hf_error = exc
        if self._hf is None:
            file = p / "tokenizer.json" if p.is_dir() else p
            if not file.is_file():
                why = f" (transformers: {hf_error})" if hf_error else ""
                raise TokenizerError(f"{p}: no tokenizer found{why}")
            import tokenizers

            try:
                self._tok = tokenizers.Tokenizer.from_file(str(file))
            except Exception as exc:  # the tokenizers error types are not exported
                raise TokenizerError(f"{file}: cannot load tokenizer: {exc}") from None
        self._pool: list[int] | None = None
        self._offset = len(self._encode("hello", True)) - len(self._encode("hello", False))

    def _encode(self, text: str, special: bool) -> list[int]:
        if self._tok is not None:
            return list(self._tok.encode(text, add_special_tokens=special).ids)
        return list(self._hf.encode(text, add_special_tokens=special))

    def encode(self, text: str) -> list[int]:
        """Token ids without special tokens."""
        return self._encode(text, False)

    def decode(self, ids: list[int]) -> str:
        if self._tok is not None:
            return str(self._tok.decode(ids, skip_special_tokens=True))
        return str(self._hf.decode(ids, skip_special_tokens=True))

    @property
    def special_offset(self) -> int:
        """Tokens the server adds to a completions prompt (a BOS, for Llama-style models)."""
        return self._offset

    def pool(self) -> list[int]:
        """Ids that random prompts draw from: the vocabulary less special/added tokens."""
        if self._pool is None:
            if self._tok is not None:
                special = set(self._tok.get_added_tokens_decoder())
                size = self._tok.get_vocab_size(with_added_tokens=False)
            else:
                special = set(self._hf.all_special_ids)
                size = int(self._hf.vocab_size)
            self._pool = [i for i in range(size) if i not in special]
        return self._pool


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

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = self._client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise TokenizerError(f"{self._client.base_url}{path}: {exc}") from None
        if r.status_code != 200:
            raise TokenizerError(
                f"{self._client.base_url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        data: dict[str, Any] = r.json()
        return data

    def _tokenize(self, text: str, special: bool) -> list[int]:
        data = self._post("/tokenize", {"model": self._model, "prompt": text,
                                        "add_special_tokens": special})
        if self.max_model_len is None and data.get("max_model_len"):
            self.max_model_len = int(data["max_model_len"])
        return [int(t) for t in data["tokens"]]

    def encode(self, text: str) -> list[int]:
        return self._tokenize(text, False)

    def decode(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", {"model": self._model, "tokens": ids})["prompt"])

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


def make_prompt(codec: Codec, rng: random.Random, n: int, head: str = "") -> tuple[str, int]:
    """Text ``head + tail`` whose encoding is ``len(encode(head)) + n`` tokens (as close as
    the tokenizer allows: it returns the real count as the second item). ``head`` stays
    byte-identical, so shared prefixes stay cacheable."""
    pool = codec.pool()
    head_len = len(codec.encode(head)) if head else 0
    target = head_len + n
    best: tuple[str, int] | None = None
    for _restart in range(4):  # a few sequences never settle (merges flip): start over
        # Consecutive vocabulary ids from a random offset, as vLLM's random dataset does
        # (ids drawn independently decode to mostly broken UTF-8 in byte-level BPEs).
        # Every 8th id is random so two prompts never coincide in a small vocabulary.
        start = rng.randrange(len(pool))
        ids = [pool[(start + j) % len(pool)] if j % 8 else rng.choice(pool) for j in range(n)]
        for _ in range(12):
            text = head + codec.decode(ids)
            got = len(codec.encode(text))
            if got == target:
                return text, got
            if best is None or abs(got - target) < abs(best[1] - target):
                best = (text, got)
            if got < target:
                # A small gap: pad with a word that is one token on its own.
                if target - got <= max(2, n // 16):
                    padded = text + " the" * (target - got)
                    if len(codec.encode(padded)) == target:
                        return padded, target
                ids = ids + [rng.choice(pool) for _ in range(target - got)]
            else:
                ids = ids[: max(0, len(ids) - (got - target))]
    assert best is not None
    return best
