"""Reading a preset file or text: TOML to a checked Preset, every bad value named by file, line and key."""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from engine import flags as flagmod
from engine.flags import Schema
from engine.presets.model import (
    DEFAULT_MODEL,
    FLAG_RE,
    MAX_PRESET_BYTES,
    MAX_REPEATS,
    NAME_RE,
    TINY_KEYS,
    TOP_KEYS,
    FlagValue,
    Preset,
    PresetError,
    TableValue,
    TinyScaling,
)
from loadgen.spec import SLO, ArrivalSpec, SpecError, WorkloadSpec

if TYPE_CHECKING:
    pass

# --------------------------------------------------------------------------- reading


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
        if key not in TOP_KEYS:
            raise fail("", key, f"unknown key; expected one of {', '.join(TOP_KEYS)}")
    name = doc.get("name")
    if name is None:
        raise PresetError(source, "name", "missing; every preset needs name = \"...\"")
    if not isinstance(name, str):
        raise fail("", "name", f"must be a string, not {_tname(name)}")
    if not NAME_RE.match(name):
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
            if key not in TINY_KEYS:
                raise fail("tiny", key, f"unknown key; expected one of {', '.join(TINY_KEYS)}")
        note = tiny_d.get("note", "")
        if not isinstance(note, str):
            raise fail("tiny", "note", f"must be a string, not {_tname(note)}")
        unset = tiny_d.get("unset", [])
        if not isinstance(unset, list) or not all(isinstance(u, str) and FLAG_RE.match(u) for u in unset):
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
        if not FLAG_RE.match(name):
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


