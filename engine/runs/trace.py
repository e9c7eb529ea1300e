"""A run as a Perfetto / Chrome trace-event JSON file (opens in ui.perfetto.dev).

Process "client requests": one slice per request on a lane ("slot"), with child
slices for its phases: ``waiting`` (only when the record knows its queue time),
``first token`` (start to first token: queueing plus prefill as the client sees it)
and ``decode`` (first token to last). Other processes hold counter tracks: GPU memory
and utilization (NVML), KV cache usage, running/waiting requests and token
throughput (vLLM's /metrics), and the client's own throughput and requests in flight.

Timestamps are microseconds from the run's start (``ts`` must be µs in this format).
Spec: "Trace Event Format" (Google doc linked from the Perfetto docs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.runs.history import RunInfo, StoredRequest, to_jsonable
from engine.runs.summary import RunSummary
from engine.values import JSONObject, JSONValue

if TYPE_CHECKING:
    from loadgen.run import RunResult

PID_CLIENT = 1
PID_SERVER = 2
PID_GPU = 3
PID_LOADGEN = 4
GIB = 1024**3

# A sample as History.samples gives it back: (kind, epoch seconds, its JSON object). That JSON is
# whatever telemetry, /metrics or loadgen stored: nested lists and mappings, read with .get and
# checked value by value. The requests come typed (History.requests: StoredRequest).
Sample = tuple[str, float, JSONObject]


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def assign_lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """Lane per span so spans on one lane never overlap (slices on one track must nest).

    Greedy interval partitioning over spans in start order: the lowest free lane.
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1]))
    lane_end: list[float] = []
    lanes = [0] * len(spans)
    for i in order:
        start, end = spans[i]
        for lane, busy_until in enumerate(lane_end):
            if busy_until <= start:
                lanes[i] = lane
                lane_end[lane] = end
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(end)
    return lanes


def build_trace(
    run: RunInfo | RunResult,
    requests: Sequence[StoredRequest] | None = None,
    samples: Iterable[Sample] = (),
) -> dict[str, object]:
    """The trace document: ``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``.

    ``run`` is a stored :class:`RunInfo` with its ``requests`` and ``samples`` from the
    history, or a loadgen ``RunResult`` alone (its kept requests and windows are used).
    """
    if not isinstance(run, RunInfo):
        run, requests, samples = _from_run_result(run, samples)
    requests = list(requests or [])
    samples = list(samples)
    # The requests with a usable start, with it (the others have no place on the timeline).
    valid = [(r, start) for r in requests if (start := _num(r.t_start)) is not None]
    t0 = min([run.started, *(start for _, start in valid), *(t for _, t, _ in samples)])

    def us(t: float) -> int:
        return round((t - t0) * 1e6)

    events: list[dict[str, object]] = []

    def meta(pid: int, name: str, tid: int | None = None, sort: int | None = None) -> None:
        if tid is None:
            events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}})
            if sort is not None:
                events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": sort}})
        else:
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})

    meta(PID_CLIENT, f"client requests: run #{run.id} {run.name}", sort=1)
    meta(PID_SERVER, "vLLM server (/metrics)", sort=2)
    meta(PID_GPU, "GPU (NVML)", sort=3)
    meta(PID_LOADGEN, "load generator", sort=4)

    # ---- requests
    spans = []
    for r, start in valid:
        e2el = _num(r.e2el_s) or 0.0
        spans.append((start, start + max(e2el, 0.0)))
    lanes = assign_lanes(spans)
    for lane in sorted(set(lanes)):
        meta(PID_CLIENT, f"slot {lane}", tid=lane + 1)
    for (r, _), (start, end), lane in zip(valid, spans, lanes, strict=True):
        tid = lane + 1
        ok = r.ok
        cancelled = r.cancelled
        ttft = _num(r.ttft_s)
        n_out = r.output_tokens
        args: dict[str, object] = {
            "id": r.id,
            "ok": ok,
            "input_tokens": r.input_tokens,
            "output_tokens": n_out,
            "e2el_ms": round((end - start) * 1000, 3),
        }
        if ttft is not None:
            args["ttft_ms"] = round(ttft * 1000, 3)
        if ok and isinstance(n_out, int) and n_out > 1 and ttft is not None:
            args["tpot_ms"] = round((end - start - ttft) / (n_out - 1) * 1000, 3)
        if r.error:
            args["error"] = r.error
        name = f"request {r.id}"
        if cancelled:
            name += " (cancelled)"
        elif not ok:
            name += f" (failed: {r.error or 'error'})"
        # Integer microseconds: epoch floats lose the last digits, and children must
        # nest exactly inside their parent on the track.
        s_us = round((start - t0) * 1e6)
        e_us = s_us + round((end - start) * 1e6)
        events.append({"ph": "X", "name": name, "cat": "request", "pid": PID_CLIENT, "tid": tid,
                       "ts": s_us, "dur": e_us - s_us, "args": args})
        cursor = s_us
        waiting = _num(r.extra.get("queued_s", r.extra.get("waiting_s")))  # where the record knows it
        if waiting is not None and waiting > 0:
            w_end = min(s_us + round(waiting * 1e6), e_us)
            events.append({"ph": "X", "name": "waiting", "cat": "phase", "pid": PID_CLIENT, "tid": tid,
                           "ts": s_us, "dur": w_end - s_us})
            cursor = w_end
        if ttft is not None and ttft > 0 and (ok or n_out):
            first = min(max(s_us + round(ttft * 1e6), cursor), e_us)
            events.append({"ph": "X", "name": "first token", "cat": "phase", "pid": PID_CLIENT, "tid": tid,
                           "ts": cursor, "dur": first - cursor})
            if e_us > first:
                events.append({"ph": "X", "name": "decode", "cat": "phase", "pid": PID_CLIENT, "tid": tid,
                               "ts": first, "dur": e_us - first, "args": {"output_tokens": n_out}})

    # ---- counters
    def counter(pid: int, name: str, t: float, values: Mapping[str, object]) -> None:
        args = {k: v for k, v in ((k, _num(v)) for k, v in values.items()) if v is not None}
        if args:
            events.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": us(t), "args": args})

    for kind, t, data in samples:
        if kind in ("telemetry", "gpu"):
            listed = data.get("gpus")
            gpus = listed if isinstance(listed, (list, tuple)) else ()  # what is not a list holds no GPU
            mem = {f"gpu{g.get('index', i)}": (_num(g.get("mem_used_bytes")) or math.nan) / GIB
                   for i, g in enumerate(gpus) if isinstance(g, Mapping) and g.get("mem_used_bytes") is not None}
            util = {f"gpu{g.get('index', i)}": g.get("util_gpu_pct") for i, g in enumerate(gpus) if isinstance(g, Mapping)}
            counter(PID_GPU, "GPU memory used (GiB)", t, mem)
            counter(PID_GPU, "GPU utilization (%)", t, util)
            host = data.get("host")
            if isinstance(host, Mapping):
                counter(PID_GPU, "host CPU (%)", t, {"cpu": host.get("cpu_percent")})
        elif kind == "server":
            if data.get("stale"):
                continue
            kv = _num(data.get("kv_cache_usage"))
            counter(PID_SERVER, "KV cache usage (%)", t, {"kv": None if kv is None else kv * 100})
            counter(PID_SERVER, "requests", t, {"running": data.get("running"), "waiting": data.get("waiting")})
            counter(PID_SERVER, "server throughput (tok/s)", t,
                    {"prompt": data.get("prompt_tok_s"), "generation": data.get("gen_tok_s")})
            counter(PID_SERVER, "preemptions/s", t, {"preemptions": data.get("preemptions_per_s")})
        elif kind == "window":
            counter(PID_LOADGEN, "client throughput", t, {"req/s": data.get("req_s"), "output tok/s": data.get("output_tok_s")})
            counter(PID_LOADGEN, "in flight", t, {"in_flight": data.get("in_flight")})

    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "vtui_run": run.id,
            "name": run.name,
            "preset": run.preset or "",
            "model": run.model or "",
            "vllm_version": run.vllm_version or "",
            "flags": json.dumps(dict(run.flags), sort_keys=True),
            "t0_epoch_s": t0,
        },
    }


def _from_run_result(
    result: RunResult, samples: Iterable[Sample]
) -> tuple[RunInfo, list[StoredRequest], list[Sample]]:
    """A loadgen ``RunResult`` (not stored in the history) as trace inputs."""
    # RequestResult.to_dict() is in ms; the trace reads the dataclass fields in seconds.
    reqs = [
        StoredRequest(id=r.id, t_start=r.t_start, ttft_s=r.ttft_s, e2el_s=r.e2el_s, itl_s=(), input_tokens=r.input_tokens,
                      output_tokens=r.output_tokens, ok=r.ok, error=r.error, cancelled=r.cancelled)
        for r in result.requests
    ]
    windows: list[Sample] = [("window", float(w.t), _window_json(to_jsonable(w))) for w in result.windows]
    starts = [r.t_start for r in result.requests] + [t for _, t, _ in windows]
    started = min(starts) if starts else 0.0
    info = RunInfo(id=0, name="run", preset=None, started=started, ended=None, status="complete", flags={},
                   vllm_version=None, model=None, gpus=[], workload={}, summary=RunSummary(load=result.summary, flat=True),
                   baseline=False, tags=())
    return info, reqs, [*windows, *samples]


def _window_json(value: JSONValue) -> JSONObject:
    """A StatsWindow through to_jsonable: a dataclass comes back a JSON object."""
    if not isinstance(value, Mapping):
        raise TypeError(f"a window as JSON is an object, not {type(value).__name__}")
    return value


def write_trace(path: str | Path, trace: Mapping[str, object]) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace, separators=(",", ":"), allow_nan=False), encoding="utf-8")
    return path
