"""Published trace formats (Mooncake, Bailian, Azure, BurstGPT) and vtui's own: detected, read in
their own units, replayed through `vtui bench --dataset-name trace` against loadgen's test server;
shared hash ids give shared prompt blocks; bad lines are named. Every format module in
loadgen/traceformats/ is in its registry, and each one's sample is claimed by it first."""

from __future__ import annotations

import json
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen import traceformats
from loadgen.spec import WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_thread
from loadgen.tokens import LocalTokenizer
from loadgen.traceformats import (
    FORMATS,
    READERS,
    Source,
    TraceError,
    TraceRow,
    conversation_chains,
    infer_block_size,
    read_trace,
)
from loadgen.workload import DatasetError, build_requests
from tui.cli import main

DATA = Path(__file__).parents[1] / "data" / "traces"
RECORDING = ('{"vtui_recording": 1, "block_size": 16}\n'
             '{"timestamp": 0.4, "input_len": 40, "output_len": 3, "hash_ids": [1, 2, 3], "conversation": "c", "turn": 1}\n'
             '{"timestamp": 0.2, "input_len": 0, "output_len": 3, "outcome": "error"}\n'
             '{"timestamp": 0.1, "input_len": 20, "output_len": 2, "hash_ids": [1, 4]}\n')
# A sample per format: a new format module needs one here (and its line in READERS).
SAMPLES = {"mooncake": "mooncake.jsonl", "bailian": "bailian.jsonl", "azure": "azure.csv", "burstgpt": "burstgpt.csv",
           "vtui": "vtui.jsonl", "vtui-recording": RECORDING}


def _sample(fmt: str, tmp_path: Path) -> Path:
    name = SAMPLES[fmt]
    if "\n" not in name:
        return DATA / name
    f = tmp_path / "sample.jsonl"
    f.write_text(name)
    return f


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(max_model_len=4096)) as u:
        yield u


@pytest.mark.parametrize(
    ("name", "fmt", "block", "times", "note"),
    [
        ("mooncake.jsonl", "mooncake", 512, [0.0, 0.0, 0.04, 0.09, 0.15], "timestamps in ms (Mooncake's definition"),
        ("bailian.jsonl", "bailian", 16, [0.0, 0.086, 0.136, 0.186], "timestamps in s (Bailian's definition"),
        ("azure.csv", "azure", None, [0.0, 0.06941, 0.11941, 0.22941], "absolute date and time"),
        ("burstgpt.csv", "burstgpt", None, [0.0, 40.0, 113.0, 180.0], "1 rows with 0 request or response tokens"),
        ("vtui.jsonl", "vtui", None, [0.0, 0.05, 0.1], "vtui's own format"),
    ],
)
def test_formats_are_detected_with_their_units(name: str, fmt: str, block: int | None, times: list[float],
                                               note: str) -> None:
    tf = read_trace(DATA / name)
    assert tf.format == fmt and tf.block_size == block
    assert [r.at_s for r in tf.rows] == pytest.approx(times, abs=1e-6)
    assert note in tf.describe()
    if block:
        assert f"block size {block} tokens per hash id (inferred" in tf.describe()


def test_every_format_module_is_in_the_registry() -> None:
    # Every module of the folder but the shared ones (base, _jsonl, _csv) is a format.
    folder = {m.name for m in pkgutil.iter_modules(traceformats.__path__) if m.name != "base" and not m.name.startswith("_")}
    registered = {f.__name__.rpartition(".")[2] for f in READERS}
    assert folder == registered, f"format modules not in READERS: {sorted(folder - registered)}"
    assert len(set(FORMATS)) == len(FORMATS) == len(READERS)
    for f in READERS:
        assert f.KIND in ("jsonl", "csv") and f.EXPECTS and callable(f.detect) and callable(f.read), f.NAME


def test_each_sample_is_claimed_by_its_own_format_first(tmp_path: Path) -> None:
    assert set(SAMPLES) == set(FORMATS), "each format needs a sample in SAMPLES"
    for fmt in FORMATS:
        path = _sample(fmt, tmp_path)
        source = Source.open(path, path.read_text(encoding="utf-8"))
        claims = [f.NAME for f in READERS if source.kind == f.KIND and f.detect(source) is not None]
        assert claims[:1] == [fmt], (fmt, claims)
        tf = read_trace(path)
        assert tf.format == fmt and tf.rows, fmt


def test_a_recording_is_read_in_arrival_order_with_its_header_block(tmp_path: Path) -> None:
    tf = read_trace(_sample("vtui-recording", tmp_path))
    assert [(r.line, r.at_s, r.session) for r in tf.rows] == [(4, 0.0, None), (2, pytest.approx(0.3), "c")]
    assert tf.block_size == 16 and tf.time_unit == "s"
    assert tf.notes == ("vtui's own format: timestamp in s (its definition)",
                        "1 recorded requests without prompt tokens skipped",
                        "block size 16 tokens per hash id (the recording's header)")


def test_bailian_turns_belong_to_their_first_turn() -> None:
    rows = read_trace(DATA / "bailian.jsonl").rows
    assert [(r.session, r.turn) for r in rows] == [("159", 1), ("159", 2), ("161", 1), ("159", 3)]


def test_a_conversations_later_turns_ride_on_its_first() -> None:
    rows = read_trace(DATA / "bailian.jsonl").rows
    assert conversation_chains(rows) == [[0, 1, 3], [2]]  # 40 + 6 < 70, 70 + 5 < 90: each holds the one before

    def row(line: int, session: str | None, turn: int, i: int, o: int = 4, prompt: str | None = None) -> TraceRow:
        return TraceRow(line=line, at_s=line / 10, input_len=i, output_len=o, session=session, turn=turn,
                        prompt=prompt)

    assert conversation_chains([
        row(1, "a", 1, 20), row(2, "a", 1, 20),  # the same opening twice: two conversations
        row(3, "a", 2, 30), row(4, "a", 2, 30),  # each continues one of them
        row(5, "b", 1, 50), row(6, "b", 2, 40),  # too short to hold turn 1 and its answer: on its own
        row(7, "c", 0, 10), row(8, "c", 0, 20), row(9, "c", 0, 30),  # no turn numbers: file order
        row(10, "d", 1, 10), row(11, "d", 2, 30, prompt="kept"),  # a kept prompt is replayed as it was
        row(12, None, 0, 10),
    ]) == [[0, 2], [1, 3], [4], [5], [6, 7, 8], [9], [10], [11]]
    # A recorded answer that came back longer as text (answer_len): the next turn must hold that.
    long_answer = TraceRow(line=1, at_s=0, input_len=20, output_len=4, session="e", turn=1, answer_len=12)
    assert conversation_chains([long_answer, row(2, "e", 2, 30)]) == [[0], [1]]  # 30 < 20 + 12
    assert conversation_chains([long_answer, row(2, "e", 2, 40)]) == [[0, 1]]


def test_a_later_turn_is_planned_on_its_first(tiny_model: Path) -> None:
    codec = LocalTokenizer(tiny_model)
    plan = build_requests(WorkloadSpec(kind="trace", dataset=str(DATA / "bailian.jsonl"), seed=5, time_scale=2.0),
                          codec, 100)
    assert [(p.input_len, p.output_len, p.session, len(p.next_turns)) for p in plan] == [(40, 6, 0, 2),
                                                                                          (20, 4, -1, 0)]
    off = codec.special_offset
    # Each later turn's own tokens: its length less the turn before and that turn's answer.
    assert [len(codec.encode(t)) for t in plan[0].next_turns] == [70 - 40 - 6 - off, 90 - 70 - 5 - off]
    assert [t[1] for t in plan[0].turn_plan] == [5, 3]
    assert [t[0] for t in plan[0].turn_plan] == pytest.approx([0.172, 0.372])  # the recorded times, scaled


def test_overrides_and_the_block_size_rule(tmp_path: Path) -> None:
    tf = read_trace(DATA / "mooncake.jsonl", block_size=256, time_unit="s")
    assert tf.block_size == 256 and tf.rows[2].at_s == 40.0
    assert "(--trace-block-size)" in tf.describe() and "(--trace-time-unit)" in tf.describe()
    assert infer_block_size([(1100, 3), (700, 2)]) == 512
    assert infer_block_size([(40, 3), (20, 2)]) == 16
    assert infer_block_size([(100, 2)]) == 64  # ceil(100/64) = 2: the first size that fits
    # Mooncake's keys with 16-token blocks: Alibaba's family, in seconds.
    f = tmp_path / "m16.jsonl"
    f.write_text('{"timestamp": 1.5, "input_length": 40, "output_length": 2, "hash_ids": [1, 2, 3]}\n')
    tf = read_trace(f)
    assert tf.format == "bailian" and tf.time_unit == "s"


def test_shared_hash_ids_share_prompt_blocks(tiny_model: Path) -> None:
    codec = LocalTokenizer(tiny_model)
    plan = build_requests(WorkloadSpec(kind="trace", dataset=str(DATA / "mooncake.jsonl"), seed=5), codec, 100)
    enc = [codec.encode(p.prompt) for p in plan]
    off = codec.special_offset
    assert [len(e) + off for e in enc] == [1100, 1300, 700, 1100, 600]  # exact lengths
    assert [p.input_len for p in plan] == [1100, 1300, 700, 1100, 600]
    assert enc[0][:1024 - off] == enc[1][:1024 - off]  # ids 0, 1 shared
    assert enc[0][1024 - off : 1034] != enc[1][1024 - off : 1034]  # 2 against 3
    assert plan[0].prompt == plan[3].prompt  # the same ids: the same prompt
    assert enc[4][: 512 - off] == enc[0][: 512 - off] and enc[4][512:520] != enc[0][512:520]
    assert enc[2][:50] != enc[0][:50]
    assert [p.at_s for p in plan] == pytest.approx([0.0, 0.0, 0.04, 0.09, 0.15])


@pytest.mark.parametrize(("name", "scale"), [("mooncake.jsonl", 1.0), ("bailian.jsonl", 1.0),
                                             ("azure.csv", 1.0), ("burstgpt.csv", 0.005)])
def test_published_samples_replay(url: str, tmp_path: Path, name: str, scale: float,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    tf = read_trace(DATA / name)
    reqs = tmp_path / "r.jsonl"
    rc = main(["bench", "--url", url, "--allow-box-bound", "--dataset-name", "trace", "--dataset", str(DATA / name),
               "--time-scale", str(scale), "-q", "--no-history", "--requests-file", str(reqs)])
    assert rc == 0
    err = capsys.readouterr().err
    assert f"{tf.format} trace, {len(tf.rows)} requests" in err
    got = sorted((json.loads(x) for x in reqs.read_text().splitlines()), key=lambda r: r["t_start"])  # rows go in time order
    assert [r["ok"] for r in got] == [True] * len(tf.rows)
    # The test server counts a prompt's UTF-8 bytes, its tokenizer's tokens.
    assert [(r["input_tokens"], r["output_tokens"]) for r in got] == [(r.input_len, r.output_len) for r in tf.rows]
    starts = [r["t_start"] - got[0]["t_start"] for r in got]
    assert starts == pytest.approx([r.at_s * scale for r in tf.rows], abs=0.03)


def test_rate_sends_the_traces_requests_under_the_arrival_model(url: str, tmp_path: Path) -> None:
    res = tmp_path / "r.json"
    rc = main(["bench", "--url", url, "--allow-box-bound", "--dataset-name", "trace", "--dataset",
               str(DATA / "burstgpt.csv"), "--rate", "200", "-q", "--no-history", "--result-file", str(res)])
    assert rc == 0  # at the recorded times it would take 180 s
    d = json.loads(res.read_text())
    assert d["completed"] == 4 and d["arrivals"]["mode"] == "poisson"


@pytest.mark.parametrize(
    ("content", "suffix", "match"),
    [
        (b'{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
         b'{"timestamp": 5, "input_length": "ten", "output_length": 2, "hash_ids": [1]}\n',
         ".jsonl", r"bad\.jsonl:2: 'input_length' must be a positive integer"),
        (b'{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
         b'{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": {"a": 1}}\n',
         ".jsonl", r"bad\.jsonl:2: 'hash_ids' must be a list"),
        (b'{"chat_id": 1, "timestamp": 3, "input_length": 10, "output_length": 2}\n'
         b'{"chat_id": 2, "timestamp": 2, "input_length": 10, "output_length": 2}\n',
         ".jsonl", r"bad\.jsonl:2: timestamps must not decrease"),
        (b'{"timestamp": 0, "input_length": 10}\n', ".jsonl", r"bad\.jsonl:1: missing 'output_length'"),
        (b'{"when": 0, "tokens": 10}\n', ".jsonl", r"bad\.jsonl:1: not a trace vtui knows"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\nyesterday,10,2\n",
         ".csv", r"bad\.csv:3: TIMESTAMP 'yesterday' is not a date and time"),
        (b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,47.5,18,490,x\n",
         ".csv", r"bad\.csv:2: token counts must be integers"),
        (b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,47\n",
         ".csv", r"bad\.csv:2: 3 columns, the header has 6"),
        (b"time,in,out\n1,2,3\n", ".csv", r"bad\.csv:1: not a trace vtui knows"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, content: bytes, suffix: str, match: str) -> None:
    f = tmp_path / f"bad{suffix}"
    f.write_bytes(content)
    with pytest.raises(TraceError, match=match):
        read_trace(f)
    with pytest.raises(DatasetError, match=match):  # as a workload's dataset
        build_requests(WorkloadSpec(kind="trace", dataset=str(f)), None, 10)


def test_bench_names_the_bad_line(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "moon.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 1}\n')
    rc = main(["bench", "--url", url, "--dataset-name", "trace", "--dataset", str(f), "-q", "--no-history"])
    assert rc == 2
    assert "moon.jsonl:2: needs 'input_length'" in capsys.readouterr().err
