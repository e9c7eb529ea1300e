"""The terminal's charts as PNG or SVG files, for a report or a pull request.

The same two charts the TUI draws (tui/widgets/runs.py, tui/widgets/tune.py): stored runs on
the throughput plane (output tokens/s per user against per GPU, the Pareto frontier apart),
and latency against load (p99 TTFT and TPOT against requests/s), for the runs of a sweep or
the steps of a tune search. The points come from the core (``engine.runs.compare``,
``engine.tune.search``); this module only draws them, with matplotlib, an optional extra
(``pip install 'vtui[plots]'``): the terminal charts need none of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from engine.runs.compare import LoadPoint, RunPoint

FORMATS = (".png", ".svg")


class PlotError(ValueError):
    """A chart that cannot be written, naming why, with what to do."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True)
class Step:
    """One measured load of a series: a tune step, or a sweep's run."""

    load: float
    ttft_ms: float | None  # at the chart's percentile
    tpot_ms: float | None
    ok: bool | None  # met the SLO (None: no SLO)
    label: str = ""


def chart_path(path: Path) -> Path:
    """``path`` checked: a .png or .svg file in a folder that exists."""
    if path.suffix.lower() not in FORMATS:
        raise PlotError(f"{path}: a chart is written as .png or .svg, not {path.suffix or 'a file without a suffix'}",
                        "e.g. --plot sweep.svg")
    if not path.parent.is_dir():
        raise PlotError(f"{path}: the folder {path.parent} does not exist")
    return path


def beside(result_file: Path, what: str) -> Path:
    """The chart's path next to a result file: ``run.json`` -> ``run-<what>.svg``."""
    return result_file.with_name(f"{result_file.stem}-{what}.svg")


def check_available() -> None:
    """PlotError when matplotlib is missing (asked before a long run, not after it)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PlotError("PNG and SVG charts need matplotlib, which is not installed",
                        "pip install 'vtui[plots]' (the terminal charts need nothing more)")


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    check_available()
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window, over SSH or not
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0 * panels, 4.6), layout="constrained")
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    try:
        fig.savefig(path, format=path.suffix.lower().lstrip("."), dpi=120)
    except OSError as exc:
        raise PlotError(f"{path}: cannot write the chart: {exc.strerror or exc}") from None
    return path


def save_pareto(points: Sequence[RunPoint], path: Path, *, title: str = "stored runs") -> Path:
    """Output tokens/s per user against per GPU; the frontier joined and named."""
    chart_path(path)
    if not points:
        raise PlotError("no run with completed requests to draw", "run a workload first (vtui bench, r in the TUI)")
    fig, (ax,) = _figure(1)
    groups = (("missed the SLO", [p for p in points if p.slo_met is False], "x", "tab:red"),
              ("met the SLO or had none", [p for p in points if not p.frontier and p.slo_met is not False], "o",
               "tab:gray"),
              ("Pareto frontier", sorted((p for p in points if p.frontier), key=lambda p: p.tokens_per_gpu), "o",
               "tab:blue"))
    for label, group, marker, color in groups:
        if not group:
            continue
        xs, ys = [p.tokens_per_gpu for p in group], [p.tokens_per_user for p in group]
        style = "-" if label == "Pareto frontier" and len(group) > 1 else ""
        ax.plot(xs, ys, marker=marker, linestyle=style or "none", color=color, label=label)
        for p in group:
            ax.annotate(f"#{p.run_id} {p.name}", (p.tokens_per_gpu, p.tokens_per_user), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("output tokens/s per GPU")
    ax.set_ylabel("output tokens/s per user")
    ax.set_title(f"{title}: throughput per user against per GPU")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def save_latency_load(series: Mapping[str, Sequence[Step]], path: Path, *, title: str,
                      slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                      load_unit: str = "requests/s", percentile: float = 99.0) -> Path:
    """TTFT and TPOT at ``percentile`` against load, one line per series; SLO limits as dashed
    lines; steps that missed the SLO drawn hollow."""
    chart_path(path)
    if not any(series.values()):
        raise PlotError("no measured step to draw")
    fig, axes = _figure(2)
    for ax, attr, name, limit in ((axes[0], "ttft_ms", f"TTFT p{percentile:g} (ms)", slo_ttft_ms),
                                  (axes[1], "tpot_ms", f"TPOT p{percentile:g} (ms)", slo_tpot_ms)):
        for label, steps in series.items():
            pts = sorted(((s.load, getattr(s, attr), s) for s in steps if getattr(s, attr) is not None),
                         key=lambda t: t[0])
            if not pts:
                continue
            (line,) = ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=label)
            missed = [(x, y) for x, y, s in pts if s.ok is False]
            if missed:
                ax.plot([x for x, _ in missed], [y for _, y in missed], marker="o", linestyle="none",
                        markerfacecolor="white", color=line.get_color())
            for x, y, s in pts:
                if s.label:
                    ax.annotate(s.label, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if limit is not None:
            ax.axhline(limit, linestyle="--", color="tab:red", linewidth=1, label=f"SLO {limit:g} ms")
        ax.set_xlabel(load_unit)
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: latency against load (hollow: missed the SLO)")
    return _save(fig, path)


def load_steps(points: Sequence[LoadPoint]) -> list[Step]:
    """Stored runs (a sweep's) as one series at p99, each labelled with its run."""
    return [Step(p.load, p.ttft_p99_ms, p.tpot_p99_ms, p.slo_met, f"#{p.run_id} {p.name}") for p in points]


def tune_steps(series: Sequence[tuple[str, Sequence[tuple[float, float | None, float | None, bool]]]],
               ) -> dict[str, list[Step]]:
    """A search's steps per configuration (``engine.tune.search.step_series``)."""
    return {key: [Step(load, ttft, tpot, ok) for load, ttft, tpot, ok in pts] for key, pts in series}
