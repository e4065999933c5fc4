"""The fork server's protocol: how the process backend (gateway/backends/zygote.py) asks the fork server
(functions/runtime/zygote.py) for an instance. Both sides import these names; neither repeats one.

The server is started once per backend with one end of a SOCK_SEQPACKET socketpair at fd `$STELLARIS_ZYGOTE_FD`. It
imports the runtime and the handlers, prints `READY <pid>` on stdout, then serves requests one message each: a JSON
`SpawnRequest` with two descriptors attached, a status socket (SOCK_SEQPACKET) and the write end of the instance's
stdout pipe. It forks; the child becomes the instance (`python -m functions.runtime <argv>` in all but the fork) and
the status socket gets `{"pid": N}`, or `{"error": "..."}` when it could not fork, then `{"exit": code}` once the
instance has exited and been reaped (a signal's death as minus its number, as `Popen.returncode` has it). The
server exits when the control socket closes, and its instances die with it (their parent-death signal).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TypedDict

ZYGOTE_MODULE = "functions.runtime.zygote"
ZYGOTE_FD_ENV = "STELLARIS_ZYGOTE_FD"
READY_PREFIX = "READY "
MAX_MESSAGE_BYTES = 1 << 20  # a request (argv and the whole env) is far below this

# Variables a forked instance may change from the fork server's environment: those read when they are used, not
# when a library is loaded (our settings, the cache's address, which GPUs CUDA sees: torch starts CUDA lazily).
# An instance whose environment changes anything else (thread counts, MUJOCO_GL, ...) is forked from a server
# started with those values.
FORKABLE_ENV = ("STELLARIS_*", "REDIS_URL", "REDIS_USER", "REDIS_PASSWORD", "CUDA_VISIBLE_DEVICES")


class SpawnRequest(TypedDict):
    argv: list[str]  # the runtime's arguments (runtime_argv), without the interpreter and module
    env: dict[str, str]  # the instance's whole environment
    cwd: str | None
    memory_bytes: int  # RLIMIT_DATA of the instance
    title: str  # its command line as `ps` and /proc/<pid>/cmdline show it


def load_time_changes(env: Mapping[str, str], base: Mapping[str, str]) -> list[str]:
    """The variables of `env` that differ from `base` (added, changed or removed) and that only a fresh interpreter
    would honour; empty when an instance with `env` may be forked from a server started with `base`."""
    changed = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
    return sorted(k for k in changed if not any(fnmatch.fnmatchcase(k, p) for p in FORKABLE_ENV))
