"""engine.session against the shared real vLLM server (``vllm_server``, marked ``vllm``): attach,
a load run in its own thread with history and telemetry, exports of the measured run.

The unit tests (built-in flag schema, no server) are in tests/engine/test_session.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.flags import FlagSet
from engine.session import Session
from loadgen import ArrivalSpec, WorkloadSpec


@pytest.mark.vllm
async def test_attach_run_record_and_export_against_real_vllm(vllm_server: object) -> None:
    server = vllm_server
    flags = FlagSet(model=str(server.model_path), values={})  # type: ignore[attr-defined]
    session = Session(
        flags,
        workload=WorkloadSpec(input_len=32, output_len=16),
        arrivals=ArrivalSpec(concurrency=4, num_requests=24, warmup_requests=3),
        workload_label="small",
    )
    await session.attach(server.base_url)  # type: ignore[attr-defined]
    snap = session.snapshot()
    assert snap.server.state == "ATTACHED"
    assert snap.server.version == "0.32.0"
    assert snap.server.kv_tokens and snap.server.kv_tokens > 0
    assert snap.running_flags is not None  # recovered from the local process

    record = await session.run_workload()
    # box-bound: the shared box held the client up (engine.runs.status), not this test's subject
    assert record.status in ("ok", "box-bound")
    load = record.summary.load
    assert load is not None and load["completed"] == 24
    assert load["median_ttft_ms"] > 0 and load["request_throughput"] > 0
    snap = session.snapshot()
    # Live's last word is the stored record's: the same totals, nothing in flight.
    assert snap.window is not None and snap.window.in_flight == 0
    assert snap.window.total_completed == 24 and snap.window.total_failed == load["failed"]
    # The server's own counters over the measured window (the 3 warm-up requests left out)
    # count exactly the client's tokens.
    server, tel = record.summary.server, record.summary.telemetry
    assert server is not None and server.prompt_tokens == load["total_input_tokens"]
    assert server.generation_tokens == load["total_output_tokens"]
    assert tel is not None and tel.prompt_tokens == server.prompt_tokens  # one figure per run
    assert record.summary.stream is not None and record.summary.stream.warmup_requests == 3
    assert snap.runs[-1] is record and snap.baseline == record.index
    assert snap.comparison is not None and snap.comparison.columns == (record.label,)

    # Telemetry: the host row (no GPU here) and a /metrics scrape arrived.
    for _ in range(100):
        snap = session.snapshot()
        if snap.devices and snap.server_metrics.kv_usage_pct is not None:
            break
        await asyncio.sleep(0.1)
    assert snap.devices and snap.devices[0].name in ("host",) + tuple(d.name for d in snap.devices)
    assert snap.server_metrics.kv_usage_pct is not None

    # The run is in the history as it was measured.
    from engine.runs.history import History

    with History() as history:
        info = history.get_run(record.history_id)
        assert info.status == record.status and info.summary.load == load
        assert len(history.requests(record.history_id)) == 24

    results = json.loads(session.export("results"))
    assert results["completed"] == 24 and results["status"] == record.status
    trace = json.loads(session.export("perfetto"))
    assert trace["traceEvents"]
    await session.close()
