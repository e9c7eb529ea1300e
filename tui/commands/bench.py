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
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tui.commands.output import (
    ProgressLine,
    cross_check_line,
    print_floor,
    print_repeats,
    print_table,
    summary_lines,
)
from tui.commands.output import (
    err as _err,
)
from tui.commands.workload import add_workload_arguments, build_specs
from tui.errors import UserError

if TYPE_CHECKING:
    from engine.runs.measure import MeasuredRun
    from engine.server.supervisor import Supervisor
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec
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
    add_workload_arguments(p)
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


async def _bench(args: argparse.Namespace, workload: WorkloadSpec, arrivals: ArrivalSpec, slo: SLO | None) -> int:
    from engine.runs.history import open_history
    from engine.runs.measure import RunHandle, RunPlan, Target, measure, with_live_limits
    from engine.runs.resultdoc import result_document
    from engine.runs.series import Slot, run_series
    from engine.server.attach import listening_pid_of_url

    sup = None
    if args.url:
        target = Target(args.url, args.model, tokenizer=args.tokenizer,
                        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
                        root_pid=listening_pid_of_url(args.url), model_label=args.model or args.url)
        target = await with_live_limits(target)
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
        progress = ProgressLine(args.quiet)
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
            _write_result(args.result_file, {"repeats": [result_document(r) for r in runs], "spread": spread})
    if floor_doc is not None and args.result_file:
        _write_result(args.result_file, {"runs": [result_document(r) for r in runs], "noise_floor": floor_doc})
    return code


def _write_result(name: str, doc: dict[str, object]) -> None:
    from engine.runs.resultdoc import write_result

    _err(f"vtui: result written to {write_result(name, doc)}")


def _report(args: argparse.Namespace, run: MeasuredRun) -> int:
    """Print one measured run (the table, telemetry, the server check) and give its exit code."""
    from engine.runs.crosscheck import CrossCheck
    from engine.runs.flagchange import TWO_CONFIGURATIONS, changes_text, flag_changes_of
    from engine.runs.measure import box_share_of
    from engine.runs.resultdoc import result_document
    from engine.runs.status import RunStatus

    if run.result is None:  # refused before any load was sent
        raise UserError(run.error or "the run failed", run.hint or "check --url/--dataset")
    out = result_document(run)
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


__all__ = ["add_parser", "build_specs", "print_table", "run"]
