"""Command lines round-trip (issue 17, item 3): what a user writes in a ``docker run``,
``vllm serve`` or ``python -m vllm...`` line survives import and export, and what vtui
changes on reading it is said."""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.flags import DockerRun, FlagError, builtin_schema, parse_command_line, read_command_line
from tui.cli import main

BUILTIN = builtin_schema()

SEED_LINE = (
    "docker run --runtime nvidia --gpus '\"device=0,1\"' -v /data:/data -p 8080:8000 "
    "-e HF_TOKEN=hf_not_for_export -e VLLM_LOGGING_LEVEL=DEBUG --env-file vllm.env --shm-size 16g "
    "--ipc=host --name qwen --network bridge --rm -d vllm/vllm-openai:v0.8.5 "
    "--model /data/Qwen2.5-7B --tensor-parallel-size 2 --max-num-seqs 64"
)


def test_the_seed_articles_docker_line_survives_export() -> None:
    read = read_command_line(SEED_LINE, BUILTIN)
    assert read.form == "docker" and read.docker is not None
    assert read.flags.model == "/data/Qwen2.5-7B"  # mounted from /data on the host
    line = read.flags.to_docker_line(docker=read.docker, multiline=False)
    toks = shlex.split(line)
    for opt, val in [("--gpus", '"device=0,1"'), ("-v", "/data:/data"), ("-p", "8080:8000"),
                     ("-e", "VLLM_LOGGING_LEVEL=DEBUG"), ("--env-file", "vllm.env"), ("--shm-size", "16g"),
                     ("--ipc", "host"), ("--name", "qwen"), ("--network", "bridge"), ("--runtime", "nvidia")]:
        assert (opt, val) in itertools.pairwise(toks), (opt, val, line)
    assert "--rm" in toks and "-d" in toks
    assert "vllm/vllm-openai:v0.8.5" in toks  # the tag the user chose, not the installed vLLM's
    assert toks[toks.index("--model") + 1] == "/data/Qwen2.5-7B"
    again = read_command_line(line, BUILTIN)
    assert again.flags == read.flags and again.docker == read.docker


def test_a_secret_in_docker_env_is_kept_by_name_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    read = read_command_line(SEED_LINE, BUILTIN)
    assert read.docker is not None and ("-e", "HF_TOKEN") in read.docker.options
    assert any("-e HF_TOKEN=... was read as -e HF_TOKEN" in n for n in read.notes)
    assert "hf_not_for_export" not in read.flags.to_docker_line(docker=read.docker)
    assert main(["export", "--line", SEED_LINE, "--format", "docker", "--no-check"]) == 0
    out, err = capsys.readouterr()
    assert "hf_not_for_export" not in out + err
    assert "note: -e HF_TOKEN=... was read as -e HF_TOKEN" in err
    assert "--shm-size 16g" in out and "vllm/vllm-openai:v0.8.5" in out and "-p 8080:8000" in out


def test_export_flags_replace_only_what_they_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--line", SEED_LINE, "--no-check", "--port", "9100", "--gpus", "2",
                 "--image", "registry.local:5000/vllm:mine"]) == 0
    out = capsys.readouterr().out
    assert "-p 9100:8000" in out and "--gpus 2" in out and "registry.local:5000/vllm:mine" in out
    assert "-v /data:/data" in out and "--name qwen" in out
    read = read_command_line(SEED_LINE, BUILTIN)
    assert read.docker is not None
    retagged = read.flags.to_docker_line(docker=read.docker, version="0.32.0")
    assert "vllm/vllm-openai:v0.32.0" in retagged and "v0.8.5" not in retagged
    assert DockerRun(image="host:5000/vllm").image_tagged("0.32.0") == "host:5000/vllm:v0.32.0"


def test_k8s_and_compose_keep_an_imported_image(capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("k8s", "compose"):
        assert main(["export", "--line", SEED_LINE, "--format", fmt, "--no-check"]) == 0
        out = capsys.readouterr().out
        assert "vllm/vllm-openai:v0.8.5" in out and "hf_not_for_export" not in out


def test_a_local_model_folder_is_mounted_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    # A docker line that does not mount the folder: the export adds a read-only mount.
    read = read_command_line(f"docker run --gpus all vllm/vllm-openai:v0.9.0 --model {folder}", BUILTIN)
    assert read.docker is not None
    line = read.flags.to_docker_line(docker=read.docker, multiline=False)
    toks = shlex.split(line)
    assert ["-v", f"{folder}:/models/my-model:ro"] == toks[toks.index("-v") : toks.index("-v") + 2]
    assert toks[toks.index("--model") + 1] == "/models/my-model"
    back = read_command_line(line, BUILTIN)
    assert back.flags.model == str(folder)
    # Exported again, the mount is not added twice: the line is a fixed point.
    assert back.docker is not None and back.flags.to_docker_line(docker=back.docker, multiline=False) == line
    # A folder the user mounted keeps the user's mount.
    read = read_command_line(f"docker run -v {tmp_path}:/w vllm/vllm-openai:v0.9.0 --model /w/my-model", BUILTIN)
    assert read.flags.model == str(folder) and read.docker is not None
    line = read.flags.to_docker_line(docker=read.docker, multiline=False)
    assert line.count(" -v ") == 1 and "--model /w/my-model" in line


@pytest.mark.parametrize(("module", "says"), [
    ("vllm.entrypoints.api_server", "legacy demo server"),
    ("vllm.entrypoints.openai.api_server", "is the server `vllm serve` runs"),
])
def test_legacy_entry_points_are_read_with_a_visible_note(module: str, says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = f"python -m {module} --model m --max-num-seqs 8"
    read = read_command_line(line, BUILTIN)
    assert read.form == "module" and read.flags == parse_command_line("vllm serve m --max-num-seqs 8", BUILTIN)
    assert any(says in n for n in read.notes)
    assert main(["export", "--line", line, "--format", "serve", "--no-check"]) == 0
    captured = capsys.readouterr()
    assert says in captured.err and captured.out.startswith("vllm serve m")


def test_an_unclosed_quote_is_pointed_at_where_it_opens() -> None:
    with pytest.raises(FlagError) as err:
        parse_command_line('vllm serve m --served-model-name "abc --max-num-seqs 8 --max-model-len 4096', BUILTIN)
    assert err.value.token.startswith('"abc --max-num-seqs 8')
    assert "never closed" in str(err.value) and err.value.hint == 'close it with a matching "'


# -- property: import, export in each form, import again gives the same flags and options --

_OPTIONS = st.sampled_from([
    ("-v", "/data:/data"), ("--volume", "/srv/hf:/root/.cache/huggingface"), ("-p", "8080:8000"),
    ("--publish", "127.0.0.1:9000:8000/tcp"), ("--gpus", "all"), ("--gpus", "2"), ("--gpus", '"device=0,1"'),
    ("-e", "VLLM_LOGGING_LEVEL=DEBUG"), ("--env", "NCCL_DEBUG"), ("--env-file", "my vllm.env"),
    ("--shm-size", "16g"), ("--ipc", "host"), ("--name", "vllm-a"), ("--runtime", "nvidia"),
    ("--network", "host"), ("--rm", None), ("-d", None), ("-it", None),
    ("--mount", "type=bind,source=/mnt/models,target=/models"),
])
_FLAGS = st.sampled_from([
    ["--max-num-seqs", "64"], ["--max-num-batched-tokens", "8192"], ["--enable-chunked-prefill"],
    ["--tensor-parallel-size", "2"], ["--gpu-memory-utilization", "0.85"], ["--max-model-len", "4096"],
    ["--port", "8000"], ["--served-model-name", "a b"],
])
_IMAGES = st.sampled_from(["vllm/vllm-openai:v0.8.5", "vllm/vllm-openai:latest", "my.reg:5000/team/vllm:2025-11",
                           "vllm/vllm-openai@sha256:" + "a" * 64])


@settings(max_examples=150, deadline=None)
@given(st.lists(_OPTIONS, max_size=8), _IMAGES, st.lists(_FLAGS, max_size=5, unique_by=lambda f: f[0]),
       st.sampled_from(["Qwen/Qwen2.5-7B", "/models/llama", "/data/x"]))
def test_import_export_import_is_the_same(options: list[tuple[str, str | None]], image: str,
                                          flags: list[list[str]], model: str) -> None:
    argv = ["docker", "run"]
    for opt, val in options:
        argv += [opt] if val is None else [opt, val]
    argv += [image, "--model", model, *(t for f in flags for t in f)]
    read = read_command_line(shlex.join(argv), BUILTIN)
    assert read.docker is not None and list(read.docker.options) == options and read.docker.image == image
    for multiline in (False, True):
        docker_line = read.flags.to_docker_line(docker=read.docker, multiline=multiline)
        again = read_command_line(docker_line, BUILTIN)
        assert again.flags == read.flags.unset("host")
        assert again.docker == read.docker
    for line in (read.flags.to_serve_line(), read.flags.to_serve_line(multiline=True)):
        assert parse_command_line(line, BUILTIN) == read.flags
    back = json.loads(json.dumps(read.flags.to_dict()))
    from engine.flags import FlagSet

    assert FlagSet.from_dict(back, BUILTIN) == read.flags
