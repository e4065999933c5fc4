"""What a function instance's environment is made of, on every backend and for serverful actors: an allow-list of
the starting process's variables (what an interpreter, its numeric libraries and a GPU need), never its whole
environment, plus what the instance is given on purpose (its registration's env, its id, the cache's address).

Whoever starts instances holds keys an instance must not: the gateway's admin and invoke tokens, the deployment's
Redis password, a Docker socket. Code that runs in a job (a user's env module, a handler) sees only its own
environment, so what is not handed on here is out of its reach (docs/reliability.md: the trust model).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

# Variables an instance inherits from the process that starts it: locale, paths, the interpreter's and virtual
# environment's, thread counts and CPU kinds of the numeric libraries (OPENBLAS_CORETYPE keeps some processors from
# wrong results), which GPUs are visible, MuJoCo's renderer, and this project's own settings (STELLARIS_*).
INHERITED_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "TERM",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "OMP_*",
    "MKL_*",
    "OPENBLAS_*",
    "KMP_*",
    "CUDA_*",
    "NVIDIA_*",
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
    "STELLARIS_*",
)

# Ray's own settings, which a Ray node and the workers it starts read (gateway/backends/ray/cluster.py).
RAY_ENV = "RAY_*"

# Never inherited, whatever the allow-list says: credentials of the deployment and of whoever starts instances.
# An instance gets the job's own Redis user from its registration, and REDIS_URL without credentials.
SECRET_ENV = (
    "REDIS_URL",
    "REDISCLI_AUTH",
    "STELLARIS_GATEWAY_*",
    "STELLARIS_REDIS_USER",
    "STELLARIS_REDIS_PASSWORD",
    "STELLARIS_RUNTIME_SECRET",
    "STELLARIS_JOB",
    "DOCKER_*",
    "*TOKEN*",
    "*PASSWORD*",
    "*SECRET*",
    "*CREDENTIAL*",
    "*_KEY",
    "*_AUTH",
)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def is_secret(name: str) -> bool:
    return _matches(name.upper(), SECRET_ENV)


def inherited_env(parent: Mapping[str, str], allow: Iterable[str] = INHERITED_ENV) -> dict[str, str]:
    """The variables of `parent` an instance inherits: those `allow` names (fnmatch patterns), less every secret."""
    allow = tuple(allow)
    return {k: v for k, v in parent.items() if _matches(k, allow) and not is_secret(k)}
