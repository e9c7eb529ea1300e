"""The session's exports: a flag set as a launch line or a deployable file, a run as JSON or a trace.

``engine.session.Session.export`` and ``save_export`` (and the tune's ``save_tune_export``)
are thin over these functions: :func:`export_text` builds the text from what the session
holds, handed in explicitly, and :func:`write_export` writes it where it is asked to go
(by default the data folder's ``exports/``, named by kind and time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine import paths
from engine.errors import SessionError
from engine.flags import FlagSet, recordable_values
from engine.runs import deploy
from engine.runs.flagchange import FLAG_CHANGES_KEY
from engine.runs.trace import build_trace

if TYPE_CHECKING:
    from engine.runs.history import History
    from engine.runs.view import RunRecord

EXPORT_KINDS = ("docker", "serve", "k8s", "compose", "results", "perfetto")
# The file name's ending for each kind (the tune's "results" is JSON too).
EXPORT_SUFFIXES = {"docker": "sh", "serve": "sh", "k8s": "k8s.yaml", "compose": "compose.yaml", "results": "json",
                   "perfetto": "trace.json"}


def export_text(kind: str, flags: FlagSet, *, name: str, version: str | None, runs: Sequence[RunRecord],
                run_index: int | None, history: Callable[[], History | None]) -> str:
    """Text for an export: "docker", "serve", "k8s" (Deployment + Service), "compose" of
    ``flags``, "results" (JSON) or "perfetto" (JSON) of run ``run_index`` of ``runs`` (1-based;
    None: the last). ``name`` and ``version`` name the deployable files; ``history`` gives the
    session's history (asked only for a trace). Raises SessionError for an unknown kind or
    when there is no run to export."""
    if kind not in EXPORT_KINDS:
        raise SessionError(f"unknown export {kind!r}", f"one of {', '.join(EXPORT_KINDS)}")
    if kind == "docker":
        return str(flags.to_docker_line())
    if kind == "serve":
        return str(flags.to_serve_line())
    if kind in ("k8s", "compose"):
        make = deploy.kubernetes if kind == "k8s" else deploy.compose
        return make(flags, name=name, version=version)
    if not runs:
        raise SessionError("no run to export", "run a workload first (r)")
    record = runs[(run_index or len(runs)) - 1]
    if kind == "results":
        out: dict[str, object] = dict(record.result.to_json()) if record.result is not None else {}  # JSON
        stored = record.summary.to_json()  # the run's parts as the history keeps them
        out["telemetry"] = stored.get("telemetry", {})
        out["label"] = record.label
        out["status"] = record.status.value
        for key in ("server", "cross_check", "stream", "slo_verdict", FLAG_CHANGES_KEY):
            if key in stored:
                out[key] = stored[key]
        out["flags"] = recordable_values(record.flags)
        out["model"] = str(record.flags.model)
        return json.dumps(out, indent=2, default=str)
    store = history()
    if store is not None and record.history_id is not None:
        info = store.get_run(record.history_id)
        data = build_trace(info, store.requests(record.history_id), store.samples(record.history_id))
    elif record.result is not None:
        data = build_trace(record.result)
    else:
        raise SessionError("this run measured nothing", "run the workload again")
    return json.dumps(data)


def write_export(name: str, kind: str, text: str, path: Path | None, *, now: float) -> Path:
    """Write ``text`` to ``path`` (None: ``exports/NAME-STAMP.SUFFIX`` in the data folder, the
    stamp the local time ``now``), ending with one newline; returns the path written."""
    if path is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        path = paths.data_dir() / "exports" / f"{name}-{stamp}.{EXPORT_SUFFIXES[kind]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + ("\n" if not text.endswith("\n") else ""))
    return path
