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


def _dynamic_import(node: object) -> str | None:
    """The module a call ``importlib.import_module("x.y")`` or ``__import__("x.y")`` names, else None."""
    import ast

    if not isinstance(node, ast.Call) or not node.args:
        return None
    func, arg = node.func, node.args[0]
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def import_lines(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Module -> the modules of ours it imports, anywhere in its source, each with the line of
    its first import there (``importlib.import_module("engine.x")`` with a literal name counts)."""
    import ast

    files = _module_files(root)

    def nearest(name: str) -> str:  # `import a.b.func_module`: the nearest module
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [nearest(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    source = ".".join([*base, node.module] if node.module else base)
                else:
                    source = node.module or ""
                found = [source] if source in files else []
                found += [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in files]
            elif (dynamic := _dynamic_import(node)) is not None:
                found = [nearest(dynamic)]
            for name in found:
                if name and name != module:
                    targets[name] = min(targets.get(name, node.lineno), node.lineno)
        graph[module] = targets
    return graph


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, anywhere in its source."""
    return {module: set(targets) for module, targets in import_lines(root).items()}


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
# The floor plan as docs/ARCHITECTURE.md ("Layers") draws it, lowest floor first. A room is an
# engine subpackage or top-level module (engine.runs holds engine.runs.part; engine.views is one
# module), loadgen or tui. A room imports only rooms on lower floors: rooms on one floor stand
# side by side and import neither each other nor anything above, counting every import the
# graph above sees (type-only, function-level and importlib ones too). So the rooms form no
# circle. What two rooms both need goes down to a floor below them both (the session's events:
# engine.events; each room's own views: engine.<room>.view), or the importer moves up.

LAYERS: tuple[tuple[str, ...], ...] = (
    ("loadgen",),
    ("engine", "engine.errors", "engine.paths", "engine.values"),
    ("engine.modelconfig",),
    ("engine.flags",),
    ("engine.events",),
    ("engine.telemetry",),
    ("engine.server",),
    ("engine.presets",),
    ("engine.runs",),
    ("engine.advise", "engine.tune"),
    ("engine.views",),
    ("engine.session",),
    ("tui",),
)

# The one place that may import vLLM itself (a plugin vLLM loads into its own process); everywhere
# else vtui reads vLLM from outside (its argparse in a subprocess, its HTTP API, its /metrics).
VLLM_IMPORTERS = ("engine.server.livehook",)

MAX_MODULE_LINES = 900


def room_of(module: str) -> str:
    """``engine.runs.part`` -> ``engine.runs``; ``engine.views`` -> itself; ``tui.app`` -> ``tui``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "engine" else parts[0]


def floor_of(room: str, layers: Sequence[Sequence[str]] = LAYERS) -> int | None:
    """The index in ``layers`` of the floor ``room`` stands on; None when it is on none."""
    return next((i for i, rooms in enumerate(layers) if room in rooms), None)


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room_of(module), set()).update(
            room_of(t) for t in targets if room_of(t) != room_of(module))
    return rooms


def layer_violations(lines: dict[str, dict[str, int]], root: Path = ROOT,
                     layers: Sequence[Sequence[str]] = LAYERS) -> list[str]:
    """Every import of a room on the same floor or a higher one, each named with its file and line
    (a module's first import of that room)."""
    files = _module_files(root)
    out = []
    for module in sorted(lines):
        here = room_of(module)
        first: dict[str, tuple[int, int, str]] = {}  # room -> its first import here (line, -len, name)
        for target, line in lines[module].items():
            first[room_of(target)] = min(first.get(room_of(target), (line, -len(target), target)),
                                         (line, -len(target), target))
        for there, (line, _, target) in sorted(first.items(), key=lambda kv: kv[1]):
            a, b = floor_of(here, layers), floor_of(there, layers)
            if here != there and a is not None and b is not None and b >= a:
                where = "the same floor" if a == b else f"floor {b + 1}"
                out.append(f"{files[module].relative_to(root).as_posix()}:{line}: {module} imports {target}: "
                           f"room {here} (floor {a + 1}) may not import {there} ({where})")
    return out


def vllm_imports(root: Path = ROOT) -> list[str]:
    """Every import of vllm in engine/, loadgen/ and tui/ outside VLLM_IMPORTERS, with its line."""
    import ast

    out = []
    for module, path in _module_files(root).items():
        if any(module == m or module.startswith(m + ".") for m in VLLM_IMPORTERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (dynamic := _dynamic_import(node)) is not None:
                names = [dynamic]
            names = [n for n in names if n.split(".")[0] == "vllm"]
            out += [f"{path.relative_to(root).as_posix()}:{node.lineno}: {module} imports {n}" for n in names]
    return out


def long_modules(root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> list[str]:
    """Modules in engine/, loadgen/, tui/ over ``limit`` lines (as `wc -l` counts), longest first."""
    counts = [(path.read_text(encoding="utf-8").count("\n"), path.relative_to(root).as_posix())
              for path in _module_files(root).values()]
    return [f"{name}: {n} lines" for n, name in sorted(counts, reverse=True) if n > limit]


def test_every_room_stands_on_a_floor() -> None:
    unplaced = sorted({room_of(m) for m in import_graph()} - {r for rooms in LAYERS for r in rooms})
    assert not unplaced, f"rooms on no floor (add them to LAYERS and docs/ARCHITECTURE.md): {unplaced}"


def test_rooms_import_only_from_lower_floors() -> None:
    found = layer_violations(import_lines())
    assert not found, ("imports that do not go down the floors (docs/ARCHITECTURE.md, Layers: move what both "
                       "need down, or the importer up):\n" + "\n".join(found))


def test_no_circle_of_rooms() -> None:
    rooms = room_graph(import_graph())
    assert not import_circles(rooms), [_circle_path(rooms, c) for c in import_circles(rooms)]


def test_only_the_livehook_imports_vllm() -> None:
    found = vllm_imports()
    assert not found, f"vLLM imported outside {VLLM_IMPORTERS}:\n" + "\n".join(found)


def test_architecture_doc_gives_the_same_layers() -> None:
    """docs/ARCHITECTURE.md's numbered Layers list names LAYERS' rooms in LAYERS' order."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.partition("\n## Layers")[2].partition("\n## ")[0]
    written = [tuple(re.findall(r"`([a-z_.]+)`", line.partition(" — ")[0]))
               for line in section.splitlines() if re.match(r"\d+\. ", line)]
    assert written == list(LAYERS), f"the doc's Layers list: {written}"


def test_no_module_over_900_lines() -> None:
    over = long_modules()
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them along a seam):\n" + "\n".join(over)


def test_layer_vllm_and_size_checks_catch_a_violation(tmp_path: Path) -> None:
    files = {
        "engine/__init__.py": "",
        "engine/flags/__init__.py": "",
        "engine/flags/spec.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.session import S\n",
        "engine/session.py": "from engine.flags import spec\n" + "x = 1\n" * 901,
        "engine/runs/__init__.py": "",
        "engine/runs/part.py": "from engine import views\n",
        "engine/runs/measure.py": "import importlib\nm = importlib.import_module('engine.tune.search')\n",
        "engine/tune/__init__.py": "",
        "engine/tune/search.py": "from engine.advise import advisor\nimport vllm\n",
        "engine/advise/__init__.py": "",
        "engine/advise/advisor.py": "",
        "engine/server/__init__.py": "",
        "engine/server/livehook/__init__.py": "from vllm import plugins\n",
        "engine/views.py": "from engine.runs import part\n",
        "loadgen/__init__.py": "def f():\n    import tui\n",
        "tui/__init__.py": "import engine.session\n",
    }
    _write_tree(tmp_path, files)
    lines = import_lines(tmp_path)
    assert layer_violations(lines, tmp_path) == [
        "engine/flags/spec.py:3: engine.flags.spec imports engine.session: "
        "room engine.flags (floor 4) may not import engine.session (floor 12)",
        "engine/runs/measure.py:2: engine.runs.measure imports engine.tune.search: "
        "room engine.runs (floor 9) may not import engine.tune (floor 10)",
        "engine/runs/part.py:1: engine.runs.part imports engine.views: "
        "room engine.runs (floor 9) may not import engine.views (floor 11)",
        "engine/tune/search.py:1: engine.tune.search imports engine.advise.advisor: "
        "room engine.tune (floor 10) may not import engine.advise (the same floor)",
        "loadgen/__init__.py:2: loadgen imports tui: room loadgen (floor 1) may not import tui (floor 13)"]
    rooms = room_graph(import_graph(tmp_path))
    assert import_circles(rooms) == [frozenset({"engine.flags", "engine.session"}), frozenset({"engine.runs", "engine.views"})]
    assert vllm_imports(tmp_path) == ["engine/tune/search.py:2: engine.tune.search imports vllm"]
    assert room_of("engine.runs.part") == "engine.runs" and room_of("engine.views") == "engine.views"
    assert floor_of("engine.nothing_here") is None
    assert long_modules(tmp_path) == ["engine/session.py: 902 lines"]
