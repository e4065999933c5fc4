"""`python -m tests.stellaris.redis_killed_at_start train ...`: `stellaris train` whose embedded Redis is killed with
-9 the moment its first local gateway is started (the gateway then cannot reach it, and exits), for
tests/stellaris/test_gateway_start.py. The kill comes from a wrapper around `subprocess.Popen` in this process."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from gateway.backends.process.tree import descendants
from tests.procs import is_redis_server, wait_pid_gone

_killed: list[int] = []


class _Popen(subprocess.Popen):  # type: ignore[type-arg]
    """Popen, but the first gateway it starts finds the embedded Redis killed (a subclass: annotations that
    subscript Popen keep working)."""

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        if not _killed and list(args)[1:3] == ["-m", "gateway"]:
            for pid in filter(is_redis_server, descendants(os.getpid())):
                os.kill(pid, signal.SIGKILL)
                assert wait_pid_gone(pid, 10)
                _killed.append(pid)
        super().__init__(args, *rest, **kwargs)


if __name__ == "__main__":
    subprocess.Popen = _Popen  # type: ignore[misc]
    from stellaris.cli import app

    app()
