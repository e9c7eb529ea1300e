"""``engine.server.tinymodel.resolve_model``: every --model value becomes one folder (or hub id) and its flags.

No vLLM here: the tiny model and a dummy folder are built into the test cache (no server).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from engine.server.tinymodel import (
    DUMMY_FLAGS,
    TINY_CPU_DEFAULTS,
    ModelError,
    ResolvedModel,
    ensure_dummy_model,
    is_tiny_model,
    resolve_model,
)
from tui.cli import main

TINY_ARGV = [f"--kv-cache-memory-bytes={TINY_CPU_DEFAULTS['kv-cache-memory-bytes']}", "--max-model-len=2048"]


@pytest.fixture()
def plain_model(tmp_path: Path) -> Path:
    """A local model folder vtui did not make: only a config.json."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    return folder


@pytest.mark.parametrize("name", [None, "", "tiny", "tiny-qwen2"])
def test_tiny_names_give_the_tiny_model_and_its_cpu_defaults(name: str | None, tiny_model: Path) -> None:
    got = resolve_model(name, root=tiny_model.parent)
    assert got == ResolvedModel(str(tiny_model), tiny=True, defaults=dict(TINY_CPU_DEFAULTS))
    assert got.argv() == TINY_ARGV


def test_shipped_name_gives_its_dummy_folder_and_load_format_dummy(tiny_model: Path) -> None:
    got = resolve_model("qwen2.5-7b", root=tiny_model.parent)
    assert got == ResolvedModel(str(tiny_model.parent / "dummy-qwen2.5-7b"), dummy=True, flags=dict(DUMMY_FLAGS))
    assert json.loads(Path(got.path, "config.json").read_text())["num_hidden_layers"] == 28
    assert got.argv() == ["--load-format=dummy"]


@pytest.mark.parametrize(
    ("which", "tiny", "dummy", "argv"),
    [
        ("tiny", True, False, TINY_ARGV),  # the tiny folder by path: same flags as by name
        ("dummy", False, True, ["--load-format=dummy"]),  # a dummy folder has no weights
        ("plain", False, False, []),
    ],
)
def test_a_local_folder_is_recognised_by_its_stamp(
    which: str, tiny: bool, dummy: bool, argv: list[str], tiny_model: Path, plain_model: Path
) -> None:
    folder = {"tiny": tiny_model, "dummy": ensure_dummy_model("qwen2.5-7b", tiny_model.parent),
              "plain": plain_model}[which]
    got = resolve_model(str(folder))
    assert (got.path, got.tiny, got.dummy, got.argv()) == (str(folder.resolve()), tiny, dummy, argv)


@pytest.mark.parametrize("spelling", ["./my-model", "my-model", "./my-model/", "~/my-model"])
def test_relative_and_home_paths_become_absolute(
    spelling: str, plain_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(plain_model.parent)
    monkeypatch.setenv("HOME", str(plain_model.parent))
    assert resolve_model(spelling) == ResolvedModel(str(plain_model))


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B", "gpt2"])
def test_hub_ids_pass_through(hub_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no local folder of that name
    assert resolve_model(hub_id) == ResolvedModel(hub_id)


@pytest.mark.parametrize(
    ("spelling", "message"),
    [
        ("{tmp}/nope", "no such folder, so no config.json to read"),
        ("./nope", "no such folder, so no config.json to read"),
        ("~/nope", "no such folder, so no config.json to read"),
        ("{tmp}/empty", "no config.json in that folder"),
        ("{tmp}/weights.gguf", "a file, not a model folder with a config.json"),
    ],
)
def test_a_path_that_is_no_model_folder_is_named_with_a_hint(
    spelling: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.gguf").write_bytes(b"GGUF")
    name = spelling.format(tmp=tmp_path)
    with pytest.raises(ModelError) as caught:
        resolve_model(name)
    assert str(caught.value) == f"--model {name}: {message}"
    assert "`vtui models`" in caught.value.hint
    with pytest.raises(ModelError, match=r"^model \./nope: no such folder"):
        resolve_model("./nope", source="model")


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ('{"recipe": 1, "kind": "tiny"}', True),
        ('{"recipe": 1, "kind": "dummy"}', False),
        ("[1, 2]", False),  # JSON, not an object
        ("not json", False),
        (None, False),  # no stamp: any other model
    ],
)
def test_is_tiny_model_reads_the_stamp(stamp: str | None, expected: bool, tmp_path: Path) -> None:
    if stamp is not None:
        (tmp_path / "vtui-model.json").write_text(stamp)
    assert is_tiny_model(tmp_path) is expected
    assert is_tiny_model(str(tmp_path)) is expected
    assert is_tiny_model(tmp_path / "missing") is False


# ---- the callers: `vtui serve` and `vtui sweep` go through it


def test_serve_puts_the_models_flags_under_the_users(tiny_model: Path) -> None:
    from tui.commands.serve import build_flags

    args = argparse.Namespace(model=str(tiny_model), extra=["--", "--max-model-len", "1024"], no_validate=True)
    flags = build_flags(args)
    assert flags.model == str(tiny_model)
    assert flags.get("kv-cache-memory-bytes") == TINY_CPU_DEFAULTS["kv-cache-memory-bytes"]  # the tiny default, visible
    assert flags.get("max-model-len") == 1024  # the user's value wins
    dummy = build_flags(argparse.Namespace(model=str(ensure_dummy_model("qwen2.5-7b", tiny_model.parent)),
                                           extra=[], no_validate=True))
    assert dummy.get("load-format") == "dummy" and dummy.get("gpu-memory-utilization") is None


@pytest.mark.parametrize("command", ["serve", "sweep"])
def test_commands_refuse_a_missing_model_folder(command: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, "--model", str(tmp_path / "nope")] + (["online-chat"] if command == "sweep" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: --model {tmp_path / 'nope'}: no such folder" in err
    assert "hint: Point --model at a model folder" in err
