"""Child processes that die with their parent: no orphaned servers or instances, even after kill -9."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For `Popen(preexec_fn=...)`: SIGKILL when the parent (the thread that forked) dies, and a new session so
    a terminal's Ctrl-C reaches only the parent, which then stops its children in order."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()


def stop_process(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout_s`; always reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
