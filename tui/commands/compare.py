"""``vtui compare RUN...``: stored runs side by side.

RUN is a run id, a run name (its newest run), ``last`` or ``baseline``; several joined
by commas (``3,5,7``) are the repeats of one configuration, one column (their median).
Each column says how many runs it holds; rows for the flags that differ and for every
metric; (±%) is the change against the baseline (the column holding the run tagged with
``vtui history baseline ID``, else the first given), and "within noise" says that the
95% interval of that change holds zero: over the repeats where both columns have some,
else from each run's stored requests (the weaker kind) and this box's noise floor
(measured by ``vtui bench --noise-floor K``, else learned from the history's repeats of any
configuration; without either, single runs are judged within noise only, where even their
within-run interval holds zero, never beyond it, and the legend says so); ``*``
marks the best value per row only where it is beyond the noise of every other column.

  vtui compare 12 13                  two single runs
  vtui compare 12,14,16 13,15,17      three repeats each (vtui bench --repeat 3)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.runs.history import History
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare stored runs side by side", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run id, name, 'last' or 'baseline'; RUN,RUN,... for the repeats of one configuration")
    parser.add_argument("--format", choices=("text", "markdown", "csv", "json"), default="text")
    parser.add_argument("--baseline", metavar="RUN", help="compare against this run (default: the tagged baseline)")
    parser.add_argument("--all-flags", action="store_true", help="show every flag, not only those that differ")
    parser.add_argument("--output", "-o", type=Path, help="write to this file instead of printing")
    add_plot_argument(parser, "--output", "the runs' output tokens/s per user against per GPU (Pareto frontier)")
    parser.set_defaults(func=run)


def open_history(read_only: bool = True) -> History:
    """The user's history, or a UserError saying why it cannot be opened."""
    from engine.runs.history import History, HistoryError
    from tui.errors import UserError

    try:
        return History(read_only=read_only)
    except HistoryError as exc:
        hint = "run something first (vtui sweep / vtui bench)" if "no history file" in exc.reason else ""
        raise UserError(str(exc), hint) from None


PLOT_BESIDE = "beside"


def add_plot_argument(parser: argparse.ArgumentParser, result_option: str, what: str) -> None:
    """``--plot [FILE]``: the chart as PNG or SVG (matplotlib, ``vtui[plots]``)."""
    parser.add_argument("--plot", nargs="?", const=PLOT_BESIDE, metavar="FILE",
                        help=f"also draw {what} as a .png or .svg file (needs `pip install 'vtui[plots]'`); "
                             f"without FILE, next to {result_option}'s file")


def plot_target(arg: str | None, result_file: Path | None, result_option: str, what: str) -> Path | None:
    """``--plot``'s file, checked before the work starts (a long search must not end in a bad
    path or a missing library): None when no chart was asked for."""
    from engine.runs.plots import PlotError, beside, chart_path, check_available
    from tui.errors import UserError

    if arg is None:
        return None
    if arg == PLOT_BESIDE and result_file is None:
        raise UserError(f"--plot without a FILE draws next to {result_option}'s file, and none was given",
                        f"give --plot {what}.svg, or {result_option} FILE")
    path = beside(result_file, what) if arg == PLOT_BESIDE and result_file is not None else Path(arg)
    try:
        check_available()
        return chart_path(path)
    except PlotError as exc:
        raise UserError(exc.reason, exc.hint) from None


def draw(draw_fn: Callable[[], object], path: Path) -> None:
    """Run one of engine.runs.plots' savers, a PlotError becoming the user's error."""
    from engine.runs.plots import PlotError
    from tui.errors import UserError

    try:
        draw_fn()
    except PlotError as exc:
        raise UserError(exc.reason, exc.hint) from None
    print(f"wrote {path}", file=sys.stderr)  # stdout stays the table or JSON asked for


def write_or_print(text: str, output: Path | None) -> None:
    from tui.errors import UserError

    if output is None:
        print(text, end="" if text.endswith("\n") else "\n")
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}", "pick a writable path") from None
    print(f"wrote {output}")


def _refs(text: str) -> list[str]:
    """``3,5,7``: the runs of one column; an empty part is the user's mistake, named."""
    from tui.errors import UserError

    refs = [part.strip() for part in text.split(",")]
    if not all(refs):
        raise UserError(f"RUN {text!r} has an empty part", "join run ids with commas, e.g. 3,5,7")
    return refs


def run(args: argparse.Namespace) -> int:
    from engine.runs.compare import compare, render
    from engine.runs.history import HistoryError
    from engine.runs.noise import box_floor
    from tui.errors import UserError

    plot = plot_target(args.plot, args.output, "--output", "pareto")
    store = open_history()
    try:
        columns = [[store.resolve(ref) for ref in _refs(text)] for text in args.runs]
        baseline = None
        if args.baseline:
            base = store.resolve(args.baseline)
            at = next((i for i, column in enumerate(columns) if any(r.id == base.id for r in column)), None)
            if at is None:
                columns.insert(0, [base])
                at = 0
            baseline = at
        runs = [run for column in columns for run in column]
        requests = {run.id: store.requests(run.id) for run in runs}  # each run's within-run noise
        floor = box_floor(store)  # this box's run-to-run noise: measured, else learned from repeats
    except HistoryError as exc:
        raise UserError(str(exc), "see `vtui history list` for run ids") from None
    finally:
        store.close()
    cmp = compare(columns, baseline, all_flags=args.all_flags, requests=requests, floor=floor)
    write_or_print(render(cmp, args.format), args.output)
    if plot is not None:
        from engine.runs.compare import run_points
        from engine.runs.plots import save_pareto

        draw(lambda: save_pareto(run_points(runs), plot, title=f"{len(runs)} runs"), plot)
    return 0
