"""One `stellaris train` per run directory at a time. A second one (a resume started while the run still goes, a
scheduler that launched it twice) would rewind the CSVs under the first, which then appends to files no longer
there: its rows are lost. The run holds an exclusive lock on the directory itself (flock, so no file is left
behind) while it runs; the kernel drops it with the process, kill -9 included."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


class DirInUse(RuntimeError):
    """Another process holds the directory's lock."""


def lock_dir(path: Path) -> int | None:
    """The descriptor that holds `path`'s lock (close it to release), or None where the filesystem has no flock for
    directories (some network filesystems): the run goes on unguarded rather than not at all."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise DirInUse(str(path)) from exc
        return None
    return fd
