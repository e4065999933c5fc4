"""`python -m functions.runtime`: see functions/runtime/cli.py."""

from functions.runtime.cli import main
from host.lifetime import quick_exit

quick_exit(main())
