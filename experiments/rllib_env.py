"""The RLlib virtual environment: RLlib runs in a venv of its own, made on first use.

`ray[rllib]==2.60.0` pins `gymnasium==1.2.2`, the project pins `gymnasium[mujoco]==1.4.0`, so the two cannot share
one environment. The suite runs `experiments/rllib_ppo.py` with this venv's interpreter as a subprocess and reads back
CSV and JSON. The venv is made with `python -m venv` and pip; `torch` is pinned exactly, or pip would fetch several GB
of CUDA packages (docs/experiments.md). A marker file, written only after the install was checked, says it is complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO_ROOT / ".venv-rllib"
VENV_ENV_VAR = "STELLARIS_RLLIB_VENV"
RAY_VERSION = "2.60.0"
REQUIREMENTS: tuple[str, ...] = (
    f"ray[rllib]=={RAY_VERSION}",
    "torch==2.13.0",  # exactly: any range admits a newer release and pulls GBs of CUDA wheels
    "gymnasium[mujoco]==1.2.2",  # what ray[rllib]==2.60.0 pins
)
MARKER = "stellaris-rllib.json"  # in the venv: the requirements it was made with, once checked
CHECK = "import gymnasium, ray, torch; from ray.rllib.algorithms.ppo import PPOConfig; print(ray.__version__)"
INSTALL_TIMEOUT_S = 1800.0


class RLlibEnvError(RuntimeError):
    """The RLlib venv could not be made or is broken; the message names the command and how to retry."""


def venv_path(given: Path | None = None) -> Path:
    """The venv to use: the one given, else $STELLARIS_RLLIB_VENV, else .venv-rllib at the repository root."""
    if given is not None:
        return given
    env = os.environ.get(VENV_ENV_VAR)
    return Path(env) if env else DEFAULT_VENV


def venv_python(path: Path) -> Path:
    return path / "bin" / "python"


def is_ready(path: Path, requirements: Sequence[str] = REQUIREMENTS) -> bool:
    """The venv exists and was completed with exactly these requirements."""
    marker = path / MARKER
    if not venv_python(path).exists() or not marker.exists():
        return False
    try:
        return json.loads(marker.read_text()).get("requirements") == list(requirements)
    except (OSError, ValueError):
        return False


def _run(cmd: list[str], echo: Callable[[str], None], timeout_s: float) -> None:
    """Run `cmd`, echoing its output line by line; raises RLlibEnvError with the last lines when it fails or takes
    over `timeout_s`."""
    echo(f"$ {' '.join(cmd)}")
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            # pip names each local index folder that lacks a package: noise, not progress
            if line and "is ignored: it is neither a file nor a directory" not in line:
                echo(line)
                tail[:] = [*tail[-19:], line]

    reader = threading.Thread(target=pump, name="pip-output", daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RLlibEnvError(f"`{' '.join(cmd)}` took over {timeout_s:.0f} s and was stopped") from None
    finally:
        reader.join(timeout=10)
    if code != 0:
        last = "\n  ".join(tail[-8:])
        raise RLlibEnvError(f"`{' '.join(cmd)}` failed with exit code {code}:\n  {last}")


def ensure_venv(
    path: Path,
    *,
    echo: Callable[[str], None] = print,
    base_python: str = sys.executable,
    requirements: Sequence[str] = REQUIREMENTS,
    timeout_s: float = INSTALL_TIMEOUT_S,
    check: str = CHECK,
    what: str = "RLlib",
    why: str = "RLlib pins gymnasium 1.2.2; the project runs 1.4.0",
    pointer: str = f"--rllib-venv / ${VENV_ENV_VAR}",
) -> Path:
    """The venv's interpreter, making the venv first if it is missing or incomplete (a minute or two from the local
    wheel mirrors). RLlib's unless told otherwise: `what` names the venv, `check` is the Python that proves the
    install and `pointer` the option or variable that points elsewhere (experiments/peers/venv.py makes the peers'
    venv this way). Raises RLlibEnvError naming what failed; a failed install is retried on the next call."""
    if is_ready(path, requirements):
        return venv_python(path)
    t0 = time.monotonic()
    echo(f"making the {what} virtual environment {path} ({why})")
    try:
        if not venv_python(path).exists():
            _run([base_python, "-m", "venv", str(path)], echo, timeout_s)
        python = str(venv_python(path))
        _run([python, "-m", "pip", "install", "--progress-bar", "off", *requirements], echo, timeout_s)
        _run([python, "-c", check], echo, timeout_s)
    except (OSError, RLlibEnvError) as exc:
        raise RLlibEnvError(
            f"could not make the {what} virtual environment {path}: {exc}\n"
            f"Fix the cause and run again (the install resumes), or remove {path} to start over, or point "
            f"{pointer} at a venv with {' '.join(requirements)}."
        ) from exc
    seconds = time.monotonic() - t0
    (path / MARKER).write_text(json.dumps({"requirements": list(requirements), "install_s": round(seconds, 1)}))
    echo(f"{what} virtual environment ready in {seconds:.0f} s: {path}")
    return venv_python(path)
