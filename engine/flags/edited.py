"""The flags being edited, checked as they change.

:class:`EditedFlags` holds one FlagSet under edit and the two it is compared with: the
flags the server took last (``loaded``: what "dirty" means) and the preset as loaded or
saved (``preset``: what run names count changes from). Every edit is checked at once
against the flag schema (engine.flags.validate); text that does not parse keeps the
last good value and its reason stays under the flag until it is typed again.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.flags.flagset import FlagSet
from engine.flags.schema import Schema, load_schema, schema_pending
from engine.flags.spec import FlagError
from engine.flags.validate import validate, validation_warnings


class EditedFlags:
    """The edited flags, their errors and warnings; ``max_request_len()`` is the longest
    prompt plus output the workload asks for (None when unknown), for the checks."""

    def __init__(self, flags: FlagSet, *, schema: Schema | None = None,
                 max_request_len: Callable[[], int | None] = lambda: None) -> None:
        self.flags = flags
        self.loaded = flags  # what the server took last, or the preset: what "dirty" compares against
        self.preset = flags  # the preset as loaded or saved: what run names compare against
        self._schema = schema
        self._max_request_len = max_request_len
        self._text_errors: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.warnings: dict[str, str] = {}
        self.revalidate()

    def schema(self) -> Schema:
        """The installed vLLM's schema once read in the background, the built-in one until
        then (never waited for: the first read takes about 10 s on a data folder)."""
        if self._schema is None or (not self._schema.complete and not schema_pending()
                                    and "background" in self._schema.source):
            self._schema = load_schema(wait=False)
        return self._schema

    def set_text(self, name: str, text: str) -> str | None:
        """Set ``name`` from typed text (parsed as vLLM would; empty unsets it); returns the
        reason it is invalid, or None."""
        text = text.strip()
        return self._edit(name, lambda: self.flags.set(name, text) if text else self.flags.unset(name))

    def set(self, name: str, value: object) -> str | None:
        """Set a typed value; returns the reason it is invalid, or None."""
        return self._edit(name, lambda: self.flags.set(name, value))

    def unset(self, name: str) -> None:
        self._edit(name, lambda: self.flags.unset(name))

    def _edit(self, name: str, change: Callable[[], FlagSet]) -> str | None:
        self._text_errors.pop(name, None)
        try:
            self.flags = change()
        except FlagError as exc:
            self._text_errors[name] = exc.reason
        self.revalidate()
        return self.errors.get(name)

    def take(self, flags: FlagSet, *, loaded: bool = False, preset: bool = False) -> None:
        """Replace the edited flags (typed-text errors dropped); ``loaded``/``preset`` move
        what they are compared with too."""
        self.flags = flags
        if loaded:
            self.loaded = flags
        if preset:
            self.preset = flags
        self._text_errors.clear()
        self.revalidate()

    def saved(self) -> None:
        """The edited flags were saved as the preset: nothing is dirty, run names count from here."""
        self.loaded = self.preset = self.flags

    def revalidate(self) -> None:
        """Check the edited flags again (the workload or the schema may have changed)."""
        errors: dict[str, str] = {}
        for err in validate(self.flags, self.schema(), max_request_len=self._max_request_len()):
            errors.setdefault(err.flag or "model", err.reason)
        errors.update(self._text_errors)
        self.errors = errors
        self.warnings = {w.flag or "model": w.reason for w in validation_warnings(self.flags)}

    @property
    def dirty(self) -> bool:
        """True when the edits differ from the loaded flags, or some typed text did not parse."""
        return bool(self._text_errors) or flags_differ(self.flags, self.loaded)

    def diff(self, running: FlagSet | None) -> list[tuple[str, object, object]]:
        """(flag, running value, edited value) for every flag an apply would change (values
        typed per flag, None when unset); empty when nothing runs."""
        if running is None:
            return []
        return [(str(name), a, b) for name, (a, b) in running.diff(self.flags).items()]

    def first_error(self) -> tuple[str, str] | None:
        """(flag, reason) of the first invalid flag, or None."""
        return next(iter(self.errors.items()), None)


def flags_differ(a: FlagSet | None, b: FlagSet | None) -> bool:
    """True when ``a`` and ``b`` would not launch the same server (None differs from a FlagSet)."""
    if a is b:
        return False
    if a is None or b is None:
        return True
    return not a.same_launch(b)
