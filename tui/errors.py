"""A mistake the user can fix, and how it is printed: one ``error:`` line and one ``hint:`` line.

Shared by the console script (``tui.cli``) and the TUI's start (``tui.app.run_app``), so
neither imports the other; ``tui.cli`` names both too, for the commands that import them there.
"""

from __future__ import annotations

import sys


class UserError(Exception):
    """A mistake the user can fix: printed as ``error:`` plus ``hint:``, no traceback."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def print_error(message: str, hint: str = "") -> None:
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
