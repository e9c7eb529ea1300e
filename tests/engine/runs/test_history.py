"""Run history: crash safety (kill -9 a writer), recovery, migrations, disk-full and read-only."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.runs import history
from engine.runs.history import MIGRATIONS, SCHEMA_VERSION, History, HistoryError

ROOT = Path(__file__).resolve().parents[3]


def _request(i: int, t0: float = 1_800_000_000.0, ok: bool = True) -> dict:
    return {
        "id": i,
        "t_start": t0 + i * 0.1,
        "ttft_s": 0.05,
        "itl_s": (0.01, 0.02),
        "e2el_s": 0.08,
        "input_tokens": 100,
        "output_tokens": 3,
        "ok": ok,
        "error": None if ok else "http_500",
        "cancelled": False,
        "worker": 2,
    }


def test_run_round_trip(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as store:
        rec = store.start_run("r1", preset="online-chat", flags={"max-num-seqs": 8}, model="tiny", gpus=[{"name": "H200"}],
                              workload={"kind": "random"}, vllm_version="0.32.0")
        for i in range(3):
            rec.add_request(_request(i, ok=i != 1))
        rec.add_sample("telemetry", 1_800_000_000.5, {"kv_usage": 0.5, "nested": (1, 2), "bad": float("inf")})
        rec.finish("complete", summary={"request_throughput": 2.5})
        assert rec.error is None
        info = store.get_run(rec.run_id)
        assert (info.status, info.requests, info.preset, info.model) == ("ok", 3, "online-chat", "tiny")
        assert info.flags == {"max-num-seqs": 8} and info.summary.to_json() == {"request_throughput": 2.5}
        assert info.ended is not None and info.ended >= info.started
        reqs = store.requests(rec.run_id)
        assert [r.ok for r in reqs] == [True, False, True]
        assert reqs[1].error == "http_500" and reqs[0].itl_s == (0.01, 0.02) and reqs[0].extra["worker"] == 2
        ((kind, _t, data),) = store.samples(rec.run_id)
        assert kind == "telemetry" and data == {"kv_usage": 0.5, "nested": [1, 2], "bad": None}


def test_list_show_delete_baseline_tag(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as store:
        ids = []
        for name in ("a", "b", "c"):
            rec = store.start_run(name)
            rec.add_request(_request(0))
            rec.finish()
            ids.append(rec.run_id)
        assert [r.name for r in store.list_runs()] == ["c", "b", "a"]
        store.set_baseline(ids[0])
        store.set_baseline(ids[1])  # one baseline at a time
        assert [r.id for r in store.list_runs() if r.baseline] == [ids[1]]
        assert store.resolve("baseline").id == ids[1]
        assert store.resolve("last").id == ids[2] and store.resolve("a").id == ids[0] and store.resolve(str(ids[2])).name == "c"
        assert store.tag(ids[0], "slow", "h200").tags == ("h200", "slow")
        assert store.tag(ids[0], "slow", remove=True).tags == ("h200",)
        store.delete_run(ids[1])
        assert [r.id for r in store.list_runs()] == [ids[2], ids[0]]
        assert store.baseline() is None
        assert store.requests(ids[1]) == []
        with pytest.raises(HistoryError, match="no run with id"):
            store.get_run(ids[1])
        with pytest.raises(HistoryError, match="no run with id or name"):
            store.resolve("zzz")


WRITER = textwrap.dedent(
    """
    import sys, time
    from engine.runs.history import History
    store = History(sys.argv[1])
    rec = store.start_run("victim", preset="online-chat")
    i = 0
    while True:
        rec.add_request({"id": i, "t_start": time.time(), "ttft_s": 0.01, "itl_s": [], "e2el_s": 0.02,
                         "input_tokens": 1, "output_tokens": 1, "ok": True})
        rec.add_sample("window", time.time(), {"completed": i + 1})
        if i == 19:
            print("added 20", flush=True)
        i += 1
        time.sleep(0.01)
    """
)


def test_kill_9_mid_run_keeps_completed_requests_and_marks_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    History(path).close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "added 20"
        # The promise is "at most the last second lost"; give the writer 3 s so a
        # busy CI box cannot make this flaky. It keeps adding requests meanwhile.
        time.sleep(3.0)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with History(path) as store:
        (run,) = store.list_runs()
        assert run.status == "cancelled"
        assert run.ended is not None and run.ended > run.started
        ids = [r.id for r in store.requests(run.id)]
        assert len(ids) >= 20
        assert ids == list(range(len(ids)))  # what is stored is a clean prefix: no holes
        assert len(store.samples(run.id, "window")) >= 20


def test_a_killed_writers_run_reads_cut_short_to_a_read_only_reader_at_once(tmp_path: Path) -> None:
    """No writer needs to open the store: a read-only reader (`vtui history`) sees the run cut short,
    with its requests and its end, the moment the writer is gone; a later writer stores the same."""
    path = tmp_path / "h.sqlite"
    History(path).close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "added 20"
        time.sleep(1.0)
        with History(path, read_only=True) as ro:  # the writer still runs: so does its run
            assert ro.list_runs()[0].status == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with History(path, read_only=True) as ro:
        (run,) = ro.list_runs()
        assert run.status == "cancelled" and ro.get_run(run.id).status == "cancelled"
        assert run.summary.error is not None and run.summary.error.startswith("cut short:")
        assert f"pid {proc.pid}" in run.summary.error
        assert run.requests >= 20 and run.ended is not None and run.ended > run.started
        seen = run
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT status FROM runs").fetchone()[0] == "running"  # read-only: nothing written
    raw.close()
    with History(path) as store:  # a writer's open stores what every reader already saw
        stored = store.get_run(seen.id)
        assert (stored.status, stored.ended, stored.requests) == (seen.status, seen.ended, seen.requests)
        assert stored.summary.to_json() == seen.summary.to_json()
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT status FROM runs").fetchone()[0] == "cancelled"
    raw.close()


def test_a_live_writer_is_not_marked_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with History(path) as store:
        rec = store.start_run("alive")
        with History(path) as other:  # this process is the writer and still alive
            assert other.get_run(rec.run_id).status == "running"
        rec.finish()
        assert store.get_run(rec.run_id).status == "ok"


def test_a_dead_writer_with_a_reused_pid_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with History(path) as store:
        rec = store.start_run("old")
        rec.flush()
        # Same pid as ours but another start time: a previous process whose pid was reused.
        conn = sqlite3.connect(path)
        conn.execute("UPDATE runs SET writer_started = writer_started - 3600")
        conn.commit()
        conn.close()
        assert store.recover() == [rec.run_id]
        assert store.get_run(rec.run_id).status == "cancelled"


def test_migration_from_version_1_keeps_runs(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0] + "\nPRAGMA user_version = 1;")
    conn.execute(
        "INSERT INTO runs (name, started, ended, status, flags) VALUES ('v1-run', 1.0, 2.0, 'complete', ?)",
        (json.dumps({"max-num-seqs": 4}),),
    )
    conn.execute("INSERT INTO requests (run_id, t_start, ok) VALUES (1, 1.5, 1)")
    conn.commit()
    conn.close()
    with History(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 4
        (run,) = store.list_runs()
        assert (run.name, run.tags, run.requests, run.flags) == ("v1-run", (), 1, {"max-num-seqs": 4})
        store.tag(run.id, "migrated")


def test_newer_schema_and_foreign_files_are_refused_clearly(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(HistoryError, match="newer than this vtui"):
        History(newer)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(HistoryError, match="not a vtui history"):
        History(junk)


def test_disk_full_keeps_the_caller_running(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite", max_bytes=96 * 1024) as store:
        rec = store.start_run("big")
        big = "x" * 4000
        for i in range(200):  # ~800 KB of records into a 96 KiB cap
            rec.add_request({**_request(i), "error_detail": big})
        rec.flush()
        assert rec.error is not None and "disk is full" in rec.error.reason
        rec.add_request(_request(999))  # still accepted, dropped quietly
        rec.finish(summary={"ok": True})
        assert store.get_run(rec.run_id).requests < 200


def test_read_only_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with History(path) as store:
        rec = store.start_run("r")
        rec.finish()
    with History(path, read_only=True) as ro:
        assert [r.name for r in ro.list_runs()] == ["r"]
        with pytest.raises(HistoryError, match="read-only"):
            ro.set_baseline(1)
        with pytest.raises(HistoryError, match="read-only"):
            ro.start_run("x")
    with pytest.raises(HistoryError, match="no history file"):
        History(tmp_path / "none.sqlite", read_only=True)


def test_default_path_follows_vtui_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    assert history.default_path() == tmp_path / "data" / "history.sqlite"


def _seed_store() -> list[int]:
    """Two finished runs in the user's history (VTUI_HOME is a temp folder in tests)."""
    ids = []
    with History() as store:
        for name, seqs, rps in (("cli-a", 128, 10.0), ("cli-b", 64, 12.5)):
            rec = store.start_run(name, preset="online-chat", flags={"max-num-seqs": seqs}, model="/models/tiny")
            for i in range(3):
                rec.add_request(_request(i))
            rec.add_sample("window", 1_800_000_000.2, {"req_s": rps, "output_tok_s": 9.0, "in_flight": 1})
            rec.finish(summary={"load": {"request_throughput": rps, "median_ttft_ms": 50.0, "completed": 3, "failed": 0}})
            ids.append(rec.run_id)
    return ids


def test_history_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    assert main(["history"]) == 2 and "no history file yet" in capsys.readouterr().err
    a, b = _seed_store()
    assert main(["history", "list"]) == 0
    out = capsys.readouterr().out
    assert out.index("cli-b") < out.index("cli-a") and " ok " in out
    assert main(["history", "list", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [b, a] and listed[0]["name"] == "cli-b" and listed[0]["status"] == "ok"
    assert main(["history", "list", "--format", "csv"]) == 2 and "a table or JSON, not csv" in capsys.readouterr().err
    assert main(["history", "show", str(a), "--format", "json"]) == 2
    assert "--format applies to `vtui history list` and `export`" in capsys.readouterr().err
    assert main(["history", "show", str(a)]) == 0
    assert "--max-num-seqs 128" in capsys.readouterr().out
    assert main(["history", "baseline", "cli-b"]) == 0 and "baseline: run" in capsys.readouterr().out
    assert main(["history", "export", str(a), "--format", "serve"]) == 0
    assert capsys.readouterr().out.strip() == "vllm serve /models/tiny --max-num-seqs 128"
    assert main(["history", "export", str(a), "--format", "docker"]) == 0
    assert "docker run" in capsys.readouterr().out
    assert main(["history", "export", str(a), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("id,t_start,ok") and len(lines) == 4
    target = tmp_path / "run.json"
    assert main(["history", "export", str(a), "--format", "json", "-o", str(target)]) == 0
    capsys.readouterr()
    assert len(json.loads(target.read_text())["requests_detail"]) == 3
    assert main(["history", "export", str(a), "--format", "trace"]) == 0
    assert json.loads(capsys.readouterr().out)["traceEvents"]
    assert main(["history", "tag", str(a), "keep"]) == 0 and "keep" in capsys.readouterr().out
    assert main(["history", "delete", str(a)]) == 0
    assert main(["history", "show", str(a)]) == 2 and f"no run with id {a}" in capsys.readouterr().err
    assert main(["history", "show"]) == 2 and "needs a RUN" in capsys.readouterr().err


def test_saved_searches_round_trip_list_newest_first_and_delete(tmp_path: Path) -> None:
    with History(tmp_path / "h.sqlite") as store:
        store.save_tune("a", {"id": "a", "steps": 1}, status="running", model="/m", summary={"done": 0})
        store.save_tune("b", {"id": "b"}, status="done")
        store.save_tune("a", {"id": "a", "steps": 2}, status="interrupted", model="/m", summary={"done": 1})
        assert store.load_tune("a") == {"id": "a", "steps": 2}
        infos = store.list_tunes()
        assert [t.id for t in infos] == ["b", "a"]
        assert (infos[1].status, infos[1].model, dict(infos[1].summary)) == ("interrupted", "/m", {"done": 1})
        assert infos[1].updated >= infos[1].started
        store.delete_tune("a")
        with pytest.raises(HistoryError, match="no saved search 'a'"):
            store.load_tune("a")
        with pytest.raises(ValueError):  # JSON has no inf: the state must say "inf" itself
            store.save_tune("c", {"load": float("inf")}, status="running")


def test_a_live_writer_survives_a_clock_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A VM fork steps the wall clock, and psutil's start times with it: a run still being written
    must not read as cut short after one (nor one of an older vtui, which stored psutil's figure)."""
    import psutil
    import psutil._pslinux as pslinux

    path = tmp_path / "h.sqlite"
    with History(path) as store:
        rec = store.start_run("alive")
        older = store.start_run("alive, older vtui")
        conn = sqlite3.connect(path)
        conn.execute("UPDATE runs SET writer_started = ? WHERE id = ?",
                     (psutil.Process(os.getpid()).create_time(), older.run_id))
        conn.commit()
        conn.close()
        with History(path) as other:
            assert other.get_run(older.run_id).status == "running"
        older.finish()
        booted = pslinux.boot_time()
        monkeypatch.setattr(pslinux, "boot_time", lambda: booted + 7.0)
        with History(path) as other:
            assert other.get_run(rec.run_id).status == "running"
        rec.finish()


def test_history_show_says_whether_the_prefix_cache_was_reset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        for name, reset in (("fresh", {"reset": True, "reason": None}),
                            ("attached", {"reset": False, "reason": "a server vtui did not start"}), ("older", None)):
            rec = store.start_run(name)
            rec.finish(summary={"load": {"completed": 1}, **({"prefix_cache_reset": reset} if reset else {})})
    shown = {}
    for name in ("fresh", "attached", "older"):
        assert main(["history", "show", name]) == 0
        shown[name] = capsys.readouterr().out
    assert "  prefix    cache reset before the run\n" in shown["fresh"]
    assert "  prefix    cache not reset: a server vtui did not start\n" in shown["attached"]
    assert "  prefix " not in shown["older"]  # stored before vtui reset the cache: nothing said
