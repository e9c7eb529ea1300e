"""The advisor in the TUI (issue 10): ``v`` lists the findings for the session's last
run, one key loads a finding's flag changes into the editor, and nothing restarts
until the user applies.

The Pilot tests use a real Session (built-in schema, no server) whose
``advise_last_run`` is replaced by the advisor's findings on a recorded run
(tests/data/runs/kv-saturation.json); ``advise_last_run`` itself is tested on a real
History file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tui_data

from engine.advise.advisor import RunData, advise
from engine.flags import builtin_schema
from engine.presets import list_presets
from engine.runs.history import History
from engine.runs.status import RunStatus
from engine.runs.summary import RunSummary
from engine.session import Session, SessionError
from engine.views import RunRecord
from tui.app import VtuiApp
from tui.widgets.modals import AdviceScreen

RUNS = Path(__file__).parents[1] / "data" / "runs"


def make_app(session: Session) -> VtuiApp:
    return VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), cursor_blink=False)


async def test_v_lists_findings_and_1_loads_the_flags_without_restarting(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = advise(RunData.read(RUNS / "kv-saturation.json"))
    change = findings[0].changes[0]
    assert change.flag == "num-gpu-blocks-override" and change.scope == "server"
    session = tui_data.make_session()
    monkeypatch.setattr(session, "advise_last_run", lambda: findings)
    starts: list[Any] = []
    monkeypatch.setattr(session, "start_server", lambda *a, **k: starts.append(a))
    monkeypatch.setattr(session, "apply_flags", lambda *a, **k: starts.append(a))
    app = make_app(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("v")
        await pilot.pause()
        assert isinstance(app.screen, AdviceScreen)
        shown = str(app.screen.query_one("#advice-1").render())
        assert "kv_saturation" in shown and "--num-gpu-blocks-override 5 -> 40" in shown
        await pilot.press("1")
        await pilot.pause()
        assert not isinstance(app.screen, AdviceScreen)
        assert session.flags.get(change.flag) == change.new
        assert (change.flag, None, change.new) in session.flags_diff() or session.dirty
        assert starts == [] and session.supervisor is None  # loaded only; the user applies
        assert any("into the editor" in n.message for n in app._notifications)


@pytest.mark.parametrize("findings, notice", [
    (SessionError("no finished run to advise on", "run a workload first (r)"), "no finished run"),
    ([], "nothing to change"),
])
async def test_v_without_a_run_or_findings_gives_a_notice(monkeypatch: pytest.MonkeyPatch, findings: Any,
                                                          notice: str) -> None:
    session = tui_data.make_session()

    def fake() -> Any:
        if isinstance(findings, Exception):
            raise findings
        return findings

    monkeypatch.setattr(session, "advise_last_run", fake)
    app = make_app(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("v")
        await pilot.pause()
        assert not isinstance(app.screen, AdviceScreen)
        assert any(notice in n.message for n in app._notifications)


def _record(index: int, history_id: Any) -> RunRecord:
    return RunRecord(index=index, label=f"#{index}", flags=None, started_t=1000.0, status=RunStatus.OK,
                     summary=RunSummary(), history_id=history_id)


def test_advise_last_run_reads_the_stored_run(tmp_path: Path) -> None:
    session = tui_data.make_session()
    with pytest.raises(SessionError, match="no finished run"):
        session.advise_last_run()

    # A run that queued: max-num-seqs 2 with 14 waiting the whole time.
    history = History(tmp_path / "h.sqlite")
    rec = history.start_run("queued", flags={"max-num-seqs": 2}, workload={"arrivals": {"concurrency": 16}},
                            started=1000.0)
    for i in range(20):
        t = 1001.0 + i
        rec.add_sample("window", t, {"completed": 5, "in_flight": 16, "client_bound": False,
                                     "ttft": {"mean": 400.0, "p50": 300.0, "p99": 900.0}})
        rec.add_sample("server", t, {"t": t, "stale": False, "running": 2.0, "waiting": 14.0,
                                     "kv_cache_usage": 0.03, "preemptions_total": 0.0})
    rec.finish("complete", {"load": {"completed": 100}, "telemetry": {"preemptions": 0.0}})
    session._runs_part.history, session._runs_part.record_history = history, True
    session._runs_part.runs.append(_record(1, rec.run_id))
    findings = session.advise_last_run()
    assert [f.to_dict() for f in findings] == [f.to_dict() for f in advise(RunData.from_history(history, rec.run_id))]
    assert any(c.flag == "max-num-seqs" for f in findings for c in f.changes)
    assert session.flags.get("max-num-seqs") == 128  # advising changes nothing

    session._runs_part.runs.append(_record(2, None))  # a run the history did not take
    with pytest.raises(SessionError, match="not stored"):
        session.advise_last_run()
    history.close()
