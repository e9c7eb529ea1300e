"""Stand-ins for the engine's seams, shared by the tests that need them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.server.logparse import StartupFacts
from engine.server.supervisor import ServerEvent, ServerState

if TYPE_CHECKING:
    from engine.flags import FlagSet


class ServerStandIn:
    """A server vtui started, as engine.runs.measure.MeasuredServer sees it (what `measure` and
    `Target.of` read of a Supervisor), in front of a server that is already running (a
    loadgen.testserver, no model): no process of its own, no log, no events."""

    def __init__(self, flags: FlagSet, url: str, model: str, *, state: ServerState = ServerState.READY,
                 facts: StartupFacts | None = None) -> None:
        self.flags, self.base_url, self.model = flags, url, model
        self.state = state
        self.pid: int | None = None
        self.facts = facts if facts is not None else StartupFacts()
        self.tail: list[str] = []
        self.error: Exception | None = None
        self.api_key: str | None = None  # the test server takes any request

    def subscribe(self, callback: Callable[[ServerEvent], object]) -> Callable[[], None]:
        return lambda: None
