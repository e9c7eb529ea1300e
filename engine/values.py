"""Numbers out of untyped values: JSON, config.json, flag values, NVML's binding.

``as_int`` and ``as_float`` are ``int()`` and ``float()`` for a value typed ``object``: the same
number, or the same TypeError (and ValueError for text that is not a number), so the parsing
edges of every room convert alike and the type checker knows the result.

``JSONValue`` / ``JSONObject`` type a JSON document kept as it was stored (the telemetry part
of a run's summary, engine.runs.summary): a reader narrows what it takes out of one
(``json_object``) instead of indexing blindly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import SupportsFloat, SupportsIndex, SupportsInt, TypeAlias

# A JSON value as json.loads gives it (its lists and objects read-only here).
JSONValue: TypeAlias = bool | int | float | str | Sequence["JSONValue"] | Mapping[str, "JSONValue"] | None
JSONObject: TypeAlias = Mapping[str, JSONValue]


def json_object(value: object) -> JSONObject:
    """``value`` where it is a JSON object (a mapping with text keys), else an empty one: the
    way into a nested part of a stored document whose shape is not guaranteed."""
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return value
    return {}


def as_float(value: object) -> float:
    """``float(value)`` for an untyped value: the same number, or the same TypeError, as float()."""
    if isinstance(value, (str, bytes, bytearray, SupportsFloat, SupportsIndex)):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not {type(value).__name__!r}")


def as_int(value: object) -> int:
    """``int(value)`` for an untyped value: the same number, or the same TypeError, as int()."""
    if isinstance(value, (str, bytes, bytearray, SupportsInt, SupportsIndex)):
        return int(value)
    raise TypeError(f"int() argument must be a string, a bytes-like object or a real number, "
                    f"not {type(value).__name__!r}")


# A stored JSON value checked, not converted: the value as it was read (an int stays an int, so
# the JSON written back is the same) or None; ValueError naming ``name`` for any other type.


def stored_number(value: object, name: str) -> float | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise ValueError(f"{name} is {value!r}, not a number")


def stored_int(value: object, name: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"{name} is {value!r}, not an integer")


def stored_text(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{name} is {value!r}, not text")


def stored_bool(value: object, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"{name} is {value!r}, not true or false")


__all__ = ["JSONObject", "JSONValue", "as_float", "as_int", "json_object", "stored_bool", "stored_int",
           "stored_number", "stored_text"]
