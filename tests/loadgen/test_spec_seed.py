"""A run's seed: drawn for it when the workload sets none, and marked so (issue 35: the plan
cache kept every drawn seed's plan, never asked for again)."""

from __future__ import annotations

import dataclasses
import pickle

from loadgen.spec import WorkloadSpec


def test_a_seed_drawn_for_a_run_is_marked_and_nothing_else_changes() -> None:
    spec = WorkloadSpec(input_len=64, output_len=8)
    drawn = spec.with_run_seed()
    assert drawn.seed is not None and drawn.seed_drawn and not spec.seed_drawn
    assert drawn.with_run_seed() is drawn  # a seed once drawn is the run's
    # Set by hand, the same seed is not drawn; the spec is equal, hashes and writes the same.
    same = WorkloadSpec(input_len=64, output_len=8, seed=drawn.seed)
    assert not same.seed_drawn and same.with_run_seed() is same
    assert drawn == same and hash(drawn) == hash(same) and drawn.to_dict() == same.to_dict()
    assert WorkloadSpec.from_dict(drawn.to_dict()) == drawn and not WorkloadSpec.from_dict(drawn.to_dict()).seed_drawn
    assert pickle.loads(pickle.dumps(drawn)).seed_drawn  # as a worker process gets it
    assert "drawn" not in repr(drawn) and [f.name for f in dataclasses.fields(drawn)] == \
        [f.name for f in dataclasses.fields(spec)]
