"""``vtui set``: change scheduler limits on a running server vtui started, without a restart.

    vtui set --url http://127.0.0.1:8000 max-num-seqs=2
    vtui set --url URL max-num-batched-tokens=512 enable-chunked-prefill=false
    vtui set --url URL            # show the started and live limits

Returns as soon as the engine took the change (requests already running finish under the limits
they were admitted with). Exit 2 with the reason when the change cannot be made live.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import TYPE_CHECKING

from tui.errors import UserError

if TYPE_CHECKING:
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    from engine.server.livehook import LIVE_FLAGS

    parser = subparsers.add_parser(
        "set",
        help="change max-num-seqs, max-num-batched-tokens or chunked prefill live (no restart)",
        description="Change live scheduler limits on a running vLLM server that vtui started, between two "
        f"engine steps and without a restart. Live flags: {', '.join(LIVE_FLAGS)}; never above the value the "
        "server was started with. The server's API key, if it has one, is read from $VLLM_API_KEY.",
    )
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("assignments", nargs="*", metavar="FLAG=VALUE",
                        help="e.g. max-num-seqs=2 enable-chunked-prefill=false; none: show the limits")
    parser.set_defaults(func=run)


def _show(values: dict[str, object]) -> str:
    return "  ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())


def run(args: argparse.Namespace) -> int:
    from engine.server.livelimits import LiveRefused, LiveUnavailable, change_live, parse_assignments, read_live

    try:
        changes = parse_assignments(list(args.assignments))
    except ValueError as exc:
        raise UserError(str(exc), "e.g. vtui set --url URL max-num-seqs=2") from None
    key = os.environ.get("VLLM_API_KEY") or None
    try:
        if not changes:
            state = asyncio.run(read_live(args.url, key))
            print(f"{args.url}: vLLM {state.vllm}, {state.engines} engine(s), {state.running} running, "
                  f"{state.waiting} waiting")
            print(f"  started  {_show(state.started)}")
            print(f"  live     {_show(state.live)}")
            return 0
        result = asyncio.run(change_live(args.url, changes, key))
    except LiveUnavailable as exc:
        hint = ("is the server up at that URL? (vtui serve starts one)" if str(exc).startswith("cannot reach")
                else "start the server with vtui (vtui serve, or the TUI) to change it live")
        raise UserError(str(exc), hint) from None
    except LiveRefused as exc:
        raise UserError(f"not changed: {exc}", "nothing was changed on the server") from None
    changed = result.changed
    took = f"{result.seconds * 1000:.0f} ms"
    if not changed:
        print(f"{args.url}: already {_show(changes)} (checked in {took})")
    else:
        for name, (old, new) in changed.items():
            print(f"{name}: {_show({'': old})[1:]} -> {_show({'': new})[1:]}")
        print(f"taken by the engine in {took}; {result.after.running} running, {result.after.waiting} waiting "
              "(those running finish under the limits they were admitted with)")
    return 0
