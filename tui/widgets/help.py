"""The help screen: every key of the app and its screens, read from their bindings.

Nothing here is a hand-written list: a binding added to a screen shows up in the help
(and the command palette) with the description it has in the footer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingsMap
from textual.containers import Vertical, VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Label, Static


@dataclass(frozen=True)
class KeyRow:
    """One line of the help: the keys (several when they do the same) and what they do."""

    keys: tuple[str, ...]
    description: str


def bindings_of(cls: type[DOMNode], *, textual_own: bool = True) -> list[Binding]:
    """The bindings ``cls`` has, its own first, then what it inherits that it does not
    override (Textual's rule: the class nearest in the MRO wins a key).

    ``textual_own``: include the bindings of Textual's own base classes (``ctrl+q``, Tab).
    """
    out: list[Binding] = []
    taken: set[str] = set()
    for base in cls.__mro__:
        if not (isinstance(base, type) and issubclass(base, DOMNode)):
            continue
        if not textual_own and base.__module__.startswith("textual."):
            break
        for binding in BindingsMap(base.__dict__.get("BINDINGS", [])).key_to_bindings.values():
            for b in binding:
                if b.key in taken:
                    continue
                out.append(b)
        taken.update(b.key for b in out)
        if not base._inherit_bindings:
            break
    return out


def key_rows(bindings: Sequence[Binding], display: Callable[[Binding], str]) -> list[KeyRow]:
    """Rows for the help: bindings that run the same action (F1 and ? for help) or share a
    group (1 to 9 in the advisor) make one row. A system binding with no description is
    Textual's own plumbing and left out."""
    rows: dict[str, tuple[list[str], str]] = {}
    for b in bindings:
        description = b.tooltip or b.description or b.action.replace("_", " ")
        if b.system and not b.description:
            continue
        merge = f"group:{b.group.description}" if b.group is not None else f"action:{b.action}"
        if b.group is not None:
            description = b.group.description
        keys, _ = rows.setdefault(merge, ([], description))
        shown = display(b)
        if shown not in keys:
            keys.append(shown)
    return [KeyRow(_runs(keys), description) for keys, description in rows.values()]


def _runs(keys: list[str]) -> tuple[str, ...]:
    """``1 2 3 ... 9`` as ``1-9``: a run of three or more digits in a row."""
    if len(keys) >= 3 and all(k.isdigit() and len(k) == 1 for k in keys):
        numbers = [int(k) for k in keys]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return (f"{keys[0]}-{keys[-1]}",)
    return tuple(keys)


class HelpScreen(ModalScreen[None]):
    """Every key, by screen. Esc, F1 or ? closes it."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close the help"),
        Binding("question_mark", "dismiss", "Close the help", show=False),
        Binding("f1", "dismiss", "Close the help", show=False),
    ]

    def __init__(self, sections: Sequence[tuple[str, Sequence[KeyRow]]], *, palette_key: str = "^p") -> None:
        super().__init__(classes="modal")
        self.sections = list(sections)
        self.palette_key = palette_key

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="help"):
            yield Label(f"Keys · {self.palette_key} finds any action by name · Esc closes", classes="title")
            with VerticalScroll(id="help-list"):
                for title, rows in self.sections:
                    table = Table(box=None, padding=(0, 1), show_header=False, show_edge=False, expand=True)
                    table.add_column(width=10, no_wrap=True, style="bold")
                    table.add_column(ratio=1)
                    for row in rows:
                        table.add_row(" ".join(row.keys), row.description)
                    yield Static(title, classes="help-section")
                    yield Static(table, classes="help-keys")

    def text(self) -> str:
        """Everything the help lists, as plain lines (for tests and for copying)."""
        lines = []
        for title, rows in self.sections:
            lines.append(title)
            lines.extend(f"  {' '.join(row.keys)}  {row.description}" for row in rows)
        return "\n".join(lines)
