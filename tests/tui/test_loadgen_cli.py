"""`vtui bench` against a real local streaming server (loadgen.testserver)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.testserver import ServerConfig, free_port, serve_in_thread
from tui.cli import main


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(first_delay_s=0.002, max_model_len=600)) as u:
        yield u


def test_bench_writes_vllm_compatible_result(url: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    res, reqs = tmp_path / "r.json", tmp_path / "r.jsonl"
    rc = main(["bench", "--url", url, "--allow-box-bound", "--input-len", "40", "--output-len", "5",
               "--concurrency", "3", "--num-requests", "12", "--slo-ttft-ms", "500",
               "--seed", "3", "--result-file", str(res), "--requests-file", str(reqs)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out and "Median TTFT (ms):" in out
    d = json.loads(res.read_text())
    assert d["completed"] == 12 and d["failed"] == 0
    assert d["max_concurrency"] == 3 and d["request_rate"] == "inf"
    assert d["workload"]["input_len"] == 40 and d["seed"] == 3
    assert d["request_goodput"] == pytest.approx(d["request_throughput"])
    assert {"p99_ttft_ms", "median_itl_ms", "std_e2el_ms", "windows", "client_bound",
            "failures_by_reason"} <= set(d)
    assert len(reqs.read_text().splitlines()) == 12
    # Telemetry on the run's clock: the test server is no vLLM (no /metrics) and this box
    # has no GPU, so the summary says why and the host series is there.
    tel = d["telemetry"]
    assert tel["summary"]["gpu_unavailable"]
    assert tel["series"]["host"]["t"], "host samples during the run"
    assert "telemetry: no GPU" in out


def test_open_loop_flags(url: str, tmp_path: Path) -> None:
    res = tmp_path / "r.json"
    rc = main(["bench", "--url", url, "--allow-box-bound", "--input-len", "10", "--output-len", "2", "--rate", "50",
               "--burstiness", "2", "--concurrency", "4", "--num-requests", "10", "-q",
               "--result-file", str(res)])
    assert rc == 0
    d = json.loads(res.read_text())
    assert d["arrivals"]["mode"] == "poisson" and d["arrivals"]["max_in_flight"] == 4
    assert d["request_rate"] == 50 and d["burstiness"] == 2


def test_too_long_for_max_model_len_is_rejected_before_the_run(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", url, "--allow-box-bound", "--input-len", "500", "--output-len", "200"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "700 tokens" in err and "max-model-len of 600" in err and "hint:" in err


def test_unreachable_server_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", f"http://127.0.0.1:{free_port()}", "-q"])
    assert rc != 0
    assert "cannot reach" in capsys.readouterr().err


def test_all_requests_failed_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with serve_in_thread(ServerConfig(mode="status=503")) as u:
        rc = main(["bench", "--url", u, "--input-len", "5", "--output-len", "2",
                   "--num-requests", "4", "-q"])
    assert rc == 1
    captured = capsys.readouterr()
    assert "no request completed (http_error: 4)" in captured.err
    assert "HTTP 503" in captured.err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--range-ratio", "2"], "--range-ratio: must be in"),
        (["--dataset-name", "jsonl", "--dataset", "/no/such.jsonl"], "no such file"),
        (["--concurrency", "0"], "--concurrency: must be at least 1"),
    ],
)
def test_bad_flags_are_user_errors(url: str, argv: list[str], match: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", url, "--allow-box-bound", *argv]) == 2
    assert match in capsys.readouterr().err


def test_malformed_dataset_line_named(url: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": \n')
    assert main(["bench", "--url", url, "--allow-box-bound", "--dataset-name", "jsonl", "--dataset", str(f)]) == 2
    assert f"{f}:2: malformed JSON" in capsys.readouterr().err


def test_api_key_is_sent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_in_thread(ServerConfig(api_key="s3cret")) as u:
        assert main(["bench", "--url", u, "--input-len", "5", "--output-len", "2",
                     "--num-requests", "3", "-q"]) == 2  # /v1/models refuses without it
        assert "HTTP 401" in capsys.readouterr().err
        res = tmp_path / "r.json"
        assert main(["bench", "--url", u, "--allow-box-bound", "--api-key", "s3cret", "--input-len", "5",
                     "--output-len", "2", "--num-requests", "3", "-q",
                     "--result-file", str(res)]) == 0
    assert json.loads(res.read_text())["completed"] == 3


def test_workload_from_a_preset_file_flags_win(url: str, tmp_path: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text('name = "mine"\n[workload]\nkind = "random"\ninput_len = 30\n'
                      'output_len = 3\n[arrivals]\nmode = "closed"\nconcurrency = 2\n'
                      'num_requests = 6\n[slo]\nttft_ms = 900\n')
    res = tmp_path / "r.json"
    assert main(["bench", "--url", url, "--allow-box-bound", "--preset", str(preset), "--output-len", "4", "-q",
                 "--result-file", str(res)]) == 0
    d = json.loads(res.read_text())
    assert d["completed"] == 6 and d["max_concurrency"] == 2
    assert d["workload"]["input_len"] == 30 and d["workload"]["output_len"] == 4
    assert d["slo"]["ttft_ms"] == 900 and d["request_goodput"] is not None


def test_bench_runs_are_stored_unless_no_history(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.runs.history import History

    with History() as h:
        before = {r.id for r in h.list_runs()}
    rc = main(["bench", "--url", url, "--allow-box-bound", "--input-len", "20", "--output-len", "4", "--concurrency", "2",
               "--num-requests", "6", "-q", "--name", "stored one"])
    assert rc == 0
    err = capsys.readouterr().err
    with History() as h:
        new = [r for r in h.list_runs() if r.id not in before]
        assert [r.name for r in new] == ["stored one"]
        [run] = new
        assert run.status in ("ok", "box-bound") and "bench" in run.tags
        assert run.summary.figure("completed") == 6 and run.summary.cross_check is not None
        assert len(h.requests(run.id)) == 6
    assert f"stored as run {run.id}" in err
    rc = main(["bench", "--url", url, "--allow-box-bound", "--input-len", "20", "--output-len", "4", "--concurrency", "2",
               "--num-requests", "6", "-q", "--no-history"])
    assert rc == 0
    with History() as h:
        assert {r.id for r in h.list_runs()} - before == {run.id}


def test_measured_run_keeps_secrets_out_of_the_history(url: str, tmp_path: Path) -> None:
    """A server vtui started with --api-key (vtui bench, the TUI, sweep all record through
    engine.runs.measure): its flags go into the history with the key as a $VLLM_API_KEY
    reference, never the key itself."""
    import asyncio

    from engine.flags import FlagSet
    from engine.runs.history import History
    from engine.runs.measure import RunPlan, Target, measure
    from engine.server.logparse import StartupFacts
    from loadgen import ArrivalSpec, WorkloadSpec
    from tests.standins import ServerStandIn

    flags = FlagSet(model=str(tmp_path), values={"api-key": "sk-not-for-the-history", "max-num-seqs": 8})
    sup = ServerStandIn(flags, url, ServerConfig().model, facts=StartupFacts(vllm_version="0.32.0"))
    target = Target.of(sup)
    assert target.api_key == "sk-not-for-the-history"  # sent with the requests...
    plan = RunPlan("secret check", WorkloadSpec(input_len=10, output_len=2), ArrivalSpec(num_requests=2))
    with History() as history:
        run = asyncio.run(measure(target, plan, history=history))
        stored = history.get_run(run.history_id or -1)
    assert stored.flags == {"api-key": "$VLLM_API_KEY", "max-num-seqs": 8}  # ...and stored nowhere
    assert "sk-not-for-the-history" not in json.dumps(stored.to_dict())
