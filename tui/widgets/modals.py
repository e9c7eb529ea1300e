"""Modal screens: confirm, flag diff before a restart, quit, one-line prompt, export, advice."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, ClassVar

from rich.table import Table
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

if TYPE_CHECKING:
    from engine.advise.finding import Finding


def _show(value: object) -> str:
    if value is None:
        return "(default)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, question: str, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__(classes="modal")
        self._question, self._yes, self._no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self._question, classes="question")
            with Horizontal(classes="buttons"):
                yield Button(self._yes, id="yes", variant="warning", compact=True)
                yield Button(self._no, id="no", compact=True)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class DiffScreen(ModalScreen[bool]):
    """The flags an apply would change, shown before the restart."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel"), Binding("enter", "dismiss(True)", "Apply")]

    def __init__(self, rows: Sequence[tuple[str, object, object]], argv: Sequence[str],
                 live: Collection[str] = ()) -> None:
        """``live``: the flags the running server takes without a restart (SessionSnapshot.live_flags)."""
        super().__init__(classes="modal")
        self.rows = list(rows)
        self.argv = list(argv)
        self.live = frozenset(live)

    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 1), show_edge=False)
        table.add_column("flag", style="bold")
        table.add_column("running")
        table.add_column("→ new")
        for name, old, new in self.rows:
            table.add_row(f"--{name}", _show(old), _show(new))
        # Every changed flag live: set on the running server, no restart, the run goes on
        # (the server refuses a value above its started one, and then the apply restarts).
        live = bool(self.rows) and all(name in self.live for name, _, _ in self.rows)
        with Vertical(classes="dialog"):
            yield Label("Apply these flags live (no restart)?" if live else "Apply these flags and restart the server?",
                        classes="title")
            yield Static(table if self.rows else "no flag changed: restart with the same flags", id="diff")
            yield Static("a value above the started one restarts instead" if live else "argv: " + " ".join(self.argv),
                         id="diff-argv", classes="muted")
            with Horizontal(classes="buttons"):
                yield Button("Apply live" if live else "Apply & restart", id="yes", variant="warning", compact=True)
                yield Button("Cancel", id="no", compact=True)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class QuitScreen(ModalScreen[str | None]):
    """Quit: stop the server vtui started, or leave it running on purpose."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, url: str | None, pid: int | None) -> None:
        super().__init__(classes="modal")
        self._url, self._pid = url, pid

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(
                f"vtui started the vLLM server at {self._url} (pid {self._pid}).\n"
                "Stop it before quitting?",
                classes="question",
            )
            with Horizontal(classes="buttons"):
                yield Button("Stop server & quit", id="stop", variant="primary", compact=True)
                yield Button("Leave it running", id="leave", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)


class PromptScreen(ModalScreen[str | None]):
    """One line of input (a URL, a preset name)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str, value: str = "", placeholder: str = "") -> None:
        super().__init__(classes="modal")
        self._title, self._value, self._placeholder = title, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._title, classes="title")
            yield Input(value=self._value, placeholder=self._placeholder, id="prompt-input")
            with Horizontal(classes="buttons"):
                yield Button("OK", id="yes", variant="primary", compact=True)
                yield Button("Cancel", id="no", compact=True)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "yes":
            self.dismiss(self.query_one(Input).value.strip() or None)
        else:
            self.dismiss(None)


EXPORT_LABELS = (
    ("docker", "docker run"),
    ("serve", "vllm serve"),
    ("k8s", "k8s"),
    ("compose", "compose"),
    ("results", "results"),
    ("perfetto", "trace"),
)


class ExportScreen(ModalScreen[None]):
    """Pick an export, see it, copy it (OSC 52, works over SSH) or save it to a file."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("c", "copy", "Copy"),
        Binding("w", "save", "Save to file"),
    ]

    def __init__(self, make: Callable[[str], str], save: Callable[[str], str], kind: str = "docker") -> None:
        super().__init__(classes="modal")
        self._make, self._save, self.kind = make, save, kind
        self.text = ""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            with Horizontal(classes="buttons"):
                for kind, label in EXPORT_LABELS:
                    yield Button(label, id=f"kind-{kind}", compact=True, classes="kind")
            yield TextArea("", read_only=True, id="export-text", soft_wrap=True)
            yield Static("", id="export-status", classes="muted")
            with Horizontal(classes="buttons"):
                yield Button("Copy (c)", id="copy", variant="primary", compact=True)
                yield Button("Save to file (w)", id="save", compact=True)
                yield Button("Close", id="close", compact=True)

    def on_mount(self) -> None:
        self.show_kind(self.kind)

    def show_kind(self, kind: str) -> None:
        """Show one export; an export that cannot be made says why in place."""
        self.kind = kind
        for k, _ in EXPORT_LABELS:
            self.query_one(f"#kind-{k}", Button).variant = "success" if k == kind else "default"
        status = self.query_one("#export-status", Static)
        try:
            self.text = self._make(kind)
            status.update("")
        except Exception as exc:  # noqa: BLE001 - shown to the user, e.g. "no run to export"
            self.text = ""
            hint = getattr(exc, "hint", "")
            status.update(f"{exc}" + (f" ({hint})" if hint else ""))
        self.query_one(TextArea).text = self.text

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        bid = event.button.id or ""
        if bid.startswith("kind-"):
            self.show_kind(bid[5:])
        elif bid == "copy":
            self.action_copy()
        elif bid == "save":
            self.action_save()
        else:
            self.dismiss(None)

    def action_copy(self) -> None:
        if self.text:
            self.app.copy_to_clipboard(self.text)
            self.query_one("#export-status", Static).update("copied to the clipboard (OSC 52)")

    def action_save(self) -> None:
        if not self.text:
            return
        try:
            path = self._save(self.kind)
        except Exception as exc:  # noqa: BLE001 - e.g. a read-only folder, shown in place
            self.query_one("#export-status", Static).update(f"not saved: {exc}")
            return
        self.query_one("#export-status", Static).update(f"saved to {path}")


class AdviceScreen(ModalScreen[int | None]):
    """The advisor's findings for the last run; key 1..9 loads one finding's flag
    changes into the editor (nothing restarts: the user applies with ``a``)."""

    DEFAULT_CSS = """
    #advice-list { height: 1fr; }
    .advice { margin-bottom: 1; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Close"), *(
        Binding(str(i), f"pick({i})", f"Load {i}", show=False,
                group=Binding.Group("Load that suggestion's flags into the editor"))
        for i in range(1, 10)
    )]

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__(classes="modal")
        self.findings = list(findings)[:9]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Advisor: the last run (1-9 loads a suggestion into the editor, Esc closes)",
                        classes="title")
            with VerticalScroll(id="advice-list"):
                for i, finding in enumerate(self.findings, 1):
                    yield Static(f"{i}. {finding.text()}", id=f"advice-{i}", classes="advice")
            with Horizontal(classes="buttons"):
                yield Button("Close", id="no", compact=True)

    def action_pick(self, number: int) -> None:
        if 1 <= number <= len(self.findings):
            self.dismiss(number - 1)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)
