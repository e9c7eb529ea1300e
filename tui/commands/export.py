"""``vtui export``: print a flag set as a docker run line, a vllm serve line, JSON, argv, a
Kubernetes Deployment and Service (``--format k8s``) or a docker compose file (``--format compose``).

Input: flags after ``--`` (``vtui export --model M -- --max-num-seqs 64``), a whole
command line (``--line "vllm serve M ..."``, also docker run and python -m lines), or a
preset file (``--preset FILE``).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.flags import FlagSet, Schema
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="print flags as a docker run / vllm serve line, JSON or argv",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--line", help="a 'vllm serve ...', 'python -m vllm...' or 'docker run ...' line")
    parser.add_argument("--preset", help="a preset TOML file whose [server] flags to export")
    parser.add_argument("--model", help="the model (folder or Hugging Face id) when flags come after --")
    parser.add_argument(
        "--format", choices=("docker", "serve", "json", "argv", "k8s", "compose"), default="docker",
        help="output form (k8s: a Deployment and a Service; compose: a docker compose file)"
    )
    parser.add_argument("--name", default=None, help="k8s/compose: the app's name (default: from the model)")
    parser.add_argument("--secret", default="vllm-secrets",
                        help="k8s: the Secret holding VLLM_API_KEY / HF_TOKEN, referenced by name")
    parser.add_argument("--port", type=int, default=None, help="host port for docker -p (default: the server port)")
    parser.add_argument(
        "--gpus", default=None,
        help="docker GPUs: 'all', a count, or device ids like 0,1; replaces an imported line's"
             " (default: an imported docker line's, else all)"
    )
    parser.add_argument("--image", default=None,
                        help="docker image (default: an imported docker line's, else vllm/vllm-openai:v<installed vLLM>)")
    parser.add_argument("--installed-version", action="store_true",
                        help="tag the image with the installed vLLM's version instead of the imported line's tag")
    parser.add_argument("--no-check", action="store_true", help="export even if validation finds problems")
    parser.set_defaults(func=run, allow_extra=True)


def _gpus(text: str | None) -> str | int | list[int] | None:
    """--gpus as the docker line takes it; None (not given) keeps an imported line's own."""
    if text is None:
        return None
    if text == "all":
        return "all"
    parts = [p for p in text.split(",") if p.strip()]
    if not parts or not all(p.strip().isdigit() for p in parts):
        from tui.errors import UserError

        raise UserError(f"--gpus {text!r} is not 'all', a count or device ids", "write e.g. --gpus all or --gpus 0,1")
    if len(parts) == 1 and "," not in text:
        return int(parts[0])
    return [int(p) for p in parts]


def run(args: argparse.Namespace) -> int:
    import sys

    from engine.flags import CommandLine, FlagError, installed_vllm_version, load_schema, parse_argv, read_command_line, validate
    from tui.errors import UserError

    extra = [a for a in getattr(args, "extra", []) if a != "--"]
    sources = sum(bool(x) for x in (args.line, args.preset, extra or args.model))
    if sources != 1:
        raise UserError(
            "give exactly one input: --line, --preset, or --model with flags after --",
            'e.g. vtui export --line "vllm serve Qwen/Qwen2.5-7B --max-num-seqs 64" --format docker',
        )
    schema = load_schema()
    read: CommandLine | None = None
    try:
        if args.line:
            read = read_command_line(args.line, schema)
            flags = read.flags
            for note in read.notes:
                print(f"note: {note}", file=sys.stderr)
        elif args.preset:
            flags = _from_preset(args.preset, schema)
        else:
            if not args.model:
                raise UserError("flags after -- need --model", "e.g. vtui export --model M -- --max-num-seqs 64")
            flags = parse_argv(["vllm", "serve", args.model, *extra], schema)
    except FlagError as exc:
        raise UserError(str(exc), exc.hint or "check the flag against `vllm serve --help`") from None
    if not args.no_check:
        problems = validate(flags, schema)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(f"{first}{more}", "fix the flag, or pass --no-check to export anyway")
    docker = read.docker if read is not None else None
    version = installed_vllm_version() if args.installed_version else None
    image = args.image
    if image is None and docker is not None:
        image = docker.image_tagged(version)  # k8s and compose keep the imported line's image too
    try:
        if args.format == "docker":
            print(flags.to_docker_line(host_port=args.port, gpus=_gpus(args.gpus), image=args.image, version=version,
                                       docker=docker))
        elif args.format == "serve":
            print(flags.to_serve_line(multiline=True))
        elif args.format in ("k8s", "compose"):
            from engine.runs import deploy

            if args.format == "k8s":
                print(deploy.kubernetes(flags, name=args.name, image=image, version=version, secret=args.secret),
                      end="")
            else:
                print(deploy.compose(flags, name=args.name, image=image, version=version, host_port=args.port),
                      end="")
        elif args.format == "json":
            print(json.dumps(flags.to_dict(), indent=2, ensure_ascii=False))
        else:
            print(json.dumps([flags.model, *flags.to_argv(include_secrets=False)], ensure_ascii=False))
    except FlagError as exc:
        raise UserError(str(exc), exc.hint or "change the value so it can be written on a command line") from None
    return 0


def _from_preset(path: str, schema: Schema) -> FlagSet:
    from engine.flags import FlagSet
    from tui.errors import UserError

    try:
        from engine.presets import load_preset
    except ImportError:
        raise UserError("presets are not available in this build", "use --line or flags after --") from None
    try:
        preset = load_preset(path)
    except Exception as exc:  # PresetError and OSError: both are the user's file
        raise UserError(str(exc), "check the preset file") from None
    flags = getattr(preset, "flags", None)
    if isinstance(flags, FlagSet):
        return flags.with_schema(schema)
    server = getattr(preset, "server", None)
    if isinstance(server, dict):
        return FlagSet.from_dict(server, schema)
    raise UserError(f"{path}: the preset has no server flags", "add a [server] table")
