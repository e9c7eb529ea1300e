"""The core (engine/, loadgen/) never imports Textual or Rich, and `vtui --help` stays light;
imports go down the layers docs/ARCHITECTURE.md gives, in no circle; no module is over 900 lines.

Each module is imported in a fresh interpreter, so one module's imports cannot hide
another's (harlequin's tests/unit_tests/test_import_hygiene.py does the same).
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from collections.abc import Sequence
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


# --------------------------------------------------------------------------- import circles
#
# Rooms import downward only; a circle, even a type-only one, says a concept sits in the wrong
# room (docs/ARCHITECTURE.md). The graph is read from the source with `ast`, so imports under
# `if TYPE_CHECKING:` and inside functions count as much as those at the top. `from X import a`
# is an edge to X (its namespace is read), and to X.a too where X.a is a module; `import X.Y`
# is an edge to X.Y. A package's own __init__ is not counted as imported by its submodules
# (Python runs it first, but every package that names its submodules would then be a circle).

GRAPH_PACKAGES = ("engine", "loadgen", "tui")

# The circles left, each a set of modules (one strongly connected part of the graph), with the
# reason it stays. Only circles that exist may be listed: a stale entry fails too.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}


def _module_files(root: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for package in GRAPH_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, anywhere in its source."""
    import ast

    files = _module_files(root)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    while name and name not in files:  # `import a.b.func_module`: the nearest module
                        name = name.rpartition(".")[0]
                    if name:
                        targets.add(name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    source = ".".join([*base, node.module] if node.module else base)
                else:
                    source = node.module or ""
                if source in files:
                    targets.add(source)
                targets.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in files)
        targets.discard(module)
        graph[module] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The graph's circles: each strongly connected part of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(frozenset(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out, key=sorted)


def _circle_path(graph: dict[str, set[str]], part: frozenset[str]) -> str:
    """One circle through ``part``'s first module, written a -> b -> a."""
    start = min(part)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & part):
            if w == start:
                return " -> ".join([*paths[v], start])
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return " <-> ".join(sorted(part))


def test_no_import_circles() -> None:
    graph = import_graph()
    circles = import_circles(graph)
    new = [_circle_path(graph, c) for c in circles if c not in ALLOWED_CIRCLES]
    assert not new, "import circles (put the shared types in the lower module or one of their own):\n" + "\n".join(new)
    stale = [sorted(c) for c in ALLOWED_CIRCLES if c not in circles]
    assert not stale, f"ALLOWED_CIRCLES lists circles that are gone (or changed): {stale}"


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_import_graph_sees_type_only_function_level_and_relative_imports(tmp_path: Path) -> None:
    files = {
        "engine/__init__.py": "",
        "engine/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.b import B\n",
        "engine/b.py": "def f():\n    from engine import a\n",
        "engine/c.py": "from . import d\n",
        "engine/d.py": "import engine.c\n",
        "engine/e.py": "from engine.f import thing\n",
        "engine/f.py": "import os\nthing = os.sep\n",
        "loadgen/__init__.py": "from loadgen.run import R\n",
        "loadgen/run.py": "from loadgen import records\n",
        "loadgen/records.py": "",
        "tui/__init__.py": "",
    }
    _write_tree(tmp_path, files)
    graph = import_graph(tmp_path)
    assert graph["engine.b"] == {"engine", "engine.a"}
    assert graph["engine.c"] == {"engine", "engine.d"}
    assert sorted(map(sorted, import_circles(graph))) == [
        ["engine.a", "engine.b"], ["engine.c", "engine.d"], ["loadgen", "loadgen.run"]]


# --------------------------------------------------------------------------- layers
#
# The layering as docs/ARCHITECTURE.md ("Layers") writes it, lowest first: tui -> engine -> loadgen,
# and inside engine the rooms in that order. A module imports its own layer and those below, never
# one above, counting every import the graph above sees (type-only and function-level ones too). A
# module belongs to the layer of the longest name that contains it: engine.runs.live is one of the
# session's parts, engine.runs.measure is engine.runs. `engine` itself names only the package.

LAYERS: tuple[tuple[str, ...], ...] = (
    ("loadgen",),
    ("engine", "engine.errors", "engine.values", "engine.paths"),
    ("engine.flags",),
    ("engine.server", "engine.telemetry"),
    ("engine.presets",),
    ("engine.runs",),
    ("engine.tune", "engine.advise"),
    ("engine.views",),
    ("engine.server.live", "engine.telemetry.live", "engine.runs.live", "engine.runs.export", "engine.tune.live"),
    ("engine.session",),
    ("tui",),
)

# Imports that go up a layer, each with the reason it stays. Only imports that exist may be listed:
# a stale entry fails too.
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("engine.flags.validate", "engine.server.modelconfig"):
        "validate checks flags against a model's numbers (heads for tensor-parallel-size, the context for "
        "max-model-len): a type-only import of ModelConfig, whose module reads config.json and imports "
        "nothing above engine.values.",
    ("engine.runs.measure", "engine.advise.speedoflight"):
        "a measured run stores its speed of light (decode floor, MBU, MFU) with its telemetry; "
        "speedoflight imports only engine.server's model numbers and engine.values, nothing of advise.",
}

MAX_MODULE_LINES = 900


def layer_of(module: str, layers: Sequence[Sequence[str]] = LAYERS) -> int | None:
    """The index in ``layers`` of the longest name containing ``module``; None when none does."""
    found: tuple[int, int] | None = None
    for index, names in enumerate(layers):
        for name in names:
            if module == name or (name != "engine" and module.startswith(name + ".")):
                if found is None or len(name) > found[1]:
                    found = (index, len(name))
    return None if found is None else found[0]


def layer_violations(graph: dict[str, set[str]], layers: Sequence[Sequence[str]] = LAYERS) -> list[tuple[str, str]]:
    """Every import from a module to one in a higher layer, as (importer, imported)."""
    out = []
    for module in sorted(graph):
        here = layer_of(module, layers)
        for target in sorted(graph[module]):
            there = layer_of(target, layers)
            if here is not None and there is not None and there > here:
                out.append((module, target))
    return out


def long_modules(root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> list[str]:
    """Modules in engine/, loadgen/, tui/ over ``limit`` lines (as `wc -l` counts), longest first."""
    counts = [(path.read_text(encoding="utf-8").count("\n"), path.relative_to(root).as_posix())
              for path in _module_files(root).values()]
    return [f"{name}: {n} lines" for n, name in sorted(counts, reverse=True) if n > limit]


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS and docs/ARCHITECTURE.md): {unplaced}"


def test_imports_go_down_the_layers() -> None:
    found = layer_violations(import_graph())
    new = [f"{a} imports {b}" for a, b in found if (a, b) not in LAYER_EXCEPTIONS]
    assert not new, ("imports up the layers (docs/ARCHITECTURE.md, Layers: move the shared part down, "
                     "or the importer up):\n" + "\n".join(new))
    stale = [pair for pair in LAYER_EXCEPTIONS if pair not in found]
    assert not stale, f"LAYER_EXCEPTIONS lists imports that no longer go up (or are gone): {stale}"


def test_architecture_doc_gives_the_same_layers() -> None:
    """docs/ARCHITECTURE.md's numbered Layers list names LAYERS' modules in LAYERS' order."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.partition("\n## Layers")[2].partition("\n## ")[0]
    written = [tuple(re.findall(r"`([a-z_.]+)`", line.partition(" — ")[0]))
               for line in section.splitlines() if re.match(r"\d+\. ", line)]
    assert written == list(LAYERS), f"the doc's Layers list: {written}"


def test_no_module_over_900_lines() -> None:
    over = long_modules()
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them along a seam):\n" + "\n".join(over)


def test_layer_and_size_checks_catch_a_violation(tmp_path: Path) -> None:
    files = {
        "engine/__init__.py": "",
        "engine/flags/__init__.py": "",
        "engine/flags/spec.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.session import S\n",
        "engine/session.py": "from engine.flags import spec\n" + "x = 1\n" * 901,
        "engine/runs/__init__.py": "",
        "engine/runs/live.py": "from engine import views\n",
        "engine/views.py": "from engine.runs import live\n",
        "loadgen/__init__.py": "def f():\n    import tui\n",
        "tui/__init__.py": "import engine.session\n",
    }
    _write_tree(tmp_path, files)
    assert layer_violations(import_graph(tmp_path)) == [
        ("engine.flags.spec", "engine.session"), ("engine.views", "engine.runs.live"), ("loadgen", "tui")]
    assert layer_of("engine.runs.live") > layer_of("engine.views") > layer_of("engine.runs.measure")
    assert layer_of("engine.nothing_here") is None
    assert long_modules(tmp_path) == ["engine/session.py: 902 lines"]
