"""The ``vtui`` console script.

``vtui`` alone opens the TUI; subcommands run headless. Each subcommand lives in
its own module under ``tui/commands/`` with two functions::

    def add_parser(subparsers) -> None   # registers the subcommand
    def run(args) -> int                 # returns the exit code

Commands stay thin: they parse arguments, call ``engine``/``loadgen`` and print.
Heavy imports (vLLM, textual) happen inside ``run`` so ``vtui --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from tui.errors import UserError, print_error

# Order is the order shown in --help.
COMMANDS = (
    "serve",
    "set",
    "bench",
    "record",
    "sweep",
    "compare",
    "history",
    "preset",
    "export",
    "plan",
    "models",
    "tune",
    "advise",
)


def offer_left_running(args: argparse.Namespace) -> int | None:
    """Before the TUI opens: servers earlier vtuis left running are said, and offered to attach or stop.

    Plain text on the terminal, before Textual takes it. Attach sets ``args.url`` (the TUI
    then attaches at start); stop ends them (only those their records prove vtui started).
    Returns an exit code to end with (quit), or None to open the TUI. Skipped with ``--url``.
    """
    if args.url is not None:
        return None
    from engine.server.supervisor import conflicting_servers, find_left_running, server_devices

    left = find_left_running()
    if not left:
        return None
    for i, entry in enumerate(left, 1):
        print(f"vtui: a server an earlier vtui left running is up: [{i}] {entry.describe()}", file=sys.stderr)
    if not sys.stdin.isatty():
        return None  # no one to ask; a start on its port or GPUs is refused with the same facts
    # A new server may start beside it only on other GPUs (never here on a CPU box).
    alongside = not conflicting_servers("127.0.0.1", None, server_devices(os.environ))
    which = "1" if len(left) == 1 else f"1-{len(left)}"
    options = f"[a] or [{which}] attach  [s] stop {'it' if len(left) == 1 else 'them'}"
    options += "  [c] continue beside it" if alongside else ""
    try:
        answer = input(f"{options}  [q] quit  (a): ").strip().lower() or "a"
    except EOFError:
        answer = "q"
    if answer == "a" or answer.isdigit():
        index = int(answer) - 1 if answer.isdigit() else 0
        if not 0 <= index < len(left):
            print_error(f"no server numbered {answer}", f"choose {which}")
            return 2
        args.url = left[index].url
        return None
    if answer.startswith("s"):
        for entry in left:
            print(f"stopping {entry.url} (pid {entry.pid}) ...", file=sys.stderr)
            if not entry.stop(timeout=15.0):
                print_error(f"the server at {entry.url} (pid {entry.pid}) survived SIGKILL",
                            "it may be stuck in a driver call; see `ps -o pid,stat,wchan -p PID`")
                return 1
        print("stopped", file=sys.stderr)
        return None
    if answer.startswith("c") and alongside:
        return None
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vtui",
        description="Tune a vLLM server live. Without a subcommand, opens the terminal UI.",
    )
    parser.add_argument("--version", action="version", version="vtui 0.1.0")
    ui = parser.add_argument_group("the terminal UI (vtui with no subcommand)")
    ui.add_argument("--model", dest="model", default=None,
                    help="model folder, Hugging Face id or shipped config name (default: the tiny model)")
    ui.add_argument("--preset", dest="preset", default=None, help="preset to load at start (default: online-chat)")
    ui.add_argument("--url", dest="url", default=None, help="attach to this running vLLM server at start")
    ui.add_argument("--live-headroom", dest="live_headroom", type=float, default=None, metavar="F",
                    help="start the server with max-num-seqs and max-num-batched-tokens F times the edited ones, "
                         "set the edited ones live, so raising them later stays live (default 1: off; the "
                         "larger start changes the KV cache, and each run records the started flags)")
    ui.add_argument("--no-start", dest="no_start", action="store_true",
                    help="open without starting the server (s starts it); by default it starts at once")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"tui.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tui.commands.{name}":
                continue  # not built yet
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    # pynvml 13 is a shim over nvidia-ml-py that warns when torch imports it; the
    # warning is for torch's maintainers, not for our users.
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "allow_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    if args.command is None:
        code = offer_left_running(args)
        if code is not None:
            return code
        from tui.app import run_app

        return run_app(args)
    try:
        return int(args.func(args))
    except UserError as exc:
        print_error(str(exc), exc.hint)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `vtui history list | head`: the reader left; not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    # Re-import so UserError has one identity when run as `python -m tui.cli`.
    from tui.cli import main as _main

    sys.exit(_main())
