"""The event loop loadgen's processes run on: uvloop's where it is installed (vLLM depends on it;
about twice asyncio's event-loop throughput), else asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TypeVar

T = TypeVar("T")


def run_fast(main: Coroutine[object, None, T]) -> T:
    """``asyncio.run(main)`` on uvloop's loop when uvloop is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


__all__ = ["run_fast"]
