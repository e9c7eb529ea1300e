"""``vtui advise RUN``: what to change next, and why, from a stored run.

    vtui advise last                      # the newest run in the history
    vtui advise 12 --format json
    vtui advise 12 --after 13             # did run 13 (the suggestion applied) do what was expected?
    vtui advise run.json                  # advisor run data written by engine.advise.advisor.RunData.to_dict

RUN is a history id, a run name, ``last`` or ``baseline``, or a run-data JSON file.
Nothing is changed: each finding names one flag change (old -> new) for you to apply.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tui.cli import UserError


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "advise", help="findings and flag changes from a stored run (never applies them)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="history id, name, 'last', 'baseline', or a run-data .json file")
    p.add_argument("--after", metavar="RUN2", help="a later run with a suggestion applied: check its effect")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def _load(ref: str, history: Any) -> Any:
    from engine.advise.advisor import RunData, RunDataError
    from engine.runs.history import HistoryError

    path = Path(ref).expanduser()
    if ref.endswith(".json") or path.is_file():
        try:
            return RunData.read(path)
        except RunDataError as exc:
            raise UserError(str(exc), "give a file written by RunData.to_dict, or a history run id") from None
    if history is None:
        from engine.runs.history import History

        try:
            history = History(read_only=True)
        except HistoryError as exc:
            raise UserError(str(exc), "run `vtui sweep` or the TUI first; `vtui history` lists runs") from None
    try:
        return RunData.from_history(history, ref)
    except HistoryError as exc:
        raise UserError(str(exc), "`vtui history` lists the stored runs") from None


def run(args: argparse.Namespace) -> int:
    from engine.advise.advisor import advise, check_expected

    history = None
    before = _load(args.run, history)
    findings = advise(before)
    verdicts = []
    after = None
    if args.after:
        after = _load(args.after, history)
        verdicts = [check_expected(f, before, after) for f in findings]
    if args.format == "json":
        out: dict[str, Any] = {"run": before.name, "findings": [f.to_dict() for f in findings]}
        if after is not None:
            out["after"] = after.name
            out["verdicts"] = [v.to_dict() for v in verdicts]
        print(json.dumps(out, indent=2))
        return 0
    if not findings:
        print(f"{before.name}: nothing to advise: no rule found evidence of a problem in this run")
        return 0
    print(f"{before.name}: {len(findings)} finding(s)")
    for i, f in enumerate(findings, 1):
        print(f"\n{i}. {f.text()}")
    if after is not None:
        print(f"\nAfter: {after.name}")
        for v in verdicts:
            print(v.describe())
    return 0


__all__ = ["add_parser", "run"]
