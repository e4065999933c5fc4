"""The fork server's protocol: how its users (the process backend and the control plane's serverful actors, through
gateway/backends/process/zygote.py) ask a fork server (functions/runtime/zygote.py) for a process. Both sides import
these
names; neither repeats one.

A server is started with one end of a SOCK_SEQPACKET socketpair at fd `$STELLARIS_ZYGOTE_FD`. It imports what it
was told to (default: the runtime and the handlers), prints `READY <pid>` on stdout, then serves requests one
message each: a JSON `SpawnRequest` with two descriptors attached, a status socket (SOCK_SEQPACKET) and the write
end of the process's stdout pipe. It forks; the child becomes the process (`python -m <module> <argv>` in all but
the fork) and the status socket gets `{"pid": N}`, or `{"error": "..."}` when it could not fork, then
`{"exit": code}` once the process has exited and been reaped (a signal's death as minus its number, as
`Popen.returncode` has it). The server exits when the control socket closes, and its processes die with it (their
parent-death signal).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TypedDict

ZYGOTE_MODULE = "functions.runtime.zygote"
ZYGOTE_FD_ENV = "STELLARIS_ZYGOTE_FD"
ZYGOTE_PRELOAD_ENV = "STELLARIS_ZYGOTE_PRELOAD"  # the modules it imports as it starts, space-separated
MAX_MESSAGE_BYTES = 1 << 20  # a request (argv and the whole env) is far below this

# Variables a forked instance may change from the fork server's environment: those read when they are used, not
# when a library is loaded (our settings, the cache's address, which GPUs CUDA sees: torch starts CUDA lazily).
# An instance whose environment changes anything else (thread counts, MUJOCO_GL, ...) is forked from a server
# started with those values.
FORKABLE_ENV = ("STELLARIS_*", "REDIS_URL", "REDIS_USER", "REDIS_PASSWORD", "CUDA_VISIBLE_DEVICES")


class SpawnRequest(TypedDict):
    module: str  # what the child runs, as `python -m <module> <argv>` would
    argv: list[str]  # its arguments
    env: dict[str, str]  # the instance's whole environment
    cwd: str | None
    memory_bytes: int | None  # RLIMIT_DATA of the process (None: the server's)
    title: str  # its command line as `ps` and /proc/<pid>/cmdline show it


def load_time_changes(env: Mapping[str, str], base: Mapping[str, str]) -> list[str]:
    """The variables of `env` that differ from `base` (added, changed or removed) and that only a fresh interpreter
    would honour; empty when an instance with `env` may be forked from a server started with `base`."""
    changed = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
    return sorted(k for k in changed if not any(fnmatch.fnmatchcase(k, p) for p in FORKABLE_ENV))
