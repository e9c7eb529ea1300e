"""Every key reachable at 80x24: the footer keeps the most used ones, whole; the help (F1
or ?) lists every binding of the app and its screens, generated from the bindings; the
command palette has every action; 1-5 bring the tabs to front.

The session is real (engine.session.Session on the built-in flag schema), without a
server, telemetry or history.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import tui_data
from textual.binding import Binding
from textual.widgets import TabbedContent
from textual.widgets._footer import FooterKey

from engine.flags import builtin_schema
from engine.presets import list_presets
from tui.app import MainScreen, VtuiApp
from tui.widgets.help import HelpScreen, bindings_of
from tui.widgets.tune import TuneScreen

FOOTER_KEYS = ["s", "x", "a", "r", "e", "v", "u", "?", "q"]


def make_app(cls: type[VtuiApp] = VtuiApp) -> VtuiApp:
    return cls(tui_data.make_session(), schema=builtin_schema(), presets=list_presets(include_user=False),
               publish=False, cursor_blink=False)


def footer_keys(app: VtuiApp) -> list[FooterKey]:
    return list(app.screen.query(FooterKey))


async def test_the_footer_keeps_the_most_used_keys_whole_at_80_columns() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        keys = footer_keys(app)
        shown = [app.get_key_display(Binding(k.key, k.action)) for k in keys if "-command-palette" not in k.classes]
        assert shown == FOOTER_KEYS
        palette = [k for k in keys if "-command-palette" in k.classes]
        assert len(palette) == 1
        for key in keys:  # each whole, none under another
            assert key.region.x >= 0 and key.region.right <= 80 and key.region.y == 23
        regions = sorted((k.region for k in keys), key=lambda r: r.x)
        assert all(a.right <= b.x for a, b in itertools.pairwise(regions))
        # Each description is drawn in full: the key's width is its text's width.
        for key in keys:
            text = str(key.render())
            assert key.region.width >= len(text.rstrip()), text


async def test_f1_and_question_mark_open_the_help_and_esc_closes_it() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        for key in ("f1", "question_mark"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, MainScreen)
        # The help is usable at 80x24: it scrolls to its last line.
        await pilot.press("f1")
        await pilot.pause()
        scroll = app.screen.query_one("#help-list")
        assert scroll.max_scroll_y > 0
        scroll.scroll_end(animate=False)
        await pilot.pause()
        last = list(app.screen.query(".help-keys"))[-1]
        assert scroll.region.contains_region(last.region) or last.region.bottom <= scroll.region.bottom
        # From the Tune screen too (its own keys are listed there).
        await pilot.press("escape", "u")
        await pilot.pause()
        assert isinstance(app.screen, TuneScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


def _described(binding: Binding) -> str:
    return binding.tooltip or binding.description or binding.action.replace("_", " ")


def _covers(keys: tuple[str, ...], shown: str) -> bool:
    """Whether a help row's keys include ``shown`` (a run of digits is written 1-9)."""
    for key in keys:
        if key == shown:
            return True
        first, dash, last = key.partition("-")
        if dash and first.isdigit() and last.isdigit() and shown.isdigit() and int(first) <= int(shown) <= int(last):
            return True
    return False


async def test_the_help_lists_every_binding_of_the_app_and_its_screens() -> None:
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        sections = dict(help_screen.sections)
        assert [title for title, _, _ in VtuiApp.HELP_SECTIONS] == list(sections)
        listed = 0
        for title, classes, textual_own in VtuiApp.HELP_SECTIONS:
            bindings = [b for cls in classes for b in bindings_of(cls, textual_own=textual_own)]
            if title == "Main screen":
                bindings += bindings_of(VtuiApp)
            for binding in bindings:
                if binding.system and not binding.description:
                    continue  # Textual's plumbing (ctrl+c asks to use ctrl+q)
                description = binding.group.description if binding.group else _described(binding)
                shown = app.get_key_display(binding)
                rows = [row for row in sections[title] if _covers(row.keys, shown)]
                assert rows, (title, binding.key)
                # The row says what the key does: its own words, or those of a key that does the same.
                same = {_described(b) for b in bindings if b.action == binding.action}
                assert rows[0].description in same | {description}, (title, binding.key, rows[0].description)
                listed += 1
        assert listed > 50
        assert "Command palette" in help_screen.text() and "^p" in help_screen.text()


class _AppWithOneMoreKey(VtuiApp):
    BINDINGS = [Binding("z", "bell", "Ring the bell", show=False)]


async def test_a_binding_added_to_the_app_shows_in_the_help_and_the_palette() -> None:
    """The help is generated from the bindings, not written by hand."""
    app = make_app(_AppWithOneMoreKey)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "  z  Ring the bell" in app.screen.text()
        await pilot.press("escape")
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Ring the bell" in titles


def _palette_titles(app: VtuiApp, screen: Any) -> list[str]:
    return [c.title for c in app.get_system_commands(screen)]


async def test_the_command_palette_has_every_action_of_the_screen_in_use() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        titles = _palette_titles(app, app.screen)
        app_bindings = bindings_of(VtuiApp, textual_own=False)
        for binding in app_bindings:
            if binding.action in ("blur",):
                continue
            # One command per action ("Log" for l and 4, "Help" for F1 and ?).
            names = {b.description for b in app_bindings if b.action == binding.action}
            assert names & set(titles), binding.key
        assert len(titles) == len(set(titles))  # F1 and ? are one "Help"
        # A command runs the action: "Runs" (key 5) brings the Runs tab to front.
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "Runs")
        assert command.help.startswith("key 5")
        app.call_next(command.callback)  # as the palette calls it (an awaitable is awaited)
        await pilot.pause()
        assert app.screen.query_one("#main", TabbedContent).active == "tab-runs"

        await pilot.press("u")
        await pilot.pause()
        tune = _palette_titles(app, app.screen)
        assert {"Start", "Stop", "Load best", "Export", "Form", "Help"} <= set(tune)
        assert "Apply" not in tune and "Run" not in tune  # the main screen's, refused here


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
async def test_digits_bring_each_tab_to_front(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        for key, tab in (("5", "tab-runs"), ("4", "tab-server"), ("3", "tab-presets"), ("1", "tab-live"),
                         ("2", "tab-flags")):
            app.screen.set_focus(None)
            await pilot.press(key)
            await pilot.pause()
            assert any(tc.active == tab for tc in app.screen.query(TabbedContent)), (key, tab)
