"""A run's stored document parsed once (engine.runs.summary.RunSummary): written back the same,
older rows and trace rows read, a wrong type named, unknown keys kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from engine.runs.compare import compare, render
from engine.runs.crosscheck import cross_check
from engine.runs.history import History, RunInfo
from engine.runs.summary import (
    STREAM_KEYS,
    EnergyFigures,
    RunSummary,
    ServerWindow,
    SloVerdict,
    StreamShape,
    TelemetryFigures,
)
from engine.server.logparse import StartupFacts
from engine.server.speedoflight import SpeedOfLight
from engine.telemetry.store import SeriesStore
from engine.telemetry.summary import GpuSummary, summarize
from loadgen.stats import LoadSummary

CAPTURES = Path(__file__).parents[2] / "data" / "captures"
# A run's load figures exactly as loadgen's LoadSummary.to_dict() writes them.
LOAD = {
    "duration": 12.5, "completed": 96, "failed": 2, "total_input_tokens": 24576, "total_output_tokens": 12288,
    "request_throughput": 7.68, "request_goodput": 7.2, "output_throughput": 983.04,
    "total_token_throughput": 2949.12, "max_output_tokens_per_s": 1130.0, "max_concurrent_requests": 16,
    "peak_in_flight": 16,
    "mean_ttft_ms": 41.5, "median_ttft_ms": 38.0, "std_ttft_ms": 9.1, "p50_ttft_ms": 38.0, "p99_ttft_ms": 90.25,
    "max_ttft_ms": 101.0, "mean_tpot_ms": 14.2, "median_tpot_ms": 14.0, "std_tpot_ms": 1.5, "p50_tpot_ms": 14.0,
    "p99_tpot_ms": 19.5, "max_tpot_ms": 22.0, "mean_itl_ms": 14.1, "median_itl_ms": 13.9, "std_itl_ms": 2.0,
    "p50_itl_ms": 13.9, "p99_itl_ms": 25.0, "max_itl_ms": 40.0, "mean_e2el_ms": 1850.0, "median_e2el_ms": 1840.0,
    "std_e2el_ms": 120.0, "p50_e2el_ms": 1840.0, "p99_e2el_ms": 2100.0, "max_e2el_ms": 2300.0,
}
# The server's window (engine.runs.measure.server_window): Quantiles.to_dict() latencies, counters.
SERVER = {"server_ttft": {"p50_ms": 33.0, "p90_ms": 50.0, "p99_ms": 60.0, "mean_ms": 35.0, "count": 96.0},
          "server_itl": None,
          "server_e2e": {"p50_ms": 1800.0, "p90_ms": 2000.0, "p99_ms": 2200.0, "mean_ms": 1840.0, "count": 96.0},
          "prompt_tokens": 24576.0, "generation_tokens": 12288.0, "prefix_hit_rate": 0.0, "preemptions": 0.0,
          "t0": 1000.0, "t1": 1012.5,
          "server_queue": {"p50_ms": 1.0, "p90_ms": 4.0, "p99_ms": 9.0, "mean_ms": 2.0, "count": 96.0}}
# The telemetry as measure writes it: every key of TelemetrySummary.to_dict() (here of an empty store,
# then set), the server's window over it, the speed of light last.
TELEMETRY = {**summarize(SeriesStore(capacity=2)).to_dict(),
             "gpus": [dataclasses.asdict(GpuSummary(0, "NVIDIA H200", 12, 120 * 2**30, 100 * 2**30, 141 * 2**30, 80.5,
                                                    118 * 2**30, 400.0, 60.0))],
             "mean_gpu_util_pct": 80.5, "peak_gpu_mem_bytes": 120 * 2**30, "peak_kv_cache_usage": 0.4,
             "mean_running": 15.2}
TELEMETRY.update({k: v for k, v in SERVER.items() if k not in ("t0", "t1")})
TELEMETRY["speed_of_light"] = {**SpeedOfLight("H200", 15.2, 300.0, 14.0, 3.2, "memory", 0.3, 0.2, False, "qwen2.5-7b")
                               .to_dict(), "line": "decode at 30% of the floor", "reason": None}
# What the server said at start, as measure stores it: StartupFacts.to_dict() without vLLM's argv echo.
STARTUP = {k: v for k, v in StartupFacts(vllm_version="0.11.0", kv_cache_tokens=500000).to_dict().items()
           if k != "non_default_args"}
ENERGY = {"joules": 5000.0, "j_per_token": 0.41, "j_per_request": 52.1, "mean_power_w": 400.0,
          "idle_power_w": 90.0, "estimated": False, "reason": None}
STREAM = {"tokens_per_event": 1.0, "same_read_gap_fraction": 0.01, "burst_requests": 0, "stream_bursts": False,
          "client_lag_p50_ms": 0.4, "client_own_lag_p99_ms": 1.2, "client_cpu_mean": 0.2, "client_cpu_p90": 0.3,
          "client_sched_delay": False, "warmup_requests": 2, "warmup_s": 0.8, "first_request_s": 1.234,
          "client_delay_ms": 0.3, "box_bound": False}


def measured_document() -> dict[str, object]:
    """The document engine.runs.measure stores for a run that went wrong at the end, every key set."""
    return {
        "load": dict(LOAD),
        "telemetry": dict(TELEMETRY),
        "energy": dict(ENERGY),
        "server": dict(SERVER),
        "cross_check": cross_check(LOAD, TelemetryFigures.from_json(SERVER, "server")).to_dict(),
        "stream": dict(STREAM),
        "client_bound": False,
        "client_cpus": [2, 3],
        "failures_by_reason": {"timeout": 2},
        "slo_verdict": {"met": False, "why": "p99 E2EL 2100 ms > 2000 ms"},
        "error": "the server stopped accepting connections mid-run",
        "hint": "what completed before is kept",
        "server_log": ["INFO engine died", "ERROR CUDA out of memory"],
        "startup": dict(STARTUP),
    }


def text(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def test_measured_document_round_trips_byte_for_byte() -> None:
    doc = measured_document()
    s = RunSummary.from_json(doc, "run 1")
    assert text(s.to_json()) == text(doc)
    assert isinstance(s.load, LoadSummary) and s.load.completed == 96 and s.load.get("p99_ttft_ms") == 90.25
    assert s.figure("request_throughput") == 7.68 and s.figure("no_such_figure") is None
    assert s.cross_check is not None and s.cross_check.server_mean_ttft_ms == 35.0
    assert s.stream == StreamShape(**STREAM)  # type: ignore[arg-type]
    assert s.slo == SloVerdict(False, "p99 E2EL 2100 ms > 2000 ms") and s.slo_met is False
    assert (s.client_bound, s.client_cpus, dict(s.failures_by_reason)) == (False, (2, 3), {"timeout": 2})
    assert s.error and s.hint and s.server_log == ("INFO engine died", "ERROR CUDA out of memory")
    tel = s.telemetry
    assert tel is not None and tel.speed_of_light is not None
    assert s.mean_power_w == 400.0 and tel.speed_of_light.line == "decode at 30% of the floor"
    assert tel.peak_kv_cache_usage == 0.4 and tel.gpus[0].name == "NVIDIA H200"
    assert tel.server_ttft is not None and tel.server_ttft.mean_ms == 35.0 and tel.energy is None
    assert s.to_json()["telemetry"] == TELEMETRY and "telemetry" not in s.kept  # the typed read writes it as it was
    assert tel.speed_of_light is not None and tel.speed_of_light.mbu == 0.3 and tel.speed_of_light.gpu == "H200"
    assert s.startup == StartupFacts(vllm_version="0.11.0", kv_cache_tokens=500000)
    assert not s.extra and not s.flat and not s.empty
    # parsed again from its own document: the same summary
    assert RunSummary.from_json(s.to_json(), "again") == s


def test_built_here_writes_measures_keys_in_measures_order() -> None:
    doc = measured_document()
    built = RunSummary(
        load=LoadSummary.from_dict(LOAD), telemetry=TelemetryFigures.from_json(TELEMETRY, "telemetry"),
        energy=EnergyFigures(**ENERGY), server=ServerWindow.from_json(SERVER, "server"),
        cross_check=cross_check(LOAD, TelemetryFigures.from_json(SERVER, "server")),
        stream=StreamShape.from_json(STREAM, "stream"),
        client_bound=False, client_cpus=(2, 3), failures_by_reason={"timeout": 2},
        slo=SloVerdict(False, "p99 E2EL 2100 ms > 2000 ms"), error=str(doc["error"]), hint=str(doc["hint"]),
        server_log=("INFO engine died", "ERROR CUDA out of memory"),
        startup=StartupFacts(vllm_version="0.11.0", kv_cache_tokens=500000))
    assert text(built.to_json()) == text(doc)
    # a run refused before any load: only how it ended
    assert RunSummary(error="refused", hint="").to_json() == {"error": "refused"}
    assert RunSummary().to_json() == {} and RunSummary().empty
    # a run that measured, no SLO, no telemetry, nothing went wrong: the client's facts still written
    plain = RunSummary(load=LoadSummary.from_dict(LOAD), server=ServerWindow()).to_json()
    assert list(plain) == ["load", "server", "client_bound", "client_cpus", "failures_by_reason"]


def test_old_row_without_newer_keys_reads_and_is_written_back_as_stored() -> None:
    old_load = {k: v for k, v in LOAD.items() if k not in ("max_output_tokens_per_s", "max_concurrent_requests",
                                                           "peak_in_flight")}
    old_load["client_lag_p99_ms"] = 3.0  # a key an older loadgen kept beside the figures
    doc = {"load": old_load, "telemetry": {"mean_gpu_util_pct": 50}, "server": {},
           "cross_check": {"client_mean_ttft_ms": 41.5, "warnings": []},
           "stream": {"tokens_per_event": 1.0, "burst_requests": 0},
           "slo_verdict": {"met": True}}
    s = RunSummary.from_json(doc, "run 7")
    assert text(s.to_json()) == text(doc)
    assert s.load is not None and s.load.peak_in_flight is None and s.figure("peak_in_flight") is None
    assert s.figure("completed") == 96 and s.load_json()["client_lag_p99_ms"] == 3.0
    assert (s.client_bound, s.client_cpus, dict(s.failures_by_reason), s.error) == (False, (), {}, None)
    assert s.stream is not None and s.stream.warmup_requests is None and s.slo_met is True
    assert s.cross_check is not None and s.cross_check.server_mean_ttft_ms is None
    # its telemetry: the one figure it has, the newer ones absent (None) and not written back
    assert s.telemetry is not None and s.telemetry.mean_gpu_util_pct == 50
    assert s.telemetry.server_front_procs is None and s.telemetry.cache_config == {}
    # an older row still lists in a comparison, its missing figures n/a
    info = RunInfo(id=7, name="old", preset=None, started=1.0, ended=2.0, status="ok", flags={},
                   vllm_version=None, model="m", gpus=[], workload={}, summary=s, baseline=False, tags=())
    assert compare([info]).row("request_throughput").values == (7.68,)


def test_trace_row_of_bench_keys_only_is_read_as_load() -> None:
    flat = {"request_throughput": 20.0, "completed": 3, "mean_ttft_ms": 10}
    s = RunSummary.from_json(flat, "trace")
    assert s.flat and s.load is not None and s.load.request_throughput == 20.0
    assert s.figure("mean_ttft_ms") == 10 and s.figure("output_throughput") is None  # not stored: n/a
    assert s.telemetry is None and s.slo is None and s.error is None
    assert text(s.to_json()) == text(flat)
    # a whole result as loadgen writes it, flat
    whole = RunSummary.from_json(dict(LOAD), "headless")
    assert whole.flat and text(whole.to_json()) == text(LOAD)
    # a document without bench keys is not read as load
    refused = RunSummary.from_json({"error": "interrupted"}, "run 3")
    assert refused.load is None and not refused.flat and refused.to_json() == {"error": "interrupted"}
    assert RunSummary.from_json({}, "empty").empty


@pytest.mark.parametrize(("doc", "key"), [
    ({"load": {"completed": "many"}}, "completed"),
    ({"load": dict(LOAD), "client_bound": "yes"}, "client_bound"),
    ({"load": dict(LOAD), "client_cpus": ["a"]}, "client_cpus"),
    ({"load": dict(LOAD), "failures_by_reason": {"timeout": "two"}}, "failures_by_reason"),
    ({"load": dict(LOAD), "stream": {"burst_requests": 1.5}}, "burst_requests"),
    ({"load": dict(LOAD), "slo_verdict": {"met": "no"}}, "met"),
    ({"load": dict(LOAD), "telemetry": [1, 2]}, "telemetry"),
    ({"load": dict(LOAD), "telemetry": {"preemptions": "3"}}, "telemetry: preemptions"),
    ({"load": dict(LOAD), "telemetry": {"server_front_procs": 1.5}}, "telemetry: server_front_procs"),
    ({"load": dict(LOAD), "telemetry": {"server_itl": {"mean_ms": "18"}}}, "telemetry: server_itl: mean_ms"),
    ({"load": dict(LOAD), "telemetry": {"gpus": [{"index": "0"}]}}, r"telemetry: gpus\[0\]: index"),
    ({"load": dict(LOAD), "telemetry": {"energy": {"estimated": 1}}}, "telemetry: energy: estimated"),
    ({"load": dict(LOAD), "telemetry": {"cache_config": {"block_size": 16}}}, "telemetry: cache_config"),
    ({"load": dict(LOAD), "telemetry": {"speed_of_light": "n/a"}}, "speed_of_light"),
    ({"load": dict(LOAD), "telemetry": {"speed_of_light": {"launch_bound": "yes"}}},
     "telemetry: speed_of_light: launch_bound"),
    ({"load": dict(LOAD), "server": [1]}, "server"),
    ({"load": dict(LOAD), "server": {"prompt_tokens": "many"}}, "server: prompt_tokens"),
    ({"load": dict(LOAD), "server": {"server_ttft": {"p99_ms": "9"}}}, "server: server_ttft: p99_ms"),
    ({"load": dict(LOAD), "startup": "0.11"}, "startup"),
    ({"load": dict(LOAD), "startup": {"kv_cache_tokens": 5e5}}, "startup: kv_cache_tokens"),
    ({"load": dict(LOAD), "startup": {"vllm_version": 11}}, "startup: vllm_version"),
    ({"load": dict(LOAD), "startup": {"non_default_args": ["--x"]}}, "startup: non_default_args"),
    ({"error": 3}, "error"),
    ({"request_throughput": "fast"}, "request_throughput"),
])
def test_wrong_type_is_an_error_naming_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=rf"run 9.*{key}"):
        RunSummary.from_json(doc, "run 9")
    # the history still lists such a row, kept whole
    kept = RunSummary.stored(doc, "run 9")
    assert kept.load is None and text(kept.to_json()) == text(doc)


def test_unknown_keys_are_kept_and_written_back() -> None:
    doc = measured_document()
    doc["kv_transfer"] = {"bytes": 10}
    doc["note"] = "from a newer vtui"
    doc["load"]["goodput_per_watt"] = 0.02  # type: ignore[index]
    doc["telemetry"] = {"kv_offload_bytes": 5, **TELEMETRY, "server_itl": {"mean_ms": 14.0}, "speed_of_light": None}
    s = RunSummary.from_json(doc, "run 2")
    assert s.extra == {"kv_transfer": {"bytes": 10}, "note": "from a newer vtui"}
    assert text(s.to_json()) == text(doc)
    # the telemetry's unknown key, its partial latency and its null speed of light are kept; the figures read
    assert s.telemetry is not None and s.telemetry.server_itl is not None
    assert s.telemetry.server_itl.mean_ms == 14.0 and s.telemetry.server_itl.p99_ms is None
    assert s.telemetry.speed_of_light is None and s.to_json()["telemetry"] == doc["telemetry"]
    # an unknown key placed between known ones keeps its place
    mixed = {"load": dict(LOAD), "new_part": [1, 2], "server": {}}
    assert list(RunSummary.from_json(mixed, "run 4").to_json()) == ["load", "new_part", "server"]


def test_history_stores_and_reads_the_same_document(tmp_path) -> None:
    doc = measured_document()
    with History(tmp_path / "h.sqlite") as store:
        rec = store.start_run("r")
        rec.finish("ok", summary=RunSummary.from_json(doc, "run").to_json())
        raw = store._conn.execute("SELECT summary FROM runs").fetchone()[0]
        assert raw == text(doc)
        info = store.list_runs()[0]
        assert isinstance(info.summary, RunSummary) and info.summary.figure("completed") == 96
        assert info.to_dict()["summary"] == json.loads(text(doc))
        # a row written by an older vtui, and a damaged one, still list
        store._conn.execute("UPDATE runs SET summary = ? WHERE id = 1", (text({"load": {"completed": "x"}}),))
        assert store.get_run(1).summary.to_json() == {"load": {"completed": "x"}}
        out = render(compare([store.get_run(1)]), "text")
        assert "#1 r" in out


def test_energy_figures_both_shapes() -> None:
    full = RunSummary.from_json({"load": dict(LOAD), "energy": dict(ENERGY)}, "run 5")
    assert full.energy == EnergyFigures(5000.0, 0.41, 52.1, 400.0, 90.0, False, None)
    assert full.mean_power_w == 400.0
    # without a reading only the reason is stored, and written back so
    none = {"load": dict(LOAD), "energy": {"joules": None, "reason": "no telemetry"}}
    s = RunSummary.from_json(none, "run 6")
    assert s.energy == EnergyFigures(reason="no telemetry") and s.mean_power_w is None
    assert text(s.to_json()) == text(none)
    with pytest.raises(ValueError, match=r"run 6: energy.*mean_power_w"):
        RunSummary.from_json({"energy": {"joules": 1.0, "mean_power_w": "hot"}}, "run 6")


def test_stream_keys_are_stream_shapes_fields() -> None:
    assert tuple(StreamShape().to_json()) == STREAM_KEYS


def test_server_window_and_startup_read_typed_and_written_back_as_stored() -> None:
    s = RunSummary.from_json(measured_document(), "run 1")
    assert s.server == ServerWindow.from_json(SERVER, "server") and "server" not in s.kept
    assert s.server.server_ttft is not None and s.server.server_ttft.mean_ms == 35.0 and s.server.t1 == 1012.5
    assert s.server.figures().prompt_tokens == 24576.0 and s.startup is not None and "startup" not in s.kept
    assert (s.startup.vllm_version, s.startup.kv_cache_tokens, s.startup.max_model_len) == ("0.11.0", 500000, None)
    # measure's empty window (no exact scrapes) writes {} back; built here it is ServerWindow()
    assert ServerWindow().to_json() == {} and ServerWindow.from_json({}, "w") == ServerWindow()
    # older and partial parts, a newer key, integer figures, vLLM's argv echo, another order: as stored
    docs = [
        {"load": dict(LOAD), "server": {}, "startup": {}},
        {"load": dict(LOAD), "server": None, "startup": None},
        {"load": dict(LOAD), "server": {"prompt_tokens": 5, "t0": 1.0, "kv_bytes": [1]},
         "startup": {"vllm_version": "0.9.2", "kv_cache_tokens": 100, "max_concurrency": 3}},
        {"load": dict(LOAD), "server": dict(reversed(SERVER.items())),
         "startup": {**STARTUP, "non_default_args": {"model": "m", "max_num_seqs": 8}}},
        {"load": dict(LOAD), "server": {**SERVER, "server_ttft": {"mean_ms": 3}}, "startup": {"future_fact": 1}},
    ]
    for doc in docs:
        back = RunSummary.from_json(doc, "run 2")
        assert text(back.to_json()) == text(doc)
    older = RunSummary.from_json(docs[2], "run 2")
    assert older.server is not None and older.server.prompt_tokens == 5 and older.server.server_ttft is None
    assert older.startup == StartupFacts(vllm_version="0.9.2", kv_cache_tokens=100, max_concurrency=3)
    echo = RunSummary.from_json(docs[3], "run 2").startup
    assert echo is not None and echo.non_default_args == {"model": "m", "max_num_seqs": 8}
    assert RunSummary.from_json(docs[0], "run 2").server is None  # stored empty: kept, nothing to read


def test_startup_facts_of_every_captured_log_round_trip() -> None:
    # StartupFacts.from_json reads back each fact to_dict() writes, with its type (the parsed logs').
    for log in sorted(CAPTURES.glob("*.log")):
        facts = StartupFacts.from_lines(log.read_text(errors="replace").splitlines())
        assert StartupFacts.from_json(facts.to_dict(), log.name) == facts, log.name
        stored = {k: v for k, v in facts.to_dict().items() if k != "non_default_args"}
        doc = {"load": dict(LOAD), "startup": stored}
        assert text(RunSummary.from_json(doc, log.name).to_json()) == text(doc)
    # every field is read back: each set to a value of its annotated type
    sample = {"str | None": "x", "int | None": 7, "float | None": 1.5, "Mapping[str, object] | None": {"a": 1}}
    full = StartupFacts(**{f.name: sample[str(f.type)] for f in dataclasses.fields(StartupFacts)})
    assert StartupFacts.from_json(full.to_dict(), "x") == full
