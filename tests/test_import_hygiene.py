"""The core (engine/, loadgen/) never imports Textual or Rich, and `vtui --help` stays light.

Each module is imported in a fresh interpreter, so one module's imports cannot hide
another's (harlequin's tests/unit_tests/test_import_hygiene.py does the same).
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Only textual is checked in sys.modules: httpx itself imports rich when it is
# installed (httpx/_main.py, its optional CLI), which is not ours to avoid. Our own
# source is checked for rich imports with the AST below.
FORBIDDEN = ("textual",)
SOURCE_FORBIDDEN = ("textual", "rich")


def _core_modules() -> list[str]:
    names: list[str] = []
    for package in ("engine", "loadgen"):
        names.append(package)
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            names.append(info.name)
    return names


def _loaded_after_import(module: str) -> set[str]:
    code = (
        "import importlib, sys, json\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    import json

    return set(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", _core_modules())
def test_core_module_does_not_import_ui_libraries(module: str) -> None:
    loaded = _loaded_after_import(module)
    bad = sorted(name for name in loaded if name.split(".")[0] in FORBIDDEN)
    assert not bad, f"{module} pulls in {bad[:5]}"


def test_cli_help_does_not_import_vllm_or_textual() -> None:
    loaded = _loaded_after_import("tui.cli")
    code = "from tui.cli import build_parser; build_parser()\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    loaded |= set(__import__("json").loads(out.strip().splitlines()[-1]))
    heavy = sorted(n for n in loaded if n.split(".")[0] in ("vllm", "torch", "transformers", "textual"))
    assert not heavy, f"`vtui --help` imports {heavy[:5]}"


def test_core_source_has_no_ui_imports() -> None:
    import ast

    offenders = []
    for package in ("engine", "loadgen"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    if name.split(".")[0] in SOURCE_FORBIDDEN:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, offenders
