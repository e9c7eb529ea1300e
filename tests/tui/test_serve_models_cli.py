"""`vtui models` and the argument handling of `vtui serve` (no server started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.cli import main


def test_models_lists_tiny_and_shipped_configs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny ")
    assert "qwen2.5-7b" in out and "Qwen2ForCausalLM, 28 layers" in out and "--load-format dummy" in out


def test_models_build_unknown_name_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--build", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert "error: --build gpt-5: no such model" in err and "hint: Known: tiny" in err


def test_serve_missing_model_folder_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and "hint:" in err


def test_serve_bad_vllm_flag_is_named_before_launch(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", str(tiny_model), "--", "--max-num-seqs", "many"]) == 2
    err = capsys.readouterr().err
    assert "--max-num-seqs" in err and "hint:" in err
