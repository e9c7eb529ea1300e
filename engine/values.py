"""Numbers out of untyped values: JSON, config.json, flag values, NVML's binding.

``as_int`` and ``as_float`` are ``int()`` and ``float()`` for a value typed ``object``: the same
number, or the same TypeError (and ValueError for text that is not a number), so the parsing
edges of every room convert alike and the type checker knows the result.
"""

from __future__ import annotations

from typing import SupportsFloat, SupportsIndex, SupportsInt


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


__all__ = ["as_float", "as_int"]
