"""The run history's file: its schema (``MIGRATIONS``, one step per version, never edited once
shipped), where it lives, opening it, and SQLite's failures as a :class:`HistoryError` that names
the file and says what to do. The store is ``engine.runs.history.History``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from engine import paths


class HistoryError(Exception):
    """The history file cannot be used: names the file and the reason."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


# --------------------------------------------------------------------------- schema
# MIGRATIONS[i] takes a database from user_version i to i + 1. Never edit a shipped
# step: add a new one, so every older file upgrades the same way.

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: the first schema.
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        preset TEXT,
        started REAL NOT NULL,
        ended REAL,
        status TEXT NOT NULL,
        flags TEXT NOT NULL DEFAULT '{}',
        vllm_version TEXT,
        model TEXT,
        gpus TEXT NOT NULL DEFAULT '[]',
        workload TEXT NOT NULL DEFAULT '{}',
        summary TEXT NOT NULL DEFAULT '{}',
        baseline INTEGER NOT NULL DEFAULT 0,
        writer_pid INTEGER,
        writer_started REAL
    );
    CREATE TABLE requests (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        req_id INTEGER,
        t_start REAL NOT NULL,
        ttft_s REAL,
        e2el_s REAL,
        itl_s TEXT NOT NULL DEFAULT '[]',
        input_tokens INTEGER,
        output_tokens INTEGER,
        ok INTEGER NOT NULL,
        error TEXT,
        cancelled INTEGER NOT NULL DEFAULT 0,
        extra TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE samples (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        t REAL NOT NULL,
        data TEXT NOT NULL
    );
    """,
    # 1 -> 2: free-form tags on runs, and indexes once histories grew past a few runs.
    """
    ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
    CREATE INDEX requests_run ON requests(run_id, t_start);
    CREATE INDEX samples_run ON samples(run_id, kind, t);
    """,
    # 2 -> 3: flag searches (`vtui tune`), saved after every step so they can be resumed.
    """
    CREATE TABLE tunes (
        id TEXT PRIMARY KEY,
        started REAL NOT NULL,
        updated REAL NOT NULL,
        status TEXT NOT NULL,
        model TEXT,
        summary TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL
    );
    """,
    # 3 -> 4: a box's noise floor (`vtui bench --noise-floor K`): each figure's run-to-run spread
    # over K runs of one workload, which single-run comparisons on that box take as their noise.
    """
    CREATE TABLE noise_floors (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        box TEXT NOT NULL,
        measured REAL NOT NULL,
        runs INTEGER NOT NULL,
        run_ids TEXT NOT NULL DEFAULT '[]',
        label TEXT NOT NULL DEFAULT '',
        model TEXT,
        fingerprint TEXT,
        spread TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX noise_floors_box ON noise_floors(box, measured);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_path() -> Path:
    return paths.data_dir() / "history.sqlite"


_PAGE_SIZE = 4096


def connect(path: Path, *, read_only: bool = False, max_bytes: int | None = None) -> sqlite3.Connection:
    if read_only:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), timeout=10.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 10000")
    if max_bytes is not None:
        # SQLite answers SQLITE_FULL past this size, exactly as on a full disk.
        conn.execute(f"PRAGMA max_page_count = {max(1, int(max_bytes) // _PAGE_SIZE)}")
    return conn


def explain(path: Path, exc: BaseException) -> HistoryError:
    text = str(exc)
    lowered = text.lower()
    if "readonly" in lowered or "read-only" in lowered:
        reason = "the history file is read-only; results stay in memory only (check the file's permissions)"
    elif "disk is full" in lowered or "database or disk is full" in lowered:
        reason = "the disk is full; results from here on stay in memory only"
    elif "unable to open" in lowered:
        reason = "cannot open the history file (missing folder or no permission)"
    elif "not a database" in lowered or "malformed" in lowered:
        reason = f"not a vtui history file or damaged ({text}); move it away to start a new one"
    else:
        reason = text
    return HistoryError(path, reason)
