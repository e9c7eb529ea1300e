"""The ``vtui`` subcommands, one module each (see tui/cli.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from typing import TypeAlias

    # What each command's ``add_parser`` is handed: the parser's ``add_subparsers()``.
    Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
