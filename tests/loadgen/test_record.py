"""`vtui record` between `vtui bench` (and a few raw clients) and loadgen's test server: everything
passes through, the generation requests are recorded (no header value, no prompt text), SIGTERM
stops it with every line written, and the recording replays with the same count, lengths and
outputs and the recorded gaps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.record import Recorder, _Pending, chained_hashes, summarize
from loadgen.testserver import ServerConfig, free_port, serve_in_thread
from loadgen.traceformats import read_trace
from tui.cli import main

SECRET = "sk-vtui-record-test-0123456789"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_in_thread(ServerConfig(first_delay_s=0.002, max_model_len=2048)) as u:
        yield u


def _start(upstream: str, out: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "record", "--upstream", upstream, "--port", str(port),
                             "--out", str(out), "-q", *extra],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "proxy at" in line, line
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> str:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


@pytest.fixture(scope="module")
def recording(server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "traffic.jsonl"
    proc, proxy = _start(server, out)
    try:
        assert main(["bench", "--url", proxy, "--allow-box-bound", "--input-len", "40", "--output-len", "5",
                     "--concurrency", "2", "--num-requests", "6", "-q", "--no-history"]) == 0
        assert main(["bench", "--url", proxy, "--allow-box-bound", "--dataset-name", "chat", "--num-turns", "2",
                     "--input-len", "30", "--output-len", "4", "--concurrency", "2", "--num-requests", "4", "-q",
                     "--no-history"]) == 0
        with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {SECRET}"}) as c:
            r = c.post("/v1/completions", json={"model": "test-model", "prompt": "not streamed " * 4, "max_tokens": 7,
                                                "temperature": 0.5})
            # (the test server answers stream=false with SSE too: a JSON body is read in test_json_body_usage)
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and r.text.count('"text":"a"') == 7
            r = c.post("/v1/completions", json={"model": "mode=status=503", "prompt": "fails", "max_tokens": 3})
            assert r.status_code == 503 and "test server says 503" in r.text  # the error passes through
            assert c.get("/v1/models").status_code == 200  # passed through, not recorded
        # A client that goes away mid-response (the server sent its head, then nothing).
        host, port = proxy.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            body = json.dumps({"model": "mode=hang", "prompt": "left behind", "max_tokens": 5, "stream": True})
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      f"content-length: {len(body)}\r\n\r\n{body}".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.3)
    finally:
        _stop(proc)
    return out


def test_the_recording_holds_every_generation_request_and_no_secret(recording: Path) -> None:
    text = recording.read_text()
    assert SECRET not in text and "Bearer" not in text and "not streamed" not in text
    lines = [json.loads(x) for x in text.splitlines()]
    header, rows = lines[0], lines[1:]
    assert header["vtui_recording"] == 1 and header["block_size"] == 16
    assert len(rows) == 6 + 4 + 3  # bench completions, chat turns, non-stream, error, cancelled
    by = sorted(rows, key=lambda r: r["timestamp"])
    assert by[0]["timestamp"] == 0.0
    assert [r["endpoint"] for r in by].count("chat") == 4
    outcomes = {r["outcome"] for r in rows}
    assert outcomes == {"ok", "error", "cancelled"}
    err = next(r for r in rows if r["outcome"] == "error")
    assert err["status"] == 503
    plain = next(r for r in rows if r["stream"] is False and r["outcome"] == "ok")
    assert plain["output_tokens"] == 7 and plain["temperature"] == 0.5 and plain["input_len"] == len("not streamed " * 4)
    bench = [r for r in by if r["endpoint"] == "completions" and r["stream"]][:6]
    assert {(r["input_len"], r["output_tokens"]) for r in bench} == {(40, 5)}
    assert all(len(r["hash_ids"]) == 3 for r in bench)  # 40 tokens: 16 + 16 + 8
    chat = [r for r in by if r["endpoint"] == "chat"]
    assert {r["turn"] for r in chat} == {1, 2} and len({r["conversation"] for r in chat}) == 2
    # A chat answer's text tokenized again (the test server: a byte a token, "a" each): what the next turn resends.
    assert all(r["answer_tokens"] == r["output_tokens"] == 4 for r in chat)
    # A second turn carries the first: its leading block hashes are the first turn's.
    for conv in {r["conversation"] for r in chat}:
        t1, t2 = sorted((r for r in chat if r["conversation"] == conv), key=lambda r: r["turn"])
        assert t2["hash_ids"][: len(t1["hash_ids"]) - 1] == t1["hash_ids"][:-1]


def test_the_recording_replays(server: str, recording: Path, tmp_path: Path) -> None:
    tf = read_trace(recording)
    assert tf.format == "vtui-recording" and tf.block_size == 16
    reqs = tmp_path / "r.jsonl"
    assert main(["bench", "--url", server, "--allow-box-bound", "--dataset-name", "trace", "--dataset", str(recording),
                 "-q", "--no-history", "--requests-file", str(reqs)]) == 0
    got = sorted((json.loads(x) for x in reqs.read_text().splitlines()), key=lambda r: r["t_start"])
    assert len(got) == len(tf.rows) == 13
    # (the chat turns ride in their sessions, with the replayed answers: the lengths are the recorded ones).
    # As a multiset: one session's second turn and the other's first were recorded milliseconds apart, and on a
    # busy box (the suite's side-by-side half) their sends can swap; the offsets below hold each to its time.
    assert sorted((r["input_tokens"], r["output_tokens"]) for r in got) == sorted(
        (r.input_len, r.output_len) for r in tf.rows)
    # Each send at its recorded offset from the first: never early, none late by more than an event-loop
    # hiccup on a busy box (6.5 ms was seen on CI's 2 cores), and no drift (the median within 5 ms).
    offsets = [r["t_start"] - got[0]["t_start"] for r in got]
    want = [r.at_s - tf.rows[0].at_s for r in tf.rows]
    late = [o - w for o, w in zip(offsets, want, strict=True)]
    assert min(late) > -0.002 and max(late) < 0.05, late
    assert statistics.median(abs(x) for x in late) < 0.005, late


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_conversations_later_turns_carry_the_replayed_answers(server: str, tmp_path: Path, endpoint: str) -> None:
    """Bailian's sample holds one conversation of three turns: replayed (through the recorder, prompts
    kept, to read what was sent), each later turn carries the turns before and the server's answers."""
    out = tmp_path / "replay.jsonl"
    proc, proxy = _start(server, out, "--keep-prompts")
    try:
        assert main(["bench", "--url", proxy, "--allow-box-bound", "--dataset-name", "trace", "--dataset",
                     str(Path(__file__).parents[1] / "data" / "traces" / "bailian.jsonl"), "--endpoint", endpoint,
                     "-q", "--no-history"]) == 0
    finally:
        _stop(proc)
    rows = [json.loads(x) for x in out.read_text().splitlines()[1:]]
    conv = sorted((r for r in rows if r["output_tokens"] != 4), key=lambda r: r["timestamp"])
    assert [r["output_tokens"] for r in conv] == [6, 5, 3]
    if endpoint == "completions":
        p1, p2, p3 = (r["prompt"] for r in conv)
        assert p2.startswith(p1 + "a" * 6) and p3.startswith(p2 + "a" * 5)  # the test server answers "a"s
        assert [len(p) for p in (p1, p2, p3)] == [40, 70, 90]  # the recorded lengths (a byte a token)
    else:
        m1, m2, m3 = (r["messages"] for r in conv)
        assert m2[:2] == [*m1, {"role": "assistant", "content": "a" * 6}] and m3[:4] == [
            *m2, {"role": "assistant", "content": "a" * 5}]
        assert len({r["conversation"] for r in conv}) == 1 and [r["turn"] for r in conv] == [1, 2, 3]


def test_a_tokenizer_of_its_own_asks_the_server_nothing(server: str, tmp_path: Path, tiny_model: Path) -> None:
    """--tokenizer: token counts come from the proxy's tokenizer (the tiny model's), not the test
    server's /tokenize (which counts bytes); a bad path is refused with the reason."""
    from loadgen.tokens import LocalTokenizer

    out = tmp_path / "tok.jsonl"
    proc, proxy = _start(server, out, "--tokenizer", str(tiny_model))
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    try:
        with httpx.Client(base_url=proxy) as c:
            assert c.post("/v1/completions", json={"model": "test-model", "prompt": prompt, "max_tokens": 3,
                                                   "stream": True}).status_code == 200
    finally:
        _stop(proc)
    head, row = (json.loads(x) for x in out.read_text().splitlines())
    assert "the proxy's tokenizer" in head["tokens_from"]
    assert row["input_len"] == len(LocalTokenizer(tiny_model).encode(prompt)) != len(prompt)
    r = subprocess.run([sys.executable, "-m", "tui.cli", "record", "--upstream", server, "--out",
                        str(tmp_path / "x.jsonl"), "--tokenizer", str(tmp_path / "nothing-here")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--tokenizer" in r.stderr and "no tokenizer found" in r.stderr


def test_summary_says_the_shape(recording: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = summarize(recording)
    assert s.requests == 13 and s.outcomes == {"ok": 11, "error": 1, "cancelled": 1}
    assert s.reuse is not None and 0.02 < s.reuse < 0.5  # a second chat turn resends the first (a 16-token block of it)
    assert s.concurrency is not None and s.concurrency > 0
    assert main(["record", "--summary", str(recording)]) == 0
    out = capsys.readouterr().out
    assert "prefix reuse:" in out and "nearest shipped preset:" in out


def test_json_body_usage_and_text() -> None:
    rec = Recorder("http://127.0.0.1:9", "/nonexistent/never-opened.jsonl")
    doc = {"choices": [{"text": "abc"}], "usage": {"prompt_tokens": 3, "completion_tokens": 11}}
    p = _Pending(t=0.0, endpoint="completions", body=b"{}", auth=None, payload=bytearray(json.dumps(doc).encode()))
    assert asyncio.run(rec._output_tokens(p, "m")) == (11, None)  # usage counts; no answer asked for


def test_chunked_framing_is_followed_however_the_bytes_fall() -> None:
    from loadgen.record import _Chunked

    msg = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nx-trailer: y\r\n\r\n"
    for cut in range(1, len(msg)):  # every place a read can end, and one byte at a time
        for parts in ((msg[:cut], msg[cut:]), [msg[k:k + 1] for k in range(len(msg))]):
            c = _Chunked()
            got = b"".join(c.feed(p) for p in parts)
            assert got == b"helloabc" and c.done
    c = _Chunked()
    assert c.feed(b"5\r\nhel") == b"hel" and not c.done
    with pytest.raises(ValueError):
        _Chunked().feed(b"zz\r\n")  # not a hex size


def test_hashes_are_chained_and_salted() -> None:
    a = chained_hashes(list(range(40)), 16, b"salt")
    b = chained_hashes([*range(16), 99, *range(17, 40)], 16, b"salt")
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]  # a change reaches every later block
    assert chained_hashes(list(range(40)), 16, b"other")[0] != a[0]


def test_sigint_stops_it_too_and_a_bad_upstream_is_refused(server: str, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    proc, _proxy = _start(server, out)
    err = _stop(proc, signal.SIGINT)
    assert "recorded 0 requests" in err
    assert json.loads(out.read_text().splitlines()[0])["vtui_recording"] == 1
    r = subprocess.run([sys.executable, "-m", "tui.cli", "record", "--upstream", "https://u:pw@example.com",
                        "--out", str(tmp_path / "x.jsonl")], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 2 and "needs an http://HOST:PORT URL" in r.stderr and "pw" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "tui.cli", "record", "--upstream", server, "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "never written over" in r.stderr
