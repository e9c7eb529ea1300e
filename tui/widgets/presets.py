"""The presets list: choosing one loads its flags and workload (the app confirms first
when that would discard edits)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

if TYPE_CHECKING:
    from engine.presets import Preset


class PresetList(Vertical):
    """Shipped and user presets; Enter loads the highlighted one."""

    BORDER_TITLE = "Presets"

    @dataclass
    class PresetChosen(Message):
        """The user picked a preset to load."""

        name: str

    def __init__(self, presets: Sequence[Preset] = (), *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._presets = list(presets)

    def compose(self) -> ComposeResult:
        yield Static("Enter loads a preset's flags and workload; a applies, r runs", id="preset-help")
        yield OptionList(*self._options(), id="preset-options")
        yield Static("", id="preset-about")

    def _options(self) -> list[Option]:
        out = []
        for p in self._presets:
            mark = " (user)" if getattr(p, "is_user", False) else ""
            out.append(Option(f"{p.name}{mark}", id=p.name))
        return out

    def set_presets(self, presets: Sequence[Preset]) -> None:
        """Replace the list (after a save)."""
        self._presets = list(presets)
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options(self._options())

    @on(OptionList.OptionHighlighted)
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        preset = next((p for p in self._presets if p.name == event.option.id), None)
        if preset is None:
            return
        lines = [preset.description or ""]
        flags = " ".join(preset.argv()) if hasattr(preset, "argv") else ""
        if flags:
            lines.append(flags)
        self.query_one("#preset-about", Static).update("\n".join(line for line in lines if line))

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.PresetChosen(event.option.id))
