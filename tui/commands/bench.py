"""``vtui bench``: drive a vLLM server with a workload, headless; numbers as `vllm bench serve`.

    vtui bench --url http://127.0.0.1:8000 --input-len 512 --output-len 128 --concurrency 32
    vtui bench --url URL --rate 20 --burstiness 0.5 --duration 60 --slo-ttft-ms 500
    vtui bench --preset chat-prefix --url URL --result-file out.json
    vtui bench --input-len 128 --output-len 64          # starts the tiny model itself
    vtui bench --model /models/x -- --max-num-seqs 64   # starts that model with those flags
    vtui bench --url URL --preset online-chat --repeat 5  # 5 runs: each figure's median and interval
    vtui bench --url URL --preset online-chat --noise-floor 5  # this box's run-to-run noise, stored

Closed loop at --concurrency unless --rate is given (then open loop with gamma gaps,
--concurrency capping requests in flight, as vLLM's --max-concurrency does).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tui.commands.output import (
    cross_check_line,
    print_floor,
    print_repeats,
    print_table,
    summary_lines,
)
from tui.commands.output import (
    err as _err,
)
from tui.errors import UserError

if TYPE_CHECKING:
    from engine.runs.measure import MeasuredRun, Target
    from engine.runs.summary import RunSummary
    from engine.server.supervisor import Supervisor
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec
    from loadgen.stats import StatsWindow
    from tui.commands import Subparsers



def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run a load test against a vLLM server (results match `vllm bench serve`)",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").split("\n\n")[1:]),
    )
    g = p.add_argument_group("server")
    g.add_argument("--url", help="base URL of a running server (default: start one)")
    g.add_argument("--model", help="served model name (with --url) or model to start")
    g.add_argument("--api-key", help="sent as 'Authorization: Bearer ...' (default: $VLLM_API_KEY; prefer the "
                   "variable: a command line is visible to every user of the box in ps)")
    g.add_argument("--tokenizer", help="local tokenizer/model folder (default: the server's "
                   "/tokenize, or the started model's folder)")
    g.add_argument("--endpoint", choices=("completions", "chat"))
    g.add_argument("--timeout", type=float, default=600.0,
                   help="read timeout per response in s (default 600)")
    g.add_argument("--server-timeout", type=float, default=600.0,
                   help="seconds to wait for a started server (default 600)")
    g.add_argument("--no-validate", action="store_true", help=argparse.SUPPRESS)
    w = p.add_argument_group("workload")
    w.add_argument("--preset", help="preset name or TOML file: workload, arrivals and SLO")
    w.add_argument("--dataset-name", "--kind", dest="kind",
                   choices=("random", "sharegpt", "jsonl", "trace", "chat"))
    w.add_argument("--dataset", help="dataset file for sharegpt/jsonl/trace")
    w.add_argument("--input-len", type=int)
    w.add_argument("--output-len", type=int)
    w.add_argument("--range-ratio", type=float, help="uniform lengths within +-ratio")
    w.add_argument("--length-dist", choices=("fixed", "uniform", "normal"))
    w.add_argument("--input-std", type=float)
    w.add_argument("--output-std", type=float)
    w.add_argument("--prefix-len", type=int, help="shared prefix tokens")
    w.add_argument("--num-prefixes", type=int)
    w.add_argument("--num-turns", type=int, help="chat: turns per session")
    w.add_argument("--time-scale", type=float, help="trace: replay speed factor on gaps")
    w.add_argument("--trace-block-size", type=int, metavar="TOKENS",
                   help="trace: prompt tokens per hash id (default: the file's; Mooncake 512, Bailian 16, "
                        "else inferred from input tokens per hash id)")
    w.add_argument("--trace-time-unit", choices=("s", "ms", "us"),
                   help="trace: the timestamps' unit (default: the format's: Mooncake ms, others s)")
    w.add_argument("--seed", type=int)
    a = p.add_argument_group("arrivals")
    a.add_argument("--concurrency", type=int, help="closed loop slots, or in-flight cap with --rate")
    a.add_argument("--rate", type=float, help="open loop requests/s ('inf' = all at once)")
    a.add_argument("--burstiness", type=float, help="gamma shape; 1.0 = Poisson")
    a.add_argument("--constant", action="store_true", help="equal gaps at --rate")
    a.add_argument("--ramp-to", type=float, help="ramp linearly from --rate to this rate")
    a.add_argument("--num-requests", "--num-prompts", dest="num_requests", type=int)
    a.add_argument("--duration", type=float, help="stop sending after this many seconds")
    a.add_argument("--warmup", type=int, help="warm-up requests, not measured")
    a.add_argument("--workers", type=int, help="load generator processes (default: auto)")
    s = p.add_argument_group("SLO and output")
    s.add_argument("--slo-ttft-ms", type=float)
    s.add_argument("--slo-tpot-ms", type=float)
    s.add_argument("--slo-e2el-ms", type=float)
    s.add_argument("--result-file", help="write the result JSON (vllm bench serve keys + ours)")
    s.add_argument("--peak-bw-tbs", type=float, metavar="TB/S",
                   help="the GPU's memory bandwidth, for the speed of light where vtui's table lacks the GPU")
    s.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                   help="the GPU's dense bf16 TFLOPS (with --peak-bw-tbs)")
    s.add_argument("--requests-file", help="write one JSON line per request")
    s.add_argument("--quiet", "-q", action="store_true", help="no live progress line")
    s.add_argument("--allow-box-bound", action="store_true",
                   help="exit 0 for a run the busy box held up (status box-bound; default: exit 3)")
    s.add_argument("--no-history", action="store_true",
                   help="do not store the run in the run history (`vtui history`, `vtui compare`)")
    s.add_argument("--name", help="the run's name in the history (default: bench c=N in/out)")
    s.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="measure N runs of the workload, each stored; then each figure's median and its 95%% "
                        "interval over the repeats (default: the preset's repeats, else 1)")
    s.add_argument("--noise-floor", type=int, metavar="K",
                   help="measure this box's noise floor: K runs of the workload (3 or more), each figure's "
                        "run-to-run spread printed and stored; single-run comparisons on this box "
                        "(vtui compare, the Runs tab) then take it as their noise")
    s.add_argument("--transport", choices=("fast", "httpx"), default="fast", help=argparse.SUPPRESS)
    p.set_defaults(func=run, allow_extra=True)


def build_specs(args: argparse.Namespace) -> tuple[WorkloadSpec, ArrivalSpec, SLO | None]:
    """WorkloadSpec, ArrivalSpec, SLO from --preset and flags (flags win)."""
    from loadgen import SLO, ArrivalSpec, SpecError, WorkloadSpec

    wd: dict[str, object] = {}
    ad: dict[str, object] = {}
    slo_d: dict[str, object] = {}
    if args.preset:
        from engine.presets import PresetError, find_preset

        try:
            preset = find_preset(args.preset)
        except PresetError as exc:
            raise UserError(str(exc), "`vtui preset list` shows the presets") from None
        if not args.url:
            preset = preset.for_tiny_model() if not args.model else preset
        if args.repeat is None and preset.repeats > 1:
            if args.noise_floor or args.requests_file:
                given = "--noise-floor" if args.noise_floor else "--requests-file"
                _err(f"vtui: preset {preset.name} asks for {preset.repeats} repeats; "
                     f"{given} measures its own runs: the preset's repeats are not run")
            else:
                args.repeat = preset.repeats
                _err(f"vtui: preset {preset.name}: {preset.repeats} repeats (--repeat 1 for one run)")
        wd.update(preset.workload)
        ad.update(preset.arrivals)
        if preset.slo is not None:
            slo_d.update(preset.slo.to_dict())
    for key in ("kind", "dataset", "input_len", "output_len", "range_ratio", "length_dist",
                "input_std", "output_std", "prefix_len", "num_prefixes", "num_turns",
                "time_scale", "seed", "endpoint", "trace_block_size", "trace_time_unit"):
        v = getattr(args, key)
        if v is not None:
            wd[key] = v
    if args.range_ratio and "length_dist" not in wd:
        wd["length_dist"] = "uniform"
    if wd.get("kind") == "chat":
        wd.setdefault("endpoint", "chat")
    if args.seed is not None:
        ad["seed"] = args.seed
    if args.concurrency is not None:
        ad["concurrency"] = args.concurrency
    if args.rate is not None:
        ad["rate"] = args.rate
        ad["mode"] = "constant" if args.constant else "poisson"
        if args.concurrency is not None:
            ad["max_in_flight"] = args.concurrency
    if args.ramp_to is not None:
        ad["mode"], ad["end_rate"] = "ramp", args.ramp_to
    if wd.get("kind") == "trace":
        # A trace replays at its recorded times; with --rate or --concurrency its requests are sent
        # under that arrival model instead (a sweep over your own traffic's mix).
        if args.rate is not None or args.concurrency is not None:
            wd["trace_timing"] = False
        elif wd.get("trace_timing", True):
            ad["mode"] = "trace"
    for flag, key in (("burstiness", "burstiness"), ("num_requests", "num_requests"),
                      ("duration", "duration_s"), ("warmup", "warmup_requests"),
                      ("workers", "workers")):
        v = getattr(args, flag)
        if v is not None:
            ad[key] = v
    if not ad.get("num_requests") and not ad.get("duration_s"):
        ad["num_requests"] = 100 if wd.get("kind") != "trace" else 1_000_000
    for key in ("ttft", "tpot", "e2el"):
        v = getattr(args, f"slo_{key}_ms")
        if v is not None:
            slo_d[f"{key}_ms"] = v
    try:
        workload = WorkloadSpec.from_dict(wd, source="workload")
        arrivals = ArrivalSpec.from_dict(ad, source="arrivals")
        slo = SLO.from_dict(slo_d) if slo_d else None
    except SpecError as exc:
        flag = "--" + exc.key.replace("_s", "").replace("_", "-")
        raise UserError(f"{flag}: {exc.reason}", f"from {exc.source}; see `vtui bench --help`"
                        ) from None
    return workload, arrivals, slo


def run(args: argparse.Namespace) -> int:
    workload, arrivals, slo = build_specs(args)  # the preset's repeats, where --repeat is not given
    if args.repeat is None:
        args.repeat = 1
    if args.repeat < 1:
        raise UserError(f"--repeat {args.repeat}: must be 1 or more", "e.g. --repeat 5")
    if args.repeat > 1 and args.requests_file:
        raise UserError("--requests-file holds one run's requests, and --repeat measures several",
                        "drop --requests-file: every repeat's requests are stored (`vtui history show ID`)")
    if args.noise_floor is not None:
        from engine.runs.noise import MIN_FLOOR_RUNS

        if args.noise_floor < MIN_FLOOR_RUNS:
            raise UserError(f"--noise-floor {args.noise_floor}: a spread needs {MIN_FLOOR_RUNS} runs or more",
                            "e.g. --noise-floor 5")
        if args.repeat > 1:
            raise UserError("--noise-floor and --repeat both measure several runs of one workload",
                            "give one: --noise-floor K stores the box's spread, --repeat N a configuration's")
        if args.requests_file:
            raise UserError("--requests-file holds one run's requests, and --noise-floor measures several",
                            "drop --requests-file: every run's requests are stored (`vtui history show ID`)")
    peaks = (args.peak_bw_tbs, args.peak_tflops)
    if (peaks[0] is None) != (peaks[1] is None) or any(p is not None and not p > 0 for p in peaks):
        raise UserError("--peak-bw-tbs and --peak-tflops go together, both > 0",
                        "e.g. --peak-bw-tbs 4.8 --peak-tflops 989 (an H200)")
    if workload.kind in ("sharegpt", "jsonl", "trace"):
        path = Path(workload.dataset).expanduser()
        if not path.is_file():
            raise UserError(f"--dataset {workload.dataset}: no such file",
                            "give the path of a ShareGPT JSON or JSONL file")
    if workload.kind == "trace":
        from loadgen.workload import DatasetError, read_spec_trace

        try:
            trace = read_spec_trace(workload, limit=arrivals.num_requests or None)
        except DatasetError as exc:
            raise UserError(str(exc), "vtui reads its own traces and recordings, Mooncake and Bailian JSONL, "
                            "the Azure LLM inference CSV and BurstGPT CSV, as published") from None
        _err(f"vtui: {trace.describe()}")
    return asyncio.run(_bench(args, workload, arrivals, slo))


async def _start_server(args: argparse.Namespace) -> Supervisor:
    from engine.server.ready import ensure_server
    from engine.server.supervisor import Supervisor
    from tui.commands.serve import build_flags

    flags = build_flags(args)
    _err(f"vtui: starting {flags.model} (this takes a minute) ...")
    ready = await ensure_server(None, flags, make=Supervisor, timeout=args.server_timeout)
    if ready.failure is not None:
        report = ready.failure.report()
        print("\n".join(report[:-1]), file=sys.stderr)  # what happened, vLLM's line, its last log lines
        raise UserError(f"the server did not start: {ready.failure}", ready.failure.hint)
    sup = ready.supervisor
    assert sup is not None  # ensure_server gives None only with a failure, handled above
    _err(f"vtui: ready at {sup.base_url} after {ready.seconds:.0f} s")
    return sup


async def _with_live_limits(target: Target) -> Target:
    """A server vtui started (``vtui serve``), measured by URL: its live limits are what the run
    records as its flags, and the values it was started with beside them, so a run after
    ``vtui set`` is told from one before it. Other servers: unchanged (their flags are not known)."""
    from engine.server.livelimits import LiveUnavailable, read_live

    try:
        state = await read_live(target.base_url, target.api_key, timeout=5.0)
    except LiveUnavailable:
        return target
    return dataclasses.replace(target, flags={**target.flags, **state.live}, started_flags=dict(state.started))


async def _bench(args: argparse.Namespace, workload: WorkloadSpec, arrivals: ArrivalSpec, slo: SLO | None) -> int:
    from engine.runs.history import open_history
    from engine.runs.measure import RunHandle, RunPlan, Target, measure
    from engine.runs.series import Slot, run_series

    sup = None
    if args.url:
        target = Target(args.url, args.model, tokenizer=args.tokenizer,
                        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
                        root_pid=_listening_pid(args.url), model_label=args.model or args.url)
        target = await _with_live_limits(target)
    else:
        sup = await _start_server(args)
        target = Target.of(sup, api_key=args.api_key, tokenizer=args.tokenizer)
    conc = arrivals.concurrency if arrivals.mode == "closed" else f"rate {arrivals.rate:g}"
    plan = RunPlan(args.name or f"bench c={conc} {workload.input_len}/{workload.output_len}", workload, arrivals,
                   slo, preset=args.preset, tags=("bench",), read_timeout_s=args.timeout,
                   requests_file=args.requests_file, transport=args.transport,
                   peak_bw_tbs=args.peak_bw_tbs, peak_tflops=args.peak_tflops)
    history = None if args.no_history else open_history(lambda text: _err(f"vtui: {text}"))
    loop = asyncio.get_running_loop()
    runs: list[MeasuredRun] = []
    code = 0
    floor_doc: dict[str, object] | None = None
    count, what, tag = (args.noise_floor, "noise floor", "noise-floor") if args.noise_floor else \
        (args.repeat, "repeat", "repeat")
    codes: list[int] = []

    async def one(slot: Slot[RunPlan]) -> MeasuredRun:
        this = plan
        if count > 1:
            # each repeat a normal measured run, stored under its own name (and its own seed)
            this = dataclasses.replace(plan, name=f"{plan.name} ({what} {slot.repeat}/{count})",
                                       tags=(*plan.tags, tag))
            _err(f"vtui: {what} run {slot.repeat} of {count}" if args.noise_floor
                 else f"vtui: repeat {slot.repeat} of {count}")
        progress = _Progress(args.quiet)
        handle = RunHandle()
        loop.add_signal_handler(signal.SIGINT, handle.cancel)
        try:
            run = await measure(target, this, history=history, handle=handle, on_window=progress.update)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            progress.end()
        codes.append(_report(args, run))
        return run

    try:
        # A repeat the box spoiled is kept as one (its status says so; the spread reads it), not
        # measured again; a cancelled run, a dead server or a failed run ends the repeats.
        runs = [run for _, run in await run_series([plan], one, repeats=count, retry_spoiled=False,
                                                   stop=lambda run: codes[-1] not in (0, 3))]
        code = max(codes, default=0)
        if args.noise_floor and code in (0, 3):
            floor_doc = print_floor(runs, history, label=args.preset or plan.name)
    finally:
        if sup is not None:
            await sup.stop()
        if history is not None:
            history.close()
    if args.repeat > 1:
        spread = print_repeats(runs)
        if args.result_file:
            _write_result(args.result_file, {"repeats": [_result(r) for r in runs], "spread": spread})
    if floor_doc is not None and args.result_file:
        _write_result(args.result_file, {"runs": [_result(r) for r in runs], "noise_floor": floor_doc})
    return code


def _result(run: MeasuredRun) -> dict[str, object]:
    """The run's result document: bench serve's keys, the stored parts, the telemetry and its series."""
    assert run.result is not None  # _report refuses a run without one before any result is written
    out: dict[str, object] = run.result.to_json()
    parts = stored_parts(run.summary)
    telemetry = parts.pop("telemetry")
    out.update(parts)
    out["telemetry"] = {"summary": telemetry,
                        "series": run.store.to_dict(run.started, run.ended) if run.store is not None else {}}
    out["status"] = run.status.value
    return out


def _write_result(name: str, doc: dict[str, object]) -> None:
    path = Path(name).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    _err(f"vtui: result written to {path}")


def _report(args: argparse.Namespace, run: MeasuredRun) -> int:
    """Print one measured run (the table, telemetry, the server check) and give its exit code."""
    from engine.runs.crosscheck import CrossCheck
    from engine.runs.flagchange import TWO_CONFIGURATIONS, changes_text, flag_changes_of
    from engine.runs.measure import box_share_of
    from engine.runs.status import RunStatus

    if run.result is None:  # refused before any load was sent
        raise UserError(run.error or "the run failed", run.hint or "check --url/--dataset")
    out = _result(run)
    check = run.summary.cross_check or CrossCheck.from_dict({})
    print_table(out)
    for line in summary_lines(run.summary):
        print(line)
    share = box_share_of(run.summary)
    if share is not None:
        print(("WARNING: " if share.crowded else "") + share.line())
    print(cross_check_line(check))
    for warning in check.warnings:
        print(f"WARNING: {warning}")
    changes = flag_changes_of(run.summary)
    if changes:  # the figures above are of two configurations
        print(f"WARNING: {changes_text(changes)}: {TWO_CONFIGURATIONS}; compare and the advisor give it no verdict")
    if run.history_id is not None:
        _err(f"vtui: stored as run {run.history_id} ({run.status}; `vtui history show {run.history_id}`, "
             f"`vtui compare {run.history_id} ...`)")
    elif run.history_error is not None:
        _err(f"vtui: the run was not stored: {run.history_error}")
    if args.result_file and args.repeat == 1 and not args.noise_floor:
        _write_result(args.result_file, out)
    if run.status is RunStatus.CANCELLED:
        return 130
    if run.status is RunStatus.SERVER_DIED:
        # Measured requests are kept above, but a run cut short by a dead server is no
        # result to compare: say so, with the server's own last words when it was ours.
        _err(f"error: the server stopped mid-run ({run.error}); the "
             f"{run.summary.load.completed if run.summary.load else 0} requests that completed before are kept above")
        for line in run.server_log:
            _err(f"  server log: {line}")
        return 1
    if run.status is RunStatus.FAILED:
        _err(f"error: {run.error}")
        return 1
    if run.status is RunStatus.BOX_BOUND and not args.allow_box_bound:
        # Measured to the end, but its latencies carry the box's delay: a script must not take
        # it as the configuration's figures unless it says so (--allow-box-bound).
        _err("vtui: the run is box-bound (see the WARNING above): measure it again on a quieter box, "
             "or pass --allow-box-bound to accept it; exit 3")
        return 3
    return 0


def _listening_pid(url: str) -> int | None:
    """The pid of the server listening on a loopback URL (its process tree is sampled:
    GPU memory share, RSS), None when it is elsewhere or psutil may not say."""
    from urllib.parse import urlsplit

    from engine.server.attach import listening_pid
    from engine.server.supervisor import is_loopback

    parts = urlsplit(url)
    if not (parts.hostname and is_loopback(parts.hostname) and parts.port):
        return None
    try:
        return listening_pid(parts.port)
    except Exception:  # noqa: BLE001 - psutil may refuse (permissions): samples without the tree
        return None


# The parts of the run's stored document the result file carries beside the load figures.
# box_cpu: who had the box's cores over the run (engine.runs.measure.BOX_SHARE_KEY)
RESULT_PARTS = ("server", "cross_check", "stream", "slo_verdict", "energy", "box_cpu", "prefix_cache_reset",
                "flag_changes")


def stored_parts(summary: RunSummary) -> dict[str, object]:
    """The run's parts for the result file, as the history keeps them (``summary.to_json()``:
    a stored row's bytes): ``RESULT_PARTS`` where the run has them, and ``telemetry`` (the
    telemetry document; empty without one), whose ``series`` the caller adds."""
    stored = summary.to_json()
    out: dict[str, object] = {k: stored[k] for k in RESULT_PARTS if k in stored}
    out["telemetry"] = stored.get("telemetry") or {}
    return out




class _Progress:
    """One live line on stderr (rewritten on a terminal, every 5 s otherwise)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def update(self, w: StatsWindow) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.tty and now - self.last < 5.0:
            return
        self.last = now
        bound = f" | CLIENT-BOUND (cpu {w.client_cpu:.0%} of a core, loop lag {w.client_lag_ms:.0f} ms)" \
            if w.client_bound else ""
        line = (f"[{w.elapsed_s:6.1f}s] done {w.total_completed} failed {w.total_failed} "
                f"in flight {w.in_flight} | {w.req_s:.1f} req/s {w.output_tok_s:.0f} tok/s | "
                f"TTFT p50 {w.ttft.p50:.0f} p99 {w.ttft.p99:.0f} ms | "
                f"TPOT p50 {w.tpot.p50:.1f} ms{bound}")
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line)
            sys.stderr.flush()
            self.shown = True
        else:
            _err(line)

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


__all__ = ["add_parser", "build_specs", "print_table", "run"]
