"""Run several presets in a row against one model and store every run in the history.

The server is started once and restarted (through its supervisor, on the same port) only
when a preset's flags differ from the running ones: :func:`engine.server.ready.ensure_server`.
Each preset is one :func:`engine.runs.measure.measure` run: every request, the stats windows,
GPU/host telemetry and the server's /metrics are recorded as it happens, and the run is
stored with the status every path uses (:mod:`engine.runs.status`). A preset whose server does
not start, or whose load the server refuses, is stored as ``failed`` with vLLM's own line,
and the sweep goes on.

With ``repeats`` above 1 each preset is measured that many times, in rounds that alternate
between the presets (A B C A B C, not A A B B C C), so the box's drift falls on all of them; the
comparison then reads each preset's noise from its repeats. Where presets'
flags differ, every run of a round restarts the server: the price of alternating.

The history is optional: if it cannot be written (disk full, read-only) the sweep keeps its
results in memory and says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine import paths
from engine.flags import FlagSet, installed_vllm_version, recordable_values
from engine.presets import FlagValue, Preset
from engine.runs.flagchange import changed_during
from engine.runs.history import History, Recording, RunInfo
from engine.runs.measure import RunPlan, Target, box_bound_why, local_tokenizer, measure
from engine.runs.series import Slot, run_series
from engine.runs.status import RunStatus
from engine.server.livelimits import LiveUnavailable, try_live, wait_drained
from engine.server.ready import ensure_server
from engine.server.supervisor import ServerState, Supervisor


@dataclass(frozen=True)
class SweepStep:
    """What happened to one preset of a sweep."""

    preset: str
    status: RunStatus
    run: RunInfo
    """The run as stored (or as it would have been, when the history is unavailable)."""
    restarted: bool = False
    downtime_s: float | None = None
    error: str | None = None
    hint: str | None = None
    repeat: int = 1  # which round of the sweep (1 without repeats)
    changed_live: bool = False  # a flag changed on the server while it ran (measured again: engine.runs.series)


def by_preset(steps: Sequence[SweepStep]) -> list[list[RunInfo]]:
    """The sweep's runs, one list per preset in the order first run: a comparison's columns,
    each preset's repeats together."""
    columns: dict[str, list[RunInfo]] = {}
    for step in steps:
        columns.setdefault(step.preset, []).append(step.run)
    return list(columns.values())


async def run_sweep(
    presets: Sequence[Preset],
    *,
    model: str,
    url: str | None = None,
    history: History | None = None,
    say: Callable[[str], None] = print,
    start_timeout: float = 600.0,
    check_max_len: bool = True,
    supervisor_factory: Callable[[FlagSet], Supervisor] | None = None,
    extra_flags: Mapping[str, FlagValue] | None = None,
    repeats: int = 1,
    live: bool = True,
) -> list[SweepStep]:
    """Run ``presets`` (already resolved: [tiny] applied, overrides made) in order.

    ``model``: the model folder or id the server is started with (ignored with ``url``,
    where the flags cannot be applied and the attached server is used as it is).
    ``extra_flags`` go under every preset's flags (e.g. ``load-format = dummy`` for a
    shipped architecture); a preset's own value wins. ``repeats``: rounds over the presets.
    ``live``: a preset that differs from the running server only in live flags
    (max-num-seqs, max-num-batched-tokens, chunked prefill, within the started values) is set on it
    without a restart; its stored run keeps the started flags beside its own.
    """
    if repeats < 1:
        raise ValueError(f"repeats {repeats}: must be 1 or more")

    def make_supervisor(flags: FlagSet) -> Supervisor:
        if supervisor_factory is not None:
            return supervisor_factory(flags)
        return Supervisor(flags, log_dir=paths.logs_dir())

    sup: Supervisor | None = None
    current: FlagSet | None = None  # the flags set live on ``sup``, if any
    tokenizer = local_tokenizer(model)
    version = installed_vllm_version()

    async def set_live(flags: FlagSet, label: str) -> bool:
        nonlocal current
        if not live or sup is None or sup.state is not ServerState.READY or not isinstance(sup.flags, FlagSet):
            return False
        key = sup.api_key
        attempt = await try_live(sup.base_url, sup.flags, current or sup.flags, flags, key)
        if attempt.result is None:
            say(f"{label}: restart ({attempt.refusal})")
            return False
        try:
            await wait_drained(sup.base_url, key)
        except LiveUnavailable as exc:
            say(f"{label}: restart (the limits were set, but the server's queue could not be read: {exc})")
            return False
        current = flags
        changed = ", ".join(f"{n} {a}->{b}" for n, (a, b) in attempt.result.changed.items()) or "no limit moved"
        say(f"{label}: set live in {attempt.result.seconds * 1000:.0f} ms, no restart ({changed})")
        return True

    async def step(slot: Slot[Preset]) -> SweepStep:
        nonlocal sup, current
        preset, repeat = slot.config, slot.repeat
        label = slot.label(preset.name)
        flags = FlagSet.from_dict({"model": model, "values": {**(extra_flags or {}), **preset.flags}})
        meta: dict[str, object] = {"scaled": list(preset.scaled)}
        restarted, downtime = False, None
        if url is not None:
            target = Target(url, None, tokenizer=tokenizer, model_label=None, vllm_version=version)
        elif await set_live(flags, label):
            assert sup is not None
            target = dataclasses.replace(Target.of(sup, tokenizer=tokenizer), flags=recordable_values(flags))
            if target.vllm_version is None:
                target = dataclasses.replace(target, vllm_version=version)
        else:
            def say_step(text: str) -> None:
                say(f"{label}: {text}")

            current = None
            ready = await ensure_server(sup, flags, make=make_supervisor, timeout=start_timeout, say=say_step)
            sup = ready.supervisor
            if ready.error is not None:
                say(f"{label}: server did not start: {ready.error}")
                rec = Recording(history, preset.name, preset=preset.name, flags=recordable_values(flags),
                                model=model, vllm_version=version,
                                workload={"workload": dict(preset.workload), "arrivals": dict(preset.arrivals),
                                          "slo": preset.slo.to_dict() if preset.slo else None, **meta})
                info = rec.finish(history, RunStatus.FAILED, {"error": ready.error, "hint": ready.hint})
                return SweepStep(preset.name, RunStatus.FAILED, info, error=ready.error, hint=ready.hint,
                                 repeat=repeat)
            assert sup is not None  # ensure_server gives None only with an error, handled above
            restarted = ready.restarted and ready.started
            if ready.started:
                downtime = ready.seconds
                say(f"{label}: server ready in {downtime:.0f} s")
            target = Target.of(sup, tokenizer=tokenizer)
            if target.vllm_version is None:
                target = dataclasses.replace(target, vllm_version=version)
        arr = preset.arrival_spec()
        say(f"{label}: {arr.num_requests or '-'} requests, {arr.mode} "
            + (f"concurrency {arr.concurrency}" if arr.mode == "closed" else f"rate {arr.rate}"))
        plan = RunPlan(preset.name, preset.workload_spec(), arr, preset.slo, preset=preset.name,
                       check_max_len=check_max_len, meta=meta)
        run = await measure(target, plan, history=history)
        if run.history_error is not None:
            say(f"{label}: history not written ({run.history_error}); results kept in memory")
        load = run.load
        if run.status is RunStatus.SERVER_DIED:
            say(f"{label}: server died: {run.error}; what it measured is kept, the next preset starts it again")
        elif run.error:
            say(f"{label}: {run.status}: {run.error}")
        else:
            why = box_bound_why(run)
            say(f"{label}: {run.status}" + (f" ({why})" if why else "") + f": {load.get('completed', 0)} done, "
                f"{load.get('failed', 0)} failed, "
                f"{load.get('request_throughput', 0):.2f} req/s, TTFT p50 {load.get('median_ttft_ms', 0):.0f} ms")
        assert run.info is not None
        error = f"server died: {run.error}" if run.status is RunStatus.SERVER_DIED else run.error
        return SweepStep(preset.name, run.status, run.info, restarted, downtime, error, run.hint, repeat,
                         changed_live=changed_during(run.summary))

    try:
        # A step the box spoiled carries the client's delay, not the preset's: stored as such,
        # and measured again before the sweep takes it (the last try is kept).
        done = await run_series(presets, step, repeats=repeats, say=say, name=lambda p: p.name)
    finally:
        if sup is not None:
            with contextlib.suppress(Exception):
                await sup.stop()
    steps = [run for _, run in done]
    return steps
