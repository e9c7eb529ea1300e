"""Issue 16's H200 proof: `vtui bench` and the TUI beside `vllm bench serve` and the server's own /metrics.

On the GPU machine (vLLM staged per ../shared/gpu/README.md) this starts the Qwen2.5-7B
architecture with dummy weights (`vtui models --build qwen2.5-7b`) with the prefix cache off
through engine.server.supervisor.Supervisor, warms it with one unreported run, then at each
concurrency runs the same random workload (1024 in / 256 out, ignore_eos, no warm-up requests, a
distinct seed per run) with three clients in turn, rotating the order each repetition:

- `vllm bench serve` (agreement.run_vllm), with a TelemetryRecorder of this script scraping
  /metrics over its run, so each run has exactly one scraper, as vtui's own runs do;
- `vtui bench --url` (agreement.run_vtui), its own telemetry and cross-check in its result file;
- the TUI: the real app (tui.app.VtuiApp, built as `vtui --model qwen2.5-7b` builds it) driven by
  Textual's Pilot: `t` and the URL typed to attach, the run's preset (written to the user preset
  folder, as `p` would) chosen in the Presets list with the keys, `r` pressed, the run worker
  awaited, its numbers read from the session's stored RunRecord, `q` to leave.

Per run it prints req/s, TTFT/TPOT p50/p99, the server's running and waiting (max and mean
over the run's /metrics samples) beside the client's peak in flight, the prefix-cache hit rate,
the client's mean TTFT beside the server's, its mean TPOT beside the server's
(E2E - TTFT)/(n - 1), the engine core's own inter-token mean, the server's generation rate
while it had requests, and the verdict: mean TTFT within 5 % and TPOT within 2 % of the
server's. Then per concurrency the medians and each vtui path's ratio to bench serve
(agreement.print_table) and the server-side medians per client (what bench serve does to the
server). Every run is also written as one JSON line to OUT/runs.jsonl as it ends.

    PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VTUI_HOME=/tmp/vtuihome \\
      python3 tests/perf/agreement_gpu.py --out /tmp/agree
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agreement import TOOLS, print_table, run_vllm, run_vtui  # noqa: E402

# The bar at c=200, where bench serve itself changed the server's speed: vtui against
# the server's own figures over the same window.
TTFT_TOL, TPOT_TOL = 0.05, 0.02
PILOT_SIZE = (160, 48)


# ---------------------------------------------------------------- the server's view of one run

def _mean_max(xs: list[Any] | None) -> tuple[float | None, float | None]:
    v = [float(x) for x in xs or () if x is not None]
    return (statistics.fmean(v), max(v)) if v else (None, None)


def server_view(load: dict[str, Any], telemetry: dict[str, Any], series: dict[str, Any],
                shared_prefix: bool = False) -> dict[str, Any]:
    """The server's side of one run: ``telemetry`` is a TelemetrySummary dict over the run's
    window, ``series`` the store's samples over it (``{"server": {"running": [...]}}``)."""
    from engine.runs.crosscheck import cross_check
    from engine.runs.summary import TelemetryFigures

    figures = TelemetryFigures.from_json(telemetry, "the run's telemetry")
    check = cross_check(load, figures, shared_prefix=shared_prefix).to_dict()
    srv = series.get("server") or {}
    run_mean, run_max = _mean_max(srv.get("running"))
    wait_mean, wait_max = _mean_max(srv.get("waiting"))
    running = srv.get("running") or []
    gen = [g for g, r in zip(srv.get("gen_tok_s") or [], running, strict=False) if g is not None and r]
    itl = telemetry.get("server_itl") or {}
    return {
        "running_mean": run_mean, "running_max": run_max, "waiting_mean": wait_mean, "waiting_max": wait_max,
        "scrapes": len(running), "prefix_hit_rate": check["prefix_hit_rate"],
        "server_mean_ttft_ms": check["server_mean_ttft_ms"], "server_tpot_ms": check["server_tpot_ms"],
        "client_mean_ttft_ms": check["client_mean_ttft_ms"], "client_mean_tpot_ms": check["client_mean_tpot_ms"],
        "client_prompt_tokens": check["client_prompt_tokens"], "server_prompt_tokens": check["server_prompt_tokens"],
        "engine_itl_mean_ms": itl.get("mean_ms"), "server_requests": (telemetry.get("server_e2e") or {}).get("count"),
        "gen_tok_s": statistics.fmean(gen) if gen else None,
        "gpu_util_pct": telemetry.get("mean_gpu_util_pct"), "preemptions": telemetry.get("preemptions"),
        "warnings": check["warnings"],
    }


async def scrape(url: str) -> Any:
    """One /metrics page, parsed (engine.telemetry.metrics.MetricsPage)."""
    import httpx

    from engine.telemetry.metrics import parse_metrics

    async with httpx.AsyncClient(trust_env=False, timeout=30.0) as client:
        return parse_metrics((await client.get(url + "/metrics")).text)


def bracket_view(before: Any, after: Any, load: dict[str, Any]) -> dict[str, Any]:
    """The server's figures from two scrapes taken just before the client started and just after
    it ended: every request of the run and nothing else (a 1 Hz scrape loop's first and last
    samples need not bracket the run; see the runs where its request count falls short)."""
    from engine.telemetry import metrics as m

    def hist(key: str) -> tuple[float, float] | None:
        a, b = before.histogram(m.LATENCY[key]), after.histogram(m.LATENCY[key])
        if b is None or b.sum is None:
            return None
        d = b.minus(a)
        return (d.count, (d.sum or 0.0) * 1000.0 / d.count) if d.count else None

    def delta(names: tuple[str, ...]) -> float | None:
        a, b = before.value(names), after.value(names)
        return None if b is None else b - (a or 0.0)

    ttft, e2e, itl = hist("ttft"), hist("e2e"), hist("itl")
    gen, prompt = delta(m.GENERATION_TOKENS), delta(m.PROMPT_TOKENS)
    queries, hits = delta(m.PREFIX_QUERIES), delta(m.PREFIX_HITS)
    n = e2e[0] if e2e else None
    per_req = gen / n if gen is not None and n else None
    tpot = ((e2e[1] - ttft[1]) / (per_req - 1) if e2e and ttft and per_req and per_req > 1 else None)
    return {"b_requests": n, "b_ttft_requests": ttft[0] if ttft else None,
            "b_server_mean_ttft_ms": ttft[1] if ttft else None, "b_server_mean_e2e_ms": e2e[1] if e2e else None,
            "b_server_tpot_ms": tpot, "b_engine_itl_mean_ms": itl[1] if itl else None,
            "b_gen_tokens_per_req": per_req, "b_prompt_tokens_per_req": prompt / n if prompt is not None and n else None,
            "b_prefix_queries": queries, "b_prefix_hit_rate": hits / queries if queries and hits is not None else None,
            "b_client_completed": load.get("completed")}


def verdict(s: dict[str, Any]) -> tuple[float | None, float | None, bool]:
    def ratio(a: Any, b: Any) -> float | None:
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None

    # Against the bracketing scrapes when the run has them, else the tool's own window.
    sttft = s.get("b_server_mean_ttft_ms", s["server_mean_ttft_ms"])
    stpot = s.get("b_server_tpot_ms", s["server_tpot_ms"])
    rt = ratio(s["client_mean_ttft_ms"], sttft)
    rp = ratio(s["client_mean_tpot_ms"], stpot)
    ok = rt is not None and rp is not None and abs(rt - 1) <= TTFT_TOL and abs(rp - 1) <= TPOT_TOL
    return rt, rp, ok


# ---------------------------------------------------------------- the three clients

async def bench_serve(url: str, model: str, tok: Path, pid: int | None, conc: int, n: int, seed: int,
                      a: argparse.Namespace, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from engine.telemetry.recorder import TelemetryRecorder

    async with TelemetryRecorder(url, root_pid=pid) as rec:
        t0 = time.time()
        r = await asyncio.to_thread(run_vllm, url, model, tok, conc, n, seed, a, out)
        t1 = time.time()
        summary = rec.summary(t0, t1).to_dict()
        series = rec.store.to_dict(t0, t1)
    # bench serve's own "peak concurrent requests" counts per 1 s bucket (reads up to 2x).
    r["peak_in_flight"] = None
    return r, server_view(r, summary, series)


async def vtui_bench(url: str, model: str, tok: Path, conc: int, n: int, seed: int,
                     a: argparse.Namespace, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    r = await asyncio.to_thread(run_vtui, url, model, tok, conc, n, seed, a, out)
    tel = r.pop("telemetry", {}) or {}
    r.pop("series", None)
    return r, server_view(r, tel.get("summary") or {}, tel.get("series") or {})


async def _until(pilot: Any, cond: Any, what: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise RuntimeError(f"TUI: timed out waiting for {what}")
        await pilot.pause(0.1)


async def tui_run(url: str, conc: int, n: int, seed: int, a: argparse.Namespace
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    from textual.widgets import OptionList

    from engine.presets import preset_from_flags, save_user_preset
    from tui.app import VtuiApp, build_session

    name = f"agree-c{conc}-s{seed}"
    path = save_user_preset(preset_from_flags(
        name, {}, {"kind": "random", "input_len": a.input_len, "output_len": a.output_len, "seed": seed},
        {"mode": "closed", "concurrency": conc, "num_requests": n, "warmup_requests": 0, "seed": seed},
        description="issue 16 agreement run"), overwrite=True)
    session = build_session(argparse.Namespace(model="qwen2.5-7b", preset=None))  # as `vtui --model qwen2.5-7b`
    app = VtuiApp(session)
    try:
        async with app.run_test(size=PILOT_SIZE) as pilot:
            await pilot.press("t")  # Attach URL: type it into the prompt
            await pilot.press(*url, "enter")
            await _until(pilot, lambda: session.snapshot().server.state == "ATTACHED", "the attach", 60)
            await pilot.press("3")  # Presets (tab 3): the list takes the focus
            await pilot.pause()
            options = app.screen.query_one("#preset-options", OptionList)
            index = next(i for i in range(options.option_count) if options.get_option_at_index(i).id == name)
            options.focus()
            await pilot.press("home", *["down"] * index, "enter")
            await _until(pilot, lambda: session.snapshot().workload_label == name, "the preset to load", 10)
            await pilot.press("r")
            await _until(pilot, lambda: session.run_active or session.runs, "the run to start", 30)
            for worker in [w for w in app.workers if w.group == "run" and not w.is_finished]:
                await asyncio.wait_for(worker.wait(), a.run_timeout_s)
            await _until(pilot, lambda: bool(session.runs), "the run record", 30)
            if not session.runs:
                raise RuntimeError(f"TUI: no run recorded ({session.snapshot().notice})")
            record = session.runs[-1]
            series = session.store.to_dict(record.started_t, record.ended_t)
            live = session.snapshot()
            await pilot.press("q")  # attached, not started here: leaves the server running
            await pilot.pause()
    finally:
        path.unlink(missing_ok=True)
    # "done" on this commit, "ok" in the status vocabulary issue 16 brings: anything measured counts.
    if record.result is None or record.status in ("failed", "cancelled", "server died", "server-died"):
        raise RuntimeError(f"TUI run: {record.status} {record.error}")
    r = {**record.result.summary.to_dict(), **record.result.extra, "status": record.status,
         "history_id": record.history_id, "client_lag_p99_ms": record.result.client_lag_p99_ms,
         "live_in_flight_after": getattr(getattr(live, "window", None), "in_flight", None)}
    tel = record.summary.telemetry.to_json() if record.summary.telemetry is not None else {}
    s = server_view(r, tel, series)
    stored = record.summary.cross_check.to_dict() if record.summary.cross_check is not None else {}
    # The record's own cross-check is the one the Runs tab shows; it must be what we recompute.
    s["record_cross_check_equal"] = all(stored.get(k) == s[k] for k in (
        "client_mean_ttft_ms", "server_mean_ttft_ms", "client_mean_tpot_ms", "server_tpot_ms", "prefix_hit_rate"))
    return r, s


# ---------------------------------------------------------------- the run

def _f(v: Any, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def run_line(conc: int, rep: int, tool: str, r: dict[str, Any], s: dict[str, Any]) -> str:
    rt, rp, ok = verdict(s)
    hit = s.get("b_prefix_hit_rate") if s.get("b_prefix_queries") else s["prefix_hit_rate"]
    return (f"  c={conc:<3} rep {rep} {tool:<16} {r['request_throughput']:6.2f} req/s"
            f"  TTFT p50/p99 {r['median_ttft_ms']:7.1f}/{r['p99_ttft_ms']:7.1f}"
            f"  TPOT p50/p99 {r['median_tpot_ms']:6.2f}/{r['p99_tpot_ms']:6.2f}"
            f"  server running max/mean {_f(s['running_max'], 0)}/{_f(s['running_mean'])}"
            f" waiting {_f(s['waiting_max'], 0)}/{_f(s['waiting_mean'])} | in flight {r.get('peak_in_flight') or '-'}"
            f"  prefix hits {'-' if hit is None else f'{hit:.1%}'} of {_f(s.get('b_prefix_queries'), 0)} queried"
            f"  mean TTFT {_f(s['client_mean_ttft_ms'])}/{_f(s.get('b_server_mean_ttft_ms'))} ({_f(rt, 3)})"
            f"  TPOT {_f(s['client_mean_tpot_ms'], 2)}/{_f(s.get('b_server_tpot_ms'), 2)} ({_f(rp, 3)})"
            f"  [server requests {_f(s.get('b_requests'), 0)}, prompt/req {_f(s.get('b_prompt_tokens_per_req'))};"
            f" own window: {_f(s['server_requests'], 0)} requests, TTFT {_f(s['server_mean_ttft_ms'])},"
            f" TPOT {_f(s['server_tpot_ms'], 2)}]"
            f"  engine ITL {_f(s.get('b_engine_itl_mean_ms', s['engine_itl_mean_ms']), 2)}  gen {_f(s['gen_tok_s'], 0)} tok/s"
            f"  tok/event {_f(r.get('tokens_per_event'), 2)}  {'OK' if ok else 'OUTSIDE'}"
            f"  | excess {_f(excess(s))} ms  lag p99 {_f(r.get('client_lag_p99_ms'), 0)}"
            f"  delay {_f(r.get('client_delay_ms'))}  status {r.get('status') or '-'}")


def excess(s: dict[str, Any]) -> float | None:
    """The client's mean TTFT minus the server's over the run (the bracketing scrapes where the
    run has them, else the tool's own window): time the client counted that vLLM did not."""
    c = s.get("client_mean_ttft_ms")
    sv = s.get("b_server_mean_ttft_ms") or s.get("server_mean_ttft_ms")
    return c - sv if isinstance(c, (int, float)) and isinstance(sv, (int, float)) else None


def is_box_bound(r: dict[str, Any]) -> bool:
    return str(r.get("status") or "") == "box-bound" or r.get("box_bound") is True


async def main_async(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet, load_schema
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import ensure_dummy_model

    started = time.monotonic()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (out_dir / "runs.jsonl").open("a")
    tok = ensure_dummy_model("qwen2.5-7b")
    flags = FlagSet(model=str(tok), values={"load-format": "dummy", "max-model-len": 4096})
    # bench serve's random prompts repeat with a small vocabulary (REFERENCE.md): off, every
    # client does the same work.
    flags = flags.set("enable-prefix-caching", False)
    if a.api_server_count:
        flags = flags.set("api-server-count", a.api_server_count)
    sup = Supervisor(flags)
    print(f"starting vllm serve {' '.join(flags.to_argv())}", flush=True)
    # The TUI reads vLLM's flag schema once (cached under VTUI_HOME): meanwhile, not in a run.
    await asyncio.gather(sup.start(timeout=600), asyncio.to_thread(load_schema))
    facts = sup.facts
    print(f"ready in {time.monotonic() - started:.0f} s at {sup.base_url}: vLLM {getattr(facts, 'vllm_version', '?')}, "
          f"KV cache {getattr(facts, 'kv_cache_tokens', '?')} tokens", flush=True)
    url, model = sup.base_url, sup.model
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    views: dict[tuple[int, str], list[dict[str, Any]]] = {}
    seed = a.seed or int(time.time()) % 100_000
    took: dict[tuple[int, str], float] = {}
    try:
        with tempfile.TemporaryDirectory() as d:
            # One unreported run first: the first requests after start pay one-time costs.
            t = time.monotonic()
            await asyncio.to_thread(run_vtui, url, model, tok, 32, 64, seed, a, Path(d) / "warm.json")
            print(f"warm-up run {time.monotonic() - t:.0f} s", flush=True)
            for rep in range(a.repeat):
                for conc in a.concurrency:
                    n = max(a.min_requests, conc * a.per_slot)
                    for tool in TOOLS[rep % 3:] + TOOLS[:rep % 3]:
                        seed += 1
                        left = a.deadline_s - (time.monotonic() - started)
                        if took.get((conc, tool), 0) * 1.3 > left:
                            print(f"  c={conc:<3} rep {rep} {tool:<16} skipped: {left:.0f} s left of the deadline",
                                  flush=True)
                            continue
                        t = time.monotonic()
                        out = Path(d) / f"{tool.split()[0]}-{conc}-{rep}.json"
                        try:
                            before = await scrape(url)
                            if tool == "vllm bench serve":
                                r, s = await bench_serve(url, model, tok, sup.pid, conc, n, seed, a, out)
                            elif tool == "vtui bench":
                                r, s = await vtui_bench(url, model, tok, conc, n, seed, a, out)
                            else:
                                r, s = await tui_run(url, conc, n, seed, a)
                            s.update(bracket_view(before, await scrape(url), r))
                        except Exception as exc:  # noqa: BLE001 - recorded, the others go on
                            print(f"  c={conc:<3} rep {rep} {tool:<16} FAILED: {type(exc).__name__}: "
                                  f"{str(exc)[-1500:]}", flush=True)
                            log.write(json.dumps({"conc": conc, "rep": rep, "tool": tool, "seed": seed,
                                                  "error": f"{type(exc).__name__}: {exc}"}) + "\n")
                            log.flush()
                            continue
                        took[(conc, tool)] = time.monotonic() - t
                        runs.setdefault((conc, tool), []).append(r)
                        views.setdefault((conc, tool), []).append(s)
                        print(run_line(conc, rep, tool, r, s), flush=True)
                        keep = {k: v for k, v in r.items() if not isinstance(v, (list, dict)) or k in (
                            "stream", "failures_by_reason")}
                        log.write(json.dumps({"conc": conc, "rep": rep, "tool": tool, "seed": seed, "n": n,
                                              "wall_s": took[(conc, tool)], "load": keep, "server": s},
                                             default=str) + "\n")
                        log.flush()
    finally:
        await sup.stop()
        log.close()
    print_table(runs, a, model="Qwen2.5-7B dummy on one H200 (vLLM 0.24.0)")
    print_server_table(runs, views, a)
    print_excess_table(runs, views, a)
    print(f"\ntotal {time.monotonic() - started:.0f} s", flush=True)


def print_server_table(runs: dict[tuple[int, str], list[dict[str, Any]]],
                       views: dict[tuple[int, str], list[dict[str, Any]]], a: argparse.Namespace) -> None:
    """Per client, medians of the server's own figures over its runs, and the verdicts."""
    print(f"\n== against the server's own /metrics, median of up to {a.repeat} runs (TTFT within "
          f"{TTFT_TOL:.0%}, TPOT within {TPOT_TOL:.0%} of the server's (E2E - TTFT)/(n - 1)) ==")
    cols = ("runs", "run max", "run mean", "wait max", "inflight", "hits %", "cTTFT", "sTTFT", "TTFT r",
            "cTPOT", "sTPOT", "TPOT r", "engITL", "gen t/s", "within")
    print(f"{'conc':>4} {'client':>17} | " + " ".join(f"{c:>8}" for c in cols))
    for conc in a.concurrency:
        for tool in TOOLS:
            vs, rs = views.get((conc, tool), []), runs.get((conc, tool), [])
            if not vs:
                continue

            def med(key: str, src: list[dict[str, Any]] = vs) -> float | None:
                xs = [x[key] for x in src if isinstance(x.get(key), (int, float))]
                return statistics.median(xs) if xs else None

            ver = [verdict(s) for s in vs]
            rts = [v[0] for v in ver if v[0] is not None]
            rps = [v[1] for v in ver if v[1] is not None]
            hit = med("b_prefix_hit_rate") if med("b_prefix_queries") else med("prefix_hit_rate")
            cells = [str(len(vs)), _f(med("running_max"), 0), _f(med("running_mean")), _f(med("waiting_max"), 0),
                     _f(med("peak_in_flight", rs), 0), _f(None if hit is None else 100 * hit, 2),
                     _f(med("client_mean_ttft_ms")), _f(med("b_server_mean_ttft_ms") or med("server_mean_ttft_ms")),
                     _f(statistics.median(rts) if rts else None, 3), _f(med("client_mean_tpot_ms"), 2),
                     _f(med("b_server_tpot_ms") or med("server_tpot_ms"), 2), _f(statistics.median(rps) if rps else None, 3),
                     _f(med("b_engine_itl_mean_ms") or med("engine_itl_mean_ms"), 2), _f(med("gen_tok_s"), 0),
                     f"{sum(v[2] for v in ver)}/{len(ver)}"]
            print(f"{conc:>4} {tool:>17} | " + " ".join(f"{c:>8}" for c in cells))


def print_excess_table(runs: dict[tuple[int, str], list[dict[str, Any]]],
                       views: dict[tuple[int, str], list[dict[str, Any]]], a: argparse.Namespace) -> None:
    """Issue 32's table: per run the mean-TTFT excess over the server's own, TPOT against the
    server's, the client's loop lag p99, the delay vtui estimates its held-up loop added
    (client_delay_ms) and its status; per client the median and worst excess over all runs and
    over the runs vtui did not mark box-bound (bench serve has no such status: all its runs)."""
    print("\n== each client against the server's own /metrics over its run (bracketing scrapes): "
          "mean TTFT excess, TPOT ratio, vtui's loop lag, client_delay_ms and status (ms) ==")
    print(f"{'conc':>4} {'client':>17} {'rep':>3} | {'TTFT':>7} {'server':>7} {'excess':>7} | {'TPOT':>6} "
          f"{'server':>6} {'ratio':>6} | {'lag p99':>7} {'delay':>6} {'box-bound':>9} status")
    for conc in a.concurrency:
        for tool in TOOLS:
            for rep, (r, s) in enumerate(zip(runs.get((conc, tool), []), views.get((conc, tool), []), strict=True)):
                _, rp, _ = verdict(s)
                print(f"{conc:>4} {tool:>17} {rep:>3} | {_f(s.get('client_mean_ttft_ms')):>7} "
                      f"{_f(s.get('b_server_mean_ttft_ms') or s.get('server_mean_ttft_ms')):>7} "
                      f"{'-' if excess(s) is None else f'{excess(s):+.1f}':>7} | {_f(s.get('client_mean_tpot_ms'), 2):>6} "
                      f"{_f(s.get('b_server_tpot_ms') or s.get('server_tpot_ms'), 2):>6} {_f(rp, 3):>6} | "
                      f"{_f(r.get('client_lag_p99_ms'), 0):>7} {_f(r.get('client_delay_ms')):>6} "
                      f"{('-' if tool == 'vllm bench serve' else 'yes' if is_box_bound(r) else 'no'):>9} "
                      f"{r.get('status') or '-'}")
    print(f"\n{'conc':>4} {'client':>17} | {'runs':>4} {'median':>7} {'worst':>7} | {'not box-bound':>13} "
          f"{'median':>7} {'worst':>7} | {'TPOT ratio range':>16}")
    for conc in a.concurrency:
        for tool in TOOLS:
            pairs = [(r, s) for r, s in zip(runs.get((conc, tool), []), views.get((conc, tool), []), strict=True)
                     if excess(s) is not None]
            if not pairs:
                continue
            ex = [excess(s) or 0.0 for _, s in pairs]
            kept = [excess(s) or 0.0 for r, s in pairs if not is_box_bound(r)]
            tp = [v for v in (verdict(s)[1] for _, s in pairs) if v is not None]
            print(f"{conc:>4} {tool:>17} | {len(ex):>4} {statistics.median(ex):+7.1f} {max(ex):+7.1f} | "
                  f"{len(kept):>13} {statistics.median(kept) if kept else float('nan'):+7.1f} "
                  f"{max(kept) if kept else float('nan'):+7.1f} | "
                  f"{min(tp) if tp else float('nan'):7.3f}-{max(tp) if tp else float('nan'):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/agree", help="folder for runs.jsonl")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 200])
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--per-slot", type=int, default=2, help="requests per concurrency slot")
    ap.add_argument("--min-requests", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--api-server-count", type=int, default=0,
                    help="vLLM's --api-server-count (0: vLLM's default); 2 where one API process is busy")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default: from the clock)")
    ap.add_argument("--deadline-s", type=float, default=1500.0,
                    help="skip a run that, timed by its last one, would end past this many s after start")
    ap.add_argument("--run-timeout-s", type=float, default=400.0, help="give up on a TUI run after this long")
    a = ap.parse_args()
    a.warmup, a.prefix_caching = 0, False  # read by agreement.run_vllm/run_vtui/print_table
    asyncio.run(main_async(a))


if __name__ == "__main__":
    main()
