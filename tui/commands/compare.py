"""``vtui compare RUN...``: stored runs side by side.

RUN is a run id, a run name (its newest run), ``last`` or ``baseline``. One column per
run; rows for the flags that differ and for every metric; ``*`` marks the best value
per row; (±%) is the change against the baseline run (the one tagged with
``vtui history baseline ID``, else the first given).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare stored runs side by side", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run id, name, 'last' or 'baseline'")
    parser.add_argument("--format", choices=("text", "markdown", "csv", "json"), default="text")
    parser.add_argument("--baseline", metavar="RUN", help="compare against this run (default: the tagged baseline)")
    parser.add_argument("--all-flags", action="store_true", help="show every flag, not only those that differ")
    parser.add_argument("--output", "-o", type=Path, help="write to this file instead of printing")
    add_plot_argument(parser, "--output", "the runs' output tokens/s per user against per GPU (Pareto frontier)")
    parser.set_defaults(func=run)


def open_history(read_only: bool = True) -> Any:
    """The user's history, or a UserError saying why it cannot be opened."""
    from engine.runs.history import History, HistoryError
    from tui.cli import UserError

    try:
        return History(read_only=read_only)
    except HistoryError as exc:
        hint = "run something first (vtui sweep / vtui bench)" if "no history file" in exc.reason else ""
        raise UserError(str(exc), hint) from None


PLOT_BESIDE = "beside"


def add_plot_argument(parser: Any, result_option: str, what: str) -> None:
    """``--plot [FILE]``: the chart as PNG or SVG (matplotlib, ``vtui[plots]``)."""
    parser.add_argument("--plot", nargs="?", const=PLOT_BESIDE, metavar="FILE",
                        help=f"also draw {what} as a .png or .svg file (needs `pip install 'vtui[plots]'`); "
                             f"without FILE, next to {result_option}'s file")


def plot_target(arg: str | None, result_file: Path | None, result_option: str, what: str) -> Path | None:
    """``--plot``'s file, checked before the work starts (a long search must not end in a bad
    path or a missing library): None when no chart was asked for."""
    from engine.runs.plots import PlotError, beside, chart_path, check_available
    from tui.cli import UserError

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


def draw(draw_fn: Any, path: Path) -> None:
    """Run one of engine.runs.plots' savers, a PlotError becoming the user's error."""
    from engine.runs.plots import PlotError
    from tui.cli import UserError

    try:
        draw_fn()
    except PlotError as exc:
        raise UserError(exc.reason, exc.hint) from None
    print(f"wrote {path}", file=sys.stderr)  # stdout stays the table or JSON asked for


def write_or_print(text: str, output: Path | None) -> None:
    from tui.cli import UserError

    if output is None:
        print(text, end="" if text.endswith("\n") else "\n")
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}", "pick a writable path") from None
    print(f"wrote {output}")


def run(args: argparse.Namespace) -> int:
    from engine.runs.compare import compare, render
    from engine.runs.history import HistoryError
    from tui.cli import UserError

    plot = plot_target(args.plot, args.output, "--output", "pareto")
    store = open_history()
    try:
        runs = [store.resolve(ref) for ref in args.runs]
        baseline = None
        if args.baseline:
            base = store.resolve(args.baseline)
            ids = [r.id for r in runs]
            if base.id not in ids:
                runs.insert(0, base)
                ids.insert(0, base.id)
            baseline = ids.index(base.id)
    except HistoryError as exc:
        raise UserError(str(exc), "see `vtui history list` for run ids") from None
    finally:
        store.close()
    write_or_print(render(compare(runs, baseline, all_flags=args.all_flags), args.format), args.output)
    if plot is not None:
        from engine.runs.compare import run_points
        from engine.runs.plots import save_pareto

        draw(lambda: save_pareto(run_points(runs), plot, title=f"{len(runs)} runs"), plot)
    return 0
