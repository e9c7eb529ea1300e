"""Terminal charts: one widget per chart, each drawing the points a view gives it (the core
computes them: engine.runs.compare, engine.tune.view) and hiding itself when there is too little
to draw. A new chart is one module here with a ``show(...)`` taking its view's points, and its test.

- :class:`LatencyLoadChart`: the compared runs' p99 TTFT and TPOT against the load each achieved (Runs)
- :class:`ParetoChart`: stored runs' tokens/s per user against tokens/s per GPU, the frontier apart (Runs)
- :class:`TuneLoadChart`: TTFT against load for each configuration a search measured (Tune)

The Live tab's sparklines are Textual's own ``Sparkline`` widgets, fed by engine.telemetry's series.
"""

from tui.widgets.charts.base import Chart
from tui.widgets.charts.latency_load import LatencyLoadChart
from tui.widgets.charts.pareto import ParetoChart
from tui.widgets.charts.tune_load import TuneLoadChart

__all__ = ["Chart", "LatencyLoadChart", "ParetoChart", "TuneLoadChart"]
