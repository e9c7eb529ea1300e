"""Numbers out of untyped values: JSON, config.json, flag values, NVML's binding.

``as_int`` and ``as_float`` are ``int()`` and ``float()`` for a value typed ``object``: the same
number, or the same TypeError (and ValueError for text that is not a number), so the parsing
edges of every room convert alike and the type checker knows the result.

``JSONValue`` / ``JSONObject`` type a JSON document kept as it was stored (a history row's
samples, a stored key this vtui does not know): a reader narrows what it takes out of one
(``json_object``) instead of indexing blindly. A stored dataclass is read back field by field,
each type checked (``stored_*``, :class:`StoredFields`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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


class StoredFields:
    """A stored JSON object read field by field, each value's type checked as it is taken
    (``stored_*`` above) and a missing or null one given the field's default: the way a
    dataclass is built back from what its ``to_dict()`` wrote. ValueError names ``where``
    and the field; TypeError when the document is not an object at all."""

    def __init__(self, doc: object, where: str) -> None:
        if not isinstance(doc, Mapping) or not all(isinstance(k, str) for k in doc):
            raise TypeError(f"{where}: expected an object, got {type(doc).__name__}")
        self.doc: Mapping[str, object] = doc
        self.where = where

    def _name(self, key: str) -> str:
        return f"{self.where}: {key}"

    def number(self, key: str, default: float) -> float:
        v = stored_number(self.doc.get(key), self._name(key))
        return default if v is None else v

    def maybe_number(self, key: str) -> float | None:
        return stored_number(self.doc.get(key), self._name(key))

    def whole(self, key: str, default: int) -> int:
        v = stored_int(self.doc.get(key), self._name(key))
        return default if v is None else v

    def maybe_whole(self, key: str) -> int | None:
        return stored_int(self.doc.get(key), self._name(key))

    def flag(self, key: str, default: bool) -> bool:
        v = stored_bool(self.doc.get(key), self._name(key))
        return default if v is None else v

    def maybe_flag(self, key: str) -> bool | None:
        return stored_bool(self.doc.get(key), self._name(key))

    def text(self, key: str, default: str) -> str:
        v = stored_text(self.doc.get(key), self._name(key))
        return default if v is None else v

    def maybe_text(self, key: str) -> str | None:
        return stored_text(self.doc.get(key), self._name(key))

    def obj(self, key: str) -> StoredFields:
        """A nested object (an empty one where it is missing or null)."""
        v = self.doc.get(key)
        return StoredFields({} if v is None else v, self._name(key))

    def items(self, key: str) -> list[object]:
        """A nested list (empty where missing or null); ValueError when it is not a list."""
        v = self.doc.get(key)
        if v is None:
            return []
        if not isinstance(v, list | tuple):
            raise ValueError(f"{self._name(key)} is {v!r}, not a list")
        return list(v)

    def unknown(self, known: Collection[str]) -> list[str]:
        """The document's keys that are not in ``known`` (a typo, or a newer vtui's field)."""
        return sorted(k for k in self.doc if k not in known)


__all__ = ["JSONObject", "JSONValue", "StoredFields", "as_float", "as_int", "json_object", "stored_bool",
           "stored_int", "stored_number", "stored_text"]
