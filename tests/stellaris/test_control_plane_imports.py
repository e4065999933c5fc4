"""The control plane stays light: checking a config, running the training loop's modules and handling a command's
errors never import torch (1.1 s of every `stellaris train` start here, and the memory of a second copy beside the
functions'). Checked in a fresh interpreter, since this one has torch loaded already."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_train_command_loads_no_torch() -> None:
    script = textwrap.dedent(
        """
        import sys
        from stellaris.config import load_config
        import stellaris.cli, stellaris.run, stellaris.round.trainer
        from stellaris.evaluate import EvalError  # what every command's error handling imports

        load_config(None, {"env": "Hopper-v5", "rounds": 1})  # the env and override checks run here
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
