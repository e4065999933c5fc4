"""The client side of fork servers (protocol: contract/zygote.py): start one, ask it for processes, and watch
each through the part of `Popen`'s interface its users need (`ForkedProcess`). The process backend forks its
instances from these, and the control plane its serverful actors."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from contract.runtime_http import READY_PREFIX
from contract.zygote import (
    MAX_MESSAGE_BYTES,
    ZYGOTE_FD_ENV,
    ZYGOTE_MODULE,
    ZYGOTE_PRELOAD_ENV,
    SpawnRequest,
)
from gateway.backends.process.tree import SpawnThread
from host.lifetime import dies_with_us, stop_process

log = logging.getLogger("stellaris.gateway")

# After a failed start a server is not asked again for `retry_s`, doubled at each failed start in a row up to this
# many times `retry_s`: a start that timed out under load is retried, one that cannot work costs little.
RETRY_BACKOFF_CAP = 32


def first_line(stream: IO[bytes], timeout_s: float) -> str | None:
    """The first line a child writes on `stream` (stripped; "" when it closed it), or None when none came within
    `timeout_s`. poll(), not select(): select fails on descriptors numbered above 1,024, which a busy gateway
    reaches."""
    poller = select.poll()
    poller.register(stream, select.POLLIN)
    if not poller.poll(timeout_s * 1000):
        return None
    return stream.readline().decode(errors="replace").strip()


class ForkServerError(RuntimeError):
    """The fork server could not give an instance (it is gone, or the fork failed): start one the usual way."""


class _ServerGone(Exception):
    """The server's end of the control socket is closed: it died."""


def _message(sock: socket.socket, timeout_s: float | None) -> dict[str, object] | None:
    """The next message on a status socket; None when none came within `timeout_s`; {} when the server is gone."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))):
        return None
    try:
        raw = sock.recv(MAX_MESSAGE_BYTES)
    except OSError:
        return {}
    return json.loads(raw) if raw else {}


class ForkedProcess:
    """An instance the fork server forked. It is the server's child, not ours: its exit code comes over its status
    socket, and a server that dies takes it along (parent-death signal), which reads as a SIGKILL."""

    def __init__(self, pid: int, status: socket.socket, stdout: IO[bytes] | None, args: str) -> None:
        self.pid, self.stdout, self.args = pid, stdout, args
        self.returncode: int | None = None
        self._status = status
        self._lock = threading.Lock()

    def _collect(self, timeout_s: float | None) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            msg = _message(self._status, timeout_s)
            if msg is None:
                return
            code = msg.get("exit")
            self.returncode = code if isinstance(code, int) else -signal.SIGKILL
            self._status.close()

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._collect(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # Not yet reported gone: not yet reaped by the server either, so the pid is still this process's.
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One fork server, started at its first spawn (or `start_soon`) with `env`. Spawns are serialised. A start
    that fails is retried after `retry_s` (doubled at each failure in a row, up to RETRY_BACKOFF_CAP times)."""

    def __init__(
        self,
        python: str,
        cwd: str | None,
        env: Mapping[str, str],
        startup_timeout_s: float,
        preload: Sequence[str] = (),
        retry_s: float = 10.0,
    ) -> None:
        self.python, self.cwd, self.env, self.startup_timeout_s = python, cwd, dict(env), startup_timeout_s
        self.preload = tuple(preload)  # the modules it imports (none given: the function runtime's)
        self.retry_s = retry_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._lock = threading.Lock()
        # The server dies with the thread that started it (PR_SET_PDEATHSIG): one that lives as long as we do.
        self._spawner: SpawnThread | None = None
        self.unforkable = False  # an import started a thread or CUDA: it never will fork (its users stop asking)
        self.failed_starts = 0  # in a row
        self._retry_at = 0.0  # monotonic: no start is tried before

    @property
    def failed(self) -> bool:
        """Not to be asked now: it can never fork, or its last start failed and the wait before a retry runs."""
        return self.unforkable or time.monotonic() < self._retry_at

    def start_soon(self) -> None:
        """Start the server in the background, so that the first instance finds it ready (or nearly)."""

        def start() -> None:
            with self._lock, contextlib.suppress(ForkServerError):  # the first spawn says why
                self._ready()

        threading.Thread(target=start, name="fork-server-start", daemon=True).start()

    def _ready(self) -> socket.socket:
        """The control socket of a running server (under the lock): the one there is, else a new one's."""
        if self.failed:
            why = "an import in it started a thread or CUDA" if self.unforkable else "it failed to start just before"
            raise ForkServerError(f"the fork server is not asked: {why}")
        if self._proc is not None and self._proc.poll() is None and self._control is not None:
            return self._control
        self._close()
        return self._start()

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._spawner = self._spawner or SpawnThread("fork-server-spawner")
        env = {**self.env, ZYGOTE_FD_ENV: str(theirs.fileno()), ZYGOTE_PRELOAD_ENV: " ".join(self.preload)}
        try:
            with theirs:
                proc: subprocess.Popen[bytes] = self._spawner.run(
                    lambda: subprocess.Popen(
                        [self.python, "-m", ZYGOTE_MODULE],
                        cwd=self.cwd,
                        env=env,
                        pass_fds=(theirs.fileno(),),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        preexec_fn=dies_with_us(),
                    )
                )
        except OSError as exc:  # no such interpreter or working directory, out of processes
            ours.close()
            raise self._start_failed(f"{type(exc).__name__}: {exc}") from exc
        assert proc.stdout is not None
        line = first_line(proc.stdout, self.startup_timeout_s) or ""
        proc.stdout.close()  # the server points its stdout at stderr after this line
        if not line.startswith(READY_PREFIX):
            ours.close()
            stop_process(proc, 1.0)
            raise self._start_failed(f"{line or 'no READY line'}; see stderr above")
        self._proc, self._control, self.failed_starts = proc, ours, 0
        return ours

    def _start_failed(self, why: str) -> ForkServerError:
        wait_s = self.retry_s * min(2**self.failed_starts, RETRY_BACKOFF_CAP)
        self.failed_starts += 1
        self._retry_at = time.monotonic() + wait_s
        return ForkServerError(f"the fork server did not start ({why}); tried again in {wait_s:.0f} s")

    def spawn(self, request: SpawnRequest, *, stdout: int | None = None) -> ForkedProcess:
        """Fork a process for `request`; its stdout is `stdout` (a descriptor of ours, shared) or else a pipe
        (`ForkedProcess.stdout`). A server found dead as it is asked (killed a moment ago, not yet reaped) is
        replaced and asked again, once."""
        with self._lock:
            try:
                return self._ask(self._ready(), request, stdout)
            except _ServerGone:
                self._close()
            try:
                return self._ask(self._ready(), request, stdout)
            except _ServerGone as gone:
                self._close()
                raise ForkServerError(f"the fork server is gone: {gone}") from gone

    def _ask(self, control: socket.socket, request: SpawnRequest, stdout: int | None) -> ForkedProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_fd, write_fd = os.pipe() if stdout is None else (None, stdout)
        try:
            socket.send_fds(control, [json.dumps(request).encode()], [theirs.fileno(), write_fd])
        except OSError as exc:
            sent, gone = False, str(exc)
        else:
            sent, gone = True, "its socket closed"
        finally:
            # Before the wait: the server, then the child, holds the only other end, so the server's death reads as
            # the end of `ours` at once, not as silence until the startup timeout (62 s in a chaos run).
            theirs.close()
            if stdout is None:
                os.close(write_fd)
        msg = _message(ours, self.startup_timeout_s) if sent else {}
        pid = (msg or {}).get("pid")
        if not isinstance(pid, int):
            ours.close()
            if read_fd is not None:
                os.close(read_fd)
            if msg == {}:
                raise _ServerGone(gone)
            reason = (msg or {}).get("error") or "no answer"
            self.unforkable = self.unforkable or bool((msg or {}).get("unforkable"))  # it never will: stop asking
            raise ForkServerError(f"the fork server did not fork: {reason}")
        pipe = os.fdopen(read_fd, "rb") if read_fd is not None else None
        return ForkedProcess(pid, ours, pipe, request["title"])

    def _close(self) -> None:
        if self._control is not None:
            self._control.close()  # the server exits at this EOF, and its instances with it
            self._control = None
        if self._proc is not None:
            stop_process(self._proc, 5.0)
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._close()
            if self._spawner is not None:
                self._spawner.close()
                self._spawner = None
