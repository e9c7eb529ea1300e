"""What one flag is: its spec (name, kind, choices, default), the tuning flags and the secret ones."""

from __future__ import annotations

import difflib
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Literal

Kind = Literal["int", "float", "str", "bool", "choice", "json", "list"]
FlagValue = bool | int | float | str | tuple[object, ...] | dict[str, object] | list[object]

# The flags the seed articles and vLLM's tuning guide turn, in display order.
TUNING_FLAGS: tuple[str, ...] = (
    "enable-chunked-prefill",
    "max-num-batched-tokens",
    "max-num-seqs",
    "gpu-memory-utilization",
    "max-model-len",
    "tensor-parallel-size",
    "quantization",
    "enable-prefix-caching",
    "kv-cache-dtype",
    "block-size",
    "dtype",
    "enforce-eager",
    "swap-space",
    "kv-offloading-size",
    # Beyond the seed articles; shown only where the installed vLLM has them.
    "async-scheduling",
    "speculative-config",
    "max-num-partial-prefills",
    "long-prefill-token-threshold",
    # Decode batches above the largest captured CUDA graph run without one (vLLM captures
    # up to min(2 x max-num-seqs, 512) by default; 1024 on data-centre Blackwell).
    "max-cudagraph-capture-size",
)

# Secret flags and the environment variable each is exported as. vLLM itself reads
# VLLM_API_KEY when --api-key is absent, and huggingface_hub reads HF_TOKEN, so a
# line that drops the flag and passes the variable by name behaves the same.
SECRET_FLAGS: Mapping[str, str] = MappingProxyType({"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"})

_ENV_REF = re.compile(r"^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))$")
_DEFAULT_IMAGE = "vllm/vllm-openai"
_CONTAINER_MODELS = PurePosixPath("/models")
_CONTAINER_HF_CACHE = "/root/.cache/huggingface"


class FlagError(ValueError):
    """A flag (or a token of a command line) that is wrong, with the reason.

    ``flag`` is the flag name without dashes ("" when the problem is the line
    itself); ``token`` the offending text when there is one.
    """

    def __init__(self, flag: str, reason: str, *, token: str | None = None, hint: str = "") -> None:
        self.flag = flag
        self.reason = reason
        self.token = token
        self.hint = hint
        where = f"--{flag}: " if flag else ""
        at = f" (at {token!r})" if token is not None and flag == "" else ""
        super().__init__(f"{where}{reason}{at}")



@dataclass(frozen=True)
class ResolvedDefault:
    """What vLLM sets a flag to at start when the command line leaves it out and its parser's
    default is None (``Schema.resolved_default``)."""

    value: FlagValue | None
    """The value, or None where it depends on what vLLM finds at start (the GPU, the model)."""
    note: str
    """Where it holds or what it depends on: "for text-generation models", "the GPU's memory"."""


def _norm(name: str) -> str:
    """``--max_num_seqs`` / ``max_num_seqs`` -> ``max-num-seqs`` (vLLM accepts both)."""
    return name.lstrip("-").replace("_", "-")


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _human_int(text: str) -> int:
    """vLLM's ``human_readable_int``: ``1k`` = 1000, ``1K`` = 1024, ``25.6k`` = 25600."""
    value = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** {"k": 3, "m": 6, "g": 9, "t": 12}[suffix])
        if "." in number:
            raise ValueError(f"decimals are not allowed with binary suffix {suffix}")
        return int(number) * (1 << {"K": 10, "M": 20, "G": 30, "T": 40}[suffix])
    return int(value)


@dataclass(frozen=True)
class FlagSpec:
    """What one ``vllm serve`` flag accepts."""

    name: str
    """Canonical name without dashes, e.g. ``max-num-seqs``."""
    kind: Kind
    default: FlagValue | None = None
    choices: tuple[str, ...] = ()
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    tuning: bool = False
    """Whether the flag is in TUNING_FLAGS (always set from it, whatever is passed)."""
    group: str = ""
    aliases: tuple[str, ...] = ()
    """Other spellings without dashes: ``tp``, ``device-memory-utilization``."""
    item_kind: Kind = "str"
    """For ``list`` flags: the kind of each item."""
    nullable: bool = False
    """vLLM's ``optional_type``: the text "None" or "" means unset."""
    negatable: bool = True
    """For ``bool``: has a ``--no-x`` form (BooleanOptionalAction); False for store_true."""
    append: bool = False
    """For ``list``: given once per item (``--middleware a --middleware b``)."""
    human: bool = False
    """For ``int``: accepts ``1k``/``1K`` like vLLM's human_readable_int."""
    allow_auto: bool = False
    """For ``int``: ``-1``/``auto`` means let vLLM decide (``--max-model-len``)."""
    exclusive_minimum: bool = False
    json_or_str: bool = False
    """For ``json``: text that is not a JSON object stays a string."""
    secret: bool = False

    def __post_init__(self) -> None:
        # Whether a flag is a tuning flag is this vtui's TUNING_FLAGS, never what a schema
        # cached by an older vtui says: a flag added to the list since would otherwise be
        # both in Schema.tuning() and among the rest of Schema.all() (listed twice).
        object.__setattr__(self, "tuning", self.name in TUNING_FLAGS)

    # -- typing --------------------------------------------------------------

    def parse(self, text: str) -> FlagValue | None:
        """Typed value of ``text`` as vLLM would read it; None for nullable "None"/"".

        Raises FlagError naming this flag.
        """
        if self.nullable and text in ("", "None"):
            return None
        return self._parse_scalar(self.kind, text)

    def _parse_scalar(self, kind: Kind, text: str) -> FlagValue | None:
        try:
            if kind == "bool":
                low = text.strip().lower()
                if low in _TRUE:
                    return True
                if low in _FALSE:
                    return False
                raise ValueError("expected true or false")
            if kind == "int":
                if self.allow_auto and text.strip().lower() in ("auto", "-1"):
                    return -1
                return _human_int(text) if self.human else int(text.strip())
            if kind == "float":
                value = float(text)
                if not math.isfinite(value):
                    raise ValueError("not a finite number")
                return value
            if kind == "choice":
                if self.choices and text not in self.choices:
                    raise FlagError(self.name, _choice_reason(text, self.choices))
                return text
            if kind == "json":
                if self.json_or_str and not re.match(r"(?s)^\s*\{.*\}\s*$", text):
                    return text
                parsed: FlagValue | None = json.loads(text)  # "null" reads as None
                return parsed
            if kind == "list":
                return (self._parse_item(text),)
            return text
        except FlagError:
            raise
        except (ValueError, TypeError) as exc:
            raise FlagError(self.name, f"expected {_kind_words(kind)}, got {text!r} ({exc})") from None

    def _parse_item(self, text: str) -> FlagValue | None:
        if self.nullable and text in ("", "None"):
            return None
        if self.item_kind == "list":
            return text
        return self._parse_scalar(self.item_kind, text)

    def coerce(self, value: object) -> FlagValue | None:
        """Typed value from a Python value (a preset, the UI) or text; raises FlagError."""
        if value is None:
            return None
        if isinstance(value, str) and self.kind not in ("str", "choice") and not (
            self.kind == "json" and self.json_or_str
        ):
            if self.kind == "list":
                return tuple(self._parse_item(item) for item in shlex.split(value))
            return self.parse(value)
        kind = self.kind
        if kind == "bool":
            if isinstance(value, bool):
                return value
        elif kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
        elif kind == "float":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(float(value)):
                    return float(value)
        elif kind in ("str", "choice"):
            if isinstance(value, str):
                return self.parse(value) if kind == "choice" else value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return self.parse(str(value))
        elif kind == "json":
            if isinstance(value, (dict, list, str, int, float, bool)):
                return value
        elif kind == "list":
            items = [value] if isinstance(value, (str, int, float)) else value
            if isinstance(items, (list, tuple)):
                out: list[FlagValue | None] = []
                for item in items:
                    if item is None or (isinstance(item, str) and self.item_kind == "str"):
                        out.append(item)
                    else:
                        out.append(self._parse_item(str(item)) if isinstance(item, str) else item)
                return tuple(out)
        raise FlagError(self.name, f"expected {_kind_words(kind)}, got {value!r}")

    def check(self, value: object) -> str | None:
        """Why ``value`` is not acceptable (type, range, choices), or None."""
        try:
            typed = self.coerce(value)
        except FlagError as exc:
            return exc.reason
        if typed is None:
            return None
        if self.kind in ("int", "float") and isinstance(typed, (int, float)):
            if self.allow_auto and typed == -1:
                return None
            lo, hi = self.minimum, self.maximum
            if lo is not None and (typed < lo or (self.exclusive_minimum and typed == lo)):
                bound = f"> {lo:g}" if self.exclusive_minimum else f">= {lo:g}"
                rng = f"({lo:g}, {hi:g}]" if self.exclusive_minimum and hi is not None else bound
                return f"must be {rng if hi is not None else bound}, got {typed}"
            if hi is not None and typed > hi:
                return f"must be <= {hi:g}, got {typed}"
        if self.kind == "choice" and self.choices and typed not in self.choices:
            return _choice_reason(str(typed), self.choices)
        return None

    # -- formatting ------------------------------------------------------------

    def to_argv(self, value: object) -> list[str]:
        """argv tokens for this flag and value (empty for a store_true flag set False)."""
        flag = f"--{self.name}"
        if self.kind == "bool" or (isinstance(value, bool) and self.kind not in ("json", "list")):
            if value:
                return [flag]
            return [f"--no-{self.name}"] if self.negatable else []
        if self.kind == "list" or isinstance(value, tuple):
            items = [_format_scalar(v) for v in (value if isinstance(value, (tuple, list)) else (value,))]
            if not items:
                return []
            if self.append:
                out: list[str] = []
                for item in items:
                    out += _flag_value(flag, item)
                return out
            if len(items) == 1:
                return _flag_value(flag, items[0])
            if any(_looks_like_option(item) for item in items):
                raise FlagError(
                    self.name,
                    "a list item starting with '-' cannot be written on a command line"
                    " (argparse would read it as a flag)",
                )
            return [flag, *items]
        if self.kind == "json" and not (self.json_or_str and isinstance(value, str)):
            return _flag_value(flag, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
        return _flag_value(flag, _format_scalar(value))


def _looks_like_option(text: str) -> bool:
    # argparse reads "-x" as an option but "-1"/"-0.5" as values.
    return text.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?", text)


def _flag_value(flag: str, text: str) -> list[str]:
    # "--flag=-x" is the only way argparse accepts a value that starts with "-".
    if _looks_like_option(text) or text == "":
        return [f"{flag}={text}"]
    return [flag, text]


def _format_scalar(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _kind_words(kind: str) -> str:
    return {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "json": "JSON",
        "list": "a list",
        "choice": "one of the choices",
    }.get(kind, "text")


def _choice_reason(text: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(text, list(choices), n=1, cutoff=0.6)
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{text!r} is not one of: {shown}{hint}"
