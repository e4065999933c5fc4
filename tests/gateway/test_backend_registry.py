"""The backend registry (gateway/backends/registry.py): one row per backend, the only place its name is declared.
Building a backend connects to nothing (the docker engine and a Ray cluster are reached at first use), so each
builds here from default settings wherever its optional dependency is installed."""

from __future__ import annotations

import importlib.util
from typing import get_args

import pytest
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from gateway.backends import registry
from gateway.models import BACKENDS, BackendName, FunctionSpec
from gateway.service import Gateway
from gateway.settings import GatewaySettings

REDIS_URL = "redis://user:secret@127.0.0.1:6390/0"  # never reached: building a backend does no I/O
DEPENDENCY = {"process": None, "docker": "docker", "ray": "ray"}  # the optional package each backend needs


def test_the_names_are_the_registry_rows() -> None:
    assert BACKENDS == registry.NAMES == tuple(registry.MODULES) == ("process", "docker", "ray")
    assert get_args(BackendName) == BACKENDS  # what pydantic checks a `backend` field against
    assert set(DEPENDENCY) == set(BACKENDS), "a new backend: name its optional dependency here"


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_builds_from_default_settings(name: str) -> None:
    needs = DEPENDENCY[name]
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"the {name} backend needs the {needs!r} package, not installed here")
    backend = registry.build(name, GatewaySettings(), REDIS_URL)
    try:
        assert backend.name == name
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()


def test_the_process_backend_gets_the_settings() -> None:
    from gateway.backends.process.backend import ProcessBackend

    settings = GatewaySettings(instance_env_inherit=["PATH"], fork_servers=3, fork_server_retry_s=7.0)
    backend = registry.build("process", settings, REDIS_URL)
    try:
        assert isinstance(backend, ProcessBackend)
        assert backend.redis_url == REDIS_URL and backend.inherit_env == ("PATH",)
        assert backend.forks is not None and (backend.forks.limit, backend.forks.retry_s) == (3, 7.0)
        bare = registry.build("process", GatewaySettings(fork_servers=0), None)
        assert isinstance(bare, ProcessBackend) and bare.forks is None and bare.redis_url is None
    finally:
        backend.close()


def test_the_docker_backend_gets_the_settings() -> None:
    pytest.importorskip("docker")
    from gateway.backends.docker.backend import DockerBackend

    settings = GatewaySettings(
        namespace="ns1", docker_python="/usr/bin/python3", docker_volumes={"/src": "/app"}, docker_workdir="/app"
    )
    backend = registry.build("docker", settings, REDIS_URL)
    assert isinstance(backend, DockerBackend) and backend._client is None  # the engine is reached at first use
    t = backend.template
    assert (t.namespace, t.redis_url, t.python, t.volumes, t.working_dir) == (
        "ns1",
        REDIS_URL,
        "/usr/bin/python3",
        {"/src": "/app"},
        "/app",
    )
    bare = registry.build("docker", GatewaySettings(), None)
    assert isinstance(bare, DockerBackend) and bare.template.volumes == {}  # no volumes: None to DockerBackend


def test_the_ray_backend_gets_the_settings() -> None:
    pytest.importorskip("ray")
    from gateway.backends.ray.backend import RayBackend

    settings = GatewaySettings(namespace="ns1", ray_address="10.0.0.1:6379", ray_startup_timeout_s=30.0)
    backend = registry.build("ray", settings, REDIS_URL)
    assert isinstance(backend, RayBackend) and not backend._connected and backend.cluster is None
    assert (backend.address, backend.namespace, backend.redis_url, backend.startup_timeout_s) == (
        "10.0.0.1:6379",
        "ns1",
        REDIS_URL,
        30.0,
    )


def test_an_unknown_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'k8s': the backends are process, docker, ray"):
        registry.build("k8s", GatewaySettings(), None)
    with pytest.raises(HTTPException) as refused:  # a registration's backend, at the gateway: a 422 naming it
        Gateway(GatewaySettings()).backend("k8s")
    assert refused.value.status_code == 422 and "'k8s'" in refused.value.detail


def test_the_backend_fields_refuse_other_names_naming_them_and_the_choices() -> None:
    with pytest.raises(ValidationError, match=r"Input should be 'process', 'docker' or 'ray'.*input_value='k8s'"):
        GatewaySettings(backend="k8s")
    with pytest.raises(ValidationError, match=r"backend must be one of process, docker, ray, got 'k8s'"):
        FunctionSpec(name="f", target="m:h", backend="k8s")
    assert GatewaySettings(backend="ray").backend == "ray"
