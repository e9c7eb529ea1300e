"""``vtui sweep PRESET...``: run several presets in a row against one model, then compare.

The server restarts only when a preset's flags differ from the running ones. Every
run is stored in the history (``vtui history``); the comparison is printed at the end.
Without ``--model`` the tiny default model is used and each preset's explicit
``[tiny]`` table applies (what it changes is printed). A preset with flags that
cannot apply on this box is refused with the reason (``--skip`` leaves it out,
``--force`` runs it anyway).

With ``--repeat N`` each preset runs N times in alternating rounds (A B C A B C ...) and each
column of the comparison holds a preset's repeats (their median, the noise from them:
"within noise" where the interval of a change holds zero).

  vtui sweep chunked-enable-256 chunked-enable-2048 chunked-disable-2048 --requests 64
  vtui sweep chunked-enable-256 chunked-disable-2048 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Re-exported: tui/commands/tune.py imports it from here (engine.server.tinymodel is light: stdlib only).
from engine.server.tinymodel import is_tiny_model as is_tiny_model
from tui.commands.compare import add_plot_argument, draw, plot_target

if TYPE_CHECKING:
    from engine.presets import FlagValue, Preset
    from engine.runs.rows import NoiseFloor, StoredRequest
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="run several presets in a row and compare them", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("presets", nargs="+", metavar="PRESET", help="preset name or .toml file")
    parser.add_argument("--model", help="model folder, Hugging Face id or a shipped config name "
                        "(`vtui models`; dummy weights) (default: the tiny model)")
    parser.add_argument("--url", help="use this running server as it is (its flags are not changed)")
    parser.add_argument("--set", action="append", default=[], metavar="FLAG=VALUE",
                        help="a vLLM flag added to every preset (e.g. load-format=dummy); repeatable; shown in the runs")
    parser.add_argument("--requests", type=int, help="override every preset's num_requests")
    parser.add_argument("--concurrency", type=int, help="override every preset's concurrency")
    parser.add_argument("--warmup", type=int, help="override every preset's warmup_requests")
    parser.add_argument("--no-live", action="store_true",
                        help="restart the server for every preset whose flags differ; by default a preset that "
                             "differs only in max-num-seqs, max-num-batched-tokens or chunked prefill (within the "
                             "started values) is set live on the running server")
    parser.add_argument("--skip", action="store_true", help="leave out presets that cannot apply here")
    parser.add_argument("--force", action="store_true", help="run presets that cannot apply here anyway")
    parser.add_argument("--allow-long", action="store_true",
                        help="send requests longer than max-model-len (the server's rejections count as failures)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="run every preset N times, in alternating rounds (default: the most repeats "
                             "the presets ask for, else 1)")
    parser.add_argument("--no-history", action="store_true", help="do not store the runs")
    parser.add_argument("--format", choices=("text", "markdown", "csv", "json"), default="text")
    parser.add_argument("--output", "-o", type=Path, help="write the comparison to this file")
    add_plot_argument(parser, "--output", "latency against load over the sweep's runs")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds to wait for vLLM to start")
    parser.set_defaults(func=run)


def resolve_presets(args: argparse.Namespace, tiny: bool) -> list[Preset]:
    """Load, scale for the tiny model, apply command-line overrides, validate."""
    from engine.flags import FlagError
    from engine.flags.cmdline import parse_assignment
    from engine.presets import PresetError, find_preset
    from loadgen.spec import SpecError
    from tui.errors import UserError

    out = []
    for name in args.presets:
        try:
            preset = find_preset(name)
        except PresetError as exc:
            raise UserError(str(exc), "see `vtui preset list`") from None
        if tiny:
            preset = preset.for_tiny_model()
        flags = dict(preset.flags)
        for item in args.set:
            try:
                name, value = parse_assignment(item, "--set")
            except FlagError as exc:
                raise UserError(str(exc), "e.g. --set load-format=dummy") from None
            flags[name] = value
        arrivals = dict(preset.arrivals)
        for key, value in (("num_requests", args.requests), ("concurrency", args.concurrency),
                           ("warmup_requests", args.warmup)):
            if value is not None:
                arrivals[key] = value
        preset = dataclasses.replace(preset, flags=flags, arrivals=arrivals)
        try:
            preset.workload_spec()
            preset.arrival_spec()
        except SpecError as exc:
            raise UserError(f"preset {preset.name}: {exc}", "give the workload in the preset or fix the override") from None
        out.append(preset)
    return out


def run(args: argparse.Namespace) -> int:
    from engine.presets import check_applicable, detect_box
    from engine.runs.compare import compare, render
    from engine.runs.history import HistoryError, open_history
    from engine.runs.noise import box_floor
    from engine.server.tinymodel import ModelError, resolve_model
    from engine.tune.sweep import by_preset, run_sweep
    from tui.commands.compare import write_or_print
    from tui.errors import UserError

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.repeat is not None and args.repeat < 1:
        raise UserError(f"--repeat {args.repeat}: must be 1 or more", "e.g. --repeat 3")
    try:
        resolved = resolve_model(args.model)
    except ModelError as exc:
        raise UserError(str(exc), exc.hint) from None
    model = resolved.path
    # load-format dummy for a shipped architecture. The tiny model's memory defaults are not
    # added: each preset's [tiny] table says what the tiny model runs with.
    extra_flags: dict[str, FlagValue] = dict(resolved.flags)
    tiny = args.url is None and resolved.tiny
    presets = resolve_presets(args, tiny)
    for preset in presets:
        for line in preset.scaled:
            say(f"{preset.name} (tiny model): {line}")
    repeats = args.repeat
    if repeats is None:
        # Rounds alternate over every preset, so the sweep has one count: the most any asks for.
        repeats = max(p.repeats for p in presets)
        if repeats > 1:
            asked = ", ".join(f"{p.name} {p.repeats}" for p in presets)
            say(f"{repeats} rounds: the most repeats the presets ask for ({asked}); --repeat N sets it")

    if args.url is None:
        gpus, backend, config = detect_box(model)
        keep = []
        refused = []
        for preset in presets:
            problems = check_applicable(preset, gpus, config, backend)
            if problems and not args.force:
                refused.append((preset, problems))
                if args.skip:
                    say(f"{preset.name}: skipped: " + "; ".join(str(p) for p in problems))
                    continue
            keep.append(preset)
        if refused and not args.skip and not args.force:
            text = "; ".join(f"{p.name}: {', '.join(str(x) for x in probs)}" for p, probs in refused)
            raise UserError(f"cannot apply on this box ({backend}, {gpus} GPU(s)): {text}",
                            "use --skip to leave them out or --force to try anyway")
        presets = keep
        if not presets:
            raise UserError("no preset left to run", "drop --skip or pick presets that apply here")
    else:
        say("--url: the presets' flags are not applied to an attached server; only their workloads run")

    plot = plot_target(args.plot, args.output, "--output", "load")
    history = None if args.no_history else open_history(say)
    requests: dict[int, list[StoredRequest]] = {}
    floor: NoiseFloor | None = None
    try:
        steps = asyncio.run(run_sweep(presets, model=model, url=args.url, history=history, say=say,
                                      extra_flags=extra_flags, repeats=repeats, live=not args.no_live,
                                      start_timeout=args.start_timeout, check_max_len=not args.allow_long))
        if history is not None:  # each run's requests: the within-run noise where there are no repeats
            with contextlib.suppress(HistoryError):
                requests = {s.run.id: history.requests(s.run.id) for s in steps if s.status.measured}
            with contextlib.suppress(HistoryError):  # a floor that cannot be read: single runs not judged, said so
                floor = box_floor(history)  # single runs: the box's noise, measured or learned from repeats
    except KeyboardInterrupt:
        say("interrupted: the runs so far are in `vtui history`")
        return 130
    finally:
        if history is not None:
            history.close()
    if not steps:
        return 1
    write_or_print(render(compare(by_preset(steps), requests=requests, floor=floor), args.format), args.output)
    if plot is not None:
        from engine.runs.compare import load_points
        from engine.runs.plots import load_steps, save_latency_load

        points = load_steps(load_points([s.run for s in steps]))
        if points:
            draw(lambda: save_latency_load({"sweep": points}, plot, title=f"sweep of {len(steps)} presets"), plot)
        else:
            say(f"no chart: no run completed a request ({plot} not written)")
    return 0 if any(s.status.measured for s in steps) else 1
