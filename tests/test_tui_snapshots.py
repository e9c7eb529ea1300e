"""Snapshot tests of the main screen states at 80x24 and 120x40.

Deterministic: the data is injected (tests/tui_data.py: fixed clock, fixed figures),
the app does not publish from a live session, inputs do not blink, no field has focus,
and VTUI_HOME is a temporary folder (conftest), so no user presets show up.
Update after an intended change with ``pytest tests/test_tui_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import tui_data
from engine.flags import builtin_schema
from engine.presets import list_presets
from engine.session import SessionSnapshot
from tui.app import VtuiApp


def _app() -> tuple[VtuiApp, object]:
    session = tui_data.make_session()
    app = VtuiApp(
        session, schema=builtin_schema(), presets=list_presets(include_user=False), publish=False, cursor_blink=False
    )
    return app, session


CASES = [
    ("stopped", tui_data.stopped, None),
    ("running", tui_data.ready_running, None),
    ("failed-server", tui_data.failed, "tab-server"),
    ("runs", tui_data.with_runs, "tab-runs"),
    ("flags-invalid", None, "tab-flags"),
    ("presets", tui_data.stopped, "tab-presets"),
]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("name,make,tab", CASES, ids=[c[0] for c in CASES])
def test_screen(
    snap_compare: Callable[..., bool],
    size: tuple[int, int],
    name: str,
    make: Callable[..., SessionSnapshot] | None,
    tab: str | None,
) -> None:
    app, session = _app()

    async def before(pilot: object) -> None:
        if make is None:  # an invalid value typed into a flag, as the session reports it
            session.set_flag_text("max-num-seqs", "12x")  # type: ignore[attr-defined]
            session.set_flag_text("gpu-memory-utilization", "1.5")  # type: ignore[attr-defined]
            snap = session.snapshot()  # type: ignore[attr-defined]
        else:
            snap = make(session)
        app.show_snapshot(snap)
        if tab:
            app.action_show(tab)
        await pilot.pause()  # type: ignore[attr-defined]
        app.show_snapshot(snap)
        await pilot.pause()  # type: ignore[attr-defined]

    assert snap_compare(app, terminal_size=size, run_before=before)
