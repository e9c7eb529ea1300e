"""What the session's snapshot costs while stored runs are compared (issue 34: the Runs tab's intervals).

The TUI rebuilds ``Session.snapshot()`` four times a second on the screen's thread; the
comparison's "within noise" verdicts bootstrap each compared run's requests
(engine.runs.noise.RunNoise, 0.1-0.5 s a run). This stores ``--runs`` made runs of ``--requests``
requests each in a history in a temporary folder, then pins them into the comparison one step at
a time (as Enter in the Runs tab does) and prints, per step, the first snapshot's time, the mean
and the largest of the next ``--repeat`` snapshots, and how many runs were bootstrapped.

    .venv/bin/python tests/perf/snapshot_cost.py [--runs 4] [--requests 400] [--repeat 20]

No server is started: no lock is needed.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from typing import Any


def made_requests(seed: int, n: int, gap_ms: float = 5.0, tokens: int = 16) -> list[dict[str, Any]]:
    """``n`` requests, 10 a second: TTFT ~20 ms, chunks every ``gap_ms``, each value off by up to 10%."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ttft = 0.020 * rng.uniform(0.9, 1.1)
        gaps = [gap_ms / 1000 * rng.uniform(0.9, 1.1) for _ in range(tokens - 1)]
        out.append({"id": i, "t_start": i * 0.1, "ttft_s": ttft, "e2el_s": ttft + sum(gaps), "itl_s": gaps,
                    "input_tokens": 12, "output_tokens": tokens, "ok": True, "error": None, "cancelled": False})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runs", type=int, default=4, help="stored runs to compare (default 4)")
    p.add_argument("--requests", type=int, default=400, help="requests a run (default 400)")
    p.add_argument("--repeat", type=int, default=20, help="snapshots timed after each step's first (default 20)")
    a = p.parse_args()
    os.environ["VTUI_HOME"] = tempfile.mkdtemp(prefix="vtui-snapshot-cost-")

    from engine.flags import FlagSet
    from engine.runs import history as history_mod
    from engine.runs.history import History, StoredRequest
    from engine.runs.noise import RunNoise
    from engine.session import Session

    bootstraps = 0
    replicates = RunNoise.replicates

    def counting(self: RunNoise, figure: str) -> tuple[float, ...] | None:
        nonlocal bootstraps
        if self.usable and getattr(self, "_replicates", None) is None:
            bootstraps += 1
        return replicates(self, figure)

    RunNoise.replicates = counting  # type: ignore[method-assign] # counts each run's bootstrap

    with History() as store:
        for k in range(a.runs):
            reqs = made_requests(k, a.requests, gap_ms=5.0 + k)
            rec = store.start_run(f"made {k + 1}", flags={"max-num-seqs": 8 * (k + 1)}, model="m")
            for r in reqs:
                rec.add_request(r)
            figures = RunNoise([StoredRequest.from_json(r) for r in reqs]).figures()
            rec.finish(summary={"load": {"completed": len(reqs), "failed": 0, **figures}})
    session = Session(FlagSet(model="m", values={}), telemetry=False, record_history=True)

    def timed() -> float:
        t0 = time.perf_counter()
        session.snapshot()
        return (time.perf_counter() - t0) * 1000

    floor_supported = hasattr(history_mod, "NoiseFloor")
    steps: list[tuple[str, Any]] = [(f"pin run {k + 1}", lambda k=k: session.toggle_stored(k + 1)) for k in range(a.runs)]
    steps += [(f"unpin run {a.runs}", lambda: session.toggle_stored(a.runs)),
              (f"pin run {a.runs} again", lambda: session.toggle_stored(a.runs)),
              ("nothing changed", lambda: None)]
    if floor_supported:
        def store_floor() -> None:
            with History() as store:
                store.save_noise_floor(history_mod.NoiseFloor(
                    box=history_mod.this_box(), measured=time.time(), runs=5,
                    spread_pct={"median_tpot_ms": 15.0, "median_ttft_ms": 20.0}, label="made"))
            live.floor_checked = None  # read the floor at the next snapshot, not in 10 s
        steps.append(("a noise floor stored", store_floor))
    live = session._runs_part
    settle = getattr(live, "noise_settled", None)  # where the bootstrap runs on a thread of its own
    print(f"{a.runs} stored runs of {a.requests} requests; snapshot times in ms "
          f"({'bootstraps on the noise thread' if settle else 'bootstraps in the snapshot'})")
    print(f"{'step':<24} {'first':>9} {'bootstrap s':>12} {'settled':>9} {f'next {a.repeat}: mean':>16} {'max':>8} "
          f"{'bootstraps':>11}")
    for label, act in steps:
        before = bootstraps
        act()
        first = timed()
        t0 = time.perf_counter()
        if settle is not None:
            settle()
        waited = time.perf_counter() - t0
        settled = timed()
        rest = [timed() for _ in range(a.repeat)]
        print(f"{label:<24} {first:>9.1f} {waited:>12.2f} {settled:>9.1f} {statistics.fmean(rest):>16.2f} "
              f"{max(rest):>8.2f} {bootstraps - before:>11}")
    notes = (session.snapshot().comparison or None)
    if notes is not None:
        print("\n".join(notes.notes))


if __name__ == "__main__":
    main()
