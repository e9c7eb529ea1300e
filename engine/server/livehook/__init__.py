"""Live scheduler limits: change max-num-seqs, max-num-batched-tokens and chunked
prefill on a running vLLM server that vtui started, between two engine steps, without a restart.

Three parts, each in the process it runs in:

- ``plugin`` runs inside vLLM's processes (a ``vllm.general_plugins`` entry point, so vLLM loads
  it in the engine core it spawns). It does nothing unless the server's environment holds
  ``VTUI_LIVE=1``, which only vtui's launcher sets. There it gives the engine core one utility
  method, ``vtui_live``: the adapter, the one place that touches vLLM's scheduler, by the
  features it finds (not version numbers).
- ``asgi`` is the API server's side: ASGI middleware (vLLM's public ``--middleware``) serving
  ``/vtui/live`` and ``/vtui/reset-prefix-cache`` to requests straight from this machine that
  carry the per-launch key (``KEY_ENV``) and the server's API key, if it has one, and calling the
  engine's utility method the way vLLM's own ``reset_prefix_cache`` reaches the engine.
- ``engine.server.livelimits`` is vtui's side: which flags can change live, the request, and the
  reason a change must restart instead.

Only ``plugin`` and ``asgi`` import vLLM, and only inside vLLM's processes.
"""

from __future__ import annotations

ENV = "VTUI_LIVE"  # set to "1" in the environment of a server vtui starts
# The per-launch key, in the server's environment only (never argv); its name holds KEY so that
# vLLM's /server_info, where a user turns dev mode on, leaves it out.
KEY_ENV = "VTUI_LIVE_KEY"
HEADER = "X-Vtui-Key"  # the request header that carries it
# "1" where the user started the server with chunked prefill off themselves (it may go on live,
# where the model allows it); otherwise a started "off" is a ceiling like the numeric limits.
CHUNKED_OFF_BY_USER_ENV = "VTUI_LIVE_CHUNKED_OFF_BY_USER"
PLUGIN = "vtui_live"  # the entry point's name (VLLM_PLUGINS is an allowlist of these)
ROUTE = "/vtui/live"
RESET_ROUTE = "/vtui/reset-prefix-cache"
MIDDLEWARE = "engine.server.livehook.asgi.LiveLimitsMiddleware"
UTILITY = "vtui_live"  # the engine core's method

# The flags that can change live: one description each, in ``flags.LIVE``.
from engine.server.livehook.flags import (  # noqa: E402
    BY_NAME,
    CHUNKED_PREFILL,
    LIVE,
    LIVE_FLAGS,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    LiveFlag,
)

__all__ = ["BY_NAME", "CHUNKED_PREFILL", "LIVE", "LIVE_FLAGS", "MAX_NUM_BATCHED_TOKENS", "MAX_NUM_SEQS", "LiveFlag",
           "launch_env", "strip_launch_args"]

# What vtui's launcher adds to a server's argv: vLLM's public middleware option, naming ours. Never
# part of the user's flags (exports, history): ``strip_launch_args`` takes it out of a read command line.
LAUNCH_ARGS = ("--middleware", MIDDLEWARE)


def launch_env(environ: dict[str, str], key: str, *, chunked_off_by_user: bool = False) -> dict[str, str]:
    """What a server vtui starts gets in its environment for the live hook: ``VTUI_LIVE=1``, the
    per-launch ``key``, whether the user chose chunked prefill off and, where ``VLLM_PLUGINS``
    allowlists plugins, ours added to the list. The launcher decides whether the hook is wanted
    (``engine.server.launch.live_hook_refusal``)."""
    env = {ENV: "1", KEY_ENV: key, CHUNKED_OFF_BY_USER_ENV: "1" if chunked_off_by_user else "0"}
    allow = environ.get("VLLM_PLUGINS")
    if allow is not None and PLUGIN not in [p.strip() for p in allow.split(",")]:
        env["VLLM_PLUGINS"] = f"{allow},{PLUGIN}" if allow.strip() else PLUGIN
    return env


def strip_launch_args(argv: list[str]) -> list[str]:
    """A server's command line without what vtui's launcher added (``LAUNCH_ARGS``)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == LAUNCH_ARGS[0] and i + 1 < len(argv) and argv[i + 1] == MIDDLEWARE:
            i += 2
            continue
        if argv[i] == f"{LAUNCH_ARGS[0]}={MIDDLEWARE}":
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out
