"""The search's schedule: what a start and a step are expected to cost (from those measured, so
the budget is not overrun), which configuration comes next (resumed half-measured ones first, then
the nearest to the best so far, lines through the best first), and what rules one out without
starting it (off every line through the best; Little's law; a running neighbour's pass).

:class:`engine.tune.search.Tuner` runs the loop and the slots; the decisions are here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from engine.tune.trial import CUT_SHORT, ConfigResult, Measurement, TuneSettings

if TYPE_CHECKING:
    from engine.flags import FlagSet
    from engine.tune.space import SearchSpace, SpaceValue


class Costs:
    """What starts and steps cost, as measured: the estimates for the next ones."""

    def __init__(self) -> None:
        self.starts: list[float] = []  # seconds per start that restarted the server
        self.steps: list[tuple[float, float]] = []  # (requests/load seconds, actual seconds)

    def start(self) -> float:
        """The next start: the slowest seen, else a minute."""
        return max(self.starts) if self.starts else 60.0

    def step(self, load: float, n: int) -> float:
        """The next step of ``n`` requests at ``load``: their span plus the overhead seen."""
        nominal = n / load if load > 0 and math.isfinite(load) else 0.0
        if self.steps:
            # Overhead beyond the arrivals' own span (drain, warm-up, setup), as measured.
            extra = max(actual - nom for nom, actual in self.steps[-5:])
            return nominal + max(0.0, extra)
        return nominal + 5.0


def flags_changed(space: SearchSpace, a: Mapping[str, object], b: Mapping[str, object]) -> int:
    """How many of the space's flags differ between two configurations."""
    return sum(a[n] != b[n] for n, _ in space.dims)


def nearest_first(pending: list[str], by_key: Mapping[str, Mapping[str, SpaceValue]],
                  configs: Mapping[str, ConfigResult], space: SearchSpace, anchor: Mapping[str, SpaceValue]) -> None:
    """Sort ``pending`` in place: half-measured (cut short) ones first, then nearest to ``anchor``
    (the best so far, else the seed), then in the space's order."""
    order = list(by_key)
    pending.sort(key=lambda k: (configs.get(k) is None or configs[k].status != CUT_SHORT,
                                space.distance(by_key[k], anchor), order.index(k)))


def off_line_reason(space: SearchSpace, values: Mapping[str, SpaceValue], best: ConfigResult) -> str:
    """Why a configuration off every line through ``best`` is skipped."""
    changed = [n for n, _ in space.dims if values[n] != best.values[n]]
    return (f"changes {' and '.join(changed)} from the best ({best.key}); each of those changes alone lost"
            " to it, so this one is skipped (assumes the flags act separately; --exhaustive measures it)")


def bound_reason(values: Mapping[str, object], best: ConfigResult | None, settings: TuneSettings, base: FlagSet,
                 measurements: Mapping[str, Sequence[Measurement]], need: float | None = None) -> str:
    """Why a config cannot beat ``best`` without starting it, or "".

    Little's law: completions/s <= max-num-seqs / (time each request holds a slot),
    and no request holds it for less than the fastest E2EL seen on any configuration
    (batching only slows each request). 0.8 of that E2EL leaves room for the client's
    share of it and for prefix-cache hits faster than anything seen. ``need``: the goodput
    it must be able to reach (default the best's; lower for a cheaper configuration, which
    wins a tie within the noise: engine.tune.ranking).
    """
    if best is None or not settings.prune or not best.goodput or settings.objective != "goodput":
        return ""
    need = best.goodput if need is None else need
    seqs = values.get("max-num-seqs", base.get("max-num-seqs"))
    fastest = [m.e2el_min_ms for ms in measurements.values() for m in ms if m.e2el_min_ms]
    if not isinstance(seqs, int) or not fastest:
        return ""
    e2el_s = 0.8 * min(fastest) / 1000
    bound = seqs / e2el_s
    if bound >= need:
        return ""
    return (f"at most {bound:.3g} req/s (max-num-seqs {seqs} / 0.8 x fastest E2EL {min(fastest):.0f} ms),"
            f" below the best so far ({best.goodput:.3g} req/s, {best.key})"
            + ("" if need >= best.goodput else f" by more than the noise (it needs {need:.3g} to tie)"))


def neighbour_pass(key: str, running: Iterable[str], measurements: Mapping[str, Sequence[Measurement]],
                   at_least: float = 0.0, skip: Iterable[str] = ()) -> tuple[float, str] | None:
    """The highest finite load (at least ``at_least``) that a trial in ``running`` beside ``key``
    (and not in ``skip``) has met the SLO at so far, and that trial; None when none has."""
    top: tuple[float, str] | None = None
    for other in sorted(set(running) - {key, *skip}):
        for m in measurements.get(other, ()):
            if m.ok and math.isfinite(m.load) and m.load >= at_least and (top is None or m.load > top[0]):
                top = (m.load, other)
    return top
