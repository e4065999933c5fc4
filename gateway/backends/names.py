"""The backends' names, one row each with the module whose `from_settings` builds it (gateway/backends/registry.py):
the one declaration every other list of backends is read from. Imports nothing, so that gateway.models can read it."""

# name -> module; the order is the one messages and docs list them in.
MODULES: dict[str, str] = {
    "process": "gateway.backends.process.backend",
    "docker": "gateway.backends.docker.backend",
    "ray": "gateway.backends.ray.backend",
}
NAMES: tuple[str, ...] = tuple(MODULES)
