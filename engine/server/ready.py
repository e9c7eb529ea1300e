"""A server running given flags: reuse it, restart it, or start one. The one readiness policy of
every path that needs a server vtui starts: the TUI's start and apply (engine.server.part), vtui
bench, sweep and tune (engine.tune.measurer, engine.tune.sweep).

:func:`ensure_server` takes the supervisor the caller has (or None) and the flags it wants; the
caller keeps the supervisor it gets back (``ServerReady.supervisor``) for the next call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import StartupError
from engine.flags import FlagSet
from engine.server.logparse import StartupFacts
from engine.server.supervisor import RestartResult, ServerState, Supervisor


@dataclass(frozen=True)
class ServerReady:
    """What :func:`ensure_server` did."""

    # The Supervisor: ready; or, when the start failed, stopped (``stop_failed``, the default: a
    # next call restarts it, same port) or as the failure left it. None when ``make`` itself
    # raised a StartupError (then ``error`` says why).
    supervisor: Supervisor | None
    restarted: bool = False  # an existing server was restarted with new flags
    started: bool = False  # a server was started (first start or restart)
    seconds: float = 0.0
    error: str | None = None  # vLLM's own line when it did not start
    hint: str | None = None
    failure: StartupError | None = None  # the start's error itself (its report: the log's last lines)
    facts: StartupFacts | None = None  # what vLLM said at this start (None when reused or failed)
    restart: RestartResult | None = None  # a restart's downtime and facts


async def ensure_server(sup: Supervisor | None, flags: FlagSet, *, make: Callable[[FlagSet], Supervisor],
                        timeout: float, say: Callable[[str], None] | None = None, reuse: bool = True,
                        stop_failed: bool = True) -> ServerReady:
    """A server running ``flags``: ``sup`` itself when it is ready with the same command line
    (``reuse``; the TUI's apply restarts even then, as the user asked), else ``sup`` restarted
    through its supervisor (same port, same log) when it is ready or failed, or a new one from
    ``make`` when there is none. A start that fails says vLLM's own line in ``error`` and leaves
    no server running (``stop_failed``; the TUI keeps the failed supervisor to show its state and
    log, and stops it before its next start)."""
    if reuse and sup is not None and sup.state is ServerState.READY and flags.same_launch(sup.flags):
        return ServerReady(sup)
    shown = " ".join(flags.display_argv())  # secrets go to the child's environment
    t0 = time.monotonic()
    restarted = sup is not None
    facts: StartupFacts | None = None
    restart: RestartResult | None = None
    try:
        if sup is None:
            if say:
                say(f"starting vLLM {flags.model} {shown}")
            sup = make(flags)
            facts = await sup.start(timeout=timeout)
        else:
            if say:
                say(f"restarting vLLM with {shown}")
            restart = await sup.restart(flags, timeout=timeout)
            facts = restart.facts
    except StartupError as exc:
        if sup is not None and stop_failed:  # None: ``make`` itself failed
            with contextlib.suppress(Exception):
                await sup.stop()
        return ServerReady(sup, restarted, False, time.monotonic() - t0,
                           error=exc.vllm_line or str(exc), hint=exc.hint or None, failure=exc)
    return ServerReady(sup, restarted, True, time.monotonic() - t0, facts=facts, restart=restart)


__all__ = ["ServerReady", "ensure_server"]
