"""Arbitrary values (spaces, quotes, $(...), backticks, newlines, backslashes) survive
to_serve_line -> parse and to_docker_line -> parse unchanged, and a real shell reading
the exported line passes exactly our argv without running anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.flags import FlagSet, builtin_schema, parse_command_line
from engine.flags.spec import _looks_like_option

SCHEMA = builtin_schema()

# Any character but NUL (argv cannot hold it) and lone surrogates (not encodable).
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
_nasty = st.sampled_from(
    ["$(touch CANARY)", "`touch CANARY`", "a b", "it's", 'say "hi"', "x\ny", "back\\slash", "\\\n", "#hash",
     "-dash", "--model", "~/home", "*", ";", "&&", "\t", "${HOME}", "'\"'", " lead", "trail "]
)
text = st.one_of(_nasty, st.text(_chars, min_size=1, max_size=30))
# vLLM reads "None" and "" as unset for these (optional) flags, so they cannot round trip.
value = text.filter(lambda s: s not in ("None", ""))


@st.composite
def flag_sets(draw: st.DrawFn) -> FlagSet:
    model = draw(text.filter(lambda s: not os.path.isdir(os.path.expanduser(s))))
    fs = FlagSet(model, {}, SCHEMA)
    if draw(st.booleans()):
        names = draw(st.lists(value, min_size=1, max_size=3))
        if len(names) > 1:  # several items cannot start with "-" (argparse limitation)
            names = [n for n in names if not n.startswith("-")] or ["x"]
        fs = fs.set("served-model-name", names)
    if draw(st.booleans()):
        fs = fs.set("host", draw(value))
    if draw(st.booleans()):
        fs = fs.set("load-format", draw(value))
    if draw(st.booleans()):
        fs = fs.set("max-num-seqs", draw(st.integers(1, 10**6)))
    if draw(st.booleans()):
        fs = fs.set("gpu-memory-utilization", draw(st.floats(0.01, 1.0)))
    if draw(st.booleans()):
        fs = fs.set("enable-chunked-prefill", draw(st.booleans()))
    if draw(st.booleans()):
        fs = fs.set("seed", draw(st.integers(-(2**31), 2**31)))
    return fs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fs=flag_sets(), multiline=st.booleans())
def test_serve_line_round_trip(fs: FlagSet, multiline: bool) -> None:
    line = fs.to_serve_line(multiline=multiline)
    assert parse_command_line(line, SCHEMA) == fs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fs=flag_sets())
def test_docker_line_round_trip(fs: FlagSet) -> None:
    line = fs.to_docker_line(version="0.32.0")
    # --host is dropped on purpose: inside a container the server listens on all interfaces.
    assert parse_command_line(line, SCHEMA) == fs.unset("host")


BASH = shutil.which("bash")


@pytest.mark.skipif(BASH is None, reason="no bash")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fs=flag_sets())
@example(fs=FlagSet(model="-0", values={}))
@example(fs=FlagSet(model="-x", values={}))
def test_a_real_shell_sees_our_argv_and_runs_nothing(fs: FlagSet, tmp_path: Path) -> None:
    # Replace the program with a function that prints its arguments NUL-separated:
    # bash must hand it exactly [model, *argv], and no $(...) or `...` may run.
    line = fs.to_serve_line(multiline=True)
    script = 'vllm() { shift; printf "%s\\0" "$@"; }\n' + line + "\n"
    out = subprocess.run([BASH, "--norc", "--noprofile", "-c", script], cwd=tmp_path, capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr
    got = out.stdout.split(b"\0")[:-1]
    # A model that argparse would read as an option goes as --model=...; "-0" or "-1.5" reads as
    # a value and stays positional (engine.flags.spec._looks_like_option; hypothesis found "-0").
    head = [f"--model={fs.model}"] if _looks_like_option(fs.model) else ([fs.model] if fs.model else [])
    assert [g.decode() for g in got] == head + fs.to_argv()
    assert not (tmp_path / "CANARY").exists()
