"""CPU seconds of a process tree, read from /proc (Linux): what a run costs in CPU across all its processes. Two
readings' difference leaves start-up out; a process's children that ended and were reaped count through its
cutime/cstime."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
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


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _tree(root: int) -> dict[int, float]:
    """CPU seconds of `root` and of every live descendant, by pid; empty when `root` is gone."""
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
    tree: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in cpu:
            tree[pid] = cpu[pid]
        todo += children.get(pid, [])
    return tree


def tree_cpu_by_kind(root: int, kind: Callable[[str], str]) -> dict[str, float]:
    """CPU seconds of `root` and every live descendant, summed by `kind` of each one's command line (a reaped
    child's CPU counts with its parent); empty when `root` is gone."""
    totals: dict[str, float] = {}
    for pid, cpu in _tree(root).items():
        name = kind(_cmdline(pid))
        totals[name] = totals.get(name, 0.0) + cpu
    return totals


def descendants_running(root: int, marker: str) -> list[int]:
    """The live descendants of `root` whose command line contains `marker`."""
    return [pid for pid in _tree(root) if pid != root and marker in _cmdline(pid)]


def busy(pids: Sequence[int], window_s: float = 0.05) -> list[int]:
    """Those of `pids` that spent CPU time over the next `window_s` (a warm spare waiting for a call spends none);
    gone ones are left out."""
    before = {pid: _stat(str(pid)) for pid in pids}
    time.sleep(window_s)  # the measuring window itself
    after = {pid: _stat(str(pid)) for pid in pids}
    return [pid for pid in pids if (b := before[pid]) is not None and (a := after[pid]) is not None and a[1] > b[1]]
