"""The numbers of a model's architecture, read from its Hugging Face ``config.json``.

Only what the memory planner and flag validation need: layer count, widths, attention
and KV heads, head size, vocabulary, dtype, context length and a parameter-count
estimate. No ``transformers`` import: reading one JSON file must stay instant.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.values import as_int

__all__ = ["DTYPE_BYTES", "ModelConfig", "ModelConfigError", "config_json_or_none", "read_config_json"]

# Bytes per element of the dtypes a config.json or a --dtype/--kv-cache-dtype names.
DTYPE_BYTES: Mapping[str, float] = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "fp8_per_token_head": 1,
    "int8": 1,
    "int8_per_token_head": 1,
    "int4_per_token_head": 0.5,
    "nvfp4": 0.5,
}

# Each key is tried in order; the first present wins. Several model families name
# the same quantity differently (GPT-2 style n_layer/n_embd, T5 style d_model).
_KEYS: Mapping[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "max_position_embeddings": (
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "max_sequence_length",
    ),
}


class ModelConfigError(ValueError):
    """A config.json that is missing, unreadable, or lacks a number the planner needs."""

    def __init__(self, path: Path | str, reason: str, key: str | None = None) -> None:
        self.path = Path(path)
        self.key = key
        self.reason = reason
        where = f"{self.path}" + (f": key {key!r}" if key else "")
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture numbers of one model (one ``config.json``)."""

    path: Path
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    torch_dtype: str
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    num_experts: int
    num_params: int
    """Estimated parameter count (embeddings, attention, MLP/experts, norms)."""

    @property
    def name(self) -> str:
        """The model folder's name (or the file's stem for a bare config file)."""
        return self.path.parent.name if self.path.name == "config.json" else self.path.stem

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read ``path`` (a model folder holding config.json, or the file itself).

        Raises ModelConfigError naming the file and key for anything missing or invalid.
        """
        file, data = read_config_json(path)
        return cls.from_dict(data, path=file)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, path: str | Path = "config.json") -> ModelConfig:
        """Build from an already parsed config.json mapping (JSON values, checked here)."""
        file = Path(path)
        # Multimodal models keep the language model's numbers under text_config.
        merged: dict[str, object] = dict(data)
        text_config = data.get("text_config")
        if isinstance(text_config, dict):
            merged = {**data, **text_config}

        def number(field: str, *, required: bool = True, default: int | None = None) -> int | None:
            for key in _KEYS[field]:
                if key in merged and merged[key] is not None:
                    value = merged[key]
                    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                        raise ModelConfigError(
                            file, f"expected a positive integer, got {value!r}", key
                        )
                    return value
            if required and default is None:
                raise ModelConfigError(
                    file, "missing (needed for the memory plan)", _KEYS[field][0]
                )
            return default

        num_layers = number("num_layers")
        hidden = number("hidden_size")
        heads = number("num_attention_heads")
        assert num_layers is not None and hidden is not None and heads is not None
        kv_heads = number("num_kv_heads", required=False)
        if kv_heads is None:
            # Falcon-style multi-query configs say so with a flag instead of a count.
            kv_heads = 1 if merged.get("multi_query") is True else heads
        head_dim_raw = merged.get("head_dim")
        if head_dim_raw is None:
            if hidden % heads:
                raise ModelConfigError(
                    file,
                    f"hidden_size {hidden} is not divisible by num_attention_heads {heads}"
                    " and no head_dim is given",
                    "head_dim",
                )
            head_dim = hidden // heads
        elif isinstance(head_dim_raw, bool) or not isinstance(head_dim_raw, int) or head_dim_raw < 1:
            raise ModelConfigError(file, f"expected a positive integer, got {head_dim_raw!r}", "head_dim")
        else:
            head_dim = head_dim_raw
        vocab = number("vocab_size")
        assert vocab is not None
        intermediate = number("intermediate_size", required=False, default=4 * hidden)
        assert intermediate is not None
        max_pos = number("max_position_embeddings", required=False)

        dtype = merged.get("torch_dtype", merged.get("dtype")) or "float32"
        if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPE_BYTES:
            raise ModelConfigError(file, f"unknown dtype {dtype!r}", "torch_dtype")
        dtype = dtype.removeprefix("torch.")

        archs = merged.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ModelConfigError(file, f"expected a list of names, got {archs!r}", "architectures")
        architecture = archs[0] if archs else str(merged.get("model_type", "unknown"))

        experts_raw = merged.get("num_local_experts", merged.get("num_experts")) or 0
        num_experts = experts_raw if isinstance(experts_raw, int) and not isinstance(experts_raw, bool) else 0
        tie = bool(merged.get("tie_word_embeddings", False))

        params = _estimate_params(
            merged,
            layers=num_layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            vocab=vocab,
            intermediate=intermediate,
            tie=tie,
            num_experts=num_experts,
        )
        return cls(
            path=file,
            architecture=architecture,
            model_type=str(merged.get("model_type", "")),
            num_layers=num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            intermediate_size=intermediate,
            torch_dtype=dtype,
            max_position_embeddings=max_pos,
            tie_word_embeddings=tie,
            num_experts=num_experts,
            num_params=params,
        )


def _estimate_params(
    cfg: Mapping[str, object],
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    intermediate: int,
    tie: bool,
    num_experts: int,
) -> int:
    """Parameter count of a decoder-only transformer with this shape.

    Llama/Qwen/Mistral layout: q/k/v/o projections, a gated MLP (three matrices),
    two norms per layer; embeddings plus an LM head unless tied. Exact for those
    families to within the bias terms (Qwen2.5-7B gives 7.62e9, published 7.61e9).
    """
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":
        attn += (heads + 2 * kv_heads) * head_dim  # Qwen2 keeps biases on q, k, v
    # GPT-2/OPT style MLPs have two matrices; the SiLU-gated ones three.
    gated = str(cfg.get("hidden_act", cfg.get("activation_function", "silu"))) in {
        "silu",
        "swiglu",
        "gelu_pytorch_tanh",
    } or "gate" in str(cfg.get("mlp_type", "gate"))
    per_mlp = (3 if gated else 2) * hidden * intermediate
    if num_experts:
        moe_inter = cfg.get("moe_intermediate_size") or intermediate
        per_mlp = num_experts * 3 * hidden * as_int(moe_inter) + hidden * num_experts
        shared = cfg.get("shared_expert_intermediate_size") or 0
        per_mlp += 3 * hidden * as_int(shared)
    per_layer = attn + per_mlp + 2 * hidden
    embed = vocab * hidden
    head = 0 if tie else vocab * hidden
    return layers * per_layer + embed + head + hidden


def read_config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The one reader of a model's ``config.json``: ``path`` is a model folder holding it, or the
    file itself. Returns the file and its JSON object; ModelConfigError naming the file for a
    missing or unreadable file, bad JSON, or a top level that is not an object."""
    p = Path(os.path.expanduser(str(path)))
    file = p / "config.json" if p.is_dir() else p
    if not file.exists():
        if p.is_dir():
            raise ModelConfigError(file, "no config.json in this model folder")
        raise ModelConfigError(file, "no such file or folder")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(file, f"cannot read: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(file, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise ModelConfigError(file, "expected a JSON object at the top level")
    return file, data


def config_json_or_none(model_dir: str | Path | None) -> dict[str, Any] | None:
    """A local model folder's ``config.json`` as a JSON object, or None where there is none or it
    cannot be read (a hub name, a folder without one): for callers to whom it is optional."""
    if not model_dir or not Path(os.path.expanduser(str(model_dir))).is_dir():
        return None
    try:
        return read_config_json(model_dir)[1]
    except ModelConfigError:
        return None
