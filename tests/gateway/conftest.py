"""A real gateway: `python -m gateway` as a subprocess on loopback, talking to the session's real redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.client import GatewayClient
from tests.procs import wait_pid_gone

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token"


@dataclass
class RunningGateway:
    proc: subprocess.Popen[str]
    url: str
    namespace: str

    def client(self, token: str | None = TOKEN) -> GatewayClient:
        return GatewayClient(self.url, token=token, timeout_s=60)


def start_gateway(
    redis_url: str, namespace: str | None = None, *, stderr: int | None = None, **env: str
) -> RunningGateway:
    """`stderr=subprocess.PIPE`: the test reads the gateway's log (and everything it prints after READY)."""
    namespace = namespace or f"gw-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={
            **os.environ,
            "REDIS_URL": redis_url,
            "STELLARIS_GATEWAY_PORT": "0",
            "STELLARIS_GATEWAY_TOKEN": TOKEN,
            "STELLARIS_GATEWAY_NAMESPACE": namespace,
            "STELLARIS_GATEWAY_TARGET_PREFIXES": '["functions.handlers.", "tests.functions."]',
            **env,
        },
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"gateway did not start: {line!r}")
    return RunningGateway(proc, f"http://127.0.0.1:{int(line.split()[1])}", namespace)


def stop_gateway(gw: RunningGateway) -> None:
    gw.proc.terminate()
    try:
        gw.proc.wait(timeout=30)
    finally:
        if gw.proc.poll() is None:
            gw.proc.kill()
            gw.proc.wait()
    assert wait_pid_gone(gw.proc.pid, 5)


@pytest.fixture(scope="module")
def gateway(redis_server) -> Iterator[RunningGateway]:
    gw = start_gateway(redis_server.url)
    yield gw
    stop_gateway(gw)


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[GatewayClient]:
    with gateway.client() as c:
        yield c


@pytest.fixture
def fname() -> str:
    return f"fn-{uuid.uuid4().hex[:8]}"
