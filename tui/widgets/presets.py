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
        about = "\n".join(line for line in lines if line)
        self.query_one("#preset-about", Static).update(about)
        if preset.workload.get("kind") == "trace":
            # A trace file may be long: its shape is read off the UI thread, then shown if still highlighted.
            self.run_worker(lambda: self._trace_shape(preset, about), thread=True, exclusive=True,
                            group="trace-shape")

    def _trace_shape(self, preset: Preset, about: str) -> None:
        from engine.presets import trace_summary

        shape = trace_summary(preset)

        def show() -> None:
            options = self.query_one(OptionList)
            highlighted = options.get_option_at_index(options.highlighted) if options.highlighted is not None else None
            if highlighted is not None and highlighted.id == preset.name:
                # The traffic first: the description may run past the panel's height.
                self.query_one("#preset-about", Static).update("\n".join(["traffic: " + shape[0], *shape[1:], about]))

        if shape:
            self.app.call_from_thread(show)

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.PresetChosen(event.option.id))
