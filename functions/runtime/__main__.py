"""`python -m functions.runtime`: see functions/runtime/cli.py."""

from cache.lifetime import quick_exit
from functions.runtime.cli import main

quick_exit(main())
