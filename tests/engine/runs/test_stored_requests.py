"""A run's requests come back typed (StoredRequest) and written back as the same JSON and CSV as
when they were handed over as dicts; a damaged row is a HistoryError naming it."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from engine.runs.history import History, HistoryError, StoredRequest
from tui.commands.history import _requests_csv

T0 = 1_800_000_000.0

RECORDS = [
    {"id": 0, "t_start": T0, "ttft_s": 0.05, "itl_s": (0.01, 0.02), "e2el_s": 0.08, "input_tokens": 100,
     "output_tokens": 3, "ok": True, "error": None, "cancelled": False, "worker": 2, "send_s": 0.001,
     "error_detail": ""},
    {"id": 1, "t_start": T0 + 0.1, "ttft_s": None, "itl_s": [], "e2el_s": 0.5, "input_tokens": 7,
     "output_tokens": 0, "ok": False, "error": "http_500", "cancelled": False, "queued_s": 0.25,
     "nested": {"a": [1, 2.5, None]}, "bad": float("inf")},
    {"id": 2, "t_start": T0 + 0.2, "ttft_s": 0.1, "itl_s": [1, 2], "e2el_s": None, "input_tokens": None,
     "output_tokens": None, "ok": True, "cancelled": True},
    {"id": 3, "t_start": T0 + 0.3, "ttft_s": 0.2, "itl_s": [0.1, float("nan")], "e2el_s": 0.9, "input_tokens": 3,
     "output_tokens": 9, "ok": 1, "error": "", "cancelled": 0},
]


def _legacy_requests(path: Path, run_id: int) -> list[dict[str, object]]:
    """History.requests as it was before the rows were typed: the merged dict of each row."""
    conn = sqlite3.connect(path)
    rows = conn.execute(
        "SELECT req_id, t_start, ttft_s, e2el_s, itl_s, input_tokens, output_tokens, ok, error, cancelled, extra"
        " FROM requests WHERE run_id = ? ORDER BY t_start, rowid", (run_id,)).fetchall()
    conn.close()
    out = []
    for rid, t0, ttft, e2el, itl, n_in, n_out, ok, err, cancelled, extra in rows:
        rec = {"id": rid, "t_start": t0, "ttft_s": ttft, "e2el_s": e2el, "itl_s": json.loads(itl),
               "input_tokens": n_in, "output_tokens": n_out, "ok": bool(ok), "error": err,
               "cancelled": bool(cancelled)}
        rec.update(json.loads(extra))
        out.append(rec)
    return out


def _legacy_csv(requests: list[dict]) -> str:
    """tui.commands.history._requests_csv as it was, reading the dicts."""
    buf = io.StringIO()
    columns = ["id", "t_start", "ok", "error", "cancelled", "ttft_ms", "tpot_ms", "e2el_ms", "input_tokens", "output_tokens"]
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in requests:
        ttft, e2el, n = r.get("ttft_s"), r.get("e2el_s"), r.get("output_tokens") or 0
        tpot = (e2el - ttft) / (n - 1) * 1000 if ttft is not None and e2el is not None and n > 1 else ""
        writer.writerow([
            r.get("id"), r.get("t_start"), int(bool(r.get("ok"))), r.get("error") or "", int(bool(r.get("cancelled"))),
            "" if ttft is None else round(ttft * 1000, 3), "" if tpot == "" else round(tpot, 3),
            "" if e2el is None else round(e2el * 1000, 3), r.get("input_tokens"), r.get("output_tokens"),
        ])
    return buf.getvalue()


def _stored(path: Path) -> int:
    with History(path) as store:
        rec = store.start_run("typed", started=T0)
        for r in RECORDS:
            rec.add_request(r)
        rec.add_sample("window", T0 + 1, {"req_s": 3.0})
        rec.finish()
        assert rec.error is None
        return rec.run_id


def test_requests_round_trip_to_the_json_and_csv_they_were(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    run_id = _stored(path)
    legacy = _legacy_requests(path, run_id)
    with History(path) as store:
        typed = store.requests(run_id)
    assert all(isinstance(r, StoredRequest) for r in typed)
    assert [r.to_json() for r in typed] == legacy
    # byte for byte, key order included: `vtui history show/export --format json` and the CSV
    assert json.dumps([r.to_json() for r in typed], indent=2) == json.dumps(legacy, indent=2)
    assert _requests_csv(typed) == _legacy_csv(legacy)
    first, failed, cancelled, odd = typed
    assert (first.id, first.itl_s, first.ok, first.extra["worker"]) == (0, (0.01, 0.02), True, 2)
    assert (failed.ttft_s, failed.error, failed.extra["queued_s"], failed.extra["bad"]) == (None, "http_500", 0.25, None)
    assert cancelled.cancelled and cancelled.itl_s == (1, 2) and cancelled.input_tokens is None
    assert odd.itl_s == (0.1, None) and odd.ok is True and odd.cancelled is False  # nan is stored as null
    # to_json and from_json are inverses
    assert [StoredRequest.from_json(r.to_json()) for r in typed] == typed


def test_export_json_lists_the_requests_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.cli import main

    monkeypatch.setenv("VTUI_HOME", str(tmp_path))
    with History() as store:
        path = store.path
    run_id = _stored(path)
    target = tmp_path / "run.json"
    assert main(["history", "export", str(run_id), "--format", "json", "-o", str(target)]) == 0
    assert json.loads(target.read_text())["requests_detail"] == _legacy_requests(path, run_id)
    csv_target = tmp_path / "run.csv"
    assert main(["history", "export", str(run_id), "--format", "csv", "-o", str(csv_target)]) == 0
    assert csv_target.read_text() == _legacy_csv(_legacy_requests(path, run_id))


@pytest.mark.parametrize(("column", "text", "says"), [
    ("extra", "not json", "the extra column is not JSON"),
    ("extra", "[1, 2]", "the extra column is '[1, 2]', not a JSON object"),
    ("itl_s", "{}", "itl_s is {}, not a list"),
    ("itl_s", '["x"]', "an itl_s value is 'x', not a number"),
    ("ttft_s", "soon", "ttft_s is 'soon', not a number"),
])
def test_a_damaged_request_row_is_a_history_error_naming_it(tmp_path: Path, column: str, text: str, says: str) -> None:
    path = tmp_path / "h.sqlite"
    run_id = _stored(path)
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE requests SET {column} = ? WHERE run_id = ? AND req_id = 1", (text, run_id))
    conn.commit()
    conn.close()
    with History(path) as store, pytest.raises(HistoryError) as caught:
        store.requests(run_id)
    assert f"run {run_id}'s request 1 cannot be read: {says}" in str(caught.value)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(("text", "says"), [("{oops", "the data column is not JSON"),
                                            ("[1]", "its data is '[1]', not a JSON object")])
def test_a_damaged_sample_is_a_history_error_naming_it(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "h.sqlite"
    run_id = _stored(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE samples SET data = ? WHERE run_id = ?", (text, run_id))
    conn.commit()
    conn.close()
    with History(path) as store:
        with pytest.raises(HistoryError, match=f"run {run_id}'s window sample at t=.* cannot be read: "):
            store.samples(run_id)
        with pytest.raises(HistoryError) as caught:
            store.samples(run_id, "window")
    assert says in str(caught.value)


def test_from_json_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="request 4: output_tokens is 'many', not an integer"):
        StoredRequest.from_json({"t_start": T0, "output_tokens": "many"}, "request 4")
    with pytest.raises(ValueError, match="t_start is missing"):
        StoredRequest.from_json({"id": 1})
