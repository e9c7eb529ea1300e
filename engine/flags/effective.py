"""How one flag reads in the editor: the value set, else the value the server reports, else the
default vLLM resolves at start; each marked as what it is.

A flag the command line leaves out is None in the FlagSet. What it then is depends: the parser's
default (``--gpu-memory-utilization`` 0.92), a default vLLM resolves at start where the parser
says None (``Schema.resolved_default``: prefix caching on, block size 128 on the CPU), or, with
a server running or attached, what that server reports it resolved
(``engine.telemetry.configinfo``). The switch, the words beside it and an empty field's hint
all come from the one FlagSet value given here, so a row cannot read otherwise than the flags
an apply would launch (a toggle read "on" while the apply dialog said "on -> off").
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from engine.flags.spec import FlagSpec, FlagValue, ResolvedDefault


@dataclass(frozen=True)
class FlagShown:
    """What one flag's row shows."""

    on: bool
    """A switch's position: the value set, else the server's, else the default."""
    state: str
    """Beside a switch: "on", "on (default)", "server: on", "off (server: on)", "(vLLM decides)"."""
    placeholder: str
    """An empty field's hint: "server: 128", "0.92", "2048 (vLLM default)", "(vLLM sets at start)",
    "(unset)"."""
    note: str
    """A line for the tooltip on the default resolved at start ("" when none)."""


def words(value: object) -> str:
    """A value as the row says it: booleans on/off, lists shell-quoted, JSON as JSON."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return shlex.join(words(v) for v in value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return "" if value is None else str(value)


def flag_shown(
    spec: FlagSpec, value: FlagValue | None, *, resolved: ResolvedDefault | None = None,
    server: FlagValue | None = None,
) -> FlagShown:
    """The row of ``spec`` whose FlagSet value is ``value`` (None: left out); ``resolved``: the
    installed vLLM's default at start where the parser has none; ``server``: the value the running
    or attached server reports (None: no server, or it does not say)."""
    default = spec.default if spec.default is not None else resolved.value if resolved is not None else None
    note = ""
    if resolved is not None:
        what = words(resolved.value) if resolved.value is not None else "decided at start"
        note = f"Left out, vLLM sets it at start: {what} ({resolved.note})."
    if server is not None:
        placeholder = f"server: {words(server)}"
    elif spec.default is not None:
        placeholder = words(spec.default) or "(unset)"
    elif resolved is not None:
        # The note is the tooltip's: the field is 20 columns in the narrow layout.
        placeholder = f"{words(resolved.value)} (vLLM default)" if resolved.value is not None else "(vLLM sets at start)"
    else:
        placeholder = "(unset)"
    if value is not None:
        on = bool(value)
        differs = server is not None and server != value
        state = words(value) + (f" (server: {words(server)})" if differs else "")
    elif server is not None:
        on, state = bool(server), f"server: {words(server)}"
    elif default is not None:
        on, state = bool(default), f"{words(default)} (default)"
    else:
        on, state = False, "(vLLM decides)"
    return FlagShown(on=on, state=state, placeholder=placeholder, note=note)
