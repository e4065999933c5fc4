"""Child processes that die with their parent: no orphaned servers or instances, even after kill -9; and processes
that leave quickly once their work is done."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn, Protocol

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """For `Popen(preexec_fn=...)`: SIGKILL when the parent (the thread that forked) dies, and a new session so
    a terminal's Ctrl-C reaches only the parent, which then stops its children in order. With `parent` (the pid
    that forked us), a parent already gone before the signal was set (killed between its fork and this call) ends
    us at once: its death signal never comes, and we would run on as an orphan."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    os.setsid()


def dies_with_us() -> Callable[[], None]:
    """For `Popen(preexec_fn=...)`: `die_with_parent` told our pid, so that a child whose parent (we) died between
    its fork and its call ends at once rather than run on as an orphan."""
    return functools.partial(die_with_parent, os.getpid())


class Stoppable(Protocol):
    """What `stop_process` needs of a process: a `subprocess.Popen`, or one that stands for it (the process backend's
    `ForkedProcess`)."""

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def stop_process(proc: Stoppable, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout_s`; always reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quick_exit(code: int, *, join_s: float = 5.0) -> NoReturn:
    """End a process whose work is done without the interpreter's teardown: with torch imported, that teardown
    (module and C++ finalisers) took 0.8-1.2 s here, paid by every instance, actor and job that stops. What a normal
    exit does before it still happens: other (non-daemon) threads are waited for, up to `join_s` (one still running
    then: the normal exit, which waits as long as it takes), atexit handlers run (an embedded Redis is stopped), and
    logs and stdio are flushed."""
    deadline = time.monotonic() + join_s
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() and not t.daemon and t is not threading.current_thread() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # CPython's own: what follows them in a normal exit is the teardown skipped here
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
