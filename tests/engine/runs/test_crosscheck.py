"""engine.runs.crosscheck: the client's figures beside the server's own /metrics over one run."""

from __future__ import annotations

from engine.runs.crosscheck import cross_check
from engine.runs.summary import ServerWindow, TelemetryFigures

LOAD = {"completed": 100, "mean_ttft_ms": 50.0, "mean_tpot_ms": 4.0, "total_input_tokens": 12_800}


def telemetry(ttft_ms: float = 48.0, e2e_ms: float = 300.0, count: float = 100, gen: float = 6400,
              prompt: float = 12_800, hit: float | None = 0.0) -> TelemetryFigures:
    """The server's window as engine.runs.measure.server_window writes it, read as the run reads it."""
    return ServerWindow.from_json(
        {"server_ttft": {"mean_ms": ttft_ms, "count": count}, "server_e2e": {"mean_ms": e2e_ms, "count": count},
         "generation_tokens": gen, "prompt_tokens": prompt, "prefix_hit_rate": hit}, "server window").figures()


def test_agreeing_client_and_server_give_no_warning() -> None:
    c = cross_check(LOAD, telemetry())
    assert c.server_mean_ttft_ms == 48.0
    assert c.server_tpot_ms == (300.0 - 48.0) / 63  # 64 tokens per request
    assert c.client_prompt_tokens == c.server_prompt_tokens == 128
    assert c.warnings == ()


def test_a_client_slower_than_the_server_is_named() -> None:
    c = cross_check({**LOAD, "mean_ttft_ms": 80.0}, telemetry())
    assert len(c.warnings) == 1 and "mean TTFT 80.0 ms here, 48.0 ms on the server" in c.warnings[0]


def test_small_gaps_under_the_floor_are_not_disagreement() -> None:
    # 12% apart but 0.5 ms: scheduling noise on a 4 ms TPOT, not a different measurement.
    c = cross_check({**LOAD, "mean_tpot_ms": 4.5}, telemetry(e2e_ms=48 + 4.0 * 63))
    assert c.warnings == ()


def test_tpot_against_the_servers_e2e_minus_ttft() -> None:
    c = cross_check({**LOAD, "mean_tpot_ms": 9.0}, telemetry(e2e_ms=48 + 4.0 * 63))
    assert any("mean TPOT 9.00 ms here, 4.00 ms" in w for w in c.warnings)


def test_cache_hits_without_a_shared_prefix_and_other_traffic_are_named() -> None:
    c = cross_check(LOAD, telemetry(hit=0.4, prompt=20_000))
    assert any("prefix cache served 40%" in w for w in c.warnings)
    assert any("200.0 prompt tokens per request" in w for w in c.warnings)
    assert not any("prefix cache" in w for w in cross_check(LOAD, telemetry(hit=0.4), shared_prefix=True).warnings)


def test_no_server_figures_means_no_verdict() -> None:
    c = cross_check(LOAD, TelemetryFigures.from_json({}, "no scrapes"))
    assert c.server_mean_ttft_ms is None and c.server_tpot_ms is None and c.warnings == ()
    assert c.to_dict()["warnings"] == []


def test_a_gap_the_held_client_explains_is_put_down_to_the_box() -> None:
    """Issue 32: a run whose loop the box held up (loadgen.run client_delay_ms) is told so, not
    blamed on the API server's streaming."""
    held = cross_check({**LOAD, "mean_ttft_ms": 80.0}, telemetry(), client_delay_ms=25.0)
    assert len(held.warnings) == 1 and "held up by the busy box (25 ms added to the mean time to first token)" in held.warnings[0]
    quiet = cross_check({**LOAD, "mean_ttft_ms": 80.0}, telemetry(), client_delay_ms=0.4)
    assert "API server's streaming" in quiet.warnings[0]


def test_the_servers_queue_time_is_read_beside_its_ttft() -> None:
    window = ServerWindow.from_json(
        {"server_ttft": {"mean_ms": 48.0, "count": 100}, "server_e2e": {"mean_ms": 300.0, "count": 100},
         "server_queue": {"mean_ms": 12.5, "count": 100}, "generation_tokens": 6400, "prompt_tokens": 12_800},
        "server window")
    c = cross_check(LOAD, window.figures())
    assert c.server_mean_queue_ms == 12.5
    assert type(c).from_dict(c.to_dict()) == c
    assert ServerWindow.from_json(window.to_json(), "again") == window
