"""The workload and arrival arguments of ``vtui bench`` and the specs they make (a preset's,
with the flags given on top)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tui.commands.output import err as _err
from tui.errors import UserError

if TYPE_CHECKING:
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The "workload" and "arrivals" argument groups."""
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


__all__ = ["add_workload_arguments", "build_specs"]
