"""``vtui bench``'s result file and summary lines for stored run documents.

The lines printed under the table read the typed telemetry (``RunSummary.telemetry``);
the result file carries the run's parts as the history keeps them. Both are pinned to what the
read-by-key bench wrote for the same documents (recorded 2026-12-03, before the typed read).
"""

from __future__ import annotations

import json

from engine.runs.resultdoc import RESULT_PARTS, stored_parts
from engine.runs.summary import RunSummary
from engine.telemetry.summary import summarize
from tests.engine.telemetry.test_telemetry_summary import build_store
from tui.commands.output import summary_lines

GIB = 1024**3
LOAD = {"completed": 96, "failed": 0, "total_output_tokens": 6144, "request_throughput": 9.6,
        "output_throughput": 614.4, "median_ttft_ms": 38.0, "p99_ttft_ms": 90.0}
SOL = {"gpu": "H200", "batch": 2.0, "context": 96.0, "step_ms": 9.0, "floor_ms": 3.25, "bound": "memory", "mbu": 0.34,
       "prefill_mfu": 0.12, "launch_bound": False, "source": "m", "line": "decode at 36% of the floor", "reason": None}
SERVER = {"server_ttft": {"p50_ms": 12.0, "p90_ms": 18.4, "p99_ms": 19.84, "mean_ms": 11.0, "count": 24.0},
          "server_itl": None, "server_e2e": {"p50_ms": 80.0, "p90_ms": 95.0, "p99_ms": 99.0, "mean_ms": 81.5,
                                             "count": 24.0},
          "prompt_tokens": 3072.0, "generation_tokens": 1536.0, "prefix_hit_rate": 0.0, "preemptions": 0.0,
          "t0": 100.0, "t1": 109.0}


def documents() -> dict[str, dict[str, object]]:
    """Stored documents: measure's (GPUs, speed of light, energy, the server's window), one whose
    speed of light is only a reason, and an older CPU-only row with integer figures and a key
    this vtui does not know."""
    tel = summarize(build_store(), 100.0, 109.0, idle=(100.0, 101.0)).to_dict()
    energy = {"joules": 7200.0, "j_per_token": 1.171875, "j_per_request": 75.0, "mean_power_w": 800.0,
              "idle_power_w": 790.0, "estimated": False, "reason": None}
    return {
        "gpu": {"load": LOAD, "telemetry": {**tel, "speed_of_light": SOL}, "energy": energy, "server": SERVER,
                "slo_verdict": {"met": False, "why": "p99 TTFT 90 ms > 50 ms"}},
        "reason-only": {"load": LOAD, "telemetry": {**tel, "preemptions": 3, "speed_of_light": {"reason": "no GPU"}},
                        "energy": {"joules": None, "reason": "no reading"}, "server": {}},
        "older-cpu": {"load": LOAD, "telemetry": {
            "gpus": [], "gpu_unavailable": "NVML Shared Library Not Found", "server_peak_rss_bytes": 3 * GIB,
            "server_mean_cpu_pct": 180, "server_front_cpu_pct": 73.0, "server_front_cpu_p90": 102.0,
            "server_front_procs": 2, "peak_kv_cache_usage": 0.5, "peak_running": 3, "peak_waiting": 0,
            "preemptions": 0, "newer_key": [1, 2]}},
    }


# What the read-by-key bench printed under the table for each document.
LINES = {
    "gpu": [
        "telemetry: GPU mem peak 19.0 GiB, util mean 50%; API server CPU mean 94%, p90 98% (busiest of 2 API "
        "server processes); KV cache peak 40.0%, running peak 3.0, waiting peak 0.0, preemptions 2.0",
        "energy: 1.172 J/output token, 75.0 J/request, 7200 J over the window at 800 W (idle 790 W)",
        "speed of light: decode at 36% of the floor",
    ],
    "reason-only": [
        "telemetry: GPU mem peak 19.0 GiB, util mean 50%; API server CPU mean 94%, p90 98% (busiest of 2 API "
        "server processes); KV cache peak 40.0%, running peak 3.0, waiting peak 0.0, preemptions 3",
        "energy: n/a (no reading)",
        "speed of light: no GPU",
    ],
    "older-cpu": [
        "telemetry: no GPU (NVML Shared Library Not Found); server RSS peak 3.0 GiB, server CPU mean 180%; "
        "API server CPU mean 73%, p90 102% (busiest of 2 API server processes); KV cache peak 50.0%, "
        "running peak 3, waiting peak 0, preemptions 0",
    ],
}


def test_summary_lines_read_the_typed_telemetry_as_the_keys_did() -> None:
    for name, doc in documents().items():
        assert summary_lines(RunSummary.from_json(doc, name)) == LINES[name], name
    assert summary_lines(RunSummary()) == [  # a run without telemetry
        "telemetry: no GPU (no GPU); server RSS peak n/a, server CPU mean n/a; KV cache peak n/a, "
        "running peak None, waiting peak None, preemptions None"]


def test_result_file_carries_the_stored_parts_byte_for_byte() -> None:
    for name, doc in documents().items():
        parts = stored_parts(RunSummary.from_json(doc, name))
        want = {k: doc[k] for k in RESULT_PARTS if k in doc} | {"telemetry": doc["telemetry"]}
        assert json.dumps(parts, indent=2) == json.dumps(want, indent=2), name
    assert stored_parts(RunSummary()) == {"telemetry": {}}
