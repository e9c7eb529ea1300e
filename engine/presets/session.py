"""A session's presets: engine.session.Session's load_preset and save_preset are thin over these:
they read and write presets here and apply what comes back to the session's state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import SessionError
from engine.flags import FlagSet, recordable_values
from engine.presets.library import find_preset, preset_from_flags, save_user_preset
from engine.presets.model import Preset, PresetError
from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec

if TYPE_CHECKING:
    pass

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
