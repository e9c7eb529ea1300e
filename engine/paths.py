"""Where vtui keeps user files: presets, run history, server logs, the tiny model.

One environment variable, ``VTUI_HOME``, moves all of them (tests point it at a
temporary folder); otherwise platformdirs' user config and data folders are used.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

_APP = "vtui"


def _home() -> Path | None:
    value = os.environ.get("VTUI_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """User presets and settings."""
    home = _home()
    path = home / "config" if home else Path(platformdirs.user_config_dir(_APP))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Run history, server logs, generated models."""
    home = _home()
    path = home / "data" if home else Path(platformdirs.user_data_dir(_APP))
    path.mkdir(parents=True, exist_ok=True)
    return path


def logs_dir() -> Path:
    path = data_dir() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
