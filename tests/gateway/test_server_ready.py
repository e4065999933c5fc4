"""`READY <port>` means the gateway accepts connections: a client that connects the moment it reads the line waits
in the backlog, never gets a refusal. The gateway is frozen (SIGSTOP) as soon as it announces, so only a socket that
was already listening can take the connection."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from contract.runtime_http import READY_PREFIX


def test_the_gateway_listens_before_it_announces_ready(redis_server) -> None:
    env = {
        **os.environ,
        "REDIS_URL": redis_server.url,
        "STELLARIS_GATEWAY_PORT": "0",
        "STELLARIS_GATEWAY_TOKEN": "t" * 32,
    }
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.send_signal(signal.SIGSTOP)  # no step further: whatever listens now listened at the announcement
        assert line.startswith(READY_PREFIX), line
        port = int(line.removeprefix(READY_PREFIX))
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # refused if it did not listen yet
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)
