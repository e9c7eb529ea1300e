"""The processes vtui started, as the event loop and the end of vtui see them: :class:`Child`, a
child process the loop can wait on; :data:`OWNED`, the servers this process started; and the hooks
that stop them when vtui ends (atexit, SIGTERM, SIGHUP), except those left running on purpose.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import weakref
from typing import Protocol


class Owned(Protocol):
    """What the end of vtui needs of a server it started: stop it now, synchronously (a server
    the user chose to leave running is left)."""

    def kill_sync(self) -> None: ...


OWNED: weakref.WeakSet[Owned] = weakref.WeakSet()
"""The servers this process started and has not stopped (a Supervisor adds itself at its launch)."""
_HOOKS_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def cleanup_all() -> None:
    """Stop (synchronously) every server this process started, except those left running."""
    for sup in list(OWNED):
        sup.kill_sync()


def _on_signal(signum: int, frame: object) -> None:
    cleanup_all()
    # Dying of the signal skips atexit: write what open history runs still queue (up to
    # the last 0.25 s of requests) and mark them cut short now.
    writer = sys.modules.get("engine.runs.writer")  # the run recorders History.start_run opened
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.finish_open_runs()
    # Then die of the same signal, as the default action would have.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_cleanup_hooks() -> None:
    """atexit + SIGTERM/SIGHUP handlers that stop our servers; idempotent.

    A handler is only installed where none was (SIG_DFL), so an application's own handler
    (which should call ``cleanup_all``) is never replaced. SIGINT raises KeyboardInterrupt,
    which unwinds to the atexit hook.
    """
    global _HOOKS_INSTALLED
    with _HOOKS_LOCK:
        if _HOOKS_INSTALLED:
            return
        _HOOKS_INSTALLED = True
        atexit.register(cleanup_all)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) == signal.SIG_DFL:
                    signal.signal(sig, _on_signal)


class Child:
    """A child process the event loop can wait for, with the part of asyncio's Process we use.

    Its exit is seen at once through a pidfd (Linux 5.3+), else by polling every 50 ms.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        rc = self._popen.poll()
        if rc is not None:
            return rc
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = None
        if pidfd is None:
            while (rc := self._popen.poll()) is None:
                await asyncio.sleep(0.05)
            return rc
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        loop.add_reader(pidfd, exited.set)
        try:
            while (rc := self._popen.poll()) is None:
                await exited.wait()
                exited.clear()
            return rc
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    def kill(self) -> None:
        if self._popen.poll() is None:  # never a signal to a pid that was reaped and reused
            self._popen.kill()


__all__ = ["OWNED", "Child", "Owned", "cleanup_all", "install_cleanup_hooks"]
