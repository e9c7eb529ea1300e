"""Speed of light: how far a run is from what its GPU can physically do.

A decode step reads every weight once and the KV cache of every running sequence, so it
cannot take less than ``bytes / memory bandwidth`` (nor less than ``FLOPs / peak FLOPS``,
which binds only at large batches). :func:`decode_floor` gives that floor for a batch and
a context length; :func:`assess` sets a run's measured step time (its TPOT) against it as
memory-bandwidth utilization (MBU), and a prefill's FLOPs against its TTFT as model-FLOPs
utilization (MFU). Far below the floor at a small batch means the step is bound by kernel
launches or scheduling, not by memory.

Peaks are keyed by NVML's device name (:data:`GPU_PEAKS`, each with its source); a GPU not
in the table takes its peaks from the user (``vtui bench --peak-bw-tbs/--peak-tflops``).
Dense bf16 tensor FLOPS, no sparsity. Per GPU: under tensor parallelism each GPU reads its
share of the weights and of the KV heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import cast

from engine.modelconfig import ModelConfig
from engine.server.planner import PlanError, kv_bytes_per_token, load_model_config, weight_bytes
from engine.values import as_float, as_int


@dataclass(frozen=True)
class GpuPeaks:
    """One GPU model's peak memory bandwidth (bytes/s) and dense bf16 FLOPS, with the source."""

    name: str
    mem_bw: float
    bf16_flops: float
    source: str


_DS = "NVIDIA datasheet"
# Matched against NVML's name in order: the first key contained in it wins (so the more
# specific names come first).
GPU_PEAKS: tuple[tuple[str, GpuPeaks], ...] = (
    ("H200", GpuPeaks("H200", 4.8e12, 989e12, f"{_DS}, H200 SXM: 4.8 TB/s, 989 TFLOPS bf16 dense")),
    ("H100 PCIe", GpuPeaks("H100 PCIe", 2.0e12, 756e12, f"{_DS}, H100 PCIe: 2.0 TB/s, 756 TFLOPS bf16 dense")),
    ("H100 NVL", GpuPeaks("H100 NVL", 3.9e12, 835e12, f"{_DS}, H100 NVL: 3.9 TB/s, 835 TFLOPS bf16 dense")),
    ("H100", GpuPeaks("H100 SXM", 3.35e12, 989e12, f"{_DS}, H100 SXM: 3.35 TB/s, 989 TFLOPS bf16 dense")),
    ("A100-SXM4-80GB", GpuPeaks("A100 80GB SXM", 2.039e12, 312e12,
                                f"{_DS}, A100 80GB SXM: 2,039 GB/s, 312 TFLOPS bf16 dense")),
    ("A100 80GB PCIe", GpuPeaks("A100 80GB PCIe", 1.935e12, 312e12,
                                f"{_DS}, A100 80GB PCIe: 1,935 GB/s, 312 TFLOPS bf16 dense")),
    ("A100", GpuPeaks("A100 40GB", 1.555e12, 312e12, f"{_DS}, A100 40GB: 1,555 GB/s, 312 TFLOPS bf16 dense")),
    ("L40S", GpuPeaks("L40S", 864e9, 362e12, f"{_DS}, L40S: 864 GB/s, 362 TFLOPS bf16 dense")),
    ("A10G", GpuPeaks("A10G", 600e9, 70e12, "AWS G5 documentation, A10G: 600 GB/s, 70 TFLOPS bf16 dense")),
    ("L4", GpuPeaks("L4", 300e9, 121e12, f"{_DS}, L4: 300 GB/s, 121 TFLOPS bf16 dense")),
    ("RTX 4090", GpuPeaks("RTX 4090", 1.008e12, 165.2e12,
                          "NVIDIA Ada whitepaper, RTX 4090: 1,008 GB/s, 165.2 TFLOPS bf16 (fp32 accumulate)")),
    ("B200", GpuPeaks("B200", 8.0e12, 2.25e15, f"{_DS}, HGX B200: 8 TB/s, 2.25 PFLOPS bf16 dense")),
)


def peaks_for(gpu_name: str | None, *, mem_bw_tbs: float | None = None,
              tflops: float | None = None) -> GpuPeaks | None:
    """The table's peaks for an NVML name, or the user's (both figures), or None."""
    if mem_bw_tbs is not None and tflops is not None:
        if not (mem_bw_tbs > 0 and tflops > 0):
            raise ValueError("peak bandwidth and TFLOPS must be > 0")
        return GpuPeaks(gpu_name or "given", mem_bw_tbs * 1e12, tflops * 1e12, "given by the user")
    if gpu_name:
        for key, peaks in GPU_PEAKS:
            if key.lower() in gpu_name.lower():
                return peaks
    return None


@dataclass(frozen=True)
class ModelCost:
    """What one token costs the model: bytes of weights per GPU, KV bytes per token per GPU,
    FLOPs per token of the dense layers (2 x parameters) and of attention per context token."""

    weight_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    flops_per_token: float
    attn_flops_per_token_per_ctx: float  # QK^T and AV: 4 x layers x heads x head_dim per context token
    tp: int

    @classmethod
    def of(cls, model: ModelConfig, *, weight_bytes: float, kv_bytes_per_token: float, tp: int = 1) -> ModelCost:
        """``weight_bytes``: all GPUs together; ``kv_bytes_per_token``: on one GPU (planner's)."""
        tp = max(1, tp)
        attn = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim
        return cls(weight_bytes / tp, float(kv_bytes_per_token), 2.0 * model.num_params, attn, tp)


def decode_floor(cost: ModelCost, peaks: GpuPeaks, batch: float, context: float) -> tuple[float, float, str]:
    """(floor seconds per decode step, bytes one GPU reads in it, what binds: memory/compute)."""
    bytes_read = cost.weight_bytes_per_gpu + batch * context * cost.kv_bytes_per_token_per_gpu
    flops = batch * (cost.flops_per_token + cost.attn_flops_per_token_per_ctx * context) / cost.tp
    t_mem, t_flops = bytes_read / peaks.mem_bw, flops / peaks.bf16_flops
    return max(t_mem, t_flops), bytes_read, "memory" if t_mem >= t_flops else "compute"


def prefill_flops(cost: ModelCost, prompt: float) -> float:
    """FLOPs of one prompt's prefill on one GPU (causal attention: half the square)."""
    return (prompt * cost.flops_per_token + cost.attn_flops_per_token_per_ctx * prompt * prompt / 2) / cost.tp


@dataclass(frozen=True)
class SpeedOfLight:
    """A run against its GPU's limits (see the module's text). Times in milliseconds."""

    gpu: str
    batch: float
    context: float
    step_ms: float | None  # measured: the run's TPOT (median)
    floor_ms: float
    bound: str  # what the floor is set by: memory or compute
    mbu: float | None  # bytes the step must read / (step time x bandwidth)
    prefill_mfu: float | None  # one prompt's FLOPs / (TTFT x peak): a lower bound, TTFT includes queueing
    launch_bound: bool  # far below the floor at a small batch
    source: str

    def line(self) -> str:
        step = "n/a" if self.step_ms is None else f"{self.step_ms:.1f} ms"
        mbu = "" if self.mbu is None else f", MBU {self.mbu * 100:.0f}%"
        mfu = "" if self.prefill_mfu is None else f", prefill MFU {self.prefill_mfu * 100:.0f}%"
        why = "; launch- or scheduling-bound at this batch" if self.launch_bound else ""
        return (f"decode step {step}, floor {self.floor_ms:.1f} ms ({self.bound}-bound at batch {self.batch:.0f},"
                f" context {self.context:.0f}){mbu}{mfu} on {self.gpu}{why}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# Below this MBU at a batch this small, the step waits on something other than memory.
LAUNCH_BOUND_MBU = 0.3
LAUNCH_BOUND_BATCH = 8


def assess(cost: ModelCost, peaks: GpuPeaks, load: Mapping[str, object], *, mean_running: float | None) -> SpeedOfLight:
    """Set a run's figures (vllm-bench keys in ``load``) against the floor.

    Batch: the server's mean running requests over the window (else, by Little's law,
    requests/s x mean E2EL); context: mean prompt plus half the mean output (the average length a
    decode step attends to); step: the median TPOT.
    """
    done = as_float(load.get("completed") or 0)
    prompt = as_float(load.get("total_input_tokens") or 0) / done if done else 0.0
    output = as_float(load.get("total_output_tokens") or 0) / done if done else 0.0
    if not (mean_running and mean_running > 0):  # Little's law: requests/s x mean time in the system
        mean_running = as_float(load.get("request_throughput") or 0) * as_float(load.get("mean_e2el_ms") or 0) / 1000
    batch = mean_running or 1.0
    batch = max(1.0, batch)
    context = prompt + output / 2
    floor_s, bytes_read, bound = decode_floor(cost, peaks, batch, context)
    tpot = load.get("median_tpot_ms")
    step_ms = float(tpot) if isinstance(tpot, (int, float)) and tpot > 0 and math.isfinite(tpot) else None
    mbu = bytes_read / (step_ms / 1000 * peaks.mem_bw) if step_ms else None
    ttft = load.get("mean_ttft_ms")
    mfu = None
    if isinstance(ttft, (int, float)) and ttft > 0 and prompt > 0:
        mfu = prefill_flops(cost, prompt) / (ttft / 1000 * peaks.bf16_flops)
    launch = mbu is not None and mbu < LAUNCH_BOUND_MBU and batch <= LAUNCH_BOUND_BATCH
    return SpeedOfLight(peaks.name, batch, context, step_ms, floor_s * 1000, bound, mbu, mfu, launch, peaks.source)


def for_run(model: str | None, flags: Mapping[str, object], gpu_name: str | None, load: Mapping[str, object], *,
            mean_running: float | None, peak_bw_tbs: float | None = None,
            peak_tflops: float | None = None) -> SpeedOfLight | str:
    """A run's speed of light, or why there is none (no GPU, a GPU not in the table, a
    model whose config.json vtui cannot read). ``flags``: the run's (tp, dtype, quantization)."""
    if not gpu_name and peak_bw_tbs is None:
        return "no GPU: the speed of light is a GPU's"
    peaks = peaks_for(gpu_name, mem_bw_tbs=peak_bw_tbs, tflops=peak_tflops)
    if peaks is None:
        return f"{gpu_name!r} is not in the peak table: give --peak-bw-tbs and --peak-tflops"
    if not model:
        return "the model is not known"
    try:
        config = load_model_config(model)
        tp = as_int(flags.get("tensor-parallel-size") or 1)
        # --quantization is text (a FlagSet choice, or the history's JSON): passed on as the run holds it.
        quant = cast("str | None", flags.get("quantization"))
        dtype = str(flags.get("dtype") or "auto")
        cost = ModelCost.of(config, weight_bytes=weight_bytes(config, dtype=dtype, quantization=quant or None),
                            kv_bytes_per_token=kv_bytes_per_token(
                                config, kv_cache_dtype=str(flags.get("kv-cache-dtype") or "auto"), dtype=dtype,
                                tensor_parallel_size=tp), tp=tp)
    except (PlanError, ValueError, OSError) as exc:
        return f"cannot read the model's config ({exc})"
    return assess(cost, peaks, load, mean_running=mean_running)


__all__ = ["GPU_PEAKS", "GpuPeaks", "ModelCost", "SpeedOfLight", "assess", "decode_floor", "for_run", "peaks_for",
           "prefill_flops"]
