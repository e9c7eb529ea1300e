"""The server's own account of the config it resolved: vLLM's ``vllm:*_config_info`` gauges.

vLLM publishes parts of its resolved config as an "info" gauge, set to 1, whose labels are the
config's fields (0.32.0 publishes ``vllm:cache_config_info``, one series per engine). A label
named as a flag (``block_size`` for ``--block-size``) is that flag's value on the server with
its defaults resolved: what the Flags tab shows for a flag the command line left out (vLLM
0.32.0 on the CPU: ``enable_prefix_caching="True"``, ``block_size="128"``, both None in its
parser). Labels of another kind (``kv_cache_size_tokens``, ``engine``) name no flag and are
left out; ``"None"`` says the server has no value and is left out too.

The labels are read where /metrics is read: ``engine.telemetry.metrics.parse_metrics``
(``ServerSample.cache_config``) and ``engine.server.attach`` (``AttachedServer.cache_config``),
both of ``vllm:cache_config_info``, the one such gauge vLLM 0.32.0 publishes.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from engine.flags import FlagError, FlagValue, Schema

# Config fields named otherwise than their flag (CacheConfig.cache_dtype is --kv-cache-dtype).
FIELD_FLAGS: Mapping[str, str] = {"cache_dtype": "kv-cache-dtype"}


def _python_value(text: str) -> object:
    # vLLM writes each label with str(): a list or a dict as Python writes it, not as JSON.
    return ast.literal_eval(text)


def server_values(infos: Mapping[str, Mapping[str, str]], schema: Schema) -> dict[str, FlagValue]:
    """Flag name -> the value the server reports for it, typed by the flag's spec, from the
    labels of its ``*_config_info`` gauges, by gauge name (``{CACHE_CONFIG:
    ServerSample.cache_config}``). A label that names no flag of ``schema``, a private one
    (``_block_size_resolved``), ``"None"`` and a text the flag would not accept are left out;
    where two gauges name one flag, the first wins."""
    out: dict[str, FlagValue] = {}
    for labels in infos.values():
        for label, text in labels.items():
            if label.startswith("_") or text == "None":
                continue
            name = FIELD_FLAGS.get(label) or schema.canonical(label.replace("_", "-"))
            spec = schema.get(name) if name is not None else None
            if spec is None or spec.name in out:
                continue
            try:
                value = spec.coerce(_python_value(text) if spec.kind in ("list", "json") else text)
            except (FlagError, ValueError, SyntaxError):
                continue
            if value is not None:
                out[spec.name] = value
    return out
