"""A program in a pseudo-terminal, its screen read back as text (pyte emulates the terminal).

For tests that drive `vtui` as a user over SSH does: the real binary, a real terminal size,
keys as bytes, and the screen as the user sees it, not the app's widget tree.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping, Sequence

import pyte

KEYS = {"enter": b"\r", "escape": b"\x1b", "tab": b"\t", "up": b"\x1b[A", "down": b"\x1b[B",
        "right": b"\x1b[C", "left": b"\x1b[D", "ctrl+a": b"\x01", "ctrl+k": b"\x0b", "ctrl+c": b"\x03",
        "f1": b"\x1bOP", "backspace": b"\x7f"}


class PtyApp:
    """``argv`` running in a ``cols`` x ``rows`` pseudo-terminal, as its session leader."""

    def __init__(self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self._lock = threading.Lock()
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        full_env = {**os.environ, **(env or {}), "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        full_env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(list(argv), stdin=slave, stdout=slave, stderr=slave, env=full_env, cwd=cwd,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.stream.feed(data)

    def text(self) -> str:
        """The screen now, one line per row."""
        with self._lock:
            return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, pattern: str, timeout: float, *, gone: bool = False) -> str:
        """The screen once ``pattern`` (a regex) shows on it (or, with ``gone``, no longer does)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            found = re.search(pattern, text) is not None
            if found != gone:
                return text
            if self.proc.poll() is not None:
                raise AssertionError(f"the program ended (exit {self.proc.returncode}) waiting for {pattern!r}:\n{text}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{'still' if gone else 'never'} saw {pattern!r} within {timeout:.0f} s; "
                                     f"the screen:\n{text}")
            time.sleep(0.1)

    def press(self, *keys: str, pause: float = 0.15) -> None:
        """Keys by name (see KEYS) or as the text to type."""
        for key in keys:
            os.write(self.master, KEYS.get(key, key.encode()))
            time.sleep(pause)

    def close(self, timeout: float = 30.0) -> int | None:
        """Wait for the program to end (SIGHUP after ``timeout``, as a closed SSH session does)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGHUP)
            return self.proc.wait(15)
        finally:
            os.close(self.master)
