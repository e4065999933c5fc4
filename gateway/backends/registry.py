"""The backends a gateway can run instances on: one row per backend, its name and the module that builds it.

Adding a backend is its own package (gateway/backends/<name>/), a row in gateway/backends/names.py, and its settings
in gateway/settings.py.
The module of a row is imported only when its backend is first used (the docker SDK and Ray are optional extras),
and it provides `from_settings(settings: GatewaySettings, redis_url: str | None) -> Backend`. Everything that names
backends (gateway.models.BACKENDS and BackendName, the settings' and the control plane's `backend` fields) reads
the names from gateway/backends/names.py, which imports nothing (gateway.models reads it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.backends.base import Backend
    from gateway.settings import GatewaySettings

from gateway.backends.names import MODULES, NAMES


class UnknownBackend(ValueError):
    """A name no row of the registry has."""


def build(name: str, settings: GatewaySettings, redis_url: str | None) -> Backend:
    """The backend `name`, built from the gateway's settings; `redis_url` is the cache its instances reach (every
    instance's REDIS_URL). Raises UnknownBackend (a ValueError) naming the known backends, and ImportError where
    the backend's optional dependency is not installed."""
    if name not in MODULES:
        raise UnknownBackend(f"unknown backend {name!r}: the backends are {', '.join(NAMES)}")
    from_settings: Callable[[GatewaySettings, str | None], Backend] = importlib.import_module(
        MODULES[name]
    ).from_settings
    return from_settings(settings, redis_url)
