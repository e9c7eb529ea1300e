"""What the commands print: `vllm bench serve`'s table, the figures under it, repeats and noise
floors, one line of telemetry, energy and the client-against-server check. Every command that
prints a run's figures calls these; none computes a figure (the engine's rooms do)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from tui.errors import UserError

if TYPE_CHECKING:
    from engine.runs.crosscheck import CrossCheck
    from engine.runs.history import History
    from engine.runs.measure import MeasuredRun
    from engine.runs.summary import RunSummary, TelemetryFigures
    from engine.values import JSONValue
    from loadgen.stats import StatsWindow

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))


def err(text: str) -> None:
    """A line on stderr, flushed (what vtui says, beside the figures on stdout)."""
    print(text, file=sys.stderr, flush=True)


_STATS = {"mean": "Mean", "median": "Median", "p90": "P90", "p99": "P99"}
_RATES = {"request_throughput": "Request throughput (req/s)", "output_throughput": "Output token throughput (tok/s)",
          "request_goodput": "Request goodput (req/s)"}


def figure_label(name: str) -> str:
    """A figure's line label as the table above names it (``p99_tpot_ms`` -> ``P99 TPOT (ms)``)."""
    if name in _RATES:
        return _RATES[name]
    stat, metric, _ = name.split("_")
    return f"{_STATS.get(stat, stat)} {dict(METRICS).get(metric, metric.upper())} (ms)"


def print_repeats(runs: list[MeasuredRun]) -> list[dict[str, object]]:
    """Each figure over the measured repeats: the median, the 95% interval of the repeats' mean
    (engine.runs.noise), the range and the coefficient of variation; returned for the result file."""
    from engine.runs.flagchange import changed_during
    from engine.runs.noise import spreads

    # a run during which flags changed live measured two configurations: not a repeat of one
    measured = [r for r in runs if r.status.measured and r.summary.load is not None and not changed_during(r.summary)]
    ids = ",".join(str(r.history_id) for r in measured if r.history_id is not None)
    print("{s:{c}^{n}}".format(s=f" Repeats: {len(measured)} of {len(runs)} runs measured ", n=86, c="="))
    print(f"{'':<34} {'median':>10} {'95% interval (repeats)':>24} {'min .. max':>20} {'CV':>6}")
    out = []
    for sp in spreads([load.to_dict() for r in measured if (load := r.summary.load) is not None]):
        iv = sp.interval
        cv = sp.cv_pct
        print(f"{figure_label(sp.figure):<34} {sp.median:>10.2f} "
              f"{('n/a' if iv is None else f'{iv.low:.2f} .. {iv.high:.2f}'):>24} "
              f"{f'{sp.low:.2f} .. {sp.high:.2f}':>20} {('n/a' if cv is None else f'{cv:.1f}%'):>6}")
        out.append({"figure": sp.figure, "runs": sp.runs, "median": sp.median, "min": sp.low, "max": sp.high,
                    "low": None if iv is None else iv.low, "high": None if iv is None else iv.high,
                    "cv_pct": cv})
    print("=" * 86)
    print("interval: 95% t-interval of the repeats' mean; CV: their standard deviation over the mean")
    if ids:
        err(f"vtui: the repeats are runs {ids}: `vtui compare {ids} OTHER,RUNS` weighs them against another "
             "configuration's repeats")
    return out


def print_floor(runs: list[MeasuredRun], history: History | None, label: str) -> dict[str, object]:
    """The box's noise floor from the measured runs (engine.runs.noise.noise_floor_of): each
    figure's median, range, CV and spread printed; stored in ``history`` (None: --no-history, or
    none could be opened: said). Returned for the result file."""
    from engine.runs.history import HistoryError
    from engine.runs.noise import MIN_FLOOR_RUNS, noise_floor_of, spreads

    found = noise_floor_of([r.summary for r in runs if r.status.measured], [r.info for r in runs if r.status.measured],
                           label=label)
    if found is None:
        raise UserError(f"fewer than {MIN_FLOOR_RUNS} of {len(runs)} runs were measured with one configuration: a "
                        "noise floor needs that many", "see the runs' errors above; measure again on a quieter box")
    floor, figures = found
    spread = floor.spread_pct
    print("{s:{c}^{n}}".format(s=f" Noise floor of {floor.box}: {floor.runs} of {len(runs)} runs measured ", n=86, c="="))
    print(f"{'':<34} {'median':>10} {'min .. max':>20} {'CV':>7} {'spread (±)':>11}")
    rows = []
    for sp in spreads(figures, names=tuple(spread)):
        cv = sp.cv_pct
        print(f"{figure_label(sp.figure):<34} {sp.median:>10.2f} {f'{sp.low:.2f} .. {sp.high:.2f}':>20} "
              f"{('n/a' if cv is None else f'{cv:.1f}%'):>7} {f'±{spread[sp.figure]:.1f}%':>11}")
        rows.append({"figure": sp.figure, "median": sp.median, "min": sp.low, "max": sp.high, "cv_pct": cv,
                     "spread_pct": spread[sp.figure]})
    print("=" * 86)
    print("spread: two single runs of one configuration on this box differ by less than this, 95 times in 100 "
          "(the larger within a factor 1 + spread of the smaller; from the runs' log figures, Student's t)")
    if history is None:
        err("vtui: the noise floor was not stored (no run history): single-run comparisons read a floor "
            "learned from repeats, if any")
    else:
        try:
            floor = history.save_noise_floor(floor)
            err(f"vtui: noise floor {floor.id} of {floor.box} stored: single-run comparisons here take it as "
                "their noise (vtui compare, the Runs tab)")
        except HistoryError as exc:
            err(f"vtui: the noise floor was not stored: {exc}")
    return {"box": floor.box, "runs": floor.runs, "run_ids": list(floor.run_ids), "label": label, "figures": rows}


def cross_check_line(check: CrossCheck) -> str:
    """The client's mean TTFT/TPOT beside the server's own over the same run."""
    def ms(v: float | None, fmt: str = "{:.1f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    hit = "n/a" if check.prefix_hit_rate is None else f"{check.prefix_hit_rate:.0%}"
    return (f"server check: mean TTFT {ms(check.client_mean_ttft_ms)} ms here / "
            f"{ms(check.server_mean_ttft_ms)} ms on the server; mean TPOT {ms(check.client_mean_tpot_ms, '{:.2f}')} / "
            f"{ms(check.server_tpot_ms, '{:.2f}')} ms; prompt tokens per request {ms(check.client_prompt_tokens)} / "
            f"{ms(check.server_prompt_tokens)}; prefix-cache hits {hit}")


def summary_lines(summary: RunSummary) -> list[str]:
    """The lines printed under the table: the telemetry, and with a GPU the energy and the
    speed of light (its line, or why there is none)."""
    # here, not at the top: engine.runs.summary brings loadgen (0.2 s), kept off `vtui --help`
    from engine.runs.summary import SpeedOfLightFigures, TelemetryFigures

    telemetry = summary.telemetry or TelemetryFigures()
    lines = [telemetry_line(telemetry)]
    if telemetry.gpus:
        lines.append(energy_line(summary.energy.to_json() if summary.energy is not None else {}))
        sol = telemetry.speed_of_light or SpeedOfLightFigures()
        lines.append(f"speed of light: {sol.line or sol.reason or 'n/a'}")
    return lines


def telemetry_line(t: TelemetryFigures) -> str:
    """One line of what the GPU (or the host) and the server did during the run (its stored
    telemetry, typed; ``TelemetryFigures()`` where it has none)."""

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0f}%"

    def gib(v: float | None) -> str:
        return "n/a" if v is None else f"{v / 2**30:.1f} GiB"

    if t.gpus:
        dev = f"GPU mem peak {gib(t.peak_gpu_mem_bytes)}, util mean {pct(t.mean_gpu_util_pct)}"
    else:
        why = t.gpu_unavailable or "no GPU"
        dev = f"no GPU ({why}); server RSS peak {gib(t.server_peak_rss_bytes)}, " \
              f"server CPU mean {pct(t.server_mean_cpu_pct)}"
    if t.server_front_cpu_p90 is not None:
        dev += f"; API server CPU mean {pct(t.server_front_cpu_pct)}, p90 {pct(t.server_front_cpu_p90)}"
        procs = t.server_front_procs
        if procs is not None and procs > 1:
            dev += f" (busiest of {procs:.0f} API server processes)"
    kv = t.peak_kv_cache_usage
    kv_text = "n/a" if kv is None else f"{kv * 100:.1f}%"
    return (f"telemetry: {dev}; KV cache peak {kv_text}, running peak {t.peak_running}, "
            f"waiting peak {t.peak_waiting}, preemptions {t.preemptions}")


def energy_line(e: Mapping[str, JSONValue]) -> str:
    """One line of what the server's GPUs drew over the window (measure.energy_figures)."""
    if e.get("joules") is None:
        return f"energy: n/a ({e.get('reason') or 'no reading'})"

    def num(v: JSONValue, fmt: str) -> str:
        return "n/a" if v is None else fmt.format(v)

    idle = e.get("idle_power_w")
    return (f"energy{' (estimated from power samples)' if e.get('estimated') else ''}: "
            f"{num(e.get('j_per_token'), '{:.3f}')} J/output token, {num(e.get('j_per_request'), '{:.1f}')} J/request, "
            f"{e['joules']:.0f} J over the window at {num(e.get('mean_power_w'), '{:.0f}')} W"
            f" (idle {num(idle, '{:.0f}')} W)")


def print_table(d: Mapping[str, object]) -> None:
    """The final table, laid out like `vllm bench serve`'s."""
    from loadgen.run import BOX_DELAY_LIMIT_MS, BOX_DELAY_NOTE

    def row(name: str, value: object, fmt: str = "{:.2f}") -> None:
        text = fmt.format(value) if isinstance(value, int | float) else str(value)
        print(f"{name:<40} {text:<10}")

    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    row("Successful requests:", d["completed"], "{}")
    row("Failed requests:", d["failed"], "{}")
    if d.get("cancelled_requests"):
        row("Cancelled requests:", d["cancelled_requests"], "{}")
    if d.get("max_concurrency"):
        row("Maximum request concurrency:", d["max_concurrency"], "{}")
    row("Benchmark duration (s):", d["duration"])
    row("Total input tokens:", d["total_input_tokens"], "{}")
    row("Total generated tokens:", d["total_output_tokens"], "{}")
    row("Request throughput (req/s):", d["request_throughput"])
    if d.get("request_goodput") is not None:
        row("Request goodput (req/s):", d["request_goodput"])
    row("Output token throughput (tok/s):", d["output_throughput"])
    row("Peak output token throughput (tok/s):", d["max_output_tokens_per_s"])
    row("Peak concurrent requests:", d.get("peak_in_flight", d["max_concurrent_requests"]), "{}")
    row("Total token throughput (tok/s):", d["total_token_throughput"])
    for key, label in METRICS:
        print("{s:{c}^{n}}".format(s=f" {label} ", n=50, c="-"))
        row(f"Mean {label} (ms):", d[f"mean_{key}_ms"])
        row(f"Median {label} (ms):", d[f"median_{key}_ms"])
        for p in ("90", "95", "99"):
            if f"p{p}_{key}_ms" in d:
                row(f"P{p} {label} (ms):", d[f"p{p}_{key}_ms"])
    print("=" * 50)
    if d.get("failures_by_reason"):
        print("Failures: " + ", ".join(f"{k} {v}" for k, v in cast("Mapping[str, int]", d["failures_by_reason"]).items()))
        for k, v in cast("Mapping[str, str]", d.get("failure_examples", {})).items():
            print(f"  {k}: {v[:160]}")
    if d.get("client_bound"):
        print(f"WARNING: client-bound (CPU p90 {d.get('client_cpu_p90', 0):.0%} of a core, event-loop "
              f"lag p99 {d['client_lag_p99_ms']:.1f} ms): latencies include the client's own "
              f"delay; use more --workers or a bigger machine")
    elif d.get("box_bound"):
        print(f"WARNING: box-bound: {BOX_DELAY_NOTE.format(delay=d.get('client_delay_ms') or 0.0)} (limit "
              f"{BOX_DELAY_LIMIT_MS:g} ms; event-loop lag p99 {d['client_lag_p99_ms']:.0f} ms, its own work "
              f"{d.get('client_own_lag_p99_ms') or 0:.1f} ms): its latencies read high by about that much")
    elif d.get("client_sched_delay"):
        print(f"note: the client waited for a core (event-loop lag p99 {d['client_lag_p99_ms']:.0f} ms at "
              f"{d.get('client_cpu_mean', 0):.0%} of a core): the box is busy (on a small box, with the "
              f"server); any client on it sees the same delay")
    if d.get("input_len_mismatches"):
        print(f"note: {d['input_len_mismatches']} requests had a prompt_tokens count other "
              f"than planned (the tokenizer differs from the server's?)")
    if d.get("stream_bursts"):
        print(f"note: {d['burst_requests']} of {d['completed']} requests arrived whole in one "
              f"network read ({(d.get('same_read_gap_fraction') or 0):.0%} of gaps were 0): the "
              f"server wrote their tokens back to back, so their TPOT/ITL say nothing of decode "
              f"speed (a starved API server process on a busy box does this to any client)")
    first = cast("Mapping[str, object]", d.get("stream") or {}).get("first_request_s")
    if isinstance(first, (int, float)):
        print(f"first request sent {first:.2f} s after the run began (prompts built, worker started)")
    print("TPOT = (E2EL - TTFT) / (output tokens - 1); ITL = gap between streamed chunks "
          "(vLLM's definitions)")


class ProgressLine:
    """One live line on stderr (rewritten on a terminal, every 5 s otherwise)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def update(self, w: StatsWindow) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.tty and now - self.last < 5.0:
            return
        self.last = now
        bound = f" | CLIENT-BOUND (cpu {w.client_cpu:.0%} of a core, loop lag {w.client_lag_ms:.0f} ms)" \
            if w.client_bound else ""
        line = (f"[{w.elapsed_s:6.1f}s] done {w.total_completed} failed {w.total_failed} "
                f"in flight {w.in_flight} | {w.req_s:.1f} req/s {w.output_tok_s:.0f} tok/s | "
                f"TTFT p50 {w.ttft.p50:.0f} p99 {w.ttft.p99:.0f} ms | "
                f"TPOT p50 {w.tpot.p50:.1f} ms{bound}")
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line)
            sys.stderr.flush()
            self.shown = True
        else:
            err(line)

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
