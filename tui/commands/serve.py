"""``vtui serve``: start a vLLM server headless, print its phases and facts, stop it on Ctrl-C.

    vtui serve                                   # the embedded tiny model
    vtui serve --model qwen2.5-7b                # a shipped config, --load-format dummy
    vtui serve --model /models/x -- --max-num-seqs 64 --enable-prefix-caching
    vtui serve --leave-running                   # the server outlives vtui serve; `vtui --url` attaches
    vtui serve --replace                         # stop a server vtui left running there, then start
    vtui serve --stop-left                       # stop every server vtui left running, start nothing

A server vtui serve started ends with it, even on kill -9, unless --leave-running. One left
running is found by the next vtui serve, which never starts a second on its port or GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import time
from typing import TYPE_CHECKING

from tui.errors import UserError

if TYPE_CHECKING:
    from engine.flags import FlagSet
    from engine.server.registry import RegisteredServer
    from engine.telemetry.nvml import NvmlBinding
    from tui.commands import Subparsers

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start a vLLM server and keep it up until Ctrl-C",
        description="Start a vLLM server (the embedded tiny model unless --model), print its startup "
        "phases and facts, keep it up until Ctrl-C, then stop it and everything it started. "
        "vLLM flags go after `--`.",
    )
    parser.add_argument("--model", help="model folder, Hugging Face id, or a shipped config name (`vtui models`)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--yes", action="store_true",
                        help="bind a non-loopback --host without --api-key without asking")
    parser.add_argument("--port", type=int, help="port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for ready (default 600)")
    parser.add_argument("--leave-running", action="store_true",
                        help="on exit (even kill -9), leave the server running; a later vtui finds it")
    parser.add_argument("--replace", action="store_true",
                        help="stop a server vtui left running on the same port or GPUs, then start")
    parser.add_argument("--stop-left", action="store_true",
                        help="stop every server vtui left running (only those its records prove it started), then exit")
    parser.add_argument("--force", action="store_true",
                        help="start even when the planner says the flags cannot fit the GPU's memory")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every server log line")
    parser.add_argument("--no-validate", action="store_true", help="skip vtui's flag checks (vLLM still checks)")
    parser.add_argument(
        "--launcher", default="", help="argv prefix for the server command, e.g. 'env CUDA_VISIBLE_DEVICES=1'"
    )
    parser.set_defaults(func=run, allow_extra=True)


def build_flags(args: argparse.Namespace) -> FlagSet:
    from engine.flags import FlagError, load_schema, parse_argv, validate
    from engine.server.tinymodel import ModelError, resolve_model

    extra = list(getattr(args, "extra", []) or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        model = resolve_model(args.model)
    except ModelError as exc:
        raise UserError(str(exc), exc.hint) from None
    # What comes with the model (tiny defaults, load-format dummy) is visible in the command
    # line, and a flag the user gives after `--` wins over it.
    argv = model.serve_argv(extra)
    # On a data folder without the installed vLLM's flag schema, reading it (about 10 s) runs
    # beside the launch instead of before it: the built-in schema types the flags meanwhile,
    # and vLLM's own parser still checks them as it starts (tests/perf/start_cost.py).
    schema = load_schema(wait=False)
    try:
        flags = parse_argv(argv, schema)
    except FlagError as exc:
        raise UserError(str(exc), exc.hint or "Check the vLLM flags after `--`.") from None
    if not args.no_validate:
        problems = validate(flags, schema)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(f"{first}{more}", first.hint or "Fix the flag, or pass --no-validate to let vLLM decide.")
    return flags


def run(args: argparse.Namespace) -> int:
    if args.stop_left:
        return stop_left_running()
    from engine.server.supervisor import server_devices
    from engine.values import as_int

    flags = build_flags(args)
    port = args.port if args.port is not None else flags.get("port")
    devices = server_devices(os.environ, shlex.split(args.launcher))
    code = check_left_running(args, args.host, as_int(port) if port is not None else None, devices)
    if code is not None:
        return code
    return asyncio.run(_serve(args, flags))


def stop_left_running() -> int:
    """``vtui serve --stop-left``: stop what earlier vtuis left running; 1 when something survived."""
    from engine.server.supervisor import find_left_running

    left = find_left_running()
    if not left:
        _print("no server left running by vtui")
        return 0
    failed = 0
    for entry in left:
        failed += not _stop_entry(entry)
    return 1 if failed else 0


def _stop_entry(entry: RegisteredServer) -> bool:
    _print(f"stopping {entry.describe()} ...")
    if entry.stop(timeout=15.0):
        _print(f"stopped the server at {entry.url}")
        return True
    print(f"error: the server at {entry.url} (pid {entry.pid}) survived SIGKILL", file=sys.stderr)
    print("hint: it may be stuck in the kernel (a GPU driver call); see `ps -o pid,stat,wchan -p PID`",
          file=sys.stderr)
    return False


def check_left_running(args: argparse.Namespace, host: str, port: int | None, devices: str | None) -> int | None:
    """Before a start: say what earlier vtuis left running; never start a second on its port or GPUs.

    Returns an exit code when ``vtui serve`` should end here (attach chosen, quit, a stop that
    failed), None to go on. Without a terminal, a conflict is an error unless ``--replace``.
    """
    from engine.server.supervisor import conflicting_servers, find_left_running

    conflicts = conflicting_servers(host, port, devices)
    clashing = {entry.pid for entry, _ in conflicts}
    for entry in find_left_running():
        if entry.pid not in clashing:
            _print(f"note: a server vtui left running is up (another port and GPU): {entry.describe()}")
    if not conflicts:
        return None
    entry, what = conflicts[0]
    if not args.replace and not sys.stdin.isatty():
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise UserError(
            f"a server vtui left running already uses {what}: {entry.url} (pid {entry.pid}){more}; "
            "vtui serve does not start a second one",
            f"attach to it with `vtui --url {entry.url}`, or stop it and start a new one with "
            "`vtui serve --replace` (`vtui serve --stop-left` only stops it)",
        )
    for other, other_what in conflicts:
        _print(f"a server vtui left running already uses {other_what}: {other.describe()}")
    if not args.replace:
        try:
            answer = input("[a] attach to it  [s] stop it and start a new one  [q] quit  (q): ").strip().lower()
        except EOFError:
            answer = "q"
        if answer.startswith("a"):
            _print(f"attach with: vtui --url {entry.url}")
            return 0
        if not answer.startswith("s"):
            _print("nothing started")
            return 0
    for other, _ in conflicts:
        if not _stop_entry(other):
            return 1
    return None


def _confirm_public_bind(args: argparse.Namespace, flags: FlagSet) -> bool:
    """Whether the user agreed to expose a server without an API key to the network.

    Asks on a terminal; without one, only ``--yes`` agrees (otherwise the supervisor
    refuses with its own error and hint)."""
    from engine.server.supervisor import bind_needs_confirmation

    if not bind_needs_confirmation(args.host, has_api_key="api-key" in flags.values):
        return False
    warning = (f"warning: --host {args.host} without --api-key lets anyone who can reach this machine "
               "use the server")
    if args.yes:
        print(warning, file=sys.stderr, flush=True)
        return True
    if not sys.stdin.isatty():
        return False
    print(warning, file=sys.stderr, flush=True)
    answer = input("bind it anyway? [y/N] ").strip().lower()
    return answer in ("y", "yes")


def _print(text: str = "") -> None:
    print(text, flush=True)


def check_fits(flags: FlagSet, *, force: bool = False, nvml_module: NvmlBinding | None = None) -> None:
    """Refuse at once a launch the planner shows cannot fit the largest visible GPU's memory
    (vLLM would take a minute and more to fail); nothing to check without a GPU, or with
    ``force``. ``nvml_module``: the NVML binding (tests pass a fake)."""
    if force:
        return
    from engine.server.planner import refusal_for
    from engine.telemetry.nvml import NvmlReader

    reader = NvmlReader(module=nvml_module)
    try:
        totals = [g.mem_total_bytes for g in reader.sample() if g.available and g.mem_total_bytes]
    finally:
        reader.close()
    if not totals:
        return
    refusal = refusal_for(flags, max(totals))
    if refusal is not None:
        raise UserError(f"this launch cannot fit: {refusal.reason}", f"{refusal.hint}; --force starts it anyway")


async def _serve(args: argparse.Namespace, flags: FlagSet) -> int:
    from engine.errors import StartupError
    from engine.server.logparse import Phase
    from engine.server.supervisor import ServerEvent, ServerState, Supervisor

    check_fits(flags, force=args.force)
    sup = Supervisor(
        flags,
        host=args.host,
        port=args.port,
        launcher=shlex.split(args.launcher),
        leave_running=args.leave_running,
        allow_public=_confirm_public_bind(args, flags),
    )
    t0 = time.monotonic()
    died = asyncio.Event()

    def on_event(event: ServerEvent) -> None:
        if event.kind == "log" and args.verbose and event.line is not None:
            _print(f"  | {event.line}")
        elif event.kind == "log" and event.parsed is not None and event.parsed.is_error:
            # While starting, the classified error at the end says it better than the traceback;
            # while stopping, vLLM's shutdown noise is expected. Errors while serving matter.
            if sup.state is ServerState.READY:
                _print(f"  ! {event.parsed.message}")
        elif event.kind == "phase" and event.phase is not None and event.phase is not Phase.READY:
            _print(f"[{time.monotonic() - t0:6.1f} s] {event.phase.label}")
        elif event.kind == "state" and event.state is ServerState.DEAD:
            died.set()

    sup.subscribe(on_event)
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    # Ctrl-C, SIGTERM and SIGHUP take one path: cancel, then stop the server in `finally`.
    # (asyncio.run's own Ctrl-C handling is left out: a CI run once saw it not end within 10 s.)
    for sig in STOP_SIGNALS:
        if main is not None:
            loop.add_signal_handler(sig, main.cancel)
    _print(f"vtui: {shlex.join(sup.build_command(args.port or 0)).replace(' --port 0', ' --port <free>')}")
    try:
        try:
            facts = await sup.start(timeout=args.timeout)
        except StartupError as exc:
            print("\n".join(exc.report()), file=sys.stderr)
            return 1
        _print(f"[{time.monotonic() - t0:6.1f} s] ready at {sup.base_url}  (model: {sup.model})")
        for name, value in facts.to_dict().items():
            if value is not None and name != "non_default_args":
                _print(f"  {name:24} {value}")
        _print(f"  {'log':24} {sup.log_path}")
        _print("Ctrl-C to stop" + (" (the server stays up: --leave-running)" if args.leave_running else ""))
        await died.wait()
        err = sup.error
        print(f"error: {err}", file=sys.stderr)
        said = str(getattr(err, "vllm_line", "") or "")
        if said:
            print(f"  vLLM said: {said}", file=sys.stderr)
        print(f"hint: {getattr(err, 'hint', None) or 'restart it'}  (log: {sup.log_path})", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        return 130
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        if args.leave_running and sup.state is ServerState.READY:
            _print(f"left running at {sup.base_url} (pid {sup.pid}): `vtui --url {sup.base_url}` attaches to it, "
                   "`vtui serve --stop-left` stops it")
        elif sup.state is not ServerState.STOPPED:
            _print("stopping ...")
            await asyncio.shield(sup.stop())
            _print("stopped; nothing left running")
