"""A series of measured runs: configurations times repeats, the one orchestration above ``measure()``.

Every path that measures more than one run of a configuration goes through here, so that each
keeps the same order and the same rule for a spoiled run:

- :func:`rounds` is the order: with repeats, rounds that alternate between the configurations
  (A B C A B C, not A A B B C C), so the box's drift falls on all of them;
- :func:`measure_sound` measures a run again while the box spoiled it (``RunStatus.spoiled``:
  the client was held up, its figures are the box's), at most ``SPOILED_TRIES`` tries, each
  stored as what it was, the last kept;
- :func:`run_series` is the two together: each slot of the rounds handed to the caller's
  ``step`` (get a server ready for the configuration, measure it), with one line said per slot.

Who calls it: ``vtui sweep`` (engine.tune.sweep.run_sweep, a server started here and restarted
only when a preset's flags differ: engine.server.ready.ensure_server), ``vtui bench --repeat``,
the TUI's ``r`` with repeats and its ``w`` sweep (engine.runs.part, the session loading each
preset into the flag editor and restarting through its ServerPart), and the tuner's step
(engine.tune.measurer: its own test of a spoiled step, the same bounded retry).

Repeats of one configuration are not retried when spoiled (``retry_spoiled=False``): each is a
sample of the configuration on this box, the comparison reads their statuses (a column resting
on spoiled repeats takes no best mark) and their spread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from engine.runs.status import SPOILED_TRIES, RunStatus


class HasStatus(Protocol):
    """A measured run of any path: ``MeasuredRun``, the session's ``RunRecord``, a sweep step."""

    @property
    def status(self) -> RunStatus: ...


C = TypeVar("C")
R = TypeVar("R")
S = TypeVar("S", bound=HasStatus)


@dataclass(frozen=True)
class Slot(Generic[C]):
    """One run of a series: which configuration, which repeat of it, where in the series."""

    config: C
    repeat: int  # 1-based: which round
    repeats: int
    index: int  # 1-based position in the series
    total: int

    def label(self, name: str) -> str:
        """``[2/6] NAME (repeat 1/3)``; without repeats ``[2/3] NAME``."""
        return f"[{self.index}/{self.total}] {name}" + (
            f" (repeat {self.repeat}/{self.repeats})" if self.repeats > 1 else "")


def rounds(configs: Sequence[C], repeats: int = 1) -> list[Slot[C]]:
    """The series' order: ``repeats`` rounds over ``configs``, each round in the given order."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats {repeats!r}: must be 1 or more")
    order = [(r, c) for r in range(1, repeats + 1) for c in configs]
    return [Slot(c, r, repeats, n, len(order)) for n, (r, c) in enumerate(order, 1)]


def is_spoiled(run: HasStatus) -> bool:
    """The box spoiled it (its status says), or a flag changed on the server while it ran
    (``changed_live``, where the run keeps it: it measured two configurations)."""
    return run.status.spoiled or getattr(run, "changed_live", False) is True


async def measure_sound(once: Callable[[], Awaitable[R]], *, spoiled: Callable[[R], bool],
                        again: Callable[[R], R] = lambda r: r,
                        say: Callable[[str], None] | None = None, label: str = "") -> R:
    """``once()``, and again while ``spoiled`` says the box spoiled it, at most
    ``SPOILED_TRIES`` tries in all; the last is returned (through ``again``, which marks a run
    that was measured again, when the caller keeps such a mark)."""
    run = await once()
    for attempt in range(2, SPOILED_TRIES + 1):
        if not spoiled(run):
            break
        if say is not None:
            status = getattr(run, "status", "spoiled")
            say(f"{label}: {status}: measured again (try {attempt} of {SPOILED_TRIES})" if label else
                f"{status}: measured again (try {attempt} of {SPOILED_TRIES})")
        run = again(await once())
    return run


async def run_series(configs: Sequence[C], step: Callable[[Slot[C]], Awaitable[S]], *, repeats: int = 1,
                     retry_spoiled: bool = True, say: Callable[[str], None] | None = None,
                     name: Callable[[C], str] = str,
                     stop: Callable[[S], bool] = lambda run: False) -> list[tuple[Slot[C], S]]:
    """Each slot of :func:`rounds` handed to ``step``; a spoiled step measured again when
    ``retry_spoiled``. ``stop(run)`` True ends the series after that run (a cancelled run, a
    server that died where nothing else could be measured). Returns each slot with its run."""
    done: list[tuple[Slot[C], S]] = []
    for slot in rounds(configs, repeats):
        label = slot.label(name(slot.config))

        async def once(slot: Slot[C] = slot) -> S:
            return await step(slot)

        if retry_spoiled:
            run = await measure_sound(once, spoiled=is_spoiled, say=say, label=label)
        else:
            run = await once()
        done.append((slot, run))
        if stop(run):
            break
    return done


__all__ = ["HasStatus", "Slot", "is_spoiled", "measure_sound", "rounds", "run_series"]
