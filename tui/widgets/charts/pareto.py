"""The stored runs' output tokens/s per user against per GPU, the Pareto frontier apart."""

from __future__ import annotations

from engine.runs.compare import RunPoint
from tui.widgets.charts.base import Chart


class ParetoChart(Chart):
    """Frontier, runs that met the SLO (or had none) and runs that missed it; hidden under two runs."""

    def show(self, points: tuple[RunPoint, ...]) -> None:
        plt = self.blank(len(points))
        if plt is None:
            return
        groups = (("Pareto frontier", [p for p in points if p.frontier]),
                  ("met the SLO or had none", [p for p in points if not p.frontier and p.slo_met is not False]),
                  ("missed the SLO", [p for p in points if p.slo_met is False]))
        for label, group in groups:
            if group:
                plt.scatter([p.tokens_per_gpu for p in group], [p.tokens_per_user for p in group], label=label)
        plt.title("stored runs: output tokens/s per user against per GPU")
        plt.xlabel("output tokens/s per GPU")
        plt.ylabel("tok/s per user")
        self.refresh()
