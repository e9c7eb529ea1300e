"""The flag editor: typed inputs for vLLM's tuning flags, or every flag with a filter.

Values are sent to the session as typed text; the session validates (engine.flags)
and the next snapshot brings the reason back, shown under the flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input, Label, Select, Static, Switch

from engine.session import SessionSnapshot

# Building a row per flag of the installed vLLM (about 200) takes a while and
# scrolls forever; the filter narrows it, and at most this many rows are shown.
MAX_ROWS = 40


def _show(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _wid(name: str) -> str:
    return "flag-" + name.replace(".", "_")


class FlagRow(Vertical):
    """One flag: its name, a typed editor, the reason it is invalid."""

    def __init__(self, spec: Any, cursor_blink: bool = True) -> None:
        super().__init__(id=_wid(spec.name), classes="flag-row")
        self.spec = spec
        self._cursor_blink = cursor_blink

    def compose(self) -> ComposeResult:
        spec = self.spec
        with Horizontal(classes="flag-line"):
            yield Label(spec.name, classes="flag-name")
            if spec.kind == "bool":
                yield Switch(value=bool(spec.default), classes="flag-editor")
            elif spec.kind == "choice" and spec.choices:
                default = f"default ({_show(spec.default)})" if spec.default is not None else "default"
                yield Select(
                    [(str(c), str(c)) for c in spec.choices],
                    prompt=default,
                    compact=True,
                    classes="flag-editor",
                )
            else:
                editor = Input(
                    placeholder=_show(spec.default) or "(unset)",
                    type="text",
                    compact=True,
                    select_on_focus=False,
                    classes="flag-editor",
                )
                editor.cursor_blink = self._cursor_blink
                yield editor
            if spec.kind == "bool":
                yield Label("", classes="flag-state")
        yield Label("", classes="flag-error")

    @property
    def editor(self) -> Widget:
        return self.query_one(".flag-editor")

    def show(self, value: Any, error: str | None, running: Any, has_server: bool) -> None:
        """Render this flag's state from a snapshot without re-sending it as an edit."""
        found = self.query(".flag-editor")
        if not found:
            return  # not composed yet (just mounted) or being removed
        editor = found.first()
        if not editor.has_focus:
            with editor.prevent(Input.Changed, Switch.Changed, Select.Changed):
                if isinstance(editor, Switch):
                    editor.value = bool(self.spec.default if value is None else value)
                    state = "on" if editor.value else "off"
                    self.query_one(".flag-state", Label).update(state if value is not None else f"{state} (default)")
                elif isinstance(editor, Select):
                    editor.value = Select.NULL if value is None else str(value)
                elif isinstance(editor, Input):
                    if error is None or editor.value == "":
                        editor.value = _show(value)
        self.set_class(error is not None, "-error")
        self.query_one(".flag-error", Label).update(error or "")
        changed = has_server and value != running
        self.set_class(changed, "-changed")
        self.set_class(value is not None, "-set")
        self.tooltip = self.spec.help or None


class FlagEditor(Vertical):
    """Tuning flags as typed inputs; a switch to every flag with a filter."""

    BORDER_TITLE = "Flags"

    @dataclass
    class FlagEdited(Message):
        """The user changed a flag; ``text`` is what was typed ("" = back to default)."""

        name: str
        text: str

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def __init__(self, schema: Any, *, cursor_blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.schema = schema
        self._cursor_blink = cursor_blink
        self._all = False
        self._filter = ""
        self._shown: tuple[str, ...] = ()
        self._rebuild_lock = asyncio.Lock()
        self._last_key: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="flag-tools"):
            yield Label("all flags", id="all-label")
            yield Switch(value=False, id="all-flags")
            yield Input(placeholder="filter", id="flag-filter", compact=True, disabled=True)
        yield Static("", id="flag-summary")
        yield VerticalScroll(id="flag-rows")

    async def on_mount(self) -> None:
        await self._rebuild()

    def _specs(self) -> list[Any]:
        specs: Iterable[Any] = self.schema.all() if self._all else self.schema.tuning()
        needle = self._filter.lower()
        out = [s for s in specs if not needle or needle in s.name.lower() or needle in (s.help or "").lower()]
        return out[:MAX_ROWS]

    async def _rebuild(self) -> None:
        # One rebuild at a time: removal is asynchronous, and typing in the filter asks
        # for a rebuild per key; without the lock new rows could meet old ids.
        async with self._rebuild_lock:
            specs = self._specs()
            names = tuple(s.name for s in specs)
            if names == self._shown:
                return
            self._shown = names
            rows = self.query_one("#flag-rows", VerticalScroll)
            await rows.remove_children()
            await rows.mount_all([FlagRow(s, self._cursor_blink) for s in specs])
        self._refresh_rows()

    def _refresh_rows(self) -> None:
        self._last_key = None
        if self.snapshot is not None:
            self.watch_snapshot(self.snapshot)

    @on(Switch.Changed, "#all-flags")
    async def _toggle_all(self, event: Switch.Changed) -> None:
        event.stop()
        self._all = event.value
        self.query_one("#flag-filter", Input).disabled = not event.value
        await self._rebuild()

    @on(Input.Changed, "#flag-filter")
    async def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._filter = event.value.strip()
        await self._rebuild()

    @on(Input.Changed, ".flag-editor")
    def _input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._send(event.input, event.value)

    @on(Switch.Changed, ".flag-editor")
    def _switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self._send(event.switch, "true" if event.value else "false")

    @on(Select.Changed, ".flag-editor")
    def _select_changed(self, event: Select.Changed) -> None:
        event.stop()
        value = "" if event.value is Select.NULL else str(event.value)
        self._send(event.select, value)

    def _send(self, editor: Widget, text: str) -> None:
        row = next((a for a in editor.ancestors if isinstance(a, FlagRow)), None)
        if row is not None:
            self.post_message(self.FlagEdited(row.spec.name, text))

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        # Most ticks carry new figures but the same flags: skip the rows then (the
        # editor is the largest panel, 16+ rows, and this runs 4 times a second).
        key = (snap.flags, snap.running_flags, tuple(snap.flag_errors.items()), snap.dirty, self._shown)
        if self._last_key is not None and all(a is b or a == b for a, b in zip(key, self._last_key, strict=True)):
            return
        self._last_key = key
        flags, running = snap.flags, snap.running_flags
        has_server = running is not None
        for row in self.query(FlagRow):
            name = row.spec.name
            row.show(
                flags.get(name),
                snap.flag_errors.get(name),
                running.get(name) if running is not None else None,
                has_server,
            )
        parts = []
        if snap.flag_errors:
            parts.append(f"{len(snap.flag_errors)} invalid: start refused")
        if has_server:
            diff = [n for n in self._shown if flags.get(n) != running.get(n)]
            parts.append(f"{len(diff)} changed vs running (a: apply)" if diff else "same as running")
        elif snap.dirty:
            parts.append("edited")
        hidden = [n for n in snap.flag_errors if n not in self._shown]
        if hidden:
            parts.append("also: " + ", ".join(f"--{n}: {snap.flag_errors[n]}" for n in hidden))
        summary = self.query_one("#flag-summary", Static)
        summary.update("  ".join(parts))
        summary.set_class(bool(snap.flag_errors), "-error")
