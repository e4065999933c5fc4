"""Processes by PID on Linux (/proc): a process's tree, a session's members, the processes naming a path, killing
and awaiting sets of them, and a thread to start long-lived children from. The ray backend's local cluster
(ray_cluster.py) stops its nodes with these, and the tests check with them that nothing is left."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def descendants(pid: int) -> set[int]:
    """`pid`'s children, grandchildren, ... now (Linux /proc); empty when it is gone."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in _listdir(f"/proc/{parent}/task"):
            with contextlib.suppress(OSError):
                children = {int(c) for c in Path(f"/proc/{parent}/task/{task}/children").read_text().split()}
                todo += children - found
                found |= children
    return found


def pids_naming(text: str) -> set[int]:
    """Processes whose command line contains `text` (e.g. a private Ray temp dir)."""
    needle = text.encode()
    found = set()
    for entry in _listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.add(int(entry))
    return found - {os.getpid()}


def session_members(sessions: set[int]) -> set[int]:
    """Processes in these sessions (not zombies): a process started with die_with_parent (which calls setsid) and
    everything it starts stay in its session, even once orphaned by a killed parent."""
    found = set()
    for entry in _listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) in sessions and fields[0] != "Z":  # state, ppid, pgrp, session
                    found.add(int(entry))
    return found - {os.getpid()}


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """Block until every pid has exited (pidfd, no polling) or `timeout_s` passes; returns those still there."""
    deadline = time.monotonic() + timeout_s
    left = set()
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):
            continue
        try:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                left.add(pid)
        finally:
            os.close(fd)
    return left


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


class SpawnThread:
    """One long-lived thread that starts children: PR_SET_PDEATHSIG (die_with_parent) fires when the *thread* that
    forked a child ends, so a child started from a short-lived worker thread (asyncio.to_thread) would die with it.
    `run(make)` calls `make` on this thread and returns its result (or raises its exception)."""

    def __init__(self, name: str = "ray-cluster-spawner") -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            make, answer = job
            try:
                answer.put((make(), None))
            except Exception as exc:
                answer.put((None, exc))

    def run(self, make: Callable[[], Any]) -> Any:
        answer: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._jobs.put((make, answer))
        result, error = answer.get()
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)


class SessionWatchdog:
    """A process that outlives its owner just long enough to kill the sessions the owner told it about: what
    PR_SET_PDEATHSIG cannot do for grandchildren (Ray's raylet does not take its agents down with it when killed).

    It reads session ids on stdin, one a line (`-<id>` forgets one), and on end of file (the owner closed the pipe,
    or died and the kernel closed it) kills every process left in those sessions, then exits. It runs in a session
    of its own, so a terminal's Ctrl-C reaches only the owner, which stops its children in order."""

    def __init__(self, stop_timeout_s: float = 10.0) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # where `gateway` is importable from
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        self.stop_timeout_s = stop_timeout_s
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )

    def watch(self, session: int) -> None:
        self._send(f"{session}")

    def forget(self, session: int) -> None:
        """Its processes are gone: a later process reusing the id must not be killed."""
        self._send(f"-{session}")

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """End of file: it kills what is left of the sessions and exits."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=self.stop_timeout_s + 5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def kill_sessions_at_eof(lines: Iterable[str], timeout_s: float = 10.0) -> None:
    """The watchdog's body: collect session ids until the input ends, then kill their members until none is left
    (a member may fork while the others are killed: look again, a few rounds)."""
    sessions: set[int] = set()
    for line in lines:
        session = int(line)
        if session < 0:
            sessions.discard(-session)
        else:
            sessions.add(session)
    for _ in range(5):
        members = session_members(sessions)
        if not members:
            return
        kill_all(members)
        wait_gone(members, timeout_s)


if __name__ == "__main__":
    kill_sessions_at_eof(sys.stdin)
