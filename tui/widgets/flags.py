"""The flag editor: typed inputs for vLLM's tuning flags, or every flag with a filter.

Values are sent to the session as typed text at every key; the session validates
(engine.flags) and the next snapshot brings the reason back, shown beside the flag. A
rejected text stays in the field as typed. Enter accepts and leaves the field, Esc puts
back what the flag held before the field was entered, Tab or the arrows move on; a line
above the flags says so for the field in use.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input, Label, Select, Static, Switch

from engine.flags.effective import FlagShown, flag_shown
from engine.views import SessionSnapshot

if TYPE_CHECKING:
    from engine.flags.schema import Schema
    from engine.flags.spec import FlagSpec, FlagValue

# Building a row per flag of the installed vLLM (about 200) takes a while and
# scrolls forever; the filter narrows it, and at most this many rows are shown.
MAX_ROWS = 40


def _item(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _show(value: object) -> str:
    """A value as the text that reads back as the same value (the session parses typed text
    as vLLM would): JSON as JSON, not Python's repr; list items quoted as a shell would."""
    if value is None:
        return ""
    if isinstance(value, tuple):
        return shlex.join(_item(v) for v in value)
    return _item(value)


def _brief(text: str, width: int = 14) -> str:
    if not text:
        return "default"
    return text if len(text) <= width else text[: width - 1] + "…"


def _wid(name: str) -> str:
    return "flag-" + name.replace(".", "_")


IDLE_HINT = "Tab: edit · Enter: accept · Esc: cancel"


def _text(value: object) -> str:
    """What, sent as typed text, sets the flag back to ``value`` (booleans too)."""
    return ("true" if value else "false") if isinstance(value, bool) else _show(value)


def _hint(editor: Widget, typed: str | None) -> str:
    """How to accept, cancel and move on, for the kind of field in use (as it is on entry)."""
    if isinstance(editor, Switch):
        return f"Space: toggle · Esc: cancel (back to {'on' if editor.value else 'off'}) · Tab/↓: next flag"
    if isinstance(editor, Select):
        shown = "default" if editor.value is Select.NULL else str(editor.value)
        return f"Enter: choose · Esc: cancel (back to {_brief(shown)}) · Tab: next flag"
    shown = typed if typed is not None else editor.value if isinstance(editor, Input) else ""
    return f"Enter: accept · Esc: cancel (back to {_brief(shown)}) · Tab/↓: next · ↑: previous"


def _row_of(widget: Widget) -> FlagRow | None:
    return next((a for a in widget.ancestors_with_self if isinstance(a, FlagRow)), None)


class FlagInput(Input):
    """A flag's text field: the footer shows how to accept and move on while it is in use
    (Input's own keys for these are hidden from the footer)."""

    BINDINGS = [
        Binding("enter", "submit", "Accept", tooltip="Accept the typed value and leave the field"),
        Binding("down", "move(1)", "Next", tooltip="Next flag (Tab too)"),
        Binding("up", "move(-1)", "Previous", tooltip="Previous flag (shift+Tab too)"),
    ]

    def action_move(self, step: int) -> None:
        row = _row_of(self)
        if row is not None:
            row.action_move(step)

    async def action_submit(self) -> None:
        await super().action_submit()
        self.screen.set_focus(None)  # leave now, not when Submitted reaches the pane

    async def _on_key(self, event: events.Key) -> None:
        # Textual queues a key to the focused widget before the previous key's action has run, so
        # keys typed right after Enter or an arrow (on a busy box or a slow link, "64", Enter, "a")
        # reach this field after it was left. They belong to whatever has the focus now: hand
        # them back to the app, which routes them afresh, in the order they came.
        if self.screen.focused is not self:
            event.prevent_default()
            event.stop()
            self.app.post_message(events.Key(event.key, event.character))
            return
        if event.key == "enter":  # accept here, in this field's own queue, not after a trip up to the app
            event.prevent_default()
            event.stop()
            await self.action_submit()


class FlagRow(Vertical):
    """One flag: its name, a typed editor, the reason it is invalid beside it."""

    # Up and down move between flags (a VerticalScroll would scroll instead); a Select
    # keeps them to open its list.
    BINDINGS = [
        Binding("down", "move(1)", "Next", tooltip="Next flag (Tab too)"),
        Binding("up", "move(-1)", "Previous", tooltip="Previous flag (shift+Tab too)"),
    ]

    def __init__(self, spec: FlagSpec, cursor_blink: bool = True, shown: FlagShown | None = None,
                 live: str | None = None) -> None:
        """``shown``: how the flag reads before the first snapshot (engine.flags.effective).
        ``live``: how the flag changes on a running server vtui started (SessionSnapshot.live_flags),
        None where it needs a restart."""
        super().__init__(id=_wid(spec.name), classes="flag-row")
        self.spec = spec
        self._live = live
        self._cursor_blink = cursor_blink
        self._reads = shown or flag_shown(spec, None)

    def compose(self) -> ComposeResult:
        spec = self.spec
        with Horizontal(classes="flag-line"):
            # "~": the flag changes on a running server vtui started, without a restart
            yield Label(self._name_text(), classes="flag-name")
            if spec.kind == "bool":
                yield Switch(value=self._reads.on, classes="flag-editor")
            elif spec.kind == "choice" and spec.choices:
                default = f"default ({_show(spec.default)})" if spec.default is not None else "default"
                yield Select(
                    [(str(c), str(c)) for c in spec.choices],
                    prompt=default,
                    compact=True,
                    classes="flag-editor",
                )
            else:
                # Its text is selected on entering it (Tab, the arrows), so typed digits replace
                # the value rather than landing in front of it (128, typed 427 -> 427128).
                editor = FlagInput(
                    placeholder=self._reads.placeholder,
                    type="text",
                    compact=True,
                    select_on_focus=True,
                    classes="flag-editor",
                )
                editor.cursor_blink = self._cursor_blink
                yield editor
            if spec.kind == "bool":
                yield Label("", classes="flag-state")
            yield Label("", classes="flag-error")
        # In a narrow column (the flags beside the live view) the reason goes under the field.
        yield Label("", classes="flag-error-below")

    @property
    def editor(self) -> Widget:
        return self.query_one(".flag-editor")

    def action_move(self, step: int) -> None:
        rows = list(self.parent.query_children(FlagRow)) if self.parent is not None else []
        i = rows.index(self) + step if self in rows else -1
        if 0 <= i < len(rows):
            rows[i].editor.focus()
            rows[i].scroll_visible()

    def _name_text(self) -> str:
        return f"{self.spec.name} ~" if self._live else self.spec.name

    def mark_live(self, live: str | None) -> None:
        """How this flag changes live (None: it needs a restart), from a snapshot."""
        if live != self._live:
            self._live = live
            for label in self.query(".flag-name"):
                cast("Label", label).update(self._name_text())

    def show(
        self, value: object, error: str | None, running: object, has_server: bool, typed: str | None = None,
        shown: FlagShown | None = None,
    ) -> None:
        """Render this flag's state from a snapshot without re-sending it as an edit.

        ``typed``: the text the user last typed, shown instead of the value while the session
        rejects it (the session keeps the last good value, which is not what was typed).
        ``shown``: how the value reads (engine.flags.effective.flag_shown of the same value).
        """
        found = self.query(".flag-editor")
        if not found:
            return  # not composed yet (just mounted) or being removed
        editor = found.first()
        shown = shown or flag_shown(self.spec, cast("FlagValue | None", value))
        self._reads = shown
        if isinstance(editor, Switch):
            # A switch and the words beside it say the edited value, also while the switch has
            # the focus (it holds no half-typed text): both used to be left as they were then,
            # and a toggled switch read "on" beside a flag an apply would turn off.
            with editor.prevent(Switch.Changed):
                editor.value = shown.on
            self.query_one(".flag-state", Label).update(shown.state)
        elif isinstance(editor, Input):
            editor.placeholder = shown.placeholder
        if not editor.has_focus:
            with editor.prevent(Input.Changed, Select.Changed):
                if isinstance(editor, Select):
                    editor.value = Select.NULL if value is None else str(value)
                elif isinstance(editor, Input):
                    text = typed if error is not None and typed is not None else _show(value)
                    if editor.value != text:
                        editor.value = text
                        editor.cursor_position = 0  # the start of a long value, not its tail
        self.set_class(error is not None, "-error")
        self.query_one(".flag-error", Label).update(error or "")
        self.query_one(".flag-error-below", Label).update(error or "")
        changed = has_server and value != running
        self.set_class(changed, "-changed")
        self.set_class(value is not None, "-set")
        live = (f"~ changes live on a server vtui started (up to its started value), no restart: {self._live}"
                if self._live else None)
        self.tooltip = "\n".join(t for t in (self.spec.help, shown.note, live) if t) or None


class FlagEditor(Vertical):
    """Tuning flags as typed inputs; a switch to every flag with a filter."""

    BORDER_TITLE = "Flags"

    # Before the app's Escape (leave the field): in a flag, Esc also puts the old value back.
    BINDINGS = [Binding("escape", "cancel_edit", "Cancel", tooltip="Cancel the edit: the flag back to its value before")]

    # Below this width the reason of a rejected value goes under the field, not beside it.
    BESIDE_MIN_WIDTH = 70

    @dataclass
    class FlagEdited(Message):
        """The user changed a flag; ``text`` is what was typed ("" = back to default)."""

        name: str
        text: str

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def __init__(
        self, schema: Schema, *, cursor_blink: bool = True, typed: dict[str, str] | None = None, id: str | None = None
    ) -> None:
        """``typed``: flag name -> the text last typed into it, kept by the owner so that a
        rebuilt editor (a new terminal width, the all-flags switch) shows it again."""
        super().__init__(id=id)
        self.schema = schema
        self._cursor_blink = cursor_blink
        self._typed = typed if typed is not None else {}
        self._before: tuple[str, str, str | None] | None = None  # flag, text, typed text on entering a field
        self._all = False
        self._filter = ""
        self._shown: tuple[str, ...] = ()
        self._rebuild_lock = asyncio.Lock()
        self._last_key: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="flag-tools"):
            yield Label("all flags", id="all-label")
            yield Switch(value=False, id="all-flags")
            yield Input(placeholder="filter", id="flag-filter", compact=True, disabled=True)
        yield Static(IDLE_HINT, id="flag-hint")
        yield Static("", id="flag-summary")
        yield VerticalScroll(id="flag-rows")

    async def on_mount(self) -> None:
        await self._rebuild()

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < self.BESIDE_MIN_WIDTH, "-column")

    def _specs(self) -> list[FlagSpec]:
        specs: Iterable[FlagSpec] = self.schema.all() if self._all else self.schema.tuning()
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
            await rows.mount_all([FlagRow(s, self._cursor_blink, self._shown_of(s, self.snapshot),
                                         self.snapshot.live_flags.get(s.name) if self.snapshot is not None else None)
                                 for s in specs])
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
        row = _row_of(event.input)
        if row is not None:
            self._typed[row.spec.name] = event.value
        self._send(event.input, event.value)

    @on(Input.Submitted, ".flag-editor")
    def _accepted(self, event: Input.Submitted) -> None:
        """Enter: keep what was typed and leave the field, so the footer's keys work."""
        event.stop()
        self._before = None
        if self.screen.focused is event.input:
            self.screen.set_focus(None)

    def action_cancel_edit(self) -> None:
        """Esc: the flag back to what it was when the field was entered, and leave it."""
        before, self._before = self._before, None
        focused = self.screen.focused
        self.screen.set_focus(None)
        row = _row_of(focused) if focused is not None else None
        if before is None or row is None or row.spec.name != before[0]:
            return
        name, text, typed = before
        if typed is None:
            self._typed.pop(name, None)
        else:
            self._typed[name] = typed
        self._last_key = None  # redraw the row even if the snapshot comes back the same
        self.post_message(self.FlagEdited(name, text))

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        row = _row_of(event.widget)
        if row is None or not event.widget.has_class("flag-editor"):
            self._before = None
            self.query_one("#flag-hint", Static).update(IDLE_HINT)
            return
        name = row.spec.name
        snap = self.snapshot
        value = snap.flags.get(name) if snap is not None else None
        typed = self._typed.get(name) if snap is not None and name in snap.flag_errors else None
        text = typed if typed is not None else ("" if value is None else _text(value))
        self._before = (name, text, typed)
        self.query_one("#flag-hint", Static).update(_hint(event.widget, typed))

    def on_descendant_blur(self, event: events.DescendantBlur) -> None:
        if self.screen.focused is None or _row_of(self.screen.focused) is None:
            self.query_one("#flag-hint", Static).update(IDLE_HINT)

    def _shown_of(self, spec: FlagSpec, snap: SessionSnapshot | None) -> FlagShown:
        """How ``spec``'s flag reads in ``snap``: its value, the server's, vLLM's default."""
        flags = snap.flags if snap is not None else None
        values = {n: flags.get(n) for n in ("tensor-parallel-size", "pipeline-parallel-size")} if flags else {}
        server = snap.server_config.get(spec.name) if snap is not None else None
        value = flags.get(spec.name) if flags is not None else None
        if not isinstance(value, (bool, int, float, str, tuple, dict, list)):
            value = None  # a FlagSet holds only flag values; anything else reads as unset
        return flag_shown(spec, value, resolved=self.schema.resolved_default(spec.name, values), server=server)

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
        row = _row_of(editor)
        if row is not None:
            self.post_message(self.FlagEdited(row.spec.name, text))

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        # Most ticks carry new figures but the same flags: skip the rows then (the
        # editor is the largest panel, 16+ rows, and this runs 4 times a second).
        key = (snap.flags, snap.running_flags, tuple(snap.flag_errors.items()), snap.dirty, self._shown,
               snap.server_config, tuple(snap.flag_warnings.items()), snap.live_flags)
        if self._last_key is not None and all(a is b or a == b for a, b in zip(key, self._last_key, strict=True)):
            return
        self._last_key = key
        flags, running = snap.flags, snap.running_flags
        has_server = running is not None
        for row in self.query(FlagRow):
            name = row.spec.name
            error = snap.flag_errors.get(name)
            if error is None:
                self._typed.pop(name, None)  # accepted: the field shows the value as read
            row.mark_live(snap.live_flags.get(name))
            row.show(
                flags.get(name),
                error,
                running.get(name) if running is not None else None,
                has_server,
                self._typed.get(name),
                self._shown_of(row.spec, snap),
            )
        parts = []
        if snap.flag_errors:
            parts.append(f"{len(snap.flag_errors)} invalid: start refused")
        if has_server and flags is not None and running is not None:
            diff = [n for n in self._shown if flags.get(n) != running.get(n)]
            if not diff:
                parts.append("same as running")
            else:
                restart = [n for n in diff if n not in snap.live_flags]
                how = f"restarts for --{restart[0]}" if restart else "live, no restart"
                parts.append(f"{len(diff)} changed vs running (a: apply, {how})")
        elif snap.dirty:
            parts.append("edited")
        hidden = [n for n in snap.flag_errors if n not in self._shown]
        if hidden:
            parts.append("also: " + ", ".join(f"--{n}: {snap.flag_errors[n]}" for n in hidden))
        # Taken by vLLM, but moot (a fraction beside an explicit KV size): said, never refused.
        parts.extend(f"note: {reason}" for reason in snap.flag_warnings.values())
        summary = self.query_one("#flag-summary", Static)
        summary.update("  ".join(parts))
        summary.set_class(bool(snap.flag_errors), "-error")
