"""`stellaris train --backend docker` end to end: the real CLI against a real gateway whose docker backend starts
every learner, parameter and (serverless) actor function as a container on a real engine (podman's Docker API in
CI, .ci/podman-setup.sh). The image is the bare test image in host-Python mode (the checkout's interpreter and
virtual environment bind-mounted read-only), as in tests/gateway/test_docker_gateway.py.

Which container served an invocation: the activation record names the instance; the engine's events name the
container that carried that instance's label, with its image. Skips (saying why) without an engine unless
STELLARIS_REQUIRE_DOCKER=1, as in CI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from docker.client import DockerClient

from cache import Cache
from gateway.backends.base import LABEL_FUNCTION, LABEL_GATEWAY
from gateway.backends.docker.config import LABEL_INSTANCE
from tests.gateway.conftest import TOKEN, stop_gateway
from tests.gateway.test_docker_backend import IMAGE, REPO, engine, host_python_mounts  # noqa: F401 (fixture)
from tests.gateway.test_docker_gateway import containers, docker_gateway, gateway_id  # noqa: F401 (fixture)
from tests.stellaris.test_isolation import (
    INVOKE_TOKEN,
    PROBE_ENV,
    assert_nothing_got_through,
    probe_reports,
    victim_job,
)
from tests.stellaris.test_train import FAST_CARTPOLE, ROOT

ROUNDS = 2


def train(
    tmp_path: Path, *args: str, config: dict[str, object] | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`stellaris train --backend docker` of a short CartPole job (`config` over it) with serverless actors, all on
    the test image."""
    out = tmp_path / "run"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**FAST_CARTPOLE, "actors": 1, **(config or {})}))
    cmd = [
        sys.executable,
        "-m",
        "stellaris.cli",
        "train",
        "--config",
        str(path),
        "--backend",
        "docker",
        "--image",
        IMAGE,
        "--actor-kind",
        "serverless",
        "--out",
        str(out),
        *args,
    ]
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}
    proc = subprocess.run(cmd, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


EVENT_READS = 5  # podman's Docker-compat events stream now and then ends at once, empty, with the events in its log


def started_containers(
    engine: DockerClient,  # noqa: F811
    gateway_id: str,  # noqa: F811
    since: float,
    complete: Callable[[dict[str, dict[str, str]]], bool],
) -> dict[str, dict[str, str]]:
    """instance id -> {id, image, function} of every container of this gateway started since `since`; read again
    (at most EVENT_READS times) until `complete` accepts what was read."""
    started: dict[str, dict[str, str]] = {}
    for _ in range(EVENT_READS):
        started = _started_once(engine, gateway_id, since)
        if complete(started):
            break
    return started


def _started_once(engine: DockerClient, gateway_id: str, since: float) -> dict[str, dict[str, str]]:  # noqa: F811
    events = engine.events(
        since=int(since) - 1,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "start", "label": f"{LABEL_GATEWAY}={gateway_id}"},
    )
    started = {}
    for event in events:
        attrs = event["Actor"]["Attributes"]
        started[attrs[LABEL_INSTANCE]] = {
            "id": event["Actor"]["ID"],
            "image": attrs["image"],
            "function": attrs[LABEL_FUNCTION],
        }
    return started


def test_every_function_of_a_docker_job_runs_in_a_container_of_its_image(
    tmp_path: Path,
    redis_server,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,  # noqa: F811
) -> None:
    gw = docker_gateway(redis_server.url, gateway_id)
    since = time.time()
    try:
        proc, out = train(
            tmp_path,
            "--gateway-url",
            gw.url,
            "--gateway-token",
            TOKEN,
            "--redis-url",
            redis_server.url,
            "--rounds",
            str(ROUNDS),
        )
        assert f"functions in containers: learner {IMAGE} (0 GPU)" in proc.stderr
        with (out / "invocations.csv").open() as f:
            invocations = list(csv.DictReader(f))
        with gw.client() as client:
            activations = [client.activation(row["activation_id"]) for row in invocations]
        ran_on = {a.instance for a in activations}
        started = started_containers(engine, gateway_id, since, lambda got: ran_on <= set(got))
        assert containers(engine, gateway_id) == []  # the finished job's functions and containers are gone
    finally:
        stop_gateway(gw)
    assert {a.function.rsplit("-", 1)[1] for a in activations} == {"actor", "learner", "parameter"}
    for act in activations:
        assert act.instance in started, f"{act.function} call {act.id} ran on {act.instance}, no container of the job"
        container = started[act.instance]
        assert (container["image"], container["function"]) == (IMAGE, act.function), act
    served = {started[a.instance]["id"] for a in activations if a.instance is not None}
    print(f"{len(activations)} invocations over {ROUNDS} rounds served by {len(served)} containers of {IMAGE}")


@pytest.mark.slow  # over 40 s: CI's long stage (make test-long)
def test_a_docker_job_on_the_local_gateway_runs_its_functions_in_containers_on_the_hosts_network(
    tmp_path: Path,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,  # noqa: F811
) -> None:
    """No --gateway-url: the gateway `stellaris train` starts itself puts the containers on the host's network, so
    that they reach the embedded Redis on loopback."""
    since = time.time()
    host_python = {
        "STELLARIS_GATEWAY_ID": gateway_id,
        "STELLARIS_GATEWAY_DOCKER_PYTHON": sys.executable,
        "STELLARIS_GATEWAY_DOCKER_VOLUMES": json.dumps(host_python_mounts()),
        "STELLARIS_GATEWAY_DOCKER_WORKDIR": str(REPO),
    }
    train(tmp_path, "--rounds", "1", **host_python)
    roles = {"actor", "learner", "parameter"}
    started = started_containers(
        engine, gateway_id, since, lambda got: {c["function"].rsplit("-", 1)[1] for c in got.values()} >= roles
    )
    assert {c["function"].rsplit("-", 1)[1] for c in started.values()} == roles
    assert {c["image"] for c in started.values()} == {IMAGE}
    assert containers(engine, gateway_id) == []


def test_code_in_a_docker_job_reaches_nothing_outside_it(
    tmp_path: Path,
    redis_server,
    cache_conn: Cache,
    engine: DockerClient,  # noqa: F811
    gateway_id: str,  # noqa: F811
) -> None:
    """tests/stellaris/test_isolation.py's probe, made inside the job's containers (learner, parameter and
    serverless actor): nothing in their environment reaches another job's keys, the keyspace or the gateway."""
    victim, theirs = victim_job(cache_conn)
    gw = docker_gateway(redis_server.url, gateway_id, STELLARIS_GATEWAY_INVOKE_TOKEN=INVOKE_TOKEN)
    try:
        with probe_reports(cache_conn.client) as reports:
            train(
                tmp_path,
                "--gateway-url",
                gw.url,
                "--gateway-token",
                TOKEN,
                "--redis-url",
                redis_server.url,
                "--rounds",
                "2",
                config={"env": PROBE_ENV, "env_kwargs": {"victim": victim, "gateway_url": gw.url}},
            )
        secrets = [TOKEN, INVOKE_TOKEN, redis_server.password]
        assert_nothing_got_through(reports, secrets, {"learner", "parameter", "actor"}, theirs)
    finally:
        stop_gateway(gw)
        theirs.delete()
