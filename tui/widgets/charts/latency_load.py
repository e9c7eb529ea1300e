"""The compared runs' p99 TTFT and TPOT against the requests/s each achieved (a sweep read as a curve)."""

from __future__ import annotations

from engine.runs.compare import LoadPoint
from tui.widgets.charts.base import Chart


class LatencyLoadChart(Chart):
    """p99 TTFT (left axis) and TPOT (right) against load; hidden under two runs."""

    def show(self, points: tuple[LoadPoint, ...]) -> None:
        plt = self.blank(len(points))
        if plt is None:
            return
        loads = [p.load for p in points]
        for label, values, side in (("TTFT p99 ms", [p.ttft_p99_ms for p in points], "left"),
                                    ("TPOT p99 ms (right)", [p.tpot_p99_ms for p in points], "right")):
            pairs = [(x, y) for x, y in zip(loads, values, strict=True) if y is not None]
            if pairs:
                plt.plot([x for x, _ in pairs], [y for _, y in pairs], label=label, marker="dot", yside=side)
        plt.title("compared runs: latency against load")
        plt.xlabel("requests/s")
        self.refresh()
