"""The README and docs/ stay true to the code: its screenshot is the app's, the CLI reference and
the keys are what `vtui ... --help` and the bindings give, and the front door keeps its promises.

Regenerate after an intended change: ``python -m tui.clidoc`` (docs/CLI.md, the keys of
docs/USER-GUIDE.md) and ``pytest tests/test_docs.py --snapshot-update`` (docs/vtui.svg).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tui_data

from engine.flags import builtin_schema
from engine.presets import list_presets
from tui import clidoc
from tui.app import VtuiApp

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCREENSHOT = ROOT / "docs" / "vtui.svg"
SCREENSHOT_SIZE = (120, 36)


async def _render_screenshot() -> str:
    """The app at 120x36 with a server ready and a run going (tests/tui_data.py: fixed clock and
    figures, no server), as Textual exports it."""
    session = tui_data.make_session()
    app = VtuiApp(session, schema=builtin_schema(), presets=list_presets(include_user=False), publish=False,
                  cursor_blink=False)
    async with app.run_test(size=SCREENSHOT_SIZE) as pilot:
        for _ in range(2):  # twice: a panel draws what arrives after it was shown
            app.show_snapshot(tui_data.ready_running(session))
            await pilot.pause()
        app.screen.set_focus(None)
        await pilot.pause()
        return app.export_screenshot(title="vtui")


async def test_readme_screenshot_is_the_app(request: pytest.FixtureRequest) -> None:
    svg = await _render_screenshot()
    if request.config.getoption("--snapshot-update", default=False):
        SCREENSHOT.write_text(svg, encoding="utf-8")
    assert SCREENSHOT.read_text(encoding="utf-8") == svg, (
        "docs/vtui.svg is not what the app draws now: `pytest tests/test_docs.py --snapshot-update`, "
        "then look at it")


def test_generated_docs_are_current() -> None:
    stale = [str(path.relative_to(ROOT)) for path, text in clidoc.generated()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated docs: {stale} (run `python -m tui.clidoc`)"


def test_cli_reference_is_what_vtui_help_prints() -> None:
    """The real entry point, in a process of its own, prints every command's help as docs/CLI.md
    holds it (clidoc reads it in-process; this checks that reading against `vtui ... --help`)."""
    doc = (ROOT / "docs" / "CLI.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (vtui[^\n]*)\n\n```text\n(.*?)\n```$", doc, flags=re.M | re.S))
    code = ("import contextlib, sys\nfrom tui.cli import build_parser, main\nfrom tui.clidoc import command_paths\n"
            "for path in command_paths(build_parser()):\n"
            "    print('\\x00' + ' '.join(('vtui', *path)), flush=True)\n"
            "    with contextlib.suppress(SystemExit):\n"
            "        main([*path, '--help'])\n"
            "    sys.stdout.flush()\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**_env(), "COLUMNS": str(clidoc.HELP_COLUMNS)}).stdout
    printed = {part.partition("\n")[0]: part.partition("\n")[2].rstrip("\n") for part in out.split("\x00")[1:]}
    assert set(printed) == set(sections), sorted(set(printed) ^ set(sections))
    differ = [name for name in printed if printed[name] != sections[name]]
    assert not differ, f"docs/CLI.md differs from --help for {differ} (run `python -m tui.clidoc`)"


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "COLUMNS"}


def test_readme_first_screen_holds_the_picture_the_pip_line_and_make_run() -> None:
    first = README.read_text(encoding="utf-8").splitlines()[:40]
    text = "\n".join(first)
    assert "](docs/vtui.svg)" in text, "the screenshot"
    assert re.search(r"^pip install \S+", text, flags=re.M), "the pip install line for a box with vLLM"
    assert re.search(r"^make run\b", text, flags=re.M) and re.search(r"^make test\b", text, flags=re.M)


def test_a_plain_install_brings_no_vllm() -> None:
    """The README's pip line goes into the environment that holds vLLM: vtui's own dependencies
    name no vllm (only the extras gpu and cpu do), so pip installs no second one."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not [d for d in project["dependencies"] if re.match(r"vllm\b", d)]


def test_every_link_in_the_readme_and_docs_leads_somewhere() -> None:
    missing = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "tests" / "perf").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_every_file_the_architecture_page_names_exists() -> None:
    """docs/ARCHITECTURE.md names files and folders in backticks (`engine/runs/measure.py`,
    `loadgen/traceformats/`): each must exist, so the page cannot drift from the tree."""
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = {m for m in re.findall(r"`([A-Za-z0-9_./-]+)`", text)
             if "/" in m and not m.startswith(("/", "http")) and re.search(r"(\.[a-z]+|/)$", m)}
    assert len(named) > 40, named
    missing = sorted(m for m in named if not (root / m).exists())
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"
