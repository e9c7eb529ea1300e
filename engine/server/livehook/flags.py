"""The flags that change on a running server: one ``LiveFlag`` each, in ``LIVE``.

Everything that treats a live flag loops over ``LIVE``: the hook inside vLLM (how the engine
started it, how it is read and set between two steps, the SchedulerConfig field vLLM's start-time
checks read), vtui's client (how a value is parsed, how a server is started so that the others
stay live), the tuner (a restart group's server) and the Flags tab (its ``~`` and tooltip). Adding
a flag is one entry here and its test (tests/engine/server/test_live_plugin.py,
tests/engine/server/test_live_limits.py, tests/real/test_live_limits_vllm.py).

The scheduler functions take vLLM's scheduler (``vllm.v1.core.sched.scheduler.Scheduler``) and
read attributes by name: no vLLM import, so vtui's side can load this module too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LiveFlag:
    """One flag a running server takes without a restart.

    ``switch``: true/false (a server started with it on keeps the others live), else a whole number
    of at least 1 (a server started with the larger keeps the others live; never above the started
    value). ``config_field``: the SchedulerConfig field vLLM's start-time checks read.
    ``started(scheduler)``: the value the engine came up with. ``read(scheduler)``: the live value.
    ``write(scheduler, value, started)``: set it between two engine steps (``started``: every live
    flag's started value). ``note``: what the Flags tab says of it."""

    name: str
    switch: bool
    config_field: str
    started: Callable[[Any], Any]
    read: Callable[[Any], Any]
    write: Callable[[Any, Any, dict[str, Any]], None]
    note: str


MAX_NUM_SEQS = "max-num-seqs"
MAX_NUM_BATCHED_TOKENS = "max-num-batched-tokens"
CHUNKED_PREFILL = "enable-chunked-prefill"


def _admission_cap(scheduler: Any) -> int:
    """The admission cap: ``max_num_active_reqs`` (0.32 on), else the running bound (0.24)."""
    return int(getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs))


def _live_cap(scheduler: Any) -> int:
    """The cap set live where the scheduler has none of its own (0.24), else its admission cap."""
    return int(getattr(scheduler, "_vtui_cap", None) or _admission_cap(scheduler))


def _set_cap(scheduler: Any, value: int, started: dict[str, Any]) -> None:
    """0.32 on: the admission cap. 0.24: kept for the guard that bounds each step's running
    bound (``plugin._instrument``): nothing admitted past it, nothing running preempted."""
    if hasattr(scheduler, "max_num_active_reqs"):
        scheduler.max_num_active_reqs = value
    else:
        scheduler._vtui_cap = value


def _set_budget(scheduler: Any, value: int, started: dict[str, Any]) -> None:
    """The step's token budget; the input budget on the scheduler's own config copy follows it
    below the started budget and is as started at it."""
    scheduler.max_num_scheduled_tokens = value
    at_start = value == started[MAX_NUM_BATCHED_TOKENS]
    scheduler.scheduler_config.max_num_batched_tokens = scheduler._vtui_input_budget if at_start else value


def _set_chunked(scheduler: Any, value: bool, started: dict[str, Any]) -> None:
    scheduler.scheduler_config.enable_chunked_prefill = value


LIVE: tuple[LiveFlag, ...] = (
    LiveFlag(MAX_NUM_SEQS, switch=False, config_field="max_num_seqs",
             started=_admission_cap, read=_live_cap, write=_set_cap,
             note="the admission cap: requests running now finish, new ones wait"),
    LiveFlag(MAX_NUM_BATCHED_TOKENS, switch=False, config_field="max_num_batched_tokens",
             started=lambda s: int(s.max_num_scheduled_tokens), read=lambda s: int(s.max_num_scheduled_tokens),
             write=_set_budget, note="the step's token budget, from the next engine step"),
    LiveFlag(CHUNKED_PREFILL, switch=True, config_field="enable_chunked_prefill",
             started=lambda s: bool(s.scheduler_config.enable_chunked_prefill),
             read=lambda s: bool(s.scheduler_config.enable_chunked_prefill),
             write=_set_chunked, note="on where you started it off yourself and the model allows it"),
)
BY_NAME = {flag.name: flag for flag in LIVE}
LIVE_FLAGS = tuple(flag.name for flag in LIVE)
