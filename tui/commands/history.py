"""``vtui history``: the runs stored in the user's data folder.

  vtui history [list]                  newest first
  vtui history show RUN                flags, workload, metrics of one run
  vtui history delete RUN
  vtui history baseline RUN            the run comparisons measure against (--clear to unset)
  vtui history tag RUN TAG...          (--remove to take tags off)
  vtui history export RUN --format json|csv|trace|docker|serve [-o FILE]
  vtui history floor [--format json]   this box's noise floor, which single-run verdicts read

RUN is a run id, a run name (its newest run), ``last`` or ``baseline``. ``trace`` is
a Perfetto / Chrome trace-event JSON file: open it at https://ui.perfetto.dev.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.runs.history import History, StoredRequest
    from engine.runs.rows import RunInfo
    from tui.commands import Subparsers

EXPORT_FORMATS = ("json", "csv", "trace", "docker", "serve")


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "history", help="list, show, delete, tag and export stored runs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", nargs="?", default="list",
                        choices=("list", "show", "delete", "baseline", "tag", "export", "floor"))
    parser.add_argument("run", nargs="?", metavar="RUN")
    parser.add_argument("tags", nargs="*", metavar="TAG")
    parser.add_argument("--format", choices=EXPORT_FORMATS,
                        help="export: the format (default json); list, floor: json prints it as JSON")
    parser.add_argument("--output", "-o", type=Path, help="export to this file instead of printing")
    parser.add_argument("--limit", type=int, default=50, help="list at most this many runs")
    parser.add_argument("--clear", action="store_true", help="baseline: unset it")
    parser.add_argument("--remove", action="store_true", help="tag: remove the tags")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.runs.history import HistoryError
    from tui.commands.compare import open_history
    from tui.errors import UserError

    writes = args.action in ("delete", "baseline", "tag")
    if args.action not in ("list", "floor") and not (args.action == "baseline" and args.clear) and not args.run:
        raise UserError(f"`vtui history {args.action}` needs a RUN", "see `vtui history list` for run ids")
    store = open_history(read_only=not writes)
    try:
        if args.format is not None and args.action not in ("list", "export", "floor"):
            raise UserError(f"--format applies to `vtui history list` and `export`, not `{args.action}`",
                            f"e.g. vtui history export {args.run or 'RUN'} --format {args.format}")
        if args.action == "list":
            if args.format not in (None, "json"):
                raise UserError(f"`vtui history list` prints a table or JSON, not {args.format}",
                                "use --format json, or `vtui history export RUN --format ...` for one run")
            return _list(store, args.limit, as_json=args.format == "json")
        if args.action == "floor":
            if args.format not in (None, "json"):
                raise UserError(f"`vtui history floor` prints a table or JSON, not {args.format}", "use --format json")
            return _floor(store, as_json=args.format == "json")
        if args.action == "baseline" and args.clear:
            store.set_baseline(None)
            print("baseline cleared")
            return 0
        info = store.resolve(args.run)
        if args.action == "show":
            return _show(store, info)
        if args.action == "delete":
            store.delete_run(info.id)
            print(f"deleted run #{info.id} {info.name}")
            return 0
        if args.action == "baseline":
            store.set_baseline(info.id)
            print(f"baseline: run #{info.id} {info.name}")
            return 0
        if args.action == "tag":
            if not args.tags:
                raise UserError("give at least one TAG", "e.g. vtui history tag 3 h200 good")
            info = store.tag(info.id, *args.tags, remove=args.remove)
            print(f"run #{info.id} tags: {', '.join(info.tags) or '(none)'}")
            return 0
        return _export(store, info, args.format or "json", args.output)
    except HistoryError as exc:
        raise UserError(str(exc), "see `vtui history list` for run ids") from None
    finally:
        store.close()


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _list(store: History, limit: int, *, as_json: bool = False) -> int:
    from engine.runs.compare import fmt_number
    from engine.runs.flagchange import changed_during

    runs = store.list_runs(limit=limit)
    if as_json:
        print(json.dumps([{
            "id": r.id, "name": r.name, "preset": r.preset, "status": r.status, "started": r.started,
            "duration_s": r.duration_s, "requests": r.requests,
            "request_throughput": r.summary.figure("request_throughput"),
            "baseline": bool(r.baseline), "tags": list(r.tags), "changed_live": changed_during(r.summary),
        } for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs stored yet")
        return 0
    rows = [("id", "name", "preset", "started", "dur s", "status", "reqs", "req/s", "")]
    for r in runs:
        rps = r.summary.figure("request_throughput")
        rows.append((
            str(r.id), r.name, r.preset or "-", _when(r.started),
            "-" if r.duration_s is None else f"{r.duration_s:.0f}", r.status, str(r.requests),
            fmt_number(rps) if isinstance(rps, (int, float)) else "-",
            # a run during which flags changed live measured two configurations
            " ".join((["baseline"] if r.baseline else []) + (["changed-live"] if changed_during(r.summary) else [])
                     + list(r.tags)),
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _floor(store: History, *, as_json: bool = False) -> int:
    """The noise floor this box's single-run verdicts read (engine.runs.noise.box_floor): where it
    came from, and per figure its spread as measured (95%) and as a verdict reads it (99%)."""
    from engine.runs.compare import floor_note
    from engine.runs.noise import FIGURES, SINGLE_RUN_LEVEL, box_floor, verdict_floor
    from engine.runs.rows import this_box
    from tui.commands.output import figure_label

    floor = box_floor(store)
    if floor is None:
        if as_json:
            print(json.dumps({"box": this_box(), "floor": None}, indent=2))
        else:
            print(f"no noise floor for this box ({this_box()}) yet: single runs are judged within noise only, never beyond it. "
                  "`vtui bench --noise-floor 5` measures one; three runs or more of any configuration teach one.")
        return 0
    spreads = [(f, pct, verdict_floor(pct, floor.df_of(f)), floor.df_of(f)) for f in FIGURES
               if (pct := floor.pct(f)) is not None]
    rows = [{"figure": f, "spread_pct": pct, "verdict_pct": read, "degrees_of_freedom": df}
            for f, pct, read, df in spreads]
    if as_json:
        print(json.dumps({"box": floor.box, "floor": {
            "source": "learned" if floor.learned else "measured", "id": floor.id, "label": floor.label,
            "runs": floor.runs, "configurations": floor.groups, "degrees_of_freedom": floor.df,
            "when": floor.measured, "run_ids": list(floor.run_ids), "figures": rows}}, indent=2))
        return 0
    print(floor_note(floor))
    print(f"{'':<34} {'spread (95%)':>13} {f'a verdict reads ({SINGLE_RUN_LEVEL:.0%})':>22} {'df':>4}")
    for figure, pct, read, df in spreads:
        print(f"{figure_label(figure):<34} {f'±{pct:.1f}%':>13} {f'±{read:.1f}%':>22} {df:>4}")
    print("two single runs of one configuration on this box differ by less than the spread 95 times in 100 "
          "(the larger within a factor 1 + spread of the smaller); df: the degrees of freedom each rests on "
          "(its runs less one per configuration): more runs narrow it")
    return 0


def _show(store: History, info: RunInfo) -> int:
    from engine.runs.compare import compare, render
    from engine.runs.flagchange import TWO_CONFIGURATIONS, changes_text, flag_changes_of
    from engine.runs.measure import PrefixReset, box_share_of, started_flags_of

    print(f"run #{info.id} {info.name}" + ("  [baseline]" if info.baseline else ""))
    print(f"  status    {info.status}")
    print(f"  preset    {info.preset or '-'}")
    print(f"  model     {info.model or '-'}   vLLM {info.vllm_version or '?'}")
    print(f"  started   {_when(info.started)}   ended {_when(info.ended)}")
    print(f"  requests  {info.requests} stored")
    if info.tags:
        print(f"  tags      {', '.join(info.tags)}")
    if info.gpus:
        print(f"  gpus      {json.dumps(list(info.gpus))}")
    print(f"  flags     {' '.join(_argv(info.flags)) or '(defaults)'}")
    started = started_flags_of(info.summary)
    if started is not None:
        print(f"  launched  {' '.join(_argv(started)) or '(defaults)'}  (the flags above were set live on it)")
    changes = flag_changes_of(info.summary)
    if changes:  # the flags above are what it began with, not all it measured
        print(f"  changed   {changes_text(changes)}")
        print(f"            {TWO_CONFIGURATIONS}: compare gives it no verdict, the advisor no advice")
    if info.workload:
        print(f"  workload  {json.dumps(dict(info.workload), sort_keys=True)}")
    error = info.summary.error
    if error:
        print(f"  error     {error}")
    prefix = PrefixReset.of(info.summary)
    if prefix is not None:
        print(f"  prefix    {'cache reset before the run' if prefix.reset else f'cache not reset: {prefix.reason}'}")
    share = box_share_of(info.summary)
    if share is not None:
        print(f"  {share.line()}")
    print()
    print(render(compare([info], all_flags=False), "text"), end="")
    return 0


def _argv(flags: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for name, value in dict(flags).items():
        if isinstance(value, bool):
            out.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            out += [f"--{name}", *(str(v) for v in value)]
        else:
            out += [f"--{name}", str(value)]
    return out


def _export(store: History, info: RunInfo, fmt: str, output: Path | None) -> int:
    from tui.commands.compare import write_or_print

    if fmt == "json":
        doc = info.to_dict()
        doc["requests_detail"] = [r.to_json() for r in store.requests(info.id)]
        text = json.dumps(doc, indent=2)
    elif fmt == "csv":
        text = _requests_csv(store.requests(info.id))
    elif fmt == "trace":
        from engine.runs.trace import build_trace

        text = json.dumps(build_trace(info, store.requests(info.id), store.samples(info.id)), separators=(",", ":"))
    else:
        text = _command_line(info, fmt)
    write_or_print(text, output)
    return 0


def _requests_csv(requests: list[StoredRequest]) -> str:
    buf = io.StringIO()
    columns = ["id", "t_start", "ok", "error", "cancelled", "ttft_ms", "tpot_ms", "e2el_ms", "input_tokens", "output_tokens"]
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in requests:
        ttft, e2el, n = r.ttft_s, r.e2el_s, r.output_tokens or 0
        tpot = (e2el - ttft) / (n - 1) * 1000 if ttft is not None and e2el is not None and n > 1 else None
        writer.writerow([
            r.id, r.t_start, int(r.ok), r.error or "", int(r.cancelled),
            "" if ttft is None else round(ttft * 1000, 3), "" if tpot is None else round(tpot, 3),
            "" if e2el is None else round(e2el * 1000, 3), r.input_tokens, r.output_tokens,
        ])
    return buf.getvalue()


def _command_line(info: RunInfo, fmt: str) -> str:
    from engine.flags import FlagError, FlagSet
    from tui.errors import UserError

    try:
        flags = FlagSet.from_dict({"model": info.model or "MODEL", "values": dict(info.flags)})
    except FlagError as exc:
        raise UserError(f"run #{info.id}'s flags no longer parse: {exc}", "export --format json instead") from None
    return str(flags.to_docker_line() if fmt == "docker" else flags.to_serve_line())
