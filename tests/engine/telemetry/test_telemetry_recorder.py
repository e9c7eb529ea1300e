"""TelemetryRecorder against a local /metrics server and the fake NVML (no NVIDIA GPU here)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from fake_nvml import FakeNvml
from test_telemetry_metrics import CUR_BUCKETS, PREV_BUCKETS, page

from engine.telemetry.nvml import NvmlReader
from engine.telemetry.recorder import TelemetryRecorder


@pytest.fixture
async def growing_server() -> AsyncIterator[tuple[str, list[int]]]:
    """Serves PREV_BUCKETS on the first scrape and CUR_BUCKETS afterwards; counts scrapes."""
    hits = [0]

    async def handler(request: web.Request) -> web.Response:
        hits[0] += 1
        if hits[0] == 1:
            return web.Response(text=page(prompt=100, gen=10, ttft=PREV_BUCKETS))
        return web.Response(text=page(running=4, kv=0.5, prompt=300, gen=110, ttft=CUR_BUCKETS))

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # no public accessor
    yield f"http://127.0.0.1:{port}", hits
    await runner.cleanup()


async def test_recorder_run(growing_server: tuple[str, list[int]]) -> None:
    url, hits = growing_server
    fake = FakeNvml(device_count=2, auto_advance=True)
    fake.cursor = 300
    t0 = time.time()
    async with TelemetryRecorder(url, nvml=NvmlReader(fake, env={}), interval_s=0.05, scrape_interval_s=0.05) as rec:
        assert hits[0] == 1  # the baseline scrape happened before the run starts
        await asyncio.sleep(0.3)
    t1 = time.time()
    assert hits[0] >= 3 and not rec.sampler.running
    s = rec.summary(t0, t1)
    assert [g.index for g in s.gpus] == [0, 1] and s.gpus[0].samples >= 2
    assert s.prompt_tokens == 200 and s.generation_tokens == 100 and s.peak_running == 4
    assert s.server_ttft is not None and s.server_ttft.count == 50 and s.server_ttft.p50 == pytest.approx(0.75)
    result = {"summary": s.to_dict(), "series": rec.store.to_dict(t0, t1)}
    assert set(result["series"]) == {"gpu0", "gpu1", "host", "server"}
    json.dumps(result)


async def test_recorder_without_server_and_without_gpu() -> None:
    async with TelemetryRecorder(None, nvml=NvmlReader(FakeNvml(device_count=0), env={}), interval_s=0.05) as rec:
        await asyncio.sleep(0.15)
    s = rec.summary()
    assert s.gpus == () and s.gpu_unavailable == "NVML found no NVIDIA GPU" and s.host_mean_cpu_pct is not None
    assert s.prompt_tokens is None


async def test_recorder_server_down_gives_stale_samples() -> None:
    rec = TelemetryRecorder("http://127.0.0.1:9", nvml=NvmlReader(FakeNvml(), env={}), scrape_interval_s=0.05)
    await rec.start()
    await asyncio.sleep(0.2)
    await rec.stop()
    await rec.stop()  # idempotent
    assert rec.summary().stale_scrapes >= 2
    assert rec.store.latest_server is not None and "unreachable" in (rec.store.latest_server.reason or "")
