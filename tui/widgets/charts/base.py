"""What every chart shares: a plotext plot cleared before drawing, hidden below what it needs."""

from __future__ import annotations

from typing import Any

from textual_plotext import PlotextPlot


class Chart(PlotextPlot):
    """A plotext chart that draws only from ``MIN_POINTS`` points on (no empty axes)."""

    MIN_POINTS = 2

    def blank(self, points: int) -> Any | None:
        """The plot cleared for drawing (its ``plt``), or None (and the chart hidden) below
        ``MIN_POINTS`` points."""
        self.display = points >= self.MIN_POINTS
        if not self.display:
            return None
        self.plt.clear_data()
        self.plt.clear_figure()
        return self.plt
