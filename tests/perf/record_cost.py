"""What `vtui record`'s proxy adds to the traffic it records: TTFT added at c=8 and c=64, and its CPU per
request, against loadgen's test server (SSE, no model, a fixed 20 ms first-chunk delay).

Each concurrency runs the same closed-loop workload directly against the server and through the proxy
(`vtui record` in its own process, as a user runs it), alternately, ``--rounds`` times; the added TTFT is
the proxied run's p50/p99 less the direct run's of the same round, and the table gives the median over the
rounds. CPU per request is the proxy process's user+system CPU time over the requests it carried (the
tokenize calls it makes off the path included).

    .venv/bin/python tests/perf/record_cost.py [--requests 400] [--rounds 3] [--out tests/perf/results/...]
    .venv/bin/python tests/perf/record_cost.py --url http://127.0.0.1:8000   # a real server, e.g. `vtui serve`'s

Target (issue 42): p99 added under 1 ms on the test server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from loadgen import ArrivalSpec, LoadRun, WorkloadSpec  # noqa: E402
from loadgen.testserver import ServerConfig, free_port, serve_in_processes  # noqa: E402
from loadgen.tokens import RemoteTokenizer  # noqa: E402


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one(url: str, conc: int, n: int, codec: RemoteTokenizer) -> tuple[float, float]:
    # One tokenizer, the server's own, for both runs: the prompts are built once (the plan cache) and
    # never through the proxy, whose CPU then counts the measured requests alone.
    run = LoadRun(url, None, WorkloadSpec(input_len=64, output_len=16, seed=1),
                  ArrivalSpec(concurrency=conc, num_requests=n, warmup_requests=conc), isolate=True, codec=codec)
    res = await run.run()
    s = res.summary
    assert s.completed == n, (s.completed, res.failures_by_reason)
    p50, p99 = s.at_percentile("ttft", 50), s.at_percentile("ttft", 99)
    assert p50 is not None and p99 is not None
    return p50, p99


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--url", help="a running server (a real vLLM) instead of loadgen's test server")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--tokenizer", help="passed to vtui record (its own tokenizer, no /tokenize calls to the server)")
    ap.add_argument("--out", help="also write the table here (default: tests/perf/results/record_cost.DATE.out.txt; "
                    "the current page is record_cost.md)")
    args = ap.parse_args()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if args.url:
            upstream, what = args.url.rstrip("/"), f"server {args.url}"
        else:
            upstream = stack.enter_context(serve_in_processes(ServerConfig(first_delay_s=0.020, gap_s=0.002),
                                                              processes=1)).url
            what = "test server first chunk 20 ms, 16 tokens 2 ms apart"
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "record", "--upstream", upstream, "--port", str(port),
                                 "--out", str(Path(tmp) / "rec.jsonl"), "-q",
                                 *(("--tokenizer", args.tokenizer) if args.tokenizer else ())],
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert proc.stderr is not None
        assert "proxy at" in proc.stderr.readline()
        proxy = f"http://127.0.0.1:{port}"
        model = httpx.get(upstream + "/v1/models", timeout=10).json()["data"][0]["id"]
        codec = RemoteTokenizer(upstream, model)
        how = f"vtui record --tokenizer {args.tokenizer}" if args.tokenizer else "vtui record (the server's /tokenize)"
        say(f"record_cost: {os.cpu_count()} cores, {what}, {how}, "
            f"{args.requests} requests a run, {args.rounds} rounds, {_dt.date.today()}")
        say(f"{'c':>4} {'direct p50':>11} {'direct p99':>11} {'added p50':>10} {'added p99':>10} {'CPU/req':>9}")
        try:
            for conc in args.concurrency:
                d50, d99, a50, a99, cpu = [], [], [], [], []
                for _ in range(args.rounds):
                    p50d, p99d = asyncio.run(one(upstream, conc, args.requests, codec))
                    before = cpu_s(proc.pid)
                    p50p, p99p = asyncio.run(one(proxy, conc, args.requests, codec))
                    # the proxy carried the run's warm-up and /v1/models too: counted against the measured requests
                    cpu.append((cpu_s(proc.pid) - before) / args.requests * 1000)
                    d50.append(p50d)
                    d99.append(p99d)
                    a50.append(p50p - p50d)
                    a99.append(p99p - p99d)
                say(f"{conc:>4} {statistics.median(d50):>8.2f} ms {statistics.median(d99):>8.2f} ms "
                    f"{statistics.median(a50):>7.2f} ms {statistics.median(a99):>7.2f} ms {statistics.median(cpu):>6.2f} ms"
                    f"   (added p50 by round: {', '.join(f'{x:.2f}' for x in a50)}; "
                    f"p99: {', '.join(f'{x:.2f}' for x in a99)})")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    out = Path(args.out) if args.out else ROOT / "tests/perf/results" / f"record_cost.{_dt.date.today()}.out.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
