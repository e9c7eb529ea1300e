"""The embedded tiny model: the right shape, loadable, the same on every build, built once."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.server.tinymodel import ensure_dummy_model, ensure_tiny_model, shipped_config_names

ROOT = Path(__file__).resolve().parents[1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_model_shape_suits_vllm_cpu(tiny_model: Path) -> None:
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 256
    assert cfg["num_attention_heads"] == 4 and cfg["num_key_value_heads"] == 2
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # CPU kernels reject head_dim 16
    assert cfg["vocab_size"] == 512
    assert (tiny_model / "model.safetensors").stat().st_size < 5_000_000


def test_tokenizer_loads_with_chat_template(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    text = "the server latency is 42 ms"
    ids = tok(text)["input_ids"]
    assert 0 < len(ids) < len(text) and max(ids) < 512
    assert tok.decode(ids) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"


def test_rebuild_is_identical_and_second_call_is_cached(tiny_model: Path, tmp_path: Path) -> None:
    fresh = ensure_tiny_model(tmp_path)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert digest(fresh / name) == digest(tiny_model / name), name
    mtime = (fresh / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == fresh
    assert (fresh / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny-qwen2.build-")]


def test_two_processes_building_at_once_get_one_model(tmp_path: Path) -> None:
    code = "import sys; from engine.server.tinymodel import ensure_tiny_model; print(ensure_tiny_model(__import__('pathlib').Path(sys.argv[1])))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] == str(tmp_path / "tiny-qwen2")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["tiny-qwen2"]


def test_dummy_model_has_real_config_and_tiny_tokenizer(tiny_model: Path) -> None:
    names = shipped_config_names()
    assert "qwen2.5-7b" in names
    root = tiny_model.parent
    folder = ensure_dummy_model("qwen2.5-7b", root)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 28 and cfg["num_key_value_heads"] == 4
    assert digest(folder / "tokenizer.json") == digest(tiny_model / "tokenizer.json")
    assert not (folder / "model.safetensors").exists()


def test_unknown_dummy_name_lists_known_ones(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="qwen2.5-7b"):
        ensure_dummy_model("gpt-5", tmp_path)
