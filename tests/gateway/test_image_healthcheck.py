"""The gateway image's HEALTHCHECK, run as the engine runs it, against a real gateway: healthy while it serves,
unhealthy once it is stopped (SIGSTOP). A TCP connect, the check before, passed for a stopped gateway too: the kernel
accepts connections into the listen backlog whether or not the gateway ever answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.gateway.conftest import start_gateway, stop_gateway

DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "Dockerfile.gateway"


def healthcheck_command() -> list[str]:
    """The exec form of the Dockerfile's HEALTHCHECK CMD (its continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    [line] = [ln for ln in text.splitlines() if ln.startswith("HEALTHCHECK ")]
    command: list[str] = json.loads(line.split(" CMD ", 1)[1])
    assert command[0] == "python"
    return [sys.executable, *command[1:]]


def check(port: int) -> int:
    env = {**os.environ, "STELLARIS_GATEWAY_PORT": str(port)}
    # The engine's own timeout for the check is 5 s (--timeout=5s); this bound only keeps a broken check from hanging.
    return subprocess.run(healthcheck_command(), env=env, capture_output=True, timeout=60).returncode


def test_the_gateway_image_healthcheck_fails_for_a_stopped_gateway(redis_server) -> None:
    gw = start_gateway(redis_server.url)
    port = int(gw.url.rsplit(":", 1)[1])
    try:
        assert check(port) == 0
        os.kill(gw.proc.pid, signal.SIGSTOP)
        assert check(port) != 0
    finally:
        os.kill(gw.proc.pid, signal.SIGCONT)
        stop_gateway(gw)
