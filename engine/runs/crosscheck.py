"""The client's figures beside the server's own, over the same run.

vLLM's ``/metrics`` histograms (deltas over the run's window, in
``engine.telemetry.summary``) say what the server measured: its mean TTFT, its mean E2E
latency, the prompt and generation tokens it counted and its prefix-cache hit rate. A
client that agrees with them measured the server; one that does not measured something
else (itself, a cache, other traffic). TPOT is checked against the server's own
(E2E - TTFT) / (n - 1), not against its inter-token histogram, which is stamped in the
engine core and leaves out the frontend's delay (REFERENCE.md).
"""

from __future__ import annotations

from collections.abc import Mapping

# CrossCheck, the stored part of a run's summary, lives with the other parts in
# engine.runs.summary (the lower module); it is named here too for this module's callers.
from engine.runs.summary import CrossCheck, ServerLatency, TelemetryFigures

# Client and server disagree when they differ by more than this share...
DISAGREE = 0.10
# ...and by more than this many ms (a 10% gap on a 3 ms TPOT is scheduling noise).
FLOOR_MS = 2.0


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _mean_ms(q: ServerLatency | None) -> float | None:
    return _num(q.mean_ms) if q is not None else None


def _differ(a: float | None, b: float | None) -> bool:
    if a is None or b is None or b <= 0:
        return False
    return abs(a - b) > FLOOR_MS and abs(a / b - 1) > DISAGREE


def cross_check(load: Mapping[str, object], server: TelemetryFigures, *,
                shared_prefix: bool = False, client_delay_ms: float | None = None) -> CrossCheck:
    """``load``: the run's result (vllm bench serve's keys); ``server``: the server's own
    figures over the same window (``engine.runs.measure.server_window``, read as
    ``TelemetryFigures``); ``shared_prefix``: the workload asks for shared prefixes (then cache
    hits are expected, not a warning); ``client_delay_ms``: what the client's held-up loop added
    to the mean TTFT (loadgen.run: its first tokens' measured waits in the socket), which a TTFT gap is
    then first put down to."""
    completed = _num(load.get("completed")) or 0.0
    c_ttft, c_tpot = _num(load.get("mean_ttft_ms")), _num(load.get("mean_tpot_ms"))
    s_ttft = _mean_ms(server.server_ttft)
    s_e2e = _mean_ms(server.server_e2e)
    s_count = _num(server.server_e2e.count) if server.server_e2e is not None else None
    gen, prompt = _num(server.generation_tokens), _num(server.prompt_tokens)
    per_req_out = gen / s_count if gen is not None and s_count else None
    s_tpot = ((s_e2e - s_ttft) / (per_req_out - 1)
              if s_e2e is not None and s_ttft is not None and per_req_out is not None and per_req_out > 1
              else None)
    c_prompt = (_num(load.get("total_input_tokens")) or 0.0) / completed if completed else None
    s_prompt = prompt / s_count if prompt is not None and s_count else None
    hit = _num(server.prefix_hit_rate)
    warnings: list[str] = []
    if _differ(c_ttft, s_ttft):
        held = client_delay_ms is not None and client_delay_ms >= 0.5 * abs((c_ttft or 0) - (s_ttft or 0))
        why = (f"this client's loop was held up by the busy box ({client_delay_ms:.0f} ms added to the mean "
               "time to first token): measure again on a quieter box"
               if held and (c_ttft or 0) > (s_ttft or 0) else
               "the difference is the time from vLLM's first token to this client reading it: the API server's "
               "streaming, the network and this client"
               if (c_ttft or 0) > (s_ttft or 0) else
               "the server's figure is the larger: it also counts requests that were not this run's")
        warnings.append(f"mean TTFT {c_ttft:.1f} ms here, {s_ttft:.1f} ms on the server: {why}")
    if _differ(c_tpot, s_tpot):
        warnings.append(f"mean TPOT {c_tpot:.2f} ms here, {s_tpot:.2f} ms from the server's (E2E - TTFT)/(n - 1)")
    if c_prompt is not None and s_prompt is not None and abs(c_prompt - s_prompt) > max(1.0, 0.01 * s_prompt):
        warnings.append(f"the server counted {s_prompt:.1f} prompt tokens per request where the responses said "
                        f"{c_prompt:.1f}: other requests reached it during the run, or it prefilled some twice "
                        "(preempted and recomputed)")
    if hit is not None and hit > 0.01 and not shared_prefix:
        warnings.append(f"the prefix cache served {hit:.0%} of prompt tokens although no prefix is shared: "
                        "repeated prompts make prefill look faster than it is")
    return CrossCheck(c_ttft, s_ttft, c_tpot, s_tpot, c_prompt, s_prompt, hit, tuple(warnings),
                      server_mean_queue_ms=_mean_ms(server.server_queue))


__all__ = ["CrossCheck", "cross_check"]
