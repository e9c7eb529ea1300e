"""``vtui preset``: list, show, check and save scenario presets.

  vtui preset list
  vtui preset show NAME [--tiny]
  vtui preset check NAME [--model DIR] [--gpus N] [--backend cpu|cuda]
  vtui preset save NAME [--like PRESET] [--workload KEY=VALUE ...] [--description TEXT] -- --max-num-seqs 64 ...
  vtui preset save NAME --from-flags="--max-num-seqs 64 --enable-chunked-prefill" --workload concurrency=8
"""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "preset", help="list, show, check and save scenario presets", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="preset_cmd", metavar="ACTION")
    sub.add_parser("list", help="shipped and user presets")
    show = sub.add_parser("show", help="print a preset's TOML")
    show.add_argument("name")
    show.add_argument("--tiny", action="store_true", help="as applied to the tiny default model ([tiny] table)")
    check = sub.add_parser("check", help="which flags cannot apply on this box, and why")
    check.add_argument("name")
    check.add_argument("--model", help="model folder (its config.json is checked); default: the tiny model")
    check.add_argument("--gpus", type=int, default=None, help="GPU count (default: what NVML sees)")
    check.add_argument("--backend", choices=("cpu", "cuda"), default=None, help="default: cuda if a GPU is seen")
    save = sub.add_parser("save", help="save flags and a workload as a user preset")
    save.add_argument("name")
    save.add_argument("--from-flags", default="", metavar="TEXT",
                      help='vLLM flags as one string (use = : --from-flags="--max-num-seqs 64"); also after --')
    save.add_argument("--like", metavar="PRESET", help="copy [workload], [arrivals] and [slo] from this preset")
    save.add_argument("--workload", action="append", default=[], metavar="KEY=VALUE",
                      help="a workload or arrivals setting (input_len=256, concurrency=8, num_requests=100); repeatable")
    save.add_argument("--description", default="")
    save.add_argument("--model", default="default", help='the model the preset expects ("default" = the tiny model)')
    save.add_argument("--force", action="store_true", help="replace an existing user preset")
    parser.set_defaults(func=run, allow_extra=True)


def run(args: argparse.Namespace) -> int:
    from engine import presets as pr
    from tui.errors import UserError

    cmd = args.preset_cmd or "list"
    extra = [a for a in getattr(args, "extra", []) if a != "--"]
    if extra and cmd != "save":
        raise UserError(f"unexpected arguments: {' '.join(extra)}", "flags after -- belong to `vtui preset save`")
    try:
        if cmd == "list":
            return _list()
        if cmd == "show":
            preset = pr.find_preset(args.name)
            if args.tiny:
                preset = preset.for_tiny_model()
                for line in preset.scaled:
                    print(f"# tiny: {line}")
            print(pr.dumps_toml(preset.to_dict()), end="")
            return 0
        if cmd == "check":
            return _check(args)
        if cmd == "save":
            return _save(args, extra)
    except pr.PresetError as exc:
        raise UserError(str(exc), "fix the file or pick a name from `vtui preset list`") from None
    raise UserError(f"unknown action {cmd!r}", "one of list, show, check, save")


def _list() -> int:
    from engine import presets as pr

    good, errors = pr.scan_presets()
    width = max((len(p.name) for p in good), default=4)
    for preset in good:
        where = "user" if preset.is_user else "shipped"
        flags = " ".join(preset.argv())
        print(f"{preset.name:<{width}}  {where:<7}  {flags}")
    for err in errors:
        print(f"(not loaded) {err}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from engine import presets as pr

    preset = pr.find_preset(args.name)
    model = args.model
    if model is None:
        from engine.server.tinymodel import ensure_tiny_model

        model = str(ensure_tiny_model())
    gpus, backend, config = pr.detect_box(model)
    gpus = args.gpus if args.gpus is not None else gpus
    backend = args.backend or backend
    problems = pr.check_applicable(preset, gpus, config, backend)
    tiny_note = ""
    if args.model is None and problems:
        tiny = preset.for_tiny_model()
        if not pr.check_applicable(tiny, gpus, config, backend):
            tiny_note = "on the tiny default model its [tiny] table applies: " + "; ".join(tiny.scaled)
    print(f"{preset.name} on {backend} with {gpus} GPU(s), model {model}:")
    for p in problems:
        print(f"  cannot apply: {p}")
    if not problems:
        print("  every flag applies")
    if tiny_note:
        print(f"  {tiny_note}")
    return 1 if problems and not tiny_note else 0


def _parse_kv(items: list[str]) -> tuple[dict[str, object], dict[str, object]]:
    """KEY=VALUE items into ([workload], [arrivals]) by which loadgen spec knows the key."""
    import dataclasses

    from engine.flags.cmdline import parse_flag_args
    from loadgen.spec import ArrivalSpec, WorkloadSpec
    from tui.errors import UserError

    wl_keys = {f.name for f in dataclasses.fields(WorkloadSpec)}
    ar_keys = {f.name for f in dataclasses.fields(ArrivalSpec)}
    workload: dict[str, object] = {}
    arrivals: dict[str, object] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise UserError(f"--workload {item!r} is not KEY=VALUE", "e.g. --workload concurrency=8")
        value = parse_flag_args([f"--x={text}"])["x"]
        if key == "seed":
            workload[key] = arrivals[key] = value
        elif key in wl_keys:
            workload[key] = value
        elif key in ar_keys:
            arrivals[key] = value
        else:
            raise UserError(f"unknown workload key {key!r}", f"known: {', '.join(sorted(wl_keys | ar_keys))}")
    return workload, arrivals


def _save(args: argparse.Namespace, extra: list[str]) -> int:
    from engine import presets as pr
    from engine.flags import FlagError, load_schema, parse_argv
    from tui.errors import UserError

    tokens = shlex.split(args.from_flags) + extra
    try:
        flag_set = parse_argv(["vllm", "serve", "MODEL", *tokens], load_schema())
    except FlagError as exc:
        raise UserError(str(exc), exc.hint or "check the flag against `vllm serve --help`") from None
    flags = dict(flag_set.values)
    workload: dict[str, object] = {}
    arrivals: dict[str, object] = {}
    slo = None
    if args.like:
        like = pr.find_preset(args.like)
        workload, arrivals, slo = dict(like.workload), dict(like.arrivals), like.slo
    more_w, more_a = _parse_kv(args.workload)
    workload.update(more_w)
    arrivals.update(more_a)
    if not flags and not workload and not arrivals:
        raise UserError("nothing to save", 'give flags (--from-flags="--max-num-seqs 64" or after --) and/or --workload')
    preset = pr.preset_from_flags(
        args.name, {k: list(v) if isinstance(v, tuple) else v for k, v in flags.items()}, workload or None,
        arrivals or None, description=args.description, model=args.model, slo=slo,
    )
    path = pr.save_user_preset(preset, overwrite=args.force)
    print(f"saved {preset.name} to {path}")
    return 0
