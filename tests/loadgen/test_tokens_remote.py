"""RemoteTokenizer against a loopback server that answers /tokenize badly: the error names
the endpoint and what was wrong (the real vLLM path is tests/real/test_loadgen_vllm.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadgen.tokens import RemoteTokenizer, TokenizerError


def _serve(reply: bytes) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("reply", "said"), [
    (b"<html>not json</html>", "/tokenize: the reply has no 'tokens'"),
    (json.dumps({"count": 3}).encode(), "/tokenize: the reply has no 'tokens'"),
    (json.dumps({"tokens": ["a", "b"]}).encode(), "/tokenize: 'tokens' is not a list of token ids"),
    (json.dumps([1, 2]).encode(), "the reply has no 'tokens'"),
])
def test_a_bad_tokenize_reply_is_named(reply: bytes, said: str) -> None:
    for url in _serve(reply):
        with pytest.raises(TokenizerError, match=said):
            RemoteTokenizer(url, "m")


def test_a_good_reply_gives_ids_and_the_model_length() -> None:
    for url in _serve(json.dumps({"tokens": [1, 2], "max_model_len": 2048}).encode()):
        tok = RemoteTokenizer(url, "m")
        assert tok.encode("hi") == [1, 2]
        assert tok.max_model_len == 2048
