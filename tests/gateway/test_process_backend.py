"""The process backend on its own: an instance starts and is stopped even when the gateway's descriptors are
numbered past 1,024 (select() cannot watch those; the backend waits for READY with poll())."""

from __future__ import annotations

import os
import resource

import httpx
import pytest

from gateway.backends.process.backend import ProcessBackend
from gateway.models import FunctionSpec


def test_an_instance_starts_with_descriptors_numbered_past_1024() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 1_400
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"this machine allows {hard} open files per process; the test needs {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1_100)]  # the next descriptors are numbered > 1,100
    backend = ProcessBackend()
    try:
        handle = backend.start(
            FunctionSpec(name="fd-test", target="tests.functions.sample_handlers:echo"), instance_id="fd-test-1"
        )
        try:
            assert backend.alive(handle)
            answer = httpx.post(f"{handle.url}/invoke", json={"x": 1}, timeout=30).json()
            assert answer["event"] == {"x": 1}
        finally:
            backend.stop(handle)
            backend.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
