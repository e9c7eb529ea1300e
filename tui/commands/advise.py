"""``vtui advise RUN``: what to change next, and why, from a stored run.

    vtui advise last                      # the newest run in the history
    vtui advise 12 --format json
    vtui advise 12 --after 13             # did run 13 (the suggestion applied) do what was expected?
    vtui advise run.json                  # advisor run data written by engine.advise.advisor.RunData.to_dict
    vtui advise 12 --draft-model Qwen/Qwen2.5-0.5B-Instruct   # a draft for speculative decoding

RUN is a history id, a run name, ``last`` or ``baseline``, or a run-data JSON file.
Nothing is changed: each finding names one flag change (old -> new) for you to apply.
--draft-model offers a draft model (a smaller model of the same family: a local folder or a
Hugging Face id): where the run decoded few sequences at once on a GPU with long outputs, the
advice puts it in --speculative-config instead of n-gram speculation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tui.errors import UserError

if TYPE_CHECKING:
    from engine.advise.rundata import RunData
    from engine.runs.history import History
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "advise", help="findings and flag changes from a stored run (never applies them)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="history id, name, 'last', 'baseline', or a run-data .json file")
    p.add_argument("--after", metavar="RUN2", help="a later run with a suggestion applied: check its effect")
    p.add_argument("--draft-model", metavar="PATH_OR_ID",
                   help="a draft model for speculative decoding, named in the advice where the run has room for it")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def _load(ref: str, history: History | None) -> RunData:
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


def _draft(value: str | None) -> str | None:
    """The --draft-model value: a Hugging Face id, or a local folder that must exist."""
    if value is None:
        return None
    draft = value.strip()
    if not draft:
        raise UserError("--draft-model is empty", "give a local model folder or a Hugging Face id")
    if draft.startswith(("/", "./", "../", "~")) and not Path(draft).expanduser().is_dir():
        raise UserError(f"--draft-model {draft}: no such folder",
                        "give a local model folder (with config.json) or a Hugging Face id such as org/name")
    return str(Path(draft).expanduser()) if draft.startswith("~") else draft


def run(args: argparse.Namespace) -> int:
    from engine.advise.advisor import advise, check_expected, not_advised

    history = None
    draft = _draft(args.draft_model)
    before = _load(args.run, history)
    skipped = not_advised(before)  # flags changed live during it: two configurations
    findings = advise(before, draft_model=draft)
    verdicts = []
    after = None
    if args.after:
        after = _load(args.after, history)
        verdicts = [check_expected(f, before, after) for f in findings]
    if args.format == "json":
        out: dict[str, object] = {"run": before.name, "findings": [f.to_dict() for f in findings]}
        if skipped is not None:
            out["skipped"] = skipped
        if draft:
            out["draft_model"] = draft
        if after is not None:
            out["after"] = after.name
            out["verdicts"] = [v.to_dict() for v in verdicts]
        print(json.dumps(out, indent=2))
        return 0
    if skipped is not None:
        print(f"{before.name}: {skipped}")
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
