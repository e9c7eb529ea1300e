"""The presets on this machine: the shipped ones and the user's, listed, found by name or path, saved;
a preset made from flags; the TOML writer."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from engine.presets.model import DEFAULT_MODEL, NAME_RE, SHIPPED_DIR, Preset, PresetError, dumps_toml, user_presets_dir
from engine.presets.reading import load_preset, loads_preset
from loadgen.spec import SLO, SpecError

if TYPE_CHECKING:
    from loadgen.record import PresetShape

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
    if not NAME_RE.match(preset.name):
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


