"""Process helpers for tests: what a process is (command line, parent), and waiting for any process (not only our
children) to exit, without polling."""

from __future__ import annotations

import os
import select
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone when /proc says so.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cmdline(pid: int) -> str:
    """The command line of `pid`, its arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def is_redis_server(pid: int) -> bool:
    """Whether `pid` is a redis-server: it rewrites its title ("/path/redis-server 127.0.0.1:PORT"), so the first
    word of its command line names it."""
    words = cmdline(pid).split()
    return bool(words) and Path(words[0]).name == "redis-server"


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` as /proc says (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def wait_pid_gone(pid: int, timeout_s: float) -> bool:
    """Block until `pid` exits (pidfd becomes readable) or `timeout_s` passes; True when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return bool(ready) or not pid_alive(pid)
    finally:
        os.close(fd)


def default_sigint() -> None:
    """For `Popen(preexec_fn=...)` in tests that press Ctrl-C: a shell that runs us in the background sets SIGINT to
    ignored, children inherit that, and Python then never raises KeyboardInterrupt; restore the default."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
