"""A search's state, kept to resume it (:class:`TuneState`), what it was asked (:class:`SavedInputs`),
and where it is kept: a JSON file per search under the data folder (:class:`FileStore`) or the run
history (:class:`HistoryStore`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine import paths
from engine.flags import FlagError, FlagSet
from engine.runs.history import History, HistoryError
from engine.tune.errors import TuneError
from engine.tune.ranking import cost, decide, limit_runs
from engine.tune.space import SearchSpace
from engine.tune.trial import CUT_SHORT, NOT_TRIED, OBJECTIVES, ConfigResult, Measurement, TuneSettings, config_score
from engine.values import StoredFields, json_object
from loadgen.spec import SLO, ArrivalSpec, SpecError, WorkloadSpec


def tune_dir() -> Path:
    path = paths.data_dir() / "tune"
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def state_path(tune_id: str) -> Path:
    if not tune_id or "/" in tune_id or tune_id.startswith("."):
        raise TuneError("tune id", f"{tune_id!r} is not a tune id")
    return tune_dir() / f"{tune_id}.json"


@dataclass
class TuneState:
    """Everything a search needs to resume: its inputs, each config's result, every step.

    Written atomically (temp file + rename) after every start and step.
    """

    id: str
    inputs: dict[str, object]
    """The search's inputs as saved (JSON): a resume parses each with its own ``from_dict``
    (a parsing edge; ``vtui tune --resume`` reads it)."""
    configs: dict[str, ConfigResult] = field(default_factory=dict)
    measurements: dict[str, list[Measurement]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    starts: int = 0
    steps: int = 0
    status: str = "running"

    def to_json(self) -> dict[str, object]:
        return {
            "version": 1, "id": self.id, "inputs": self.inputs, "status": self.status,
            "elapsed_s": self.elapsed_s, "starts": self.starts, "steps": self.steps,
            "configs": {k: c.to_dict() for k, c in self.configs.items()},
            "measurements": {k: [m.to_dict() for m in ms] for k, ms in self.measurements.items()},
        }

    @property
    def model(self) -> str | None:
        """The model its base flags serve (None where the saved inputs do not say)."""
        model = json_object(self.inputs.get("base_flags")).get("model")
        return str(model) if model else None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")
        os.replace(tmp, path)

    def summary(self) -> dict[str, object]:
        """What a listing shows: configs finished of all, time spent, the best so far."""
        finished = [c for c in self.configs.values() if c.status not in (NOT_TRIED, CUT_SHORT)]
        settings = self.inputs.get("settings")
        objective = settings.get("objective", "goodput") if isinstance(settings, dict) else "goodput"
        if objective not in OBJECTIVES:
            objective = "goodput"
        best = self.best(objective)
        space = self.inputs.get("space")
        total = math.prod(len(v) for v in space.values()) if isinstance(space, dict) else len(self.configs)
        return {"done": len(finished), "total": max(total, len(self.configs)), "elapsed_s": self.elapsed_s,
                "best": best.key if best else None, "goodput": best.goodput if best else None,
                "objective": objective, "score": config_score(best, objective) if best else None}

    def best(self, objective: str) -> ConfigResult | None:
        """The best as the search ranks them (Tuner.best: engine.tune.ranking.decide), from the
        saved steps and the saved base flags under each configuration's values."""
        base = json_object(self.inputs.get("base_flags"))
        settings = json_object(self.inputs.get("settings"))
        tolerance = settings.get("tolerance", 0.0)
        decided = decide(self.configs.values(),
                         lambda c: limit_runs(c, self.measurements.get(c.key, ()), objective), objective,
                         cost_of=lambda c: cost({**base, **c.values}),
                         tolerance=float(tolerance) if isinstance(tolerance, (int, float)) else 0.0)
        return decided[0] if decided is not None else None

    @classmethod
    def load(cls, path: Path) -> TuneState:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TuneError(str(path), "no such tune state (see `vtui tune --list`)") from None
        except (OSError, ValueError) as exc:
            raise TuneError(str(path), f"cannot read the tune state: {exc}") from None
        return cls.from_json(d, str(path))

    @classmethod
    def from_json(cls, d: object, where: str) -> TuneState:
        """From :meth:`to_json`'s form; TuneError naming ``where`` when it is not one."""
        try:
            f = StoredFields(d, where)
            inputs = json_object(f.doc.get("inputs"))
            if not isinstance(f.doc.get("inputs"), Mapping):
                raise KeyError("inputs")
            configs, measured = f.obj("configs"), f.obj("measurements")
            return cls(
                id=str(f.doc["id"]), inputs=dict(inputs), status=f.text("status", "running"),
                elapsed_s=f.number("elapsed_s", 0.0), starts=f.whole("starts", 0), steps=f.whole("steps", 0),
                configs={k: ConfigResult.from_dict(configs.obj(k).doc) for k in configs.doc},
                measurements={k: [Measurement.from_dict(StoredFields(m, f"{where}: {k}").doc, f"{where}: {k}")
                                  for m in measured.items(k)] for k in measured.doc},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TuneError(where, f"not a vtui tune state: {type(exc).__name__}: {exc}") from None


def _part(inputs: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = inputs.get(key)
    if value is None:
        raise TuneError(f"saved {key}", "missing")
    if not isinstance(value, Mapping):
        raise TuneError(f"saved {key}", f"{type(value).__name__}, not an object")
    return value


@dataclass(frozen=True)
class SavedInputs:
    """What a saved search was asked: its base flags, space, SLO, workload (and arrivals) and
    settings, decoded from :attr:`TuneState.inputs`."""

    base: FlagSet
    space: SearchSpace
    slo: SLO
    workload: WorkloadSpec
    arrivals: ArrivalSpec | None
    settings: TuneSettings

    @classmethod
    def of(cls, state: TuneState, now: TuneSettings) -> SavedInputs:
        """``state``'s inputs, its settings with the budget and timeouts of ``now`` (what the user
        gives when resuming). Raises TuneError naming the part that is missing or unreadable."""
        inputs = state.inputs
        try:
            saved_load = _part(inputs, "workload")
            saved = TuneSettings.from_dict(_part(inputs, "settings"))
            return cls(
                base=FlagSet.from_dict(_part(inputs, "base_flags")),
                space=SearchSpace.from_dict(_part(inputs, "space")),
                slo=SLO.from_dict(_part(inputs, "slo")),
                workload=WorkloadSpec.from_dict(json_object(saved_load.get("workload"))),
                arrivals=ArrivalSpec.from_dict(_part(saved_load, "arrivals")) if saved_load.get("arrivals") else None,
                settings=TuneSettings.from_dict({**saved.to_dict(), "budget_s": now.budget_s,
                                                 "start_timeout_s": now.start_timeout_s,
                                                 "step_timeout_s": now.step_timeout_s}),
            )
        except TuneError:
            raise
        except (FlagError, SpecError, KeyError, TypeError, ValueError) as exc:
            raise TuneError(f"saved search {state.id}", str(exc)) from None


class TuneStore(Protocol):
    """Where a search is saved after every start and step."""

    def save(self, state: TuneState) -> None: ...


@dataclass(frozen=True)
class FileStore:
    """A JSON file (tests, benchmark scripts)."""

    path: Path

    def save(self, state: TuneState) -> None:
        state.save(self.path)


@dataclass(frozen=True)
class HistoryStore:
    """The run history (engine.runs.history, table ``tunes``): ``vtui tune --list`` and
    ``--resume ID`` read it. The file is opened per save (a few ms, between steps that take
    seconds), so no SQLite connection is held across the search's awaits."""

    path: Path | None = None

    def save(self, state: TuneState) -> None:
        with History(self.path) as h:
            h.save_tune(state.id, state.to_json(), status=state.status,
                        model=state.model,
                        summary=state.summary())


def load_state(ref: str, history_path: Path | None = None) -> TuneState:
    """A saved search by id (from the history) or by the path of a JSON state file."""
    path = Path(ref)
    if ref.endswith(".json") or path.is_file():
        return TuneState.load(path)
    try:
        with History(history_path) as h:
            d = h.load_tune(ref)
    except HistoryError as exc:
        with contextlib.suppress(TuneError):  # not an id state_path takes: no legacy file either
            legacy = state_path(ref)
            if legacy.is_file():  # saved by vtui before searches went into the history
                return TuneState.load(legacy)
        raise TuneError(f"tune {ref!r}", exc.reason) from None
    return TuneState.from_json(d, f"saved search {ref!r}")


def list_states(history_path: Path | None = None) -> list[dict[str, object]]:  # rows of saved JSON summaries
    """Saved searches, newest first: id, status, model, started, and :meth:`TuneState.summary`."""
    with History(history_path) as h:
        rows = [{"id": t.id, "status": t.status, "model": t.model, "started": t.started, **t.summary}
                for t in h.list_tunes()]
    known = {r["id"] for r in rows}
    for path in sorted(tune_dir().glob("*.json"), reverse=True):  # older vtui's files
        if path.stem in known:
            continue
        try:
            st = TuneState.load(path)
        except TuneError as exc:
            rows.append({"id": path.stem, "status": "unreadable", "model": None, "error": exc.reason})
            continue
        rows.append({"id": st.id, "status": st.status, "started": path.stat().st_mtime,
                     "model": st.model, **st.summary()})
    return rows
