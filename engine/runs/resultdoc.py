"""A measured run's result document (``vtui bench --result-file``): `vllm bench serve`'s keys, the
parts the history stores (byte for byte), the telemetry and its series, the status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.runs.measure import MeasuredRun
    from engine.runs.summary import RunSummary


# The parts of the run's stored document the result file carries beside the load figures.
# box_cpu: who had the box's cores over the run (engine.runs.measure.BOX_SHARE_KEY)
RESULT_PARTS = ("server", "cross_check", "stream", "slo_verdict", "energy", "box_cpu", "prefix_cache_reset",
                "flag_changes")


def stored_parts(summary: RunSummary) -> dict[str, object]:
    """The run's parts for the result file, as the history keeps them (``summary.to_json()``:
    a stored row's bytes): ``RESULT_PARTS`` where the run has them, and ``telemetry`` (the
    telemetry document; empty without one), whose ``series`` the caller adds."""
    stored = summary.to_json()
    out: dict[str, object] = {k: stored[k] for k in RESULT_PARTS if k in stored}
    out["telemetry"] = stored.get("telemetry") or {}
    return out


def result_document(run: MeasuredRun) -> dict[str, object]:
    """The run's result document: bench serve's keys, the stored parts, the telemetry and its series."""
    if run.result is None:
        raise ValueError("a run refused before any load was sent has no result document")
    out: dict[str, object] = run.result.to_json()
    parts = stored_parts(run.summary)
    telemetry = parts.pop("telemetry")
    out.update(parts)
    out["telemetry"] = {"summary": telemetry,
                        "series": run.store.to_dict(run.started, run.ended) if run.store is not None else {}}
    out["status"] = run.status.value
    return out


def write_result(name: str, doc: dict[str, object]) -> Path:
    """``doc`` as indented JSON at ``name`` (``~`` expanded, folders made); the path written."""
    path = Path(name).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    return path


__all__ = ["RESULT_PARTS", "result_document", "stored_parts", "write_result"]
