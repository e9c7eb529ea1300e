"""How much faster does a search run with more slots? (issue 19: within 1.25x of serial / slots, same winner)

The same search (8 configurations, or 32 with ``--space large``, every one measured fully) with 1, 2 and 4 slots, each slot a
stand-in trial (tests/ray_trials.TableTrial: a known limit per configuration, a server start of
``--step-s / 2`` and steps of ``--step-s`` real seconds), so the right winner is known and the wall
time is the search's own scheduling: what the slots buy and what the winner's confirmation alone
costs. With ``--ray`` the slots are Ray actors on a local cluster with logical GPUs instead.

    .venv/bin/python tests/perf/tune_parallel.py [--step-s 0.3] [--ray] [--space large]

Prints one line per slot count: wall seconds, winner, steps, and wall / (serial / slots).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS)]

from ray_trials import TableTrial  # noqa: E402

from engine.flags import FlagSet, builtin_schema  # noqa: E402
from engine.tune.search import SearchSpace, StepRule, Tuner, TuneSettings  # noqa: E402
from loadgen.spec import SLO  # noqa: E402

SPACE = SearchSpace((("max-num-seqs", (16, 32, 64, 128)), ("max-num-batched-tokens", (512, 2048))))
# Limits (req/s) per configuration: the right winner is max-num-seqs=64, max-num-batched-tokens=2048.
LIMITS = (3.0, 4.0, 5.0, 6.0, 8.0, 11.0, 7.0, 9.0)
SMALL = dict(zip((SPACE.key(v) for v in SPACE.configs()), LIMITS, strict=True))

# A search the size an 8-GPU team runs (the seed articles' two batching flags at four values each,
# and the KV block size): 32 configurations on one smooth hill, its top (11.5 req/s, 15% above the
# next: more than the search's tolerance) at max-num-seqs=64, max-num-batched-tokens=2048, block-size=16.
LARGE_SPACE = SearchSpace((("max-num-seqs", (16, 32, 64, 128)), ("max-num-batched-tokens", (512, 1024, 2048, 4096)),
                           ("block-size", (16, 32))))


def _hill(values: dict[str, object]) -> float:
    seqs, tokens, block = (float(str(values[n])) for n, _ in LARGE_SPACE.dims)
    return round(10.0 - 1.5 * abs(math.log2(seqs / 64)) - 1.2 * abs(math.log2(tokens / 2048))
                 + (1.5 if block == 16 else 0.0), 3)


LARGE = {LARGE_SPACE.key(v): _hill(v) for v in LARGE_SPACE.configs()}
SPACES = {"small": (SPACE, SMALL), "large": (LARGE_SPACE, LARGE)}


async def search(slots: int, step_s: float, ray: bool, space_name: str = "small") -> tuple[float, str, int]:
    space, table = SPACES[space_name]
    factory = functools.partial(TableTrial, space, table, step_s)
    if ray:
        from engine.tune.ray import RayMeasurer

        measurers = [RayMeasurer(factory, num_gpus=1, num_cpus=0.1, label=f"slot {i}") for i in range(slots)]
    else:
        measurers = [factory() for _ in range(slots)]
    schema = builtin_schema()
    tuner = Tuner(measurers[0], slots=measurers[1:], base_flags=FlagSet("/models/tiny", {"max-model-len": 2048}, schema),
                  space=space, slo=SLO(ttft_ms=500.0), schema=schema, max_request_len=192,
                  settings=TuneSettings(budget_s=1e9, step=StepRule(min_requests=50), exhaustive=True))
    t0 = time.perf_counter()
    res = await tuner.run()
    return time.perf_counter() - t0, res.best.key if res.best else "-", res.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-s", type=float, default=0.3)
    ap.add_argument("--ray", action="store_true", help="slots as Ray actors on a local cluster")
    ap.add_argument("--space", choices=sorted(SPACES), default="small",
                    help="small: 8 configurations (the issue's first table); large: 32 (where the winner's "
                         "confirmation alone at the end weighs less)")
    a = ap.parse_args()
    if a.ray:
        import ray

        ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}})
    rows = []
    for slots in (1, 2, 4):
        wall, best, steps = asyncio.run(search(slots, a.step_s, a.ray, a.space))
        rows.append((slots, wall, best, steps))
    serial = rows[0][1]
    _, table = SPACES[a.space]
    right = max(table, key=lambda k: table[k])
    print(f"== tune_parallel: {len(table)} configurations, every one measured, steps of {a.step_s:g} s"
          f"{', slots as Ray actors' if a.ray else ''} ==")
    print(f"{'slots':>5} {'wall s':>8} {'steps':>6} {'wall / (serial/slots)':>22}  winner")
    for slots, wall, best, steps in rows:
        print(f"{slots:>5} {wall:8.2f} {steps:>6} {wall / (serial / slots):22.2f}  {best}")
    print(f"target: wall / (serial/slots) <= 1.25, the same winner (the right one: {right})")


if __name__ == "__main__":
    main()
