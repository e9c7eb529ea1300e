"""engine.telemetry.host.release_free_memory: the C heap's free pages go back to the system
(issue 35: a long session's RSS held the free pages its runs' requests had left)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.telemetry.host import release_free_memory


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc")
def test_free_pages_go_back_after_a_burst_of_allocations() -> None:
    import ctypes.util

    if ctypes.util.find_library("c") is None or "musl" in (ctypes.util.find_library("c") or ""):
        pytest.skip("no glibc here")
    release_free_memory()
    base = _rss_kb()
    # 60 MB in 3 kB blocks (malloc's heap, not mmap), the last one kept: the heap cannot shrink
    # from its top, so the free pages stay resident until trimmed.
    blocks = [bytearray(3000) for _ in range(20_000)]
    kept = blocks[-1]
    del blocks
    held = _rss_kb()
    assert release_free_memory() is True
    after = _rss_kb()
    assert held - base > 40_000, (base, held)  # the free pages were still resident
    assert after - base < (held - base) / 2, (base, held, after)
    assert len(kept) == 3000
