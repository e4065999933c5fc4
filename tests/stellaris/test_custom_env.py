"""Custom environments end to end: `stellaris train` on an env class defined in a test module (module:EnvClass),
and on an id that --env-module registers, with --env-kwargs reaching the policy's and the actors' envs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from tests.stellaris.test_train import check_outputs, rows, run_train, train_cmd

HIDDEN = 64  # FAST_CARTPOLE's network


@pytest.mark.parametrize(
    ("args", "size"),
    [
        (["--env", "tests.stellaris.custom_env:PickTarget"], 2),
        pytest.param(  # the long stage: 39 s, and the module:Class form above covers the same path in make test
            ["--env-module", "tests.stellaris.custom_env", "--env", "PickTarget-v0", "--env-kwargs", '{"size": 3}'],
            3,
            marks=pytest.mark.slow,
        ),
    ],
)
def test_train_runs_on_a_custom_env_with_its_kwargs(tmp_path: Path, args: list[str], size: int) -> None:
    out = tmp_path / "run"
    proc = run_train(train_cmd(tmp_path, "--rounds", "2", "--out", str(out), *args), timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_outputs(out, serverless=False)
    assert len(rows(out / "info.csv")) >= 2
    # `size` sets the observation size and the action count: the policy was built for the kwarg's env (an actor
    # ignoring the kwarg would have sent observations of the wrong size, failing the run).
    shapes = {tensor.shape for tensor in load_file(out / "policy.safetensors").values()}
    assert (HIDDEN, size) in shapes and (size, HIDDEN) in shapes, shapes
    # Evaluation makes the env from the run's spec, module and kwargs included.
    evaluated = run_train([sys.executable, "-m", "stellaris.cli", "eval", str(out), "--episodes", "2"], timeout_s=120)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env-module", "no_such_module_xyz"], "env_module: Value error, cannot import env_module"),
        (["--env-module", "tests.stellaris.custom_env", "--env", "Nope-v0"], "after importing env_module"),
        (["--env", "CartPole-v1", "--env-kwargs", "[1, 2]"], "env_kwargs: Value error, env_kwargs must be a JSON"),
        (["--env", "CartPole-v1", "--env-kwargs", "{bad"], "env_kwargs: Value error, env_kwargs is not valid JSON"),
        (
            ["--env", "tests.stellaris.custom_env:PickTarget", "--env-kwargs", '{"size": 1}'],
            "env_kwargs: Value error, gymnasium.make('tests.stellaris.custom_env:PickTarget', **{'size': 1}) rejected",
        ),
    ],
)
def test_a_bad_custom_env_fails_before_anything_starts(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_train(train_cmd(tmp_path, "--rounds", "1", "--out", str(tmp_path / "run"), *args), timeout_s=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()
