"""How fast random prompts of exact token lengths are built: the old one-prompt-at-a-time
loop (kept here only, for the comparison) against loadgen.tokens.make_prompts, and a
repeated plan served from loadgen.workload's plan cache.

With the tiny model's tokenizer (engine.server.tinymodel.ensure_tiny_model()), for 1,500 prompts
of 1,024 tokens and 2,000 of 128, it prints (the median of --repeat rounds) wall and CPU
seconds (CPU: all threads; the Rust tokenizer encodes a batch on every core), prompts/s,
the texts encoded per prompt (the cost that matters: an encode is ~1 ms of CPU per
1,024-token prompt, most of it the tokenizer's pre-tokenizing regex), the share of prompts
whose encoding (counted again with the per-item encode, as the server counts) has exactly
the planned length, and each path's speed-up over the old one in the same run: the
machines this runs on are shared and their absolute speed moves.

    .venv/bin/python tests/perf/prompt_build.py [--quick] [--repeat 3] [--sizes 1500x1024,2000x128]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadgen.spec import WorkloadSpec  # noqa: E402
from loadgen.tokens import Codec, LocalTokenizer, make_prompts  # noqa: E402
from loadgen.workload import build_requests, clear_plan_cache  # noqa: E402


def old_make_prompt(codec: Codec, rng: random.Random, n: int, head: str = "") -> tuple[str, int]:
    """loadgen.tokens.make_prompt as it was before issue 16 (commit bc05d8f): one prompt
    at a time, about 4 decode + encode round trips each."""
    pool = codec.pool()
    head_len = len(codec.encode(head)) if head else 0
    target = head_len + n
    best: tuple[str, int] | None = None
    for _restart in range(4):
        start = rng.randrange(len(pool))
        ids = [pool[(start + j) % len(pool)] if j % 8 else rng.choice(pool) for j in range(n)]
        for _ in range(12):
            text = head + codec.decode(ids)
            got = len(codec.encode(text))
            if got == target:
                return text, got
            if best is None or abs(got - target) < abs(best[1] - target):
                best = (text, got)
            if got < target:
                if target - got <= max(2, n // 16):
                    padded = text + " the" * (target - got)
                    if len(codec.encode(padded)) == target:
                        return padded, target
                ids = ids + [rng.choice(pool) for _ in range(target - got)]
            else:
                ids = ids[: max(0, len(ids) - (got - target))]
    assert best is not None
    return best


class Counted:
    """Counts the texts the tokenizer encodes (per item or in batches)."""

    def __init__(self, codec: LocalTokenizer) -> None:
        self.n = 0
        encode, encode_batch = codec.encode, codec.encode_batch

        def one(text: str) -> list[int]:
            self.n += 1
            return encode(text)

        def many(texts: list[str]) -> list[list[int]]:
            self.n += len(texts)
            return encode_batch(texts)

        codec.encode = one  # type: ignore[method-assign]  # instance attributes, this script only
        codec.encode_batch = many  # type: ignore[method-assign]


def timed(fn: Callable[[], list[str]], counter: Counted) -> tuple[float, float, int, list[str]]:
    counter.n = 0
    w0, c0 = time.perf_counter(), time.process_time()
    texts = fn()
    return time.perf_counter() - w0, time.process_time() - c0, counter.n, texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1500x1024,2000x128", help="PROMPTSxTOKENS,...")
    ap.add_argument("--quick", action="store_true", help="a tenth of the prompts")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every path (median shown)")
    args = ap.parse_args()
    from engine.server.tinymodel import ensure_tiny_model

    codec = LocalTokenizer(ensure_tiny_model())
    codec.pool()
    counter = Counted(codec)
    rows = []
    for size in args.sizes.split(","):
        count, n = (int(x) for x in size.split("x"))
        if args.quick:
            count = max(10, count // 10)
        spec = WorkloadSpec(input_len=n, output_len=16, seed=1)

        def old(c: int = count, n: int = n) -> list[str]:
            return [old_make_prompt(codec, random.Random(k), n)[0] for k in range(c)]

        def new(c: int = count, n: int = n) -> list[str]:
            return [t for t, _ in make_prompts(codec, random.Random(1), [n] * c)]

        def cold(c: int = count, s: WorkloadSpec = spec) -> list[str]:
            clear_plan_cache()
            return [p.prompt for p in build_requests(s, codec, c)]

        def cached(c: int = count, s: WorkloadSpec = spec) -> list[str]:
            return [p.prompt for p in build_requests(s, codec, c)]

        paths: list[tuple[str, Callable[[], list[str]]]] = [
            ("old: one at a time", old), ("new: make_prompts", new),
            ("new: build_requests, cold", cold), ("new: build_requests, cached", cached)]
        # Rounds of every path in turn, so a busy spell on the shared box hits all of them;
        # the table shows each path's median round.
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name, _ in paths}
        exact: dict[str, float] = {}
        for _rep in range(args.repeat):
            for name, fn in paths:
                wall, cpu, encodes, texts = timed(fn, counter)
                runs[name].append((wall, cpu, encodes))
                if name not in exact:
                    exact[name] = sum(len(codec.encode(t)) + codec.special_offset == n
                                      for t in texts) / len(texts)
                print(f"  {count} x {n}  {name:<28} {wall:7.2f} s", file=sys.stderr, flush=True)
        base = statistics.median(w for w, _, _ in runs[paths[0][0]])
        for name, _ in paths:
            wall = statistics.median(w for w, _, _ in runs[name])
            cpu = statistics.median(c for _, c, _ in runs[name])
            enc = statistics.median(e for _, _, e in runs[name]) / count
            rows.append((f"{count} x {n}", name, wall, cpu, count / wall, enc, exact[name], base / wall))
    print(f"{'prompts x tokens':>16}  {'path':<28} {'wall s':>8} {'cpu s':>7} {'prompts/s':>10} "
          f"{'encodes/prompt':>14} {'exact':>6} {'speed-up':>8}")
    for size, name, wall, cpu, rate, enc, share, up in rows:
        print(f"{size:>16}  {name:<28} {wall:8.3f} {cpu:7.2f} {rate:10.0f} {enc:14.2f} {share:6.1%} {up:7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
