"""``vtui export`` as a user types it in a shell (issue 33, item 4): options the user did not
give leave an imported docker line's own alone."""

from __future__ import annotations

import shlex

import pytest

from engine.flags import builtin_schema, read_command_line
from tui.cli import main

# The command exactly as typed at the prompt in issue 33.
TYPED = ("vtui export --line 'docker run --runtime nvidia --gpus \"device=0,1\" -v /data:/data "
         "-p 8080:8000 vllm/vllm-openai:v0.9.2 --model m' --format docker")


def _export(typed: str, capsys: pytest.CaptureFixture[str]) -> str:
    argv = shlex.split(typed)
    assert argv[0] == "vtui"
    assert main(argv[1:]) == 0
    return capsys.readouterr().out


def _gpus_of(line: str) -> list[str]:
    toks = shlex.split(line)
    return [toks[i + 1] for i, t in enumerate(toks) if t == "--gpus"]


def test_an_imported_docker_lines_gpu_list_survives_export(capsys: pytest.CaptureFixture[str]) -> None:
    out = _export(TYPED, capsys)
    assert _gpus_of(out) == ["device=0,1"], out  # was "all": the CLI's default replaced the user's
    # Every other option and the tag survive, and the line reads back as the same docker run.
    imported = read_command_line(shlex.split(TYPED)[3], builtin_schema())
    again = read_command_line(out, builtin_schema())
    assert again.docker == imported.docker and again.flags == imported.flags


def test_gpus_given_on_the_command_line_still_replaces_the_imported_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _gpus_of(_export(TYPED + " --gpus 2", capsys)) == ["2"]
    assert _gpus_of(_export(TYPED + " --gpus all", capsys)) == ["all"]
    assert _gpus_of(_export(TYPED + " --gpus 0,3", capsys)) == ['"device=0,3"']


def test_a_line_without_docker_options_still_gets_all_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert _gpus_of(_export("vtui export --line 'vllm serve m --max-num-seqs 8' --format docker", capsys)) == ["all"]
    # A docker line that never named --gpus gets none added unless asked for.
    out = _export("vtui export --line 'docker run -p 8080:8000 vllm/vllm-openai:v0.9.2 --model m'", capsys)
    assert _gpus_of(out) == []


def test_a_bad_gpus_value_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(shlex.split(TYPED)[1:] + ["--gpus", "two"]) != 0
    err = capsys.readouterr().err
    assert "--gpus 'two'" in err and "hint:" in err
