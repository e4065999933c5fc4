"""A handler module that starts a thread when it is imported: a fork server that imported it cannot fork."""

from __future__ import annotations

import os
import threading
from typing import Any

from functions.runtime.context import Context

_stop = threading.Event()
threading.Thread(target=_stop.wait, name="started-at-import", daemon=True).start()


def handle(event: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {"pid": os.getpid(), "ppid": os.getppid()}
