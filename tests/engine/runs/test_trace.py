"""The Perfetto export is valid Chrome trace-event JSON with the slices and counters we promise."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from engine.runs.history import History, RunInfo, StoredRequest
from engine.runs.summary import RunSummary
from engine.runs.trace import assign_lanes, build_trace, write_trace

T0 = 1_800_000_000.0


def _run() -> RunInfo:
    return RunInfo(id=7, name="trace-me", preset="online-chat", started=T0, ended=T0 + 3, status="complete",
                   flags={"max-num-seqs": 4}, vllm_version="0.32.0", model="tiny", gpus=[], workload={},
                   summary=RunSummary(), baseline=False, tags=())


REQUESTS = [
    {"id": 0, "t_start": T0 + 0.1, "ttft_s": 0.2, "e2el_s": 1.0, "itl_s": [0.1] * 8, "input_tokens": 50, "output_tokens": 9, "ok": True},
    {"id": 1, "t_start": T0 + 0.2, "ttft_s": 0.3, "e2el_s": 0.5, "itl_s": [], "input_tokens": 50, "output_tokens": 5, "ok": True,
     "queued_s": 0.1},
    {"id": 2, "t_start": T0 + 0.8, "ttft_s": 0.0, "e2el_s": 0.05, "itl_s": [], "input_tokens": 50, "output_tokens": 0, "ok": False,
     "error": "http_400"},
    {"id": 3, "t_start": T0 + 1.2, "ttft_s": 0.1, "e2el_s": 0.4, "itl_s": [], "input_tokens": 50, "output_tokens": 4, "ok": True},
]
SAMPLES = [
    ("telemetry", T0 + 0.5, {"t": T0 + 0.5, "gpus": [{"index": 0, "mem_used_bytes": 2 * 1024**3, "util_gpu_pct": 80.0}],
                             "host": {"cpu_percent": 50.0}}),
    ("server", T0 + 0.6, {"running": 2, "waiting": 1, "kv_cache_usage": 0.25, "gen_tok_s": 100.0, "prompt_tok_s": None}),
    ("server", T0 + 0.7, {"stale": True}),
    ("window", T0 + 1.0, {"req_s": 3.0, "output_tok_s": 30.0, "in_flight": 2}),
]


def check_trace_event_format(doc: dict) -> None:
    """The structure ui.perfetto.dev's JSON importer expects (Trace Event Format)."""
    json.loads(json.dumps(doc, allow_nan=False))  # strict JSON: no NaN/Infinity
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        assert ev["ph"] in {"X", "C", "M"}, ev
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "M":
            assert ev["name"] in {"process_name", "thread_name", "process_sort_index"} and isinstance(ev["args"], dict)
            continue
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
            by_track[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
        if ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values())
    # Complete events on one track must nest: any two are disjoint or one contains the other.
    for spans in by_track.values():
        for a in spans:
            for b in spans:
                disjoint = a[1] <= b[0] or b[1] <= a[0]
                nested = (a[0] <= b[0] and b[1] <= a[1]) or (b[0] <= a[0] and a[1] <= b[1])
                assert disjoint or nested, (a, b)


def test_trace_structure_slices_and_counters() -> None:
    doc = build_trace(_run(), [StoredRequest.from_json(r) for r in REQUESTS], SAMPLES)
    check_trace_event_format(doc)
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    parents = [e for e in slices if e["cat"] == "request"]
    assert [e["name"] for e in parents] == ["request 0", "request 1", "request 2 (failed: http_400)", "request 3"]
    r0 = parents[0]
    assert r0["ts"] == pytest.approx(100_000) and r0["dur"] == pytest.approx(1_000_000)  # microseconds
    assert r0["args"]["ttft_ms"] == pytest.approx(200) and r0["args"]["tpot_ms"] == pytest.approx(100)
    phases = defaultdict(list)
    for e in slices:
        if e["cat"] == "phase":
            phases[(e["tid"], e["name"])].append(e)
    # request 1 overlaps request 0, so it is on another slot; it knows its queue time.
    assert r0["tid"] != parents[1]["tid"]
    assert phases[(parents[1]["tid"], "waiting")][0]["dur"] == pytest.approx(100_000)
    first = phases[(r0["tid"], "first token")][0]
    decode = phases[(r0["tid"], "decode")][0]
    assert (first["ts"], first["dur"]) == (pytest.approx(100_000), pytest.approx(200_000))
    assert decode["ts"] == pytest.approx(300_000) and decode["dur"] == pytest.approx(800_000)
    counters = {(e["name"], k): v for e in events if e["ph"] == "C" for k, v in e["args"].items()}
    assert counters[("GPU memory used (GiB)", "gpu0")] == pytest.approx(2.0)
    assert counters[("GPU utilization (%)", "gpu0")] == 80.0
    assert counters[("KV cache usage (%)", "kv")] == 25.0
    assert counters[("requests", "running")] == 2 and counters[("requests", "waiting")] == 1
    assert counters[("server throughput (tok/s)", "generation")] == 100.0
    assert ("server throughput (tok/s)", "prompt") not in counters  # None is left out
    assert counters[("client throughput", "req/s")] == 3.0 and counters[("in flight", "in_flight")] == 2
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "client requests: run #7 trace-me" in names


def test_lanes_never_overlap() -> None:
    spans = [(0, 5), (1, 2), (2, 3), (5, 6), (1, 10), (3, 4)]
    lanes = assign_lanes(spans)
    for i, a in enumerate(spans):
        for j, b in enumerate(spans):
            if i != j and lanes[i] == lanes[j]:
                assert a[1] <= b[0] or b[1] <= a[0]
    assert max(lanes) == 2  # at most three overlap at once


def test_trace_from_history_file(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as store:
        rec = store.start_run("stored", started=T0)
        for r in REQUESTS:
            rec.add_request(r)
        for kind, t, data in SAMPLES:
            rec.add_sample(kind, t, data)
        rec.finish()
        run = store.get_run(rec.run_id)
        doc = build_trace(run, store.requests(run.id), store.samples(run.id))
    path = write_trace(tmp_path / "run.json", doc)
    loaded = json.loads(path.read_text())
    check_trace_event_format(loaded)
    assert sum(1 for e in loaded["traceEvents"] if e.get("cat") == "request") == 4


def test_trace_of_a_loadgen_run_result_alone() -> None:
    from loadgen.records import RequestResult
    from loadgen.run import RunResult
    from loadgen.stats import LoadSummary

    reqs = tuple(
        RequestResult(id=i, t_start=T0 + i * 0.1, ttft_s=0.05, itl_s=(0.01,), e2el_s=0.2, input_tokens=10,
                      output_tokens=5, ok=True)
        for i in range(3)
    )
    result = RunResult(summary=LoadSummary.from_dict({"completed": 3}), windows=(), requests=reqs,
                       failures_by_reason={}, failure_examples={},
                       client_bound=False, client_lag_p99_ms=0.0, client_cpu_max=0.0, cancelled=False, workers=1)
    doc = build_trace(result)
    check_trace_event_format(doc)
    parents = [e for e in doc["traceEvents"] if e.get("cat") == "request"]
    assert [p["ts"] for p in parents] == [0, 100_000, 200_000] and parents[0]["dur"] == 200_000
    assert len({p["tid"] for p in parents}) == 2  # 0 and 2 share a slot; 1 overlaps both
