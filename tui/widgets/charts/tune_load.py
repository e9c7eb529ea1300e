"""TTFT against load for each configuration's steps in a search: where each one's latency turns up."""

from __future__ import annotations

from engine.views import TuneView
from tui.widgets.charts.base import Chart

# Lines drawn at most (the best first): more would not read at a terminal's size.
MAX_LINES = 6


class TuneLoadChart(Chart):
    """One line per configuration measured at a finite load; hidden before the first."""

    MIN_POINTS = 1

    def show(self, view: TuneView | None) -> None:
        measured = [(k, [p for p in pts if p[1] is not None]) for k, pts in (view.step_series if view else ())]
        series = [(k, pts) for k, pts in measured if pts]
        plt = self.blank(len(series))
        if plt is None or view is None:
            return
        series.sort(key=lambda item: item[0] != view.best_key)
        for key, pts in series[:MAX_LINES]:
            plt.plot([p[0] for p in pts], [p[1] for p in pts], marker="braille",
                     label=("★ " if key == view.best_key else "") + key[:40])
        unit = "req/s" if view.mode == "rate" else "concurrent requests"
        plt.title(f"TTFT against load ({view.slo_label})" if view.slo_label else "TTFT against load")
        plt.xlabel(f"load ({unit})")
        plt.ylabel("TTFT ms")
        self.refresh()
