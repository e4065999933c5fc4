"""The Python API end to end: the guide's example run for real (`stellaris.train`: embedded Redis, local gateway,
subprocess instances), its policy loaded in a fresh process with no Redis and no gateway, and a resumed run that
restores the actors' reward-scaler state."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

import stellaris
from contract.codec import decode
from contract.jobspec import JobSpec
from contract.packed import unpacked
from functions.model.policies import build_policy
from stellaris.config import ConfigError
from stellaris.evaluate import evaluate_run
from stellaris.rundir.outputs import RunDirError

ROOT = Path(__file__).resolve().parents[2]
README_CONFIG = '{"env": "CartPole-v1", "rounds": 2, "out": "runs/cartpole-api"}'
# the guide's run, made quick: small batches (the paper preset's 4 minibatches x 2 epochs), one round, and the fast
# preset's normalisers on, so the file carries observation statistics and the checkpoint reward-scaler state.
QUICK_CONFIG = {
    "env": "CartPole-v1",
    "algo": "ppo",
    "preset": "paper",
    "actors": 1,
    "learners": 2,
    "rounds": 1,
    "seed": 3,
    "out": "runs/cartpole-api",
    "overrides": {
        "lr": 2.5e-3,
        "train_batch_size": 512,
        "num_minibatches": 4,
        "num_epochs": 2,
        "normalize_obs": True,
        "normalize_reward": True,
        "network": {"kind": "mlp", "hidden": [64, 64]},
    },
}


def no_deployment_env() -> dict[str, str]:
    """This process's environment without a Redis or a gateway to reach."""
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}


def readme_example() -> str:
    """The training guide's Python API example (docs/training.md), as a user would copy it."""
    text = (ROOT / "docs" / "training.md").read_text()
    section = text[text.index("## Python API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The guide's example, as written but for its config (QUICK_CONFIG), in a fresh process: its run and output."""
    code = readme_example()
    assert README_CONFIG in code, "the guide's example changed: update README_CONFIG"
    code = code.replace(README_CONFIG, repr(QUICK_CONFIG))
    cwd = tmp_path_factory.mktemp("api")
    env = {**no_deployment_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd / "runs" / "cartpole-api", done.stdout


@pytest.fixture(scope="module")
def run(readme_run: tuple[Path, str]) -> Path:
    return readme_run[0]


def test_the_readme_example_trains_and_acts(readme_run: tuple[Path, str]) -> None:
    """What the guide's example printed (RunResult's run_dir, env_steps, metrics; an episode's return) is the run's."""
    run, stdout = readme_run
    first, last = stdout.splitlines()[0].split(), stdout.splitlines()[-1]
    state = json.loads((run / "state.json").read_text())
    with (run / "info.csv").open() as f:
        info = list(csv.DictReader(f))
    assert first == ["runs/cartpole-api", str(state["env_steps"]), str(float(info[-1]["train_reward_mean"]))]
    assert state["round"] == 1 and state["env_steps"] >= 512
    assert last.startswith("deterministic return ") and float(last.split()[-1]) >= 1


LOAD_AND_ACT = """
import json, sys
import gymnasium as gym
import numpy as np
import stellaris

policy = stellaris.load_policy(sys.argv[1])
env = gym.make("CartPole-v1")
obs = np.stack([env.reset(seed=s)[0] for s in range(16)])
single = [int(policy.act(o, deterministic=True)) for o in obs]
batch = policy.act(obs, deterministic=True).tolist()
reached = sorted(m for m in sys.modules if m.split(".")[0] in ("redis", "gateway", "cache"))
print(json.dumps({"single": single, "batch": batch, "reached": reached, "version": policy.version}))
"""


def test_load_policy_in_a_fresh_process_acts_as_the_trained_network(run: Path) -> None:
    """load_policy in a process with no REDIS_URL and no gateway, from policy.safetensors alone (the run's other
    files removed): the same deterministic actions as the network rebuilt the way evaluate.py did before the file
    described itself (job_spec + the env's spaces + the weights), and it touches no Redis, gateway or cache code."""
    alone = run.parent / "alone"
    alone.mkdir()
    shutil.copy(run / "policy.safetensors", alone / "policy.safetensors")
    env = {**no_deployment_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_ACT, str(alone / "policy.safetensors")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["reached"] == []

    spec = JobSpec.model_validate(yaml.safe_load((run / "config.yaml").read_text())["job_spec"])
    cartpole = gym.make("CartPole-v1")
    reference = build_policy(
        cartpole.observation_space,
        cartpole.action_space,
        hidden=spec.algo.network.hidden,
        kind=spec.algo.network.kind,
        activation=spec.algo.network.activation,
        normalize_obs=spec.algo.normalize_obs,
    )
    reference.load_state_dict(load_file(str(run / "policy.safetensors")))
    assert reference.obs_normalizer is not None and float(reference.obs_normalizer.count) > 512  # statistics travel
    obs = torch.as_tensor(np.stack([cartpole.reset(seed=s)[0] for s in range(16)]))
    expected = reference.act(obs, deterministic=True)[0].tolist()
    assert got["single"] == got["batch"] == expected
    # The file holds the run's newest checkpointed weights, at that checkpoint's policy version.
    state = json.loads((run / "state.json").read_text())
    assert got["version"] == state["version"]
    frame = decode((run / state["policy_file"]).read_bytes())
    checkpoint = unpacked(frame.meta, frame.arrays)  # published packed (one array of parameters), filed by name
    saved = load_file(str(run / "policy.safetensors"))
    assert all(np.array_equal(checkpoint[k], saved[k].numpy()) for k in checkpoint) and set(checkpoint) == set(saved)
    # stellaris eval builds its policy through load_policy too.
    returns = evaluate_run(run, episodes=2, seed=0)
    assert len(returns) == 2 and all(r >= 1 for r in returns)


def test_a_resumed_run_restores_the_actors_reward_scaler_state(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint's reward-scaler moments go back to the actor on resume: its count goes on from the checkpointed
    one (every env step of both runs), where a fresh scaler would count the resumed run's steps only. One actor, so
    every batch of both runs is its own."""
    for name in ("REDIS_URL", "STELLARIS_GATEWAY_URL"):
        monkeypatch.delenv(name, raising=False)
    resumed = run.parent / "resumed"
    shutil.copytree(run, resumed)
    before = json.loads((resumed / "state.json").read_text())
    assert before["reward_scalers"]["actor-0"][2] == pytest.approx(before["env_steps"] + 1e-4)  # starts at 1e-4
    result = stellaris.train({**QUICK_CONFIG, "rounds": 2, "out": str(resumed)}, resume=True)
    assert result.rounds == 2 and result.run_dir == resumed and result.policy_path == resumed / "policy.safetensors"
    assert isinstance(result.metrics["round_id"], int) and isinstance(result.metrics["train_reward_mean"], float)
    after = json.loads((resumed / "state.json").read_text())
    assert after["env_steps"] == result.env_steps > before["env_steps"]
    assert after["reward_scalers"]["actor-0"][2] == pytest.approx(after["env_steps"] + 1e-4)


def test_train_refuses_bad_configs_and_reports_a_run_that_did_not_finish(tmp_path: Path) -> None:
    """A bad field is a ConfigError naming it; an existing run without resume a RunDirError; a resume with nothing to
    resume a TrainingError carrying the exit code. None of them starts a platform."""
    with pytest.raises(ConfigError, match="rounds"):
        stellaris.train({**QUICK_CONFIG, "rounds": 0, "out": str(tmp_path / "a")})
    with pytest.raises(TypeError, match="config must be"):
        stellaris.train(42)  # type: ignore[arg-type]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "info.csv").write_text("round_id\n")
    with pytest.raises(RunDirError, match="--resume"):
        stellaris.train({**QUICK_CONFIG, "out": str(taken)})
    empty = tmp_path / "empty"
    with pytest.raises(stellaris.TrainingError) as failed:
        stellaris.train({**QUICK_CONFIG, "out": str(empty)}, resume=True)
    assert failed.value.exit_code == 2 and failed.value.run_dir == empty
    yaml_config = tmp_path / "run.yaml"
    yaml_config.write_text(yaml.safe_dump({**QUICK_CONFIG, "lr": 1.0}))
    with pytest.raises(ConfigError, match="lr"):
        stellaris.train(yaml_config)
