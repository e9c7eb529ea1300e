"""The vtui application: one thin screen over an ``engine.session.Session``.

Every action calls the session in a worker (the screen never waits on HTTP or on the
server's pipes); the session publishes a frozen snapshot a few times a second and
the screen renders it in one ``batch_update``.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.dom import DOMNode
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from engine.session import Session, SessionError
from engine.views import SessionSnapshot
from tui.messages import SessionUpdated
from tui.widgets.flags import FlagEditor, FlagInput, FlagRow
from tui.widgets.help import HelpScreen, KeyRow, bindings_of, key_rows
from tui.widgets.live import LivePanel
from tui.widgets.modals import AdviceScreen, ConfirmScreen, DiffScreen, ExportScreen, PromptScreen, QuitScreen
from tui.widgets.presets import PresetList
from tui.widgets.runs import RunsPanel
from tui.widgets.server import ServerPanel
from tui.widgets.status import StatusBar
from tui.widgets.tune import TuneScreen

if TYPE_CHECKING:
    from engine.advise.finding import Finding
    from engine.flags.schema import Schema
    from engine.presets import Preset
    from engine.views import TuneRequest

# At this width and above the flags sit beside the live view; below, every panel is a tab.
WIDE_COLUMNS = 110

PANELS = (FlagEditor, PresetList, LivePanel, ServerPanel, RunsPanel)


class MainScreen(Screen[None]):
    """Status line, the panels (side by side when wide, tabs when narrow), footer."""

    # No field takes the focus at start, so the footer's keys work at once; Tab enters the panels.
    AUTO_FOCUS = None

    wide: reactive[bool] = reactive(True, recompose=True)
    """Whether the terminal is wide enough for the two-column layout."""

    def __init__(self, schema: Schema, presets: list[Preset], *, cursor_blink: bool = True) -> None:
        super().__init__()
        self.schema = schema
        self.presets = presets
        self.cursor_blink = cursor_blink
        # What the user set in the panels (log filters, text typed into a flag) survives
        # the rebuild of the layout when the terminal crosses WIDE_COLUMNS.
        self.kept_log: dict[str, object] = {}
        self.kept_typed: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        flags = FlagEditor(self.schema, cursor_blink=self.cursor_blink, typed=self.kept_typed, id="flags")
        presets = PresetList(self.presets, id="presets")
        if self.wide:
            with Horizontal(id="columns"):
                with TabbedContent(id="left", initial="tab-flags"):
                    with TabPane("2 Flags", id="tab-flags"):
                        yield flags
                    with TabPane("3 Presets", id="tab-presets"):
                        yield presets
                with TabbedContent(id="main", initial="tab-live"):
                    with TabPane("1 Live", id="tab-live"):
                        yield LivePanel(id="live")
                    with TabPane("4 Server", id="tab-server"):
                        yield ServerPanel(keep=self.kept_log, id="server")
                    with TabPane("5 Runs", id="tab-runs"):
                        yield RunsPanel(id="runs")
        else:
            with TabbedContent(id="main", initial="tab-live"):
                with TabPane("1 Live", id="tab-live"):
                    yield LivePanel(id="live")
                with TabPane("2 Flags", id="tab-flags"):
                    yield flags
                with TabPane("3 Presets", id="tab-presets"):
                    yield presets
                with TabPane("4 Server", id="tab-server"):
                    yield ServerPanel(keep=self.kept_log, id="server")
                with TabPane("5 Runs", id="tab-runs"):
                    yield RunsPanel(id="runs")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.wide = self.size.width >= WIDE_COLUMNS
        self.call_after_refresh(cast("VtuiApp", self.app).rerender)

    def on_resize(self) -> None:
        wide = self.size.width >= WIDE_COLUMNS
        if wide != self.wide:
            self.wide = wide
            self.call_after_refresh(cast("VtuiApp", self.app).rerender)

    def show_tab(self, tab: str) -> None:
        """Bring a panel to front, whichever layout is showing."""
        for tc in self.query(TabbedContent):
            if tc.query(f"#{tab}"):
                tc.active = tab

    def render_snapshot(self, snap: SessionSnapshot) -> None:
        """One batched update of every panel."""
        with self.app.batch_update():
            for widget in self.query("StatusBar, FlagEditor, LivePanel, ServerPanel, RunsPanel"):
                try:
                    cast("StatusBar | FlagEditor | LivePanel | ServerPanel | RunsPanel", widget).snapshot = snap
                except NoMatches:
                    # A panel between mount and compose (or being rebuilt for a new width)
                    # has no children yet; the next snapshot, a quarter second on, draws it.
                    continue


class VtuiApp(App[int]):
    """Tune a vLLM server live."""

    # Absolute, so subclasses in other folders (benchmarks, tests) find it too.
    CSS_PATH = str(Path(__file__).parent / "vtui.tcss")
    TITLE = "vtui"

    # The footer shows the keys a session is made of (start, apply, run, look, tune, help,
    # quit): at 80 columns they fill it. Every key, shown or not, is in the help (F1, ?)
    # and the command palette (ctrl+p); the tooltip is what they say of it.
    BINDINGS = [
        Binding("s", "start_server", "Start", tooltip="Start the server with the edited flags"),
        Binding("x", "stop_server", "Stop", tooltip="Stop the server (or detach from an attached one)"),
        Binding("a", "apply", "Apply", tooltip="Apply the edited flags: live if all are ~, else restart"),
        Binding("r", "run", "Run", tooltip="Run the workload against the server"),
        Binding("e", "export", "Export", tooltip="Export: docker run, vllm serve, results JSON, trace"),
        Binding("v", "advise", "Advise", tooltip="The advisor's findings for the last run"),
        Binding("u", "tune", "Tune", tooltip="Tune: the flags with the most goodput under an SLO"),
        Binding("question_mark", "help", "Help", tooltip="Every key (this list)"),
        Binding("q", "quit", "Quit"),
        Binding("f1", "help", "Help", show=False, tooltip="Every key (this list)"),
        Binding("S", "start_server_anyway", "Start anyway", show=False,
                tooltip="Start even when the planner says the flags cannot fit the GPU's memory"),
        Binding("c", "stop_run", "Cancel run", show=False, tooltip="Cancel the run in progress (what was measured is kept)"),
        Binding("p", "save_preset", "Save preset", show=False, tooltip="Save the flags and workload as a preset"),
        Binding("b", "baseline", "Baseline", show=False, tooltip="Mark the last run as the baseline of the comparison"),
        Binding("w", "sweep", "Sweep", show=False, tooltip="Sweep: run several presets in a row"),
        Binding("n", "repeats", "Repeats", show=False,
                tooltip="How many runs r makes of the workload (repeats: one column, an interval over them)"),
        Binding("t", "attach", "Attach URL", show=False, tooltip="Attach to a vLLM server already running"),
        Binding("l", "show('tab-server')", "Log", show=False, tooltip="The server's log (Server tab)"),
        Binding("h", "log_polls", "Log: show/hide vtui's polls", show=False),
        Binding("f", "log_level", "Log: level filter", show=False,
                tooltip="Log: level filter (all, warnings and errors, errors)"),
        Binding("escape", "blur", "Leave field", show=False, tooltip="Leave the field (in a flag: cancel the edit)"),
        Binding("1", "show('tab-live')", "Live", show=False, tooltip="Live tab"),
        Binding("2", "show('tab-flags')", "Flags", show=False, tooltip="Flags tab"),
        Binding("3", "show('tab-presets')", "Presets", show=False, tooltip="Presets tab"),
        Binding("4", "show('tab-server')", "Server", show=False, tooltip="Server tab"),
        Binding("5", "show('tab-runs')", "Runs", show=False, tooltip="Runs tab"),
    ]

    def __init__(
        self,
        session: Session,
        *,
        schema: Schema | None = None,
        presets: list[Preset] | None = None,
        publish: bool = True,
        cursor_blink: bool = True,
        start_server: bool = False,
    ) -> None:
        """``start_server``: start the session's server as soon as the screen is up (what
        `vtui` and `make run` do without --url; tests and attaching leave it off)."""
        super().__init__()
        self.session = session
        self.start_on_mount = start_server
        self.schema = schema if schema is not None else session.schema()
        self.presets = presets if presets is not None else _safe_presets(session)
        self.publish = publish
        self.cursor_blink = cursor_blink
        self.last_snapshot: SessionSnapshot | None = None
        self.exit_code = 0
        self.tune_screen: TuneScreen | None = None  # made on the first u, kept (the form stays as typed)

    # ------------------------------------------------------------------ wiring

    def on_mount(self) -> None:
        self.push_screen(MainScreen(self.schema, self.presets, cursor_blink=self.cursor_blink))
        if self.publish:
            self.session.start_sampling()
            self.session.subscribe(self._publish)
            self.run_worker(self.session.publish_forever(4.0), group="publish", exit_on_error=False)
        if self.start_on_mount:
            self.call_after_refresh(self.action_start_server)
        fd = _terminal_fd()
        if fd is not None:
            self.set_interval(1.0, lambda: self._check_terminal(fd), name="terminal-watch")

    def _check_terminal(self, fd: int) -> None:
        """The terminal hung up (its window closed, `tmux kill-session`, SSH dropped) while another
        process leads its session (`make run`): no SIGHUP reaches vtui then, so it looks. It quits
        as if asked to stop the server: nobody chose to leave it running."""
        if terminal_hung_up(fd) and not self._hung_up:
            self._hung_up = True
            self._quit_worker(True)

    _hung_up = False

    def _publish(self, snap: SessionSnapshot) -> None:
        # Called on this loop by the session's publisher; a message keeps the order.
        self.post_message(SessionUpdated(snap))

    def on_session_updated(self, message: SessionUpdated) -> None:
        self.show_snapshot(message.snapshot)

    def show_snapshot(self, snap: SessionSnapshot) -> None:
        """Render a snapshot now (tests inject fixed ones through this)."""
        self.last_snapshot = snap
        if self.tune_screen is not None and self.tune_screen.is_mounted:
            self.tune_screen.view = snap.tune
        if isinstance(self.screen, MainScreen):
            self.screen.render_snapshot(snap)
        else:
            main = self._main_screen()
            if main is not None:
                main.render_snapshot(snap)

    def rerender(self) -> None:
        """Render the last snapshot again (after the layout was rebuilt)."""
        snap = self.last_snapshot or (self.session.snapshot() if self.publish else None)
        if snap is not None:
            self.show_snapshot(snap)

    def refresh_now(self) -> None:
        """After an action, show its effect at once instead of on the next tick."""
        if self.publish:
            self.show_snapshot(self.session.snapshot())

    def _main_screen(self) -> MainScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        return None

    def _error(self, exc: BaseException) -> None:
        hint = getattr(exc, "hint", "")
        self.notify(f"{exc}" + (f"\nhint: {hint}" if hint else ""), severity="error", timeout=8)
        self.refresh_now()

    # ------------------------------------------------------------------ widget messages

    @on(RunsPanel.FilterChanged)
    def _stored_filter(self, event: RunsPanel.FilterChanged) -> None:
        self.session.set_stored_filter(event.text)
        self.refresh_now()

    @on(RunsPanel.Toggled)
    def _stored_toggled(self, event: RunsPanel.Toggled) -> None:
        try:
            self.session.toggle_stored(event.run_id)
        except SessionError as exc:
            self.notify(f"{exc}: {exc.hint}", severity="warning")
            return
        self.refresh_now()

    @on(FlagEditor.FlagEdited)
    def _flag_edited(self, event: FlagEditor.FlagEdited) -> None:
        self.session.set_flag_text(event.name, event.text)
        self.refresh_now()

    @on(PresetList.PresetChosen)
    def _preset_chosen(self, event: PresetList.PresetChosen) -> None:
        if self.session.dirty:
            self.push_screen(
                ConfirmScreen(f"Load preset {event.name}? Your flag edits will be discarded.", yes="Load"),
                lambda ok: self._load_preset(event.name) if ok else None,
            )
        else:
            self._load_preset(event.name)

    def _load_preset(self, name: str) -> None:
        try:
            self.session.load_preset(name)
        except SessionError as exc:
            self._error(exc)
            return
        self.refresh_now()
        self.notify(f"loaded preset {name}: a applies its flags, r runs its workload")

    # ------------------------------------------------------------------ actions

    def action_blur(self) -> None:
        self.screen.set_focus(None)

    def action_show(self, tab: str) -> None:
        main = self._main_screen()
        if main is not None:
            main.show_tab(tab)
            # Keys go where the user looks: the first flag field, the preset list.
            target = {"tab-flags": ".flag-editor", "tab-presets": "#preset-options"}.get(tab)
            if target is not None and main is self.screen:
                self.call_after_refresh(lambda: main.query(target).first().focus() if main.query(target) else None)

    def _server_panel(self) -> ServerPanel | None:
        """The Server panel, brought to front (the log keys act on what the user sees)."""
        main = self._main_screen()
        if main is None or main is not self.screen:
            return None
        main.show_tab("tab-server")
        found = main.query(ServerPanel)
        return found.first() if found else None

    def action_log_polls(self) -> None:
        panel = self._server_panel()
        if panel is not None:
            panel.toggle_polls()

    def action_log_level(self) -> None:
        panel = self._server_panel()
        if panel is not None:
            panel.next_level()

    def action_start_server(self) -> None:
        errors = self.session.flag_errors()
        if errors:
            name, reason = next(iter(errors.items()))
            self.notify(f"not starting: --{name}: {reason}", severity="error", timeout=8)
            self.action_show("tab-flags")
            return
        self._start_server()

    def action_start_server_anyway(self) -> None:
        """S: start even when the planner says the launch cannot fit (it may be wrong)."""
        self._start_server(force=True)

    @work(exclusive=True, group="server", exit_on_error=False)
    async def _start_server(self, force: bool = False) -> None:
        self.action_show("tab-server")
        try:
            await self.session.start_server(force=force)
        except SessionError as exc:
            self._error(exc)
            return
        self.refresh_now()
        self.notify("server ready: r runs the workload")

    def action_stop_server(self) -> None:
        self._stop_server()

    @work(exclusive=True, group="server", exit_on_error=False)
    async def _stop_server(self) -> None:
        await self.session.stop_server()
        self.refresh_now()

    def action_apply(self) -> None:
        errors = self.session.flag_errors()
        if errors:
            name, reason = next(iter(errors.items()))
            self.notify(f"not applying: --{name}: {reason}", severity="error", timeout=8)
            return
        snap = self.session.snapshot()
        if snap.running_flags is None:
            self.action_start_server()
            return
        self.push_screen(
            DiffScreen(self.session.flags_diff(), self.session.launch_argv(), snap.live_flags),
            self._apply_if_confirmed,
        )

    def _apply_if_confirmed(self, ok: bool | None) -> None:
        if ok:
            self._apply()

    @work(exclusive=True, group="server", exit_on_error=False)
    async def _apply(self) -> None:
        self.action_show("tab-server")
        try:
            await self.session.apply_flags()
        except SessionError as exc:
            self._error(exc)
            return
        self.refresh_now()
        # the session's notice says how: "changed live in 12 ms, no restart: ..." or "restarted in
        # 41.2 s (--max-model-len needs a restart)"
        self.notify(self.session.snapshot().notice or "applied")

    def action_run(self) -> None:
        self._run()

    @work(exclusive=True, group="run", exit_on_error=False)
    async def _run(self) -> None:
        self.action_show("tab-live")
        try:
            records = await self.session.run_repeats()
        except SessionError as exc:
            self._error(exc)
            return
        self.refresh_now()
        if len(records) == 1:
            record = records[0]
            self.notify(f"run {record.label}: {record.status}",
                        severity="warning" if record.status != "ok" else "information")
        else:
            statuses = ", ".join(str(r.status) for r in records)
            self.notify(f"{len(records)} repeats: {statuses} (Runs tab: one column)",
                        severity="warning" if any(r.status != "ok" for r in records) else "information")

    def action_repeats(self) -> None:
        def take(text: str | None) -> None:
            if text is None:
                return
            try:
                self.session.set_repeats(text)
            except SessionError as exc:
                self._error(exc)
            self.refresh_now()

        self.push_screen(PromptScreen("Runs of the workload per r (1 to 50; 3 or more give an interval)",
                                      value=str(self.session.repeats)), take)

    def action_stop_run(self) -> None:
        self.session.stop_workload()
        self.refresh_now()

    def action_baseline(self) -> None:
        try:
            self.session.set_baseline()
        except SessionError as exc:
            self._error(exc)
        self.refresh_now()

    def action_save_preset(self) -> None:
        def save(name: str | None) -> None:
            if not name:
                return
            try:
                path = self.session.save_preset(name)
            except SessionError as exc:
                self._error(exc)
                return
            self.notify(f"saved {path}")
            main = self._main_screen()
            if main is not None:
                main.query_one(PresetList).set_presets(_safe_presets(self.session))

        self.push_screen(PromptScreen("Save flags and workload as preset", placeholder="name"), save)

    def action_attach(self) -> None:
        def attach(url: str | None) -> None:
            if url:
                self._attach_url(url)

        self.push_screen(PromptScreen("Attach to a running vLLM server", placeholder="http://127.0.0.1:8000"), attach)

    @work(exclusive=True, group="server", exit_on_error=False)
    async def _attach_url(self, url: str) -> None:
        try:
            await self.session.attach(url)
        except SessionError as exc:
            self._error(exc)

    def action_sweep(self) -> None:
        names = " ".join(p.name for p in self.presets[:2])

        def sweep(text: str | None) -> None:
            if text:
                self._sweep(text.replace(",", " ").split())

        rounds = f"; {self.session.repeats} rounds (n)" if self.session.repeats > 1 else ""
        self.push_screen(PromptScreen(f"Presets to run in a row (space separated){rounds}", value=names), sweep)

    @work(exclusive=True, group="run", exit_on_error=False)
    async def _sweep(self, names: list[str]) -> None:
        try:
            await self.session.sweep(names)
        except SessionError as exc:
            self._error(exc)
            return
        self.action_show("tab-runs")

    def action_export(self) -> None:
        self.push_screen(ExportScreen(self.session.export, lambda kind: str(self.session.save_export(kind))))

    def action_advise(self) -> None:
        """The advisor's findings for the last run; one key loads a suggestion into the editor."""
        try:
            findings = self.session.advise_last_run()
        except SessionError as exc:
            self.notify(f"advisor: {exc}" + (f" ({exc.hint})" if exc.hint else ""), severity="warning")
            return
        if not findings:
            self.notify("advisor: nothing to change for the last run")
            return
        self.push_screen(AdviceScreen(findings),
                         lambda i: self._load_finding(findings[i]) if i is not None else None)

    def _load_finding(self, finding: Finding) -> None:
        # Only into the editor: the user reviews the diff and restarts with the apply key.
        loaded = []
        for change in finding.changes:
            if change.scope != "server":
                continue
            if change.new is None:
                self.session.unset_flag(change.flag)
            else:
                self.session.set_flag(change.flag, change.new)
            loaded.append(change.describe())
        self.refresh_now()
        others = [c.describe() for c in finding.changes if c.scope != "server"]
        if loaded:
            self.notify("loaded " + ", ".join(loaded) + " into the editor: a applies (restarts the server)")
        if others:
            self.notify("change in the workload yourself: " + ", ".join(others))

    # Main-screen actions hidden from the Tune screen's footer (still refused by the
    # session while a tune runs; hidden so the footer shows the screen's own keys).
    _MAIN_ACTIONS = frozenset({"start_server", "stop_server", "apply", "run", "stop_run", "export", "advise",
                               "save_preset", "baseline", "sweep", "attach", "show", "tune", "log_polls",
                               "log_level"})

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        on_tune = self.tune_screen is not None and self.screen is self.tune_screen
        return not (on_tune and action in self._MAIN_ACTIONS)

    def action_tune(self) -> None:
        """The Tune screen (one instance: what was typed stays when it is left and reopened)."""
        if self.tune_screen is None:
            self.tune_screen = TuneScreen(self.session.tune_form_defaults(), schema=self.schema,
                                          percentile=self.session.tune_percentile(), cursor_blink=self.cursor_blink,
                                          estimate=self.session.tune_estimate)
            self.install_screen(self.tune_screen, name="tune")
        if self.screen is self.tune_screen:
            return
        self.push_screen("tune")
        self.call_after_refresh(self.rerender)

    @on(TuneScreen.StartRequested)
    def _tune_requested(self, event: TuneScreen.StartRequested) -> None:
        self._tune(event.request)

    @work(exclusive=True, group="tune", exit_on_error=False)
    async def _tune(self, request: TuneRequest) -> None:
        try:
            result = await self.session.tune(request)
        except SessionError as exc:
            if self.tune_screen is not None:
                # The GPUs a search may use are checked against the session's: a field to mark.
                self.tune_screen.show_error(str(exc), exc.hint, getattr(exc, "field", None))
            self._error(exc)
            return
        self.refresh_now()
        if result.best is not None:
            self.notify(f"tune {result.status}: {result.outcome()}; l loads it into the editor")
        else:
            self.notify(f"tune {result.status}: {result.outcome()}",
                        severity="information" if result.stopped_by_user else "warning")

    @on(TuneScreen.StopRequested)
    def _tune_stop(self) -> None:
        if self.session.stop_tune():
            self.notify("stopping the tune: it is saved as interrupted")
        self.refresh_now()

    @on(TuneScreen.LoadRequested)
    def _tune_load(self) -> None:
        try:
            changes = self.session.load_tuned_flags()
        except SessionError as exc:
            self._error(exc)
            return
        self.refresh_now()
        what = ", ".join(f"--{name} {new}" for name, _, new in changes) or "nothing changed"
        self.notify(f"loaded into the editor: {what}. a applies (restarts the server)")

    @on(TuneScreen.ExportRequested)
    def _tune_export(self) -> None:
        self.push_screen(ExportScreen(self.session.export_tune, lambda kind: str(self.session.save_tune_export(kind))))

    async def action_quit(self) -> None:
        snap = self.session.snapshot()
        if self.session.server_started_here:
            self.push_screen(QuitScreen(snap.server.base_url, snap.server.pid), self._quit_chosen)
            return
        await self._close_and_exit(stop_server=True)

    def _quit_chosen(self, choice: str | None) -> None:
        if choice is None:
            return
        self._quit_worker(choice == "stop")

    @work(exclusive=True, group="quit", exit_on_error=False)
    async def _quit_worker(self, stop_server: bool) -> None:
        await self._close_and_exit(stop_server=stop_server)

    async def _close_and_exit(self, *, stop_server: bool) -> None:
        if stop_server:
            self.notify("stopping the server…")
        # Left running by choice: the session's ServerPart tells its supervisor (and reaper) so.
        await self.session.close(stop_server=stop_server)
        self.exit(self.exit_code)

    # ------------------------------------------------------------------ command palette

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Textual's own commands, then every key of the screen in use and of the app that
        can run there, by the name the footer and the help give it."""
        textual_own = list(super().get_system_commands(screen))
        yield from textual_own
        titles = {command.title for command in textual_own}  # Textual's "Quit" is ours too
        own = bindings_of(type(screen), textual_own=False) if not isinstance(screen, MainScreen) else []
        seen: set[str] = set()
        for binding in [*own, *bindings_of(type(self), textual_own=False)]:
            name = binding.action.split("(", 1)[0]
            if binding.action in seen or binding.description in titles or name in ("blur", "dismiss", "cancel_edit"):
                continue
            if binding in own:
                namespace: DOMNode = screen
            elif self.check_action(name, ()) is False:
                continue
            else:
                namespace = self
            seen.add(binding.action)
            keys = "/".join(self.get_key_display(b) for b in [*own, *self._bindings_for(binding.action)]
                            if b.action == binding.action)
            yield SystemCommand(
                binding.description,
                f"key {keys}" + (f" · {binding.tooltip}" if binding.tooltip else ""),
                lambda action=binding.action, ns=namespace: self.run_action(action, ns),
            )

    def get_key_display(self, binding: Binding) -> str:
        # Textual shows Enter as a return-arrow glyph that some terminal fonts lack.
        return "enter" if binding.key == "enter" else super().get_key_display(binding)

    def _bindings_for(self, action: str) -> list[Binding]:
        return [b for b in bindings_of(type(self), textual_own=False) if b.action == action]

    # ------------------------------------------------------------------ help

    # (title, the classes whose bindings it lists, whether Textual's own keys are included)
    HELP_SECTIONS: tuple[tuple[str, tuple[type[DOMNode], ...], bool], ...] = (
        ("Main screen", (MainScreen,), True),
        ("In a flag (Flags tab)", (FlagInput, FlagRow, FlagEditor), False),
        ("Tune screen (u)", (TuneScreen,), False),
        ("Export (e)", (ExportScreen,), False),
        ("Advisor (v)", (AdviceScreen,), False),
        ("Apply: the flags that change (a)", (DiffScreen,), False),
        ("Quit while vtui's server runs (q)", (QuitScreen,), False),
        ("A question (load a preset over edits)", (ConfirmScreen,), False),
        ("A line to type (attach t, save preset p, sweep w)", (PromptScreen,), False),
        ("This help", (HelpScreen,), False),
    )

    def help_sections(self) -> list[tuple[str, list[KeyRow]]]:
        """Every key of the app and its screens, from their bindings (see tui.widgets.help)."""
        palette = Binding(self.COMMAND_PALETTE_BINDING, "command_palette", "Command palette: every action by name")
        sections = []
        for title, classes, textual_own in self.HELP_SECTIONS:
            bindings = [b for cls in classes for b in bindings_of(cls, textual_own=textual_own)]
            if title == "Main screen":
                taken = {b.key for b in bindings}
                app_keys = [b for b in bindings_of(type(self)) if b.key not in taken]
                bindings = [*app_keys, palette, *bindings]
            sections.append((title, key_rows(bindings, self.get_key_display)))
        return sections

    def action_help(self) -> None:
        """Every key (F1 or ?), generated from the bindings."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.help_sections(), palette_key=self.get_key_display(
                Binding(self.COMMAND_PALETTE_BINDING, "command_palette"))))


def _safe_presets(session: Session) -> list[Preset]:
    try:
        return session.list_presets()
    except Exception:  # noqa: BLE001 - a broken preset folder must not stop the app
        return []


def build_session(args: argparse.Namespace | None = None) -> Session:
    """The session ``vtui`` opens with: the tiny model and the online-chat preset on a
    CPU box, or what the arguments say (``--model`` read by engine.server.tinymodel.resolve_model).

    Raises ``engine.server.tinymodel.ModelError`` for a ``--model`` that names no usable model.
    """
    return Session.open(getattr(args, "model", None), getattr(args, "preset", None))


def run_app(args: argparse.Namespace) -> int:
    """``vtui`` with no subcommand: open the TUI. Returns the exit code."""
    import sys

    # The first run builds the tiny model and reads the installed vLLM's flags (~30 s).
    print("vtui: preparing the model and vLLM's flag schema…", file=sys.stderr, flush=True)
    from engine.errors import SessionError
    from engine.server.tinymodel import ModelError
    from tui.errors import print_error

    try:
        session = build_session(args)
        if getattr(args, "live_headroom", None) is not None:
            session.set_live_headroom(args.live_headroom)
    except (ModelError, SessionError) as exc:
        print_error(str(exc), exc.hint)
        return 2
    url = getattr(args, "url", None)
    # Without --url the server starts at once (the README's `make run`), unless --no-start.
    app = VtuiApp(session, start_server=not url and not getattr(args, "no_start", False))
    if url:
        app.call_later(app._attach_url, url)
    result = app.run()
    return int(result or 0)


def _terminal_fd() -> int | None:
    """The terminal vtui draws on (its standard output), or None without one (tests, a pipe)."""
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else -1
    except (OSError, ValueError):
        return None
    return fd if fd >= 0 and os.isatty(fd) else None


def terminal_hung_up(fd: int) -> bool:
    """Whether the terminal on ``fd`` hung up (poll says HUP or ERR, or the descriptor is gone)."""
    poller = select.poll()
    poller.register(fd, select.POLLHUP | select.POLLERR)
    try:
        events = poller.poll(0)
    except OSError:
        return True
    return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in events)
