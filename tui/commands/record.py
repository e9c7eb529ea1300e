"""``vtui record``: record the traffic that reaches a server, through an OpenAI-compatible proxy.

    vtui record --upstream http://127.0.0.1:8000 --port 8100 --out my-traffic.jsonl
    # point your clients at http://127.0.0.1:8100 instead of :8000; Ctrl-C (or SIGTERM) stops
    vtui record --summary my-traffic.jsonl      # what the recording says about the traffic
    vtui bench --url http://127.0.0.1:8000 --dataset-name trace --dataset my-traffic.jsonl

Only what a client of an OpenAI-compatible server needs is relayed (loadgen.record.RELAYED_PATHS:
/v1/..., /health, /metrics, /tokenize and the like), unchanged; any other path (vtui's /vtui/live,
vLLM's dev routes) gets a 404 that names the proxy. /v1/completions and /v1/chat/completions
are recorded (arrival time, prompt tokens and salted block hashes from the server's /tokenize,
output tokens, sampling parameters, outcome). No prompt text unless --keep-prompts; no header
value ever. Each request's line is flushed as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING

from tui.errors import UserError

if TYPE_CHECKING:
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "record",
        help="record what reaches a server (a proxy), or summarize a recording",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").split("\n\n")[1:]),
    )
    p.add_argument("--upstream", metavar="URL", help="the server to pass requests to (http://HOST:PORT)")
    p.add_argument("--port", type=int, default=8100, help="port the proxy listens on (default 8100)")
    p.add_argument("--host", default="127.0.0.1", help="address the proxy listens on (default 127.0.0.1)")
    p.add_argument("--out", metavar="FILE", help="the recording (JSONL; never written over)")
    p.add_argument("--block-size", type=int, default=16,
                   help="prompt tokens per block hash (default 16, vLLM's KV-cache block)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="count tokens with this tokenizer (a model folder or tokenizer.json) in the proxy, "
                        "instead of the server's /tokenize (chat: the messages' contents, without the template)")
    p.add_argument("--keep-prompts", action="store_true",
                   help="also write the prompts' text (default: token counts and salted hashes only)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds requests in flight get to finish at stop (default 10)")
    p.add_argument("--summary", metavar="FILE",
                   help="print what a recording (or a published trace) says: rate, lengths, reuse, nearest preset")
    p.add_argument("--quiet", "-q", action="store_true", help="no live status line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.summary:
        return _summary(args.summary)
    if not args.upstream or not args.out:
        raise UserError("vtui record needs --upstream URL and --out FILE (or --summary FILE)",
                        "e.g. vtui record --upstream http://127.0.0.1:8000 --port 8100 --out traffic.jsonl")
    from loadgen.aio import run_fast

    return run_fast(_record(args))


def _summary(path: str) -> int:
    from engine.presets import preset_shapes
    from loadgen.record import summarize
    from loadgen.traceformats import TraceError

    try:
        s = summarize(path, preset_shapes())
    except TraceError as exc:
        raise UserError(str(exc), "vtui record --summary reads vtui's recordings and traces and the published "
                        "Mooncake, Bailian, Azure and BurstGPT formats") from None
    print("\n".join(s.lines()))
    return 0


async def _record(args: argparse.Namespace) -> int:
    from loadgen.record import Recorder, RecordError

    def warn(msg: str) -> None:
        print(f"\nvtui record: {msg}", file=sys.stderr)

    codec = None
    if args.tokenizer:
        from loadgen.tokens import TokenizerError, shared_local_tokenizer

        try:
            codec = await asyncio.to_thread(shared_local_tokenizer, args.tokenizer)
        except (TokenizerError, OSError, ValueError) as exc:
            raise UserError(f"--tokenizer {args.tokenizer}: {exc}", "give a model folder or a tokenizer.json") from None
    try:
        rec = Recorder(args.upstream, args.out, host=args.host, port=args.port, block_size=args.block_size,
                       keep_prompts=args.keep_prompts, on_error=warn, codec=codec)
        await rec.start()
    except RecordError as exc:
        raise UserError(str(exc), "") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Its own handlers: a process started in the background by a script ignores SIGINT.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"vtui record: proxy at {rec.url} -> {rec.upstream}; recording to {args.out} (Ctrl-C stops)",
          file=sys.stderr, flush=True)
    live = sys.stderr.isatty() and not args.quiet
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
            if live:
                print(f"\r\x1b[Kvtui record: {rec.state.line()}", end="", file=sys.stderr, flush=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if live:
            print(file=sys.stderr)
        print(f"vtui record: stopping (requests in flight get {args.grace:g} s) ...", file=sys.stderr, flush=True)
        await rec.stop(args.grace)
    print(f"vtui record: {rec.state.line()}; written to {args.out}", file=sys.stderr)
    print(f"vtui record: replay with `vtui bench --url {rec.upstream} --dataset-name trace --dataset {args.out}`",
          file=sys.stderr)
    return 0
