"""The live view: resources (GPU or host), server queue and KV cache, latency from the
client beside the server's own, throughput, progress and SLO, sparklines over time."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Label, ProgressBar, Sparkline, Static

from engine.views import LIVE_METRICS, SessionSnapshot

# (series name in the snapshot, label)
MARKED = "ttft_p50"  # the chart whose line shows where live changes fall

SPARKS = (
    ("req_s", "req/s"),
    ("ttft_p50", "TTFT p50"),
    ("kv", "KV %"),
    ("util", "util %"),
)


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


class LivePanel(VerticalScroll):
    """Everything measured right now, redrawn from each snapshot."""

    BORDER_TITLE = "Live"

    snapshot: reactive[SessionSnapshot | None] = reactive(None, always_update=True)
    """The latest session snapshot."""

    def compose(self) -> ComposeResult:
        yield Static("", id="live-resources")
        yield Static("", id="live-server")
        yield Static("", id="live-latency")
        yield Static("", id="live-throughput")
        with Horizontal(id="live-progress-row"):
            yield Label("no run", id="live-progress-label")
            yield ProgressBar(total=100, show_eta=False, id="live-progress")
        # The client beside the server after a run: under the progress line, so that at 80x24 the
        # run's figures and how it ended stay in view and this scrolls in below them.
        yield Static("", id="live-check")
        with Vertical(id="live-sparks"):
            for name, label in SPARKS:
                with Horizontal(classes="spark-row"):
                    yield Label(label, classes="spark-label")
                    yield Sparkline([], id=f"spark-{name}", classes="spark")
                    yield Label("", id=f"spark-last-{name}", classes="spark-last")
        # Under the charts: where a live limit change falls on TTFT's, and what it was.
        yield Static("", id="live-marks")

    def watch_snapshot(self, snap: SessionSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        self.query_one("#live-resources", Static).update(self._resources(snap))
        self.query_one("#live-server", Static).update(self._server(snap))
        self.query_one("#live-latency", Static).update(self._latency(snap))
        self.query_one("#live-throughput", Static).update(self._throughput(snap))
        check = self._check(snap)
        box = self.query_one("#live-check", Static)
        box.update(check)
        box.display = bool(check.plain)
        self._progress(snap)
        for name, _ in SPARKS:
            data = snap.series.get(name, ())
            # Textual scales a flat series to full height: zeros (an idle server) would draw
            # as full bars. Nothing above zero draws nothing.
            self.query_one(f"#spark-{name}", Sparkline).data = list(data) if any(data) else []
            self.query_one(f"#spark-last-{name}", Label).update(_f(data[-1]) if data else "-")
        self._marks(snap)

    def _marks(self, snap: SessionSnapshot) -> None:
        box = self.query_one("#live-marks", Static)
        marks = snap.series_marks.get(MARKED, ())
        points = len(snap.series.get(MARKED, ()))
        box.display = bool(marks) and points > 0
        if not box.display:
            return
        spark = self.query_one(f"#spark-{MARKED}", Sparkline)
        width, left = spark.size.width, max(0, spark.region.x - self.content_region.x)
        text = Text()
        if width > 0:  # laid out (a tab not shown yet has no size): the marks' columns
            line = [" "] * (left + width)
            for ago, _ in marks:
                # Textual's sparkline spreads the points over its width: the change's first point's column.
                line[left + max(0, min(width - 1, (points - ago) * width // points))] = "▲"
            text.append("".join(line).rstrip() + "\n")
        text.append(f"▲ set live: {marks[-1][1]}", style="italic")
        box.update(text)

    def _resources(self, snap: SessionSnapshot) -> Text:
        text = Text()
        if snap.gpu_unavailable:
            # Shown once, in its own line, instead of an empty GPU table.
            text.append(f"No GPU: {snap.gpu_unavailable}; host figures shown\n", style="italic")
        if not snap.devices:
            text.append("resources: waiting for the first sample")
            return text
        for d in snap.devices:
            mem = f"{_f(d.mem_used_gib)}/{_f(d.mem_total_gib)} GiB"
            vllm = f" (vLLM {_f(d.vllm_mem_gib, '{:.2f}')} GiB)" if d.vllm_mem_gib is not None else ""
            util = f"  {'CPU' if d.name.startswith('host') else 'util'} {_f(d.util_pct, '{:.0f}')}%"
            watts = f"  {d.power_w:.0f} W" if d.power_w is not None else ""
            text.append(f"{d.name:<12}", style="bold")
            text.append(f" mem {mem}{vllm}{util}{watts}\n")
        last = snap.runs[-1].summary.telemetry if snap.runs else None
        sol = last.speed_of_light if last is not None else None
        if sol is not None and sol.line:  # engine.server.speedoflight, for the last run
            text.append("last run    ", style="bold")
            text.append(f" {sol.line}\n")
        text.rstrip()
        return text

    def _server(self, snap: SessionSnapshot) -> Text:
        m = snap.server_metrics
        text = Text()
        text.append("server      ", style="bold")
        text.append(
            f" KV {_f(m.kv_usage_pct)}%  running {_f(m.running, '{:.0f}')}"
            f"  waiting {_f(m.waiting, '{:.0f}')}  preempt {_f(m.preemptions_per_s)}/s"
            f"  prefix hit {_f(m.prefix_hit_pct, '{:.0f}')}%"
        )
        if m.api_server_cpu_pct is not None:
            # The busiest one's, of one core; with several (--api-server-count), how many.
            several = f" (busiest of {m.api_servers})" if m.api_servers is not None and m.api_servers > 1 else ""
            text.append(f"  API server CPU {m.api_server_cpu_pct:.0f}%{several}")
        if m.error:
            text.append(f"\n/metrics: {m.error}", style="italic")
        return text

    def _latency(self, snap: SessionSnapshot) -> Table:
        # The client's figures say what they cover: the rolling window while a run goes, the
        # whole run (its stored figures, as Runs shows them) once it ended.
        figures = snap.figures
        table = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
        table.add_column(f"ms, {figures.scope}" if figures is not None else "ms", style="bold")
        for col in ("p50", "p90", "p99"):
            table.add_column(col, justify="right")
        table.add_column("server p50", justify="right")
        table.add_column("p99", justify="right")
        # The server's side covers what the client's does: its histograms over the whole run's
        # window once it ended (the scrapes at its edges), the live scrapes' while it goes.
        m = snap.server_metrics
        live = {"TTFT": m.ttft_ms, "ITL": m.itl_ms, "E2EL": m.e2el_ms}
        server = {label: ((live.get(label) or {}).get("p50"), (live.get(label) or {}).get("p99"))
                  for label, _ in LIVE_METRICS}
        if figures is not None and figures.server_latency:
            server = dict(figures.server_latency)
        rows = dict(figures.latency) if figures is not None else {}
        for label, _ in LIVE_METRICS:
            table.add_row(
                label,
                *(_f(v) for v in rows.get(label, (None, None, None))),
                *(_f(v) for v in server.get(label, (None, None))),
            )
        return table

    def _throughput(self, snap: SessionSnapshot) -> Text:
        f = snap.figures
        text = Text()
        if f is None:
            text.append("throughput  no run yet (r runs the workload"
                        + (f" {snap.repeats} times: n sets how many)" if snap.repeats > 1 else ")"))
            return text
        parts = [f"{_f(f.req_s)} req/s", f"{_f(f.out_tok_s, '{:.0f}')} out tok/s"]
        if f.in_flight is not None:
            parts.append(f"in flight {f.in_flight}")
        if f.completed is not None:
            parts.append(f"{f.completed} done")
        if f.slo_met is not None:
            parts.append(f"SLO met {f.slo_met * 100:.0f}%")
        if f.goodput is not None:
            parts.append(f"goodput {f.goodput:.1f}/s")
        marked = []
        if f.failed:
            marked.append(f"failed {f.failed}")
        if f.client_bound:
            marked.append("CLIENT-BOUND" + (f" (lag {f.client_lag_ms:.0f} ms)" if f.client_lag_ms is not None else ""))
        elif f.status is not None and f.status != "slo-missed":
            marked.append(f.status.upper())  # box-bound, cancelled, server-died: the run's own word
        # The figures after the scope's label, broken where the panel is narrower than the
        # line (80 columns), under the figures rather than under the label.
        width = max(40, self.scrollable_content_region.width - 1)
        head = f"{f.scope:<11} "
        text.append(head, style="bold")
        col = len(head)
        for i, part in enumerate(parts + marked):
            sep = "  " if i else ""
            if i and col + len(sep) + len(part) > width:
                text.append("\n" + " " * len(head))
                col, sep = len(head), ""
            text.append(sep + part, style="bold" if i >= len(parts) else "")
            col += len(sep) + len(part)
        if f.note:
            text.append(f"\n{f.note}", style="italic")
        return text

    def _check(self, snap: SessionSnapshot) -> Text:
        """A finished run's client beside the server, and the cross-check's warnings; flags changed
        live during the run going on, or during the finished one (two configurations)."""
        f = snap.figures
        text = Text()
        changes = snap.run.changes if snap.run is not None else f.changes if f is not None else None
        if changes:
            text.append(f"{changes}: two configurations, kept out of verdicts", style="bold")
        if f is None:
            return text
        if f.beside:
            text.append("\n" if text.plain else "")
            text.append(f.beside)
        for warning in f.warnings:
            text.append(("\n" if text.plain else "") + f"WARNING: {warning}", style="bold")
        return text

    def _progress(self, snap: SessionSnapshot) -> None:
        bar = self.query_one("#live-progress", ProgressBar)
        label = self.query_one("#live-progress-label", Label)
        run = snap.run
        if run is None:
            label.update("no run" if not snap.runs else f"last: {snap.runs[-1].label} ({snap.runs[-1].status})")
            bar.update(total=100, progress=100 if snap.runs else 0)
            return
        planned = f"/{run.planned}" if run.planned else ""
        label.update(f"{run.label}: {run.completed}{planned} done, {run.elapsed_s:.0f} s · c cancels")
        if run.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=run.fraction * 100)
