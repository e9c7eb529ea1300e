"""A stored run read back as columns (History.request_columns, what the Runs tab's bootstrap reads:
no Python object per request, issue 44) gives RunNoise the same figures and resamples, to the bit,
as the run's StoredRequests; a damaged row is a HistoryError naming the run and the request."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from engine.runs.history import History, HistoryError, RequestColumns, StoredRequest
from engine.runs.noise import FIGURES, RunNoise, run_noise

T0 = 1_800_000_000.0
WORKLOAD = {"slo": {"ttft_ms": 21.0, "tpot_ms": 5.2}}


def made(n: int) -> list[dict[str, object]]:
    """``n`` records as a run hands them over: most ok, some failed, cancelled, without a TTFT,
    one- and two-token outputs, gaps stored as null, starts out of order and tied, extra fields."""
    rng = random.Random(44)
    out: list[dict[str, object]] = []
    for i in range(n):
        ttft = round(0.020 * (1 + rng.uniform(-0.3, 0.3)), 4)
        tokens = rng.choice([1, 2, 16, 16, 16])
        gaps: list[float | None] = [0.005 * (1 + rng.uniform(-0.3, 0.3)) for _ in range(tokens - 1)]
        if gaps and rng.random() < 0.1:
            gaps[-1] = None
        kind = rng.random()
        out.append({"id": i, "t_start": T0 + round(i * 0.01 + rng.uniform(0, 2), 2), "ttft_s": None if kind < 0.03 else ttft,
                    "e2el_s": ttft + sum(g or 0.0 for g in gaps), "itl_s": gaps, "input_tokens": 12,
                    "output_tokens": None if kind > 0.98 else tokens, "ok": not 0.03 <= kind < 0.06,
                    "error": None, "cancelled": 0.06 <= kind < 0.08, "worker": i % 3, "queued_s": 0.001})
    return out


def stored(path: Path, n: int = 600) -> int:
    with History(path) as store:
        rec = store.start_run("columns", started=T0, workload=WORKLOAD)
        for r in made(n):
            rec.add_request(r)
        rec.finish()
        assert rec.error is None
        return rec.run_id


def test_columns_give_the_same_figures_and_resamples_as_the_stored_requests(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    run_id = stored(path)
    with History(path) as store:
        requests = store.requests(run_id)
        columns = store.request_columns(run_id)
    done = [r for r in requests if r.ok and not r.cancelled and r.ttft_s is not None and r.e2el_s is not None]
    assert 500 < len(columns) == len(done) < len(requests)  # the odd rows are there, and left out
    assert list(columns.t_start) == [r.t_start for r in done]  # in the stored order
    assert columns == RequestColumns.of(requests)
    old, new = run_noise(requests, WORKLOAD, key=run_id), run_noise(columns, WORKLOAD, key=run_id)
    assert old.completed == new.completed and old.block_s == new.block_s
    figures = new.figures()
    assert "request_goodput" in figures and 0 < figures["request_goodput"] < figures["request_throughput"]
    assert figures == old.figures()
    for figure in FIGURES:
        assert new.replicates(figure) == old.replicates(figure), figure
    assert new.settle().figures() == figures


def test_too_few_completed_requests_read_as_columns_are_not_usable(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    run_id = stored(path, n=8)
    with History(path) as store:
        assert not RunNoise(store.request_columns(run_id)).usable


@pytest.mark.parametrize(("column", "text", "says"), [
    ("itl_s", "{}", "itl_s is {}, not a list"),
    ("itl_s", '["x"]', "an itl_s value is 'x', not a number"),
    ("itl_s", "[0.1", "the itl_s column is not JSON"),
    ("ttft_s", "soon", "ttft_s is 'soon', not a number"),
    ("e2el_s", "late", "e2el_s is 'late', not a number"),
    ("output_tokens", "many", "output_tokens is 'many', not an integer"),
    ("t_start", "now", "t_start is 'now', not a number"),
])
def test_a_damaged_row_is_a_history_error_naming_the_run_and_the_request(tmp_path: Path, column: str, text: str,
                                                                        says: str) -> None:
    path = tmp_path / "h.sqlite"
    run_id = stored(path, n=30)
    with History(path) as store:
        req_id = next(r.id for r in store.requests(run_id) if r.ok and not r.cancelled and r.ttft_s is not None)
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE requests SET {column} = ? WHERE run_id = ? AND req_id = ?", (text, run_id, req_id))
    conn.commit()
    conn.close()
    for read in (History.request_columns, History.requests):  # both readers, in the same words
        with History(path) as store, pytest.raises(HistoryError) as caught:
            read(store, run_id)
        assert f"run {run_id}'s request {req_id} cannot be read: {says}" in str(caught.value)
        assert str(path) in str(caught.value)


def test_stored_request_records_as_columns_keep_only_the_completed() -> None:
    def one(i: int, **kw: object) -> StoredRequest:
        base: dict[str, object] = {"id": i, "t_start": float(i), "ttft_s": 0.1, "e2el_s": 0.3, "itl_s": [0.1, None, 0.1],
                                   "output_tokens": 3, "ok": True}
        return StoredRequest.from_json({**base, **kw})

    cols = RequestColumns.of([one(0), one(1, ok=False), one(2, cancelled=True), one(3, ttft_s=None),
                              one(4, output_tokens=None, itl_s=[])])
    assert list(cols.t_start) == [0.0, 4.0] and list(cols.output_tokens) == [3, 0]
    assert list(cols.itl_s) == [0.1, 0.1] and list(cols.itl_ends) == [2, 2]
