"""The RLlib venv's management without installing RLlib: which venv is used, when it counts as made, and failures
named with what to do (real `python -m venv` subprocesses)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from experiments import rllib_env


def test_the_venv_is_the_one_given_else_the_env_var_else_the_repos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(rllib_env.VENV_ENV_VAR, raising=False)
    assert rllib_env.venv_path() == Path(rllib_env.__file__).resolve().parents[1] / ".venv-rllib"
    monkeypatch.setenv(rllib_env.VENV_ENV_VAR, str(tmp_path / "from-env"))
    assert rllib_env.venv_path() == tmp_path / "from-env"
    assert rllib_env.venv_path(tmp_path / "given") == tmp_path / "given"


def test_a_venv_is_ready_only_with_its_marker_for_the_same_requirements(tmp_path: Path) -> None:
    assert not rllib_env.is_ready(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    assert not rllib_env.is_ready(tmp_path)  # an install that never finished writes no marker
    marker = tmp_path / rllib_env.MARKER
    marker.write_text(json.dumps({"requirements": list(rllib_env.REQUIREMENTS)}))
    assert rllib_env.is_ready(tmp_path)
    assert rllib_env.ensure_venv(tmp_path, echo=lambda line: None) == tmp_path / "bin" / "python"  # nothing to do
    marker.write_text(json.dumps({"requirements": ["ray[rllib]==2.9.0"]}))
    assert not rllib_env.is_ready(tmp_path)
    marker.write_text("{not json")
    assert not rllib_env.is_ready(tmp_path)


def test_the_pins_are_exact() -> None:
    # torch pinned exactly, or pip pulls GBs of CUDA wheels; gymnasium as ray[rllib]==2.60.0 pins it.
    assert rllib_env.REQUIREMENTS == ("ray[rllib]==2.60.0", "torch==2.13.0", "gymnasium[mujoco]==1.2.2")


def test_a_failed_venv_creation_is_named_with_how_to_retry(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    lines: list[str] = []
    with pytest.raises(rllib_env.RLlibEnvError) as failed:
        rllib_env.ensure_venv(blocker / "venv", echo=lines.append, timeout_s=120)
    message = str(failed.value)
    assert f"could not make the RLlib virtual environment {blocker / 'venv'}" in message
    assert "-m venv" in message and "failed with exit code 1" in message and "--rllib-venv" in message
    assert lines[0].startswith("making the RLlib virtual environment") and lines[1].startswith("$ ")
    with pytest.raises(rllib_env.RLlibEnvError, match="No such file or directory"):
        rllib_env.ensure_venv(tmp_path / "venv", echo=lines.append, base_python=str(tmp_path / "no-python"))


def test_a_step_over_its_time_limit_is_stopped_and_named() -> None:
    lines: list[str] = []
    cmd = [sys.executable, "-c", "import sys, time; print('started', flush=True); time.sleep(60)"]
    with pytest.raises(rllib_env.RLlibEnvError, match=re.escape("took over 2 s and was stopped")):
        rllib_env._run(cmd, lines.append, timeout_s=2)
    assert lines[-1] == "started"
