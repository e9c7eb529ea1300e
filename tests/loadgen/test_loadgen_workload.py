"""Workload kinds, exact prompt lengths with the real tiny tokenizer, bad dataset files."""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Hashable
from pathlib import Path

import pytest

import loadgen.workload as workload
from loadgen.spec import SpecError, WorkloadSpec
from loadgen.tokens import LocalTokenizer, make_prompts
from loadgen.workload import DatasetError, build_requests, clear_plan_cache, sample_lengths


@pytest.fixture(scope="module")
def codec(tiny_model: Path) -> LocalTokenizer:
    return LocalTokenizer(tiny_model)


@pytest.fixture(autouse=True)
def fresh_plan_cache() -> None:
    clear_plan_cache()


def _common_start(texts: list[str]) -> str:
    first = min(texts)
    last = max(texts)
    n = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first))
    return first[:n]


class PlainCodec:
    """Only the Codec protocol's four members: no batch methods, no cache key (a tokenizer
    reached some other way). Counts the encode calls."""

    def __init__(self, inner: LocalTokenizer) -> None:
        self.inner = inner
        self.encodes = 0

    def encode(self, text: str) -> list[int]:
        self.encodes += 1
        return self.inner.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)

    def pool(self) -> list[int]:
        return self.inner.pool()

    @property
    def special_offset(self) -> int:
        return self.inner.special_offset


class KeyedCodec(PlainCodec):
    """With batch methods and a cache key, like LocalTokenizer; counts every encode."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self.encodes += len(texts)
        return self.inner.encode_batch(texts)

    def decode_batch(self, seqs: list[list[int]]) -> list[str]:
        return self.inner.decode_batch(seqs)

    @property
    def cache_key(self) -> Hashable:
        return self.inner.cache_key


def test_prompts_are_exact_over_many_seeds_and_lengths(codec: LocalTokenizer) -> None:
    lens = [1, 2, 3, 7, 16, 33, 100, 255, 513, 1024] * 3
    for seed in range(6):
        out = make_prompts(codec, random.Random(seed), lens)
        assert [got for _, got in out] == lens
        assert [len(codec.encode(text)) for text, _ in out] == lens  # the server's count
        assert len({text for text, _ in out}) == len(lens)


def test_planned_input_lengths_are_the_servers_counts(codec: LocalTokenizer) -> None:
    for seed in range(5):
        spec = WorkloadSpec(input_len=200, output_len=8, length_dist="uniform", range_ratio=0.95,
                            seed=seed)
        plan = build_requests(spec, codec, 40)
        planned = [i for i, _ in sample_lengths(spec, random.Random(seed), 40)]
        assert [p.input_len for p in plan] == planned
        assert [len(codec.encode(p.prompt)) + codec.special_offset for p in plan] == planned


def test_a_plan_for_a_seed_drawn_for_one_run_is_not_kept(codec: LocalTokenizer) -> None:
    """Issue 35: every run without a seed of its own draws one (WorkloadSpec.with_run_seed), and
    the cache kept each such run's plan, never asked for again; a seed set by hand is kept."""
    from loadgen import workload

    drawn = WorkloadSpec(input_len=32, output_len=8).with_run_seed()
    first = build_requests(drawn, codec, 20)
    assert not workload._cache
    by_hand = build_requests(WorkloadSpec(input_len=32, output_len=8, seed=drawn.seed), codec, 20)
    assert len(workload._cache) == 1 and by_hand == first  # the same prompts, now kept


def test_a_bare_tokenizer_json_builds_exact_prompts(tiny_model: Path) -> None:
    bare = LocalTokenizer(tiny_model / "tokenizer.json")  # the tokenizers package, no transformers
    out = make_prompts(bare, random.Random(0), [5, 64, 700])
    assert [len(bare.encode(t)) for t, _ in out] == [5, 64, 700]


def test_a_codec_without_batch_methods_makes_the_same_prompts(codec: LocalTokenizer) -> None:
    lens = [1, 9, 64, 300]
    heads = ["", "a shared head ", "", "a shared head "]
    assert (make_prompts(PlainCodec(codec), random.Random(4), lens, heads)
            == make_prompts(codec, random.Random(4), lens, heads))
    spec = WorkloadSpec(input_len=40, output_len=4, prefix_len=20, num_prefixes=2, seed=9)
    assert build_requests(spec, PlainCodec(codec), 12) == build_requests(spec, codec, 12)


def test_padding_free_path_is_exact(codec: LocalTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    import loadgen.tokens

    monkeypatch.setattr(loadgen.tokens, "_PAD_WORDS", ())  # a tokenizer with no padding word
    lens = [1, 2, 5, 50, 500] * 4
    out = make_prompts(codec, random.Random(1), lens)
    assert [len(codec.encode(t)) for t, _ in out] == lens


@pytest.mark.parametrize(
    "spec",
    [
        WorkloadSpec(input_len=60, output_len=5, length_dist="uniform", range_ratio=0.5, seed=2),
        WorkloadSpec(input_len=30, output_len=5, prefix_len=25, num_prefixes=3, seed=2),
        WorkloadSpec(kind="chat", endpoint="chat", input_len=12, output_len=4, num_turns=2, seed=2),
    ],
)
def test_a_shorter_plan_is_the_start_of_a_longer_one(codec: LocalTokenizer, spec: WorkloadSpec) -> None:
    plain = PlainCodec(codec)  # no cache key: both are built
    assert build_requests(spec, plain, 7) == build_requests(spec, plain, 25)[:7]
    assert build_requests(spec, plain, 9, pool=4) == build_requests(spec, plain, 30, pool=4)[:9]


def test_shared_prefixes_stay_byte_identical(codec: LocalTokenizer) -> None:
    heads = [t for t, _ in make_prompts(codec, random.Random(0), [50, 64])]
    out = make_prompts(codec, random.Random(1), [1, 10, 100, 1, 10, 100], heads * 3)
    for (text, got), head in zip(out, heads * 3, strict=True):
        assert text.startswith(head)
        assert got == len(codec.encode(text))
    assert [got - len(codec.encode(h)) for (_, got), h in zip(out, heads * 3, strict=True)] == [
        1, 10, 100, 1, 10, 100]


def test_repeated_plans_come_from_the_cache(codec: LocalTokenizer) -> None:
    keyed = KeyedCodec(codec)
    spec = WorkloadSpec(input_len=64, output_len=4, seed=5)
    first = build_requests(spec, keyed, 20)
    assert keyed.encodes > 20
    keyed.encodes = 0
    again = build_requests(spec, keyed, 20)
    fewer = build_requests(spec, keyed, 8)  # the start of the cached plan
    assert keyed.encodes == 0
    assert again == first and fewer == first[:8]
    again.clear()  # callers get their own list
    assert build_requests(spec, keyed, 20) == first
    build_requests(WorkloadSpec(input_len=64, output_len=4, seed=6), keyed, 20)  # another seed
    assert keyed.encodes > 0
    keyed.encodes = 0
    build_requests(spec, keyed, 20, max_model_len=4096)  # random prompts do not read it
    assert keyed.encodes == 0
    plain = PlainCodec(codec)  # no cache key: never cached
    build_requests(spec, plain, 5)
    plain.encodes = 0
    build_requests(spec, plain, 5)
    assert plain.encodes > 0


def test_plan_cache_is_bounded(codec: LocalTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    keyed = KeyedCodec(codec)
    monkeypatch.setattr(workload, "_CACHE_PLANS", 2)
    for seed in range(3):
        build_requests(WorkloadSpec(input_len=8, output_len=2, seed=seed), keyed, 4)
    keyed.encodes = 0
    build_requests(WorkloadSpec(input_len=8, output_len=2, seed=0), keyed, 4)  # evicted
    assert keyed.encodes > 0
    monkeypatch.setattr(workload, "_CACHE_CHARS", 100)  # a plan larger than the budget
    build_requests(WorkloadSpec(input_len=80, output_len=2, seed=7), keyed, 4)
    keyed.encodes = 0
    build_requests(WorkloadSpec(input_len=80, output_len=2, seed=7), keyed, 4)
    assert keyed.encodes > 0


def test_a_changed_dataset_file_is_read_again(codec: LocalTokenizer, tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello model"}\n')
    spec = WorkloadSpec(kind="jsonl", dataset=str(f), output_len=3)
    assert build_requests(spec, codec, 2)[0].prompt == "hello model"
    f.write_text('{"prompt": "another prompt here"}\n')
    assert build_requests(spec, codec, 2)[0].prompt == "another prompt here"


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
    clear_plan_cache()  # built again, not served from the cache
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
    # Two distinct prefixes of 50 tokens, shared round-robin.
    even = _common_start([p.prompt for p in plan[0::2]])
    odd = _common_start([p.prompt for p in plan[1::2]])
    assert len(codec.encode(even)) >= 48 and len(codec.encode(odd)) >= 48
    assert len(codec.encode(_common_start([plan[0].prompt, plan[1].prompt]))) < 10
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


def test_multi_turn_sessions_are_known_before_a_run(tmp_path: Path) -> None:
    """A later turn is sent when the answer before it ends, not on its own arrival, and is numbered by
    arrival and turn (loadgen.worker): the tuner's window book reads ids by it, and a step's early stop
    counts an arrival's turns among the requests it plans (engine.tune.measurer)."""
    shipped = Path(__file__).resolve().parents[2] / "presets" / "traces" / "agent-sessions.jsonl"
    agent = WorkloadSpec(kind="trace", dataset=str(shipped))
    assert workload.has_sessions(agent) and workload.session_turns(agent) == (4, 4.0)
    assert workload.has_sessions(WorkloadSpec(kind="chat", num_turns=3))
    assert workload.session_turns(WorkloadSpec(kind="chat", num_turns=3)) == (3, 3.0)
    # One turn: a session only on the chat endpoint, where the worker sends it as one (its id arrival x 1000).
    assert workload.has_sessions(WorkloadSpec(kind="chat", num_turns=1, endpoint="chat"))
    assert not workload.has_sessions(WorkloadSpec(kind="chat", num_turns=1))
    random_ = WorkloadSpec(kind="random", input_len=64, output_len=8)
    assert not workload.has_sessions(random_) and workload.session_turns(random_) == (1, 1.0)
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps({"timestamp": t, "input_len": 32, "output_len": 8}) + "\n" for t in (0, 1, 2)))
    assert not workload.has_sessions(WorkloadSpec(kind="trace", dataset=str(flat)))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl"):
        workload.has_sessions(WorkloadSpec(kind="trace", dataset=str(tmp_path / "bad.jsonl")))
