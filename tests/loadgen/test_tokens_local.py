"""LocalTokenizer builds the same prompts as transformers' AutoTokenizer (what vLLM loads, and
what LocalTokenizer ran in-process before issue 33 item 8) without transformers in its process.

The reference here is the old path: AutoTokenizer in this (pytest's) process, one item per call.
The tiny model and every shipped config's dummy folder (the tiny tokenizer under a Qwen2, Llama
or Mistral config.json, each of which AutoTokenizer loads with another class) are checked: the
pool, the special-token offset, and for several seeds the prompts' texts and token counts.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.server.tinymodel import ensure_dummy_model, shipped_config_names
from loadgen import tokens
from loadgen.tokens import LocalTokenizer, make_prompts
from tests.conftest import TEST_CACHE

LENS = [1, 2, 5, 17, 64, 200, 700, 1500]


class OldPath:
    """The tokenizer as LocalTokenizer loaded a folder before: AutoTokenizer, in-process."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(folder))
        self.special_offset = len(self.hf.encode("hello")) - len(self.hf.encode("hello", add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.hf.decode(ids, skip_special_tokens=True))

    def pool(self) -> list[int]:
        special = set(self.hf.all_special_ids)
        return [i for i in range(int(self.hf.vocab_size)) if i not in special]


def _folders() -> list[str]:
    return ["tiny", *shipped_config_names()]


@pytest.fixture(scope="module")
def folders(tiny_model: Path) -> dict[str, Path]:
    out = {"tiny": tiny_model}
    for name in shipped_config_names():
        out[name] = ensure_dummy_model(name, TEST_CACHE / "models")
    return out


@pytest.mark.parametrize("name", _folders())
def test_prompts_and_counts_equal_the_old_paths(folders: dict[str, Path], name: str) -> None:
    folder = folders[name]
    new, old = LocalTokenizer(folder), OldPath(folder)
    assert new.source == "transformers' tokenizer, exported"
    assert new.pool() == old.pool()
    assert new.special_offset == old.special_offset
    for seed in range(3):
        got = make_prompts(new, random.Random(seed), LENS)
        assert got == make_prompts(old, random.Random(seed), LENS)
        # The counts are the old tokenizer's (the server's) counts of the texts, and exact.
        assert [len(old.encode(text)) for text, _ in got] == [n for _, n in got] == LENS
    probe = "Hello, world!  It's 2026:\n\tnaïve café, 東京 🚀  the model server's latency"
    assert new.encode(probe) == old.encode(probe)
    assert new.encode_batch([probe, probe[:9]]) == [old.encode(probe), old.encode(probe[:9])]


def test_the_tokenizer_json_alone_counts_otherwise(tiny_model: Path) -> None:
    """Why a folder is not read from its tokenizer.json alone: AutoTokenizer loads the tiny
    model's "PreTrainedTokenizerFast" as Qwen2Tokenizer (by model_type), whose own normalizer
    and pre-tokenizer split digits one by one."""
    text = "latency 12345 tokens, 2026"
    bare, old = LocalTokenizer(tiny_model / "tokenizer.json"), OldPath(tiny_model)
    assert bare.encode(text) != old.encode(text)
    assert LocalTokenizer(tiny_model).encode(text) == old.encode(text)


def test_a_second_load_reads_the_export_from_disk(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    LocalTokenizer(tiny_model)  # exported (or already on disk)
    tokens._exports.clear()

    def no_child(*_a: object, **_k: object) -> None:
        raise AssertionError("the export was on disk: no child process")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert LocalTokenizer(tiny_model).source == "transformers' tokenizer, exported"


def test_a_changed_tokenizer_is_exported_again(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    before = LocalTokenizer(folder).encode("<|im_start|>user")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = []  # <|im_start|> is no longer special: not skipped
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    after = LocalTokenizer(folder)
    assert after.encode("<|im_start|>user") == OldPath(folder).encode("<|im_start|>user") == before
    assert after.pool() == OldPath(folder).pool() != LocalTokenizer(tiny_model).pool()


def test_where_the_child_finds_it_unfit_transformers_runs_here(tiny_model: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "odd"
    shutil.copytree(tiny_model, folder)
    monkeypatch.setattr(tokens, "_export_cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(tokens, "_export_in_child", lambda _f: "its Rust tokenizer encodes otherwise than transformers")
    tok = LocalTokenizer(folder)
    assert tok.source.startswith("transformers, in this process (its Rust tokenizer encodes otherwise")
    assert tok.encode("latency 12345") == OldPath(folder).encode("latency 12345")


def test_a_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(tokens.TokenizerError, match="no-such: no tokenizer found"):
        LocalTokenizer(tmp_path / "no-such")


def test_a_sessions_runs_share_one_tokenizer_until_its_files_change(tiny_model: Path, tmp_path: Path) -> None:
    """Issue 35: each run built its tokenizer again, and each build left ~7 MB resident behind
    in the TUI process; loadgen.run now asks shared_local_tokenizer, one per tokenizer."""
    import shutil

    from loadgen.tokens import shared_local_tokenizer

    folder = tmp_path / "tok"
    shutil.copytree(tiny_model, folder)
    first = shared_local_tokenizer(folder)
    assert shared_local_tokenizer(str(folder)) is first
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text(encoding="utf-8") + "\n", encoding="utf-8")  # a changed file
    again = shared_local_tokenizer(folder)
    assert again is not first and again.encode("hello world") == first.encode("hello world")
