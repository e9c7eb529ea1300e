"""Per-request records: what is sent (``PlannedRequest``) and what came back (``RequestResult``)."""

from __future__ import annotations

from dataclasses import dataclass

# A stream with multi-turn sessions numbers its requests arrival x TURN_IDS + turn (loadgen.worker),
# every one of them (a lone request is turn 0), so an id names its arrival and turn; else id = arrival.
TURN_IDS = 1000

# Failure reasons (RequestResult.error). Each is a key of RunResult.failures_by_reason.
HTTP_ERROR = "http_error"  # detail: "HTTP 503: <body excerpt>"
TIMEOUT = "timeout"
CONNECT_REFUSED = "connection_refused"
CONNECTION_RESET = "connection_reset"
MALFORMED_STREAM = "malformed_stream"
TRUNCATED_STREAM = "truncated_stream"
SHORT_OUTPUT = "short_output"  # fewer tokens than max_tokens although ignore_eos was set
NO_CHOICES = "no_choices"  # stream ended cleanly but never carried a token
CLIENT_ERROR = "client_error"  # anything else (a bug or an odd transport error), with detail

FAILURE_REASONS = (
    HTTP_ERROR, TIMEOUT, CONNECT_REFUSED, CONNECTION_RESET, MALFORMED_STREAM,
    TRUNCATED_STREAM, SHORT_OUTPUT, NO_CHOICES, CLIENT_ERROR,
)


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send. ``prompt`` for /v1/completions; ``messages`` for chat (the
    conversation so far; a session's later turns are built by the worker from the real
    replies, on either endpoint). ``at_s``: offset from the run start for trace replay, else None."""

    index: int
    input_len: int
    output_len: int
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    at_s: float | None = None
    session: int = -1  # chat: session id; turns of one session run in order
    turn: int = 0
    # chat: the user's next turns of this session (turn 0 carries them all)
    next_turns: tuple[str, ...] = ()
    # trace conversations: each next turn's (at_s, output_len), as recorded
    turn_plan: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request as the client saw it, with vLLM bench's definitions:

    ``ttft_s`` from just before the POST to the first SSE chunk carrying ``choices``;
    ``itl_s`` every gap between successive such chunks; ``e2el_s`` last chunk minus start;
    ``output_tokens``/``input_tokens`` from ``usage`` (``input_tokens`` falls back to the
    planned length when the server sent no usage). ``t_start`` is epoch seconds
    (time.time(), the clock telemetry uses); durations come from time.perf_counter.
    ``error`` is one of FAILURE_REASONS (None when ok); ``cancelled`` requests were in
    flight when the run was cancelled and are neither successes nor failures.
    """

    id: int
    t_start: float
    ttft_s: float
    itl_s: tuple[float, ...]
    e2el_s: float
    input_tokens: int
    output_tokens: int
    ok: bool
    error: str | None = None
    error_detail: str = ""
    cancelled: bool = False
    expected_input: int = 0
    expected_output: int = 0
    worker: int = 0
    new_conn: bool = False  # sent on a connection opened for it (fast transport)
    send_s: float = 0.0  # start to the request's bytes handed to the socket (connect included)
    # How long the first token waited in the socket before the client read it (fast transport on
    # Linux; -1 unknown): the client's own share of ttft_s (loadgen.client.first_read_delay).
    read_delay_s: float = -1.0
    # Another turn of its session follows (id + 1), sent as this one ends (or at its recorded time where
    # a trace keeps its own): what is in flight can be told before it comes back (engine.tune.windows).
    follows: bool = False

    @property
    def tpot_s(self) -> float:
        """(E2EL - TTFT) / (n - 1) when n > 1, else 0 (vLLM counts 0 for goodput)."""
        if self.output_tokens > 1:
            return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)
        return 0.0

    @property
    def t_end(self) -> float:
        return self.t_start + self.e2el_s

    def to_dict(self) -> dict[str, object]:
        """The per-request JSONL record."""
        return {
            "id": self.id,
            "t_start": round(self.t_start, 6),
            "ok": self.ok,
            "cancelled": self.cancelled,
            "error": self.error,
            "error_detail": self.error_detail,
            "ttft_ms": round(self.ttft_s * 1000, 3),
            "tpot_ms": round(self.tpot_s * 1000, 3),
            "e2el_ms": round(self.e2el_s * 1000, 3),
            "itl_ms": [round(x * 1000, 3) for x in self.itl_s],
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "expected_input_tokens": self.expected_input,
            "expected_output_tokens": self.expected_output,
            "worker": self.worker,
            "new_conn": self.new_conn,
            "send_ms": round(self.send_s * 1000, 3),
        }
