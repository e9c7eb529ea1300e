"""The flags being edited (engine.flags.edited.EditedFlags), on the built-in schema: each edit
is checked at once, bad text keeps the last good value, and "dirty" and the diff compare with
the right FlagSet."""

from __future__ import annotations

from engine.flags import FlagSet, builtin_schema
from engine.flags.edited import EditedFlags, flags_differ

BASE = FlagSet(model="m", values={"max-num-seqs": 8, "max-num-batched-tokens": 512})


def edited(**kw: object) -> EditedFlags:
    return EditedFlags(BASE, schema=builtin_schema(), **kw)  # type: ignore[arg-type]


def test_text_that_does_not_parse_keeps_the_last_good_value_until_typed_again() -> None:
    ed = edited()
    reason = ed.set_text("max-num-seqs", "many")
    assert reason and "many" in reason
    assert ed.flags.get("max-num-seqs") == 8 and ed.errors["max-num-seqs"] == reason
    assert ed.dirty  # the typed text is not what runs
    assert ed.set_text("max-num-seqs", " 16 ") is None
    assert ed.flags.get("max-num-seqs") == 16 and "max-num-seqs" not in ed.errors


def test_empty_text_unsets_and_a_rule_across_flags_is_checked_at_once() -> None:
    ed = edited()
    ed.set_text("max-num-batched-tokens", "")
    assert ed.flags.get("max-num-batched-tokens") is None
    reason = ed.set("max-num-batched-tokens", 4)  # below max-num-seqs 8: vLLM refuses it at start
    assert reason and "max_num_seqs" in reason
    assert ed.first_error() == ("max-num-batched-tokens", reason)


def test_the_workloads_longest_request_is_read_at_each_check() -> None:
    longest: list[int | None] = [None]
    ed = edited(max_request_len=lambda: longest[0])
    ed.set("max-model-len", 256)
    assert "max-model-len" not in ed.errors
    longest[0] = 4096
    ed.revalidate()
    assert "max-model-len" in ed.errors


def test_dirty_and_the_diff_follow_what_was_loaded_and_what_runs() -> None:
    ed = edited()
    assert not ed.dirty and ed.diff(None) == []
    ed.set("max-num-seqs", 4)
    assert ed.dirty
    assert ed.diff(BASE) == [("max-num-seqs", 8, 4)]
    ed.loaded = ed.flags  # the server took them
    assert not ed.dirty
    ed.set_text("max-num-seqs", "x")
    ed.take(BASE, loaded=True)  # a preset loaded: errors dropped, nothing dirty
    assert not ed.dirty and not ed.errors and ed.flags is BASE
    ed.set("max-num-seqs", 2)
    ed.saved()
    assert not ed.dirty and ed.preset is ed.flags


def test_flags_differ_reads_none_as_different() -> None:
    assert not flags_differ(None, None) and flags_differ(BASE, None) and not flags_differ(BASE, BASE)
