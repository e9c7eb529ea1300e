"""Workload kinds, exact prompt lengths with the real tiny tokenizer, bad dataset files."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from loadgen.spec import SpecError, WorkloadSpec
from loadgen.tokens import LocalTokenizer
from loadgen.workload import DatasetError, build_requests, sample_lengths


@pytest.fixture(scope="module")
def codec(tiny_model: Path) -> LocalTokenizer:
    return LocalTokenizer(tiny_model)


def test_random_prompts_have_exact_token_lengths(codec: LocalTokenizer) -> None:
    plan = build_requests(WorkloadSpec(input_len=100, output_len=7, seed=1), codec, 20)
    assert len(plan) == 20
    assert {len(codec.encode(p.prompt)) + codec.special_offset for p in plan} == {100}
    assert {p.input_len for p in plan} == {100}
    assert {p.output_len for p in plan} == {7}
    assert len({p.prompt for p in plan}) == 20  # distinct prompts


def test_seed_reproduces_and_changes(codec: LocalTokenizer) -> None:
    spec = WorkloadSpec(input_len=30, output_len=5, length_dist="uniform", range_ratio=0.5, seed=7)
    a = build_requests(spec, codec, 10)
    b = build_requests(spec, codec, 10)
    c = build_requests(WorkloadSpec(**{**spec.__dict__, "seed": 8}), codec, 10)
    assert a == b
    assert a != c


def test_uniform_range_ratio_bounds_like_vllm() -> None:
    spec = WorkloadSpec(input_len=100, output_len=50, length_dist="uniform", range_ratio=0.2)
    lens = sample_lengths(spec, random.Random(0), 4000)
    ins, outs = [i for i, _ in lens], [o for _, o in lens]
    assert min(ins) == 80 and max(ins) == 120
    assert min(outs) == 40 and max(outs) == 60
    assert statistics.mean(ins) == pytest.approx(100, abs=1)


def test_normal_lengths_are_clipped() -> None:
    spec = WorkloadSpec(input_len=100, output_len=20, length_dist="normal", input_std=30,
                        output_std=10, min_len=60, max_len=140)
    lens = sample_lengths(spec, random.Random(0), 4000)
    ins = [i for i, _ in lens]
    assert min(ins) == 60 and max(ins) == 140
    assert statistics.mean(ins) == pytest.approx(100, abs=2)
    assert statistics.pstdev(ins) == pytest.approx(30 * 0.82, rel=0.1)  # clipping shrinks it


def test_shared_prefix_prompts(codec: LocalTokenizer) -> None:
    spec = WorkloadSpec(input_len=40, output_len=4, prefix_len=50, num_prefixes=2, seed=3)
    plan = build_requests(spec, codec, 6)
    heads = {p.prompt[:60] for p in plan}
    assert len(heads) == 2  # two distinct prefixes, shared round-robin
    assert plan[0].prompt[:60] == plan[2].prompt[:60] == plan[4].prompt[:60]
    for p in plan:
        assert len(codec.encode(p.prompt)) == 90


def test_sharegpt_first_turn_and_reply_length(codec: LocalTokenizer, tmp_path: Path) -> None:
    data = [
        {"conversations": [{"from": "human", "value": "the model server token " * 4},
                           {"from": "gpt", "value": "queue gpu cache " * 10}]},
        {"conversations": [{"from": "human", "value": "hi"}]},  # no reply: skipped
        {"conversations": [{"from": "human", "value": "x"},  # too short: filtered
                           {"from": "gpt", "value": "batch memory " * 5}]},
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data))
    plan = build_requests(WorkloadSpec(kind="sharegpt", dataset=str(f)), codec, 3)
    assert {p.prompt for p in plan} == {"the model server token " * 4}
    assert plan[0].output_len == len(codec.encode("queue gpu cache " * 10))
    assert plan[0].input_len == len(codec.encode(plan[0].prompt))


def test_jsonl_prompts_with_optional_output_len(codec: LocalTokenizer, tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello model", "output_len": 9}\n\n{"prompt": "another"}\n')
    plan = build_requests(WorkloadSpec(kind="jsonl", dataset=str(f), output_len=3), codec, 3)
    assert [(p.prompt, p.output_len) for p in plan] == [
        ("hello model", 9), ("another", 3), ("hello model", 9)]


def test_trace_replay_times_scaled(codec: LocalTokenizer, tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"timestamp": 10.0, "input_len": 20, "output_len": 4},
        {"timestamp": 10.5, "input_len": 30, "output_len": 5, "prompt": "given prompt"},
        {"timestamp": 12.0, "input_len": 25, "output_len": 6},
    ]))
    plan = build_requests(WorkloadSpec(kind="trace", dataset=str(f), time_scale=2.0), codec, 10)
    assert [p.at_s for p in plan] == [0.0, 1.0, 4.0]
    assert plan[1].prompt == "given prompt"
    assert len(codec.encode(plan[0].prompt)) == 20
    assert [p.output_len for p in plan] == [4, 5, 6]


def test_chat_sessions_carry_turns(codec: LocalTokenizer) -> None:
    plan = build_requests(WorkloadSpec(kind="chat", endpoint="chat", input_len=10, output_len=4,
                                       num_turns=3), codec, 2)
    assert [p.session for p in plan] == [0, 1]
    assert len(plan[0].messages) == 1 and len(plan[0].next_turns) == 2


@pytest.mark.parametrize(
    ("content", "kind", "match"),
    [
        (None, "jsonl", r"missing\.jsonl: no such file"),
        (b"", "jsonl", r"bad\.jsonl: file is empty"),
        (b'{"prompt": "a"}\n{"prompt": "b"\n', "jsonl", r"bad\.jsonl:2: malformed JSON"),
        (b'{"prompt": "a"}\n\n"text"\n', "jsonl", r"bad\.jsonl:3: expected a JSON object"),
        (b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n', "jsonl", r"bad\.jsonl:2: not UTF-8"),
        (b'{"prompt": "a", "output_len": -1}\n', "jsonl", r"bad\.jsonl:1: 'output_len' must"),
        (b'{"timestamp": 1, "input_len": 3}\n', "trace", r"bad\.jsonl:1: missing 'output_len'"),
        (b'{"timestamp": 2, "input_len": 3, "output_len": 2}\n{"timestamp": 1, "input_len": 3,'
         b' "output_len": 2}\n', "trace", r"bad\.jsonl:2: timestamps must not decrease"),
        (b'[{"conversations": [}]\n', "sharegpt", r"bad\.jsonl:1: malformed JSON"),
    ],
)
def test_bad_dataset_files_name_file_and_line(codec: LocalTokenizer, tmp_path: Path,
                                              content: bytes | None, kind: str, match: str
                                              ) -> None:
    f = tmp_path / ("missing.jsonl" if content is None else "bad.jsonl")
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(DatasetError, match=match):
        build_requests(WorkloadSpec(kind=kind, dataset=str(f)), codec, 4)


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"kind": "nope"}, "workload: kind: must be one of"),
        ({"input-len": "ten"}, "preset.toml: input-len: expected an integer"),
        ({"range_ratio": 1.5}, "range_ratio: must be in"),
        ({"inputlen": 3}, "inputlen: unknown key"),
        ({"kind": "jsonl"}, "dataset: kind 'jsonl' needs a dataset"),
    ],
)
def test_workload_spec_errors_name_the_key(d: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        WorkloadSpec.from_dict(d, source="preset.toml" if "input-len" in d else "workload")


def test_spec_round_trip() -> None:
    w = WorkloadSpec(input_len=256, output_len=64, length_dist="uniform", range_ratio=0.1, seed=4)
    assert WorkloadSpec.from_dict(w.to_dict()) == w
    assert w.to_dict() == {"input_len": 256, "output_len": 64, "length_dist": "uniform",
                           "range_ratio": 0.1, "seed": 4}
