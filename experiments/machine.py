"""What a run ran on, in a line: wall-clock only compares between runs of the same machine."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path


def describe() -> str:
    """CPU model, cores, memory, e.g. 'AMD EPYC, 2 cores, 24 GiB'."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (OSError, ValueError):
        mem_gib = math.nan
    return f"{model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB"
