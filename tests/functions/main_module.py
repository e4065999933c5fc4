"""A module run as `python -m tests.functions.main_module` by the fork-server tests: says it ran as `__main__`."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    print(f"main {sys.argv[1:]}", flush=True)
