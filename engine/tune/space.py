"""The search space: the flags searched and the values each may take (:class:`SearchSpace`), its
configurations, their keys, the seed and the distance between two of them."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from engine.flags import FlagError, FlagSet
from engine.tune.errors import TuneError

if TYPE_CHECKING:
    from engine.flags import FlagValue, Schema

    # One flag's value in a search space; None leaves the flag unset (FlagSet.set(name, None)).
    SpaceValue: TypeAlias = FlagValue | None


# The seed articles' tuning flags over the values they use.
DEFAULT_SPACE: tuple[tuple[str, tuple[SpaceValue, ...]], ...] = (
    ("enable-chunked-prefill", (True, False)),
    ("max-num-batched-tokens", (512, 2048, 8192)),
    ("max-num-seqs", (64, 128, 256)),
)


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class SearchSpace:
    """Flag name -> the values to try, in order (the order defines 'nearby')."""

    dims: tuple[tuple[str, tuple[SpaceValue, ...]], ...]

    def __post_init__(self) -> None:
        names = [n for n, _ in self.dims]
        if len(set(names)) != len(names):
            raise TuneError("space", "a flag appears twice")
        for name, values in self.dims:
            if not values:
                raise TuneError("space", f"{name}: no values")
            if len(set(map(repr, values))) != len(values):
                raise TuneError("space", f"{name}: a value appears twice")

    @classmethod
    def default(cls) -> SearchSpace:
        return cls(DEFAULT_SPACE)

    @classmethod
    def parse(cls, specs: Sequence[str], schema: Schema | None = None) -> SearchSpace:
        """From ``["max-num-seqs=64,128,256", "enable-chunked-prefill=on,off"]``.

        Values are typed by the flag's schema as vLLM would parse them (``on``/``off`` and
        ``true``/``false`` for booleans). Raises TuneError naming the spec and flag.
        """
        dims: list[tuple[str, tuple[SpaceValue, ...]]] = []
        probe = FlagSet("m", {}, schema)
        for spec in specs:
            name, sep, rest = spec.partition("=")
            name = name.strip().lstrip("-")
            if not sep or not name or not rest.strip():
                raise TuneError(f"--space {spec!r}", "expected NAME=V1,V2,... (e.g. max-num-seqs=64,128,256)")
            values: list[SpaceValue] = []
            for text in rest.split(","):
                text = text.strip()
                if text.lower() in ("on", "off") and _is_bool_flag(probe, name):
                    text = "true" if text.lower() == "on" else "false"
                try:
                    fs = probe.set(name, text)
                except FlagError as exc:
                    raise TuneError(f"--space {spec!r}", f"value {text!r}: {exc}") from None
                canon = next(iter(fs.values)) if fs.values else name
                values.append(_space_value(fs.values.get(canon)))
                name = canon
            dims.append((name, tuple(values)))
        return cls(tuple(dims))

    def configs(self) -> list[dict[str, SpaceValue]]:
        """Every combination, first dimension slowest."""
        names = [n for n, _ in self.dims]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in self.dims))]

    def key(self, values: Mapping[str, object]) -> str:
        """A stable name for one configuration: ``max-num-seqs=64,enable-chunked-prefill=on``."""
        return ",".join(f"{n}={_fmt(values[n])}" for n, _ in self.dims)

    def lines(self) -> list[str]:
        """One ``NAME=V1,V2`` line a dimension: what :meth:`parse` reads back."""
        return [f"{n}=" + ",".join(_fmt(v) for v in vals) for n, vals in self.dims]

    def index(self, values: Mapping[str, SpaceValue]) -> tuple[int, ...]:
        return tuple(list(vals).index(values[n]) for n, vals in self.dims)

    def distance(self, a: Mapping[str, SpaceValue], b: Mapping[str, SpaceValue]) -> int:
        """Ordinal distance: steps along each dimension's list."""
        return sum(abs(x - y) for x, y in zip(self.index(a), self.index(b), strict=True))

    def seed(self, base: Mapping[str, object]) -> dict[str, SpaceValue]:
        """Where the search starts: the base flags' value when it is in the list,
        chunked prefill on (vLLM's default since V1), else the middle value."""
        out: dict[str, SpaceValue] = {}
        for name, values in self.dims:
            if name in base and base[name] in values:
                out[name] = _space_value(base[name])
            elif name == "enable-chunked-prefill" and True in values:
                out[name] = True
            else:
                out[name] = values[(len(values) - 1) // 2] if len(values) % 2 else values[len(values) // 2]
        return out

    def to_dict(self) -> dict[str, list[SpaceValue]]:
        return {n: list(v) for n, v in self.dims}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> SearchSpace:
        """From :meth:`to_dict`'s form (a state file's JSON); TuneError when a flag's values are not a list."""
        dims: list[tuple[str, tuple[SpaceValue, ...]]] = []
        for n, v in d.items():
            if not isinstance(v, (list, tuple)):
                raise TuneError("space", f"{n}: {v!r} is not a list of values")
            dims.append((str(n), tuple(_space_value(x) for x in v)))
        return cls(tuple(dims))


def _space_value(value: object) -> SpaceValue:
    """``value`` as a flag value (what FlagSet holds, or JSON read back); TypeError when it is none."""
    if value is None or isinstance(value, (bool, int, float, str, tuple, list, dict)):
        return value
    raise TypeError(f"not a flag value: {value!r}")


def _space_values(d: object) -> dict[str, SpaceValue]:
    """A configuration's flag values read back from JSON; TypeError when it is not an object."""
    if not isinstance(d, Mapping):
        raise TypeError(f"flag values: expected an object, got {type(d).__name__}")
    return {k: _space_value(v) for k, v in d.items()}


def _opt_number(value: object) -> float | None:
    """A JSON number or null, as read (no conversion); TypeError for anything else."""
    if value is None or isinstance(value, (int, float)):
        return value
    raise TypeError(f"not a number: {value!r}")


def _is_bool_flag(probe: FlagSet, name: str) -> bool:
    # A boolean set from "true" comes back as True: the schema calls it a bool.
    try:
        return any(isinstance(v, bool) for v in probe.set(name, "true").values.values())
    except FlagError:
        return False
