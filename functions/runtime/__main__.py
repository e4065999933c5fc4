"""`python -m functions.runtime`: see functions/runtime/cli.py."""

import sys

from functions.runtime.cli import main

sys.exit(main())
