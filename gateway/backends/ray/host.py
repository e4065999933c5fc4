"""The Ray actor that hosts one function instance: the function runtime, in the actor's own process, serving on its
node's address; the actor answers the gateway's questions about it (describe, ping) and drains it on request.

The gateway never imports functions/ (docs/architecture.md): the actor reaches the runtime by the name the contract
gives
(EMBEDDED_RUNTIME), in the worker process on the node, where functions/ is importable like on any node that runs
our instances. Everything the runtime reads from its environment (REDIS_URL, STELLARIS_INSTANCE_ID, the secret in
SECRET_ENV, the spec's env) is set in the actor's process before the runtime starts, over the allowed part of the
node's environment (contract/instance_env.py); the actor's process is its own (an actor never shares its
worker), so nothing leaks between instances.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from contract.instance_env import INHERITED_ENV, RAY_ENV, inherited_env
from contract.runtime_http import EMBEDDED_RUNTIME

# describe/ping must answer while drain() runs: a threaded actor with a few threads.
HOST_THREADS = 4


@dataclass(frozen=True)
class HostConfig:
    """What one actor serves, and what it reports to a gateway that finds it again."""

    instance: str
    function: str
    target: str
    spec_digest: str
    concurrency: int
    timeout_s: float
    ready_timeout_s: float
    secret: str
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class RuntimeHost:
    """One instance. Created with num_cpus/num_gpus/resources from the spec, so Ray places it on a node that has
    them; `__init__` returns once the runtime accepts connections (an error there fails the actor's creation)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = HostConfig(**config)
        # The worker's process inherits its node's environment (a cluster's we did not start, perhaps): only its
        # allowed part stays, and the instance's own is added.
        kept = inherited_env(os.environ, (*INHERITED_ENV, RAY_ENV))
        os.environ.clear()
        os.environ.update({**kept, **self.config.env})
        module, _, entry = EMBEDDED_RUNTIME.partition(":")
        start = getattr(importlib.import_module(module), entry)
        self.node = ray.util.get_node_ip_address()
        self.served = start(
            self.config.target,
            host=self.node,
            port=0,
            concurrency=self.config.concurrency,
            timeout_s=self.config.timeout_s,
            ready_timeout_s=self.config.ready_timeout_s,
        )

    def describe(self) -> dict[str, Any]:
        """Who this instance is and where it serves: what an InstanceHandle is made of."""
        described = {k: v for k, v in asdict(self.config).items() if k not in ("env", "target")}
        return {**described, "url": http_url(self.node, self.served.port), "node": self.node, "pid": os.getpid()}

    def ping(self) -> bool:
        return True

    def drain(self, timeout_s: float) -> bool:
        """The runtime's graceful stop: new calls 503, running ones get `timeout_s`; True when all finished."""
        return bool(self.served.stop(timeout_s))


# The ignore: ray's keyword overloads of `remote` leave out max_concurrency, an actor option it documents and takes.
RemoteRuntimeHost = ray.remote(max_concurrency=HOST_THREADS)(RuntimeHost)  # type: ignore[call-overload]
