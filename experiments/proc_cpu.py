"""CPU seconds of a process tree, read from /proc (Linux): what a run costs in CPU across all its processes. Two
readings' difference leaves start-up out; a process's children that ended and were reaped count through its
cutime/cstime."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds: own user + system and its reaped children's) of one process; None once it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its closing one.
    fields = text[text.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / ticks


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and every live descendant (0.0 when `root` is gone)."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(entry.name)
        if stat is not None:
            pid = int(entry.name)
            children.setdefault(stat[0], []).append(pid)
            cpu[pid] = stat[1]
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total
