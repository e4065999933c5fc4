"""`overrides:` and `--set`: merged as documented, and every override checked before anything starts, named as the
user wrote it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import stellaris.run
from contract.jobspec import JobRequest, resolve
from stellaris.cli import app
from stellaris.config import ConfigError, TrainConfig, load_config
from stellaris.train_options import parsed_sets

ROOT = Path(__file__).resolve().parents[2]


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("env: CartPole-v1\nrounds: 1\n" + text)
    return path


def _train(monkeypatch: pytest.MonkeyPatch, *args: str) -> TrainConfig:
    """The TrainConfig `stellaris train ARGS` would run (the run itself replaced by a recorder)."""
    seen: list[TrainConfig] = []
    monkeypatch.setattr(stellaris.run, "run_training", lambda cfg, resume=False: seen.append(cfg) or 0)
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_set_nests_dotted_keys_into_overrides_and_reaches_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _train(
        monkeypatch,
        "--config",
        str(_yaml(tmp_path, "")),
        "--set",
        "lr=1e-4",
        "--set",
        "stellaris.d=0.9",
        "--set",
        "network.hidden=[64,64]",
        "--set",
        "stellaris.beta_floor=3",
        "--set",
        "stellaris.rule=ssp",
    )
    assert (cfg.d, cfg.mode) == (0.9, "ssp")  # a knob's `stellaris.<knob>` is its field (`rule`: `mode`)
    assert cfg.overrides == {"lr": 1e-4, "network": {"hidden": [64, 64]}, "stellaris": {"beta_floor": 3}}
    algo = resolve(JobRequest.model_validate(cfg.job_request("j"))).algo
    assert (algo.lr, algo.network.hidden, algo.stellaris.d, algo.stellaris.beta_floor) == (1e-4, (64, 64), 0.9, 3.0)


def test_set_beats_the_files_same_key_and_keeps_its_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _yaml(tmp_path, "d: 0.5\noverrides: {lr: 0.01, gamma: 0.9, network: {activation: relu, hidden: [8]}}\n")
    cfg = _train(
        monkeypatch,
        "--config",
        str(path),
        "--set",
        "lr=0.02",
        "--set",
        "network.hidden=[16]",
        "--set",
        "stellaris.d=0.7",
    )
    assert cfg.overrides == {"lr": 0.02, "gamma": 0.9, "network": {"activation": "relu", "hidden": [16]}}
    assert cfg.d == 0.7
    with pytest.raises(ConfigError, match=r"--d 0.3 and --set stellaris.d=0.5 set the same knob; give one"):
        load_config(path, {"d": 0.3}, sets={"stellaris": {"d": 0.5}})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("lr", "--set 'lr' is not KEY=VALUE (e.g. --set lr=1e-4)"),
        ("=3", "--set '=3' has an empty key or key part"),
        ("stellaris..d=1", "--set 'stellaris..d=1' has an empty key or key part"),
        ("lr=[1", "--set 'lr=[1': the value is not YAML"),
    ],
)
def test_a_malformed_set_is_named(given: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parsed_sets([given])
    assert str(err.value).startswith(message), err.value


@pytest.mark.parametrize(
    ("yaml_text", "sets", "message"),
    [
        ("overrides: {lrr: 0.1}\n", None, "overrides.lrr: Extra inputs are not permitted (did you mean: lr?)"),
        ("", {"stellaris": {"dd": 1}}, "overrides.stellaris.dd: Extra inputs are not permitted (did you mean: d?)"),
        (
            "",
            {"network": {"hiden": [8]}},
            "overrides.network.hiden: Extra inputs are not permitted (did you mean: hidden?)",
        ),
        (
            "",
            {"replay_ratio": 0.5},
            "overrides.replay_ratio: Extra inputs are not permitted (a setting of impact and appo; this job's --algo "
            "is ppo)",
        ),
        ("", {"zzz": 1}, "invalid configuration: overrides.zzz: Extra inputs are not permitted"),
        ("", {"lr": -1}, "invalid configuration: overrides.lr: Input should be greater than 0"),
        (
            "overrides: {network: {hidden: [64, 0]}}\n",
            None,
            "overrides.network.hidden.1: Input should be greater than 0",
        ),
        ("overrides: {stellaris: 3}\n", None, "overrides.stellaris: must be a mapping of fields, got 3"),
        ("overrides: {num_minibatches: 3}\n", None, "train_batch_size 2048 is not divisible by num_minibatches 3"),
        (
            "overrides: {stellaris: {horizon_rounds: 0}}\n",
            None,
            "overrides.stellaris.horizon_rounds: Input should be greater than 0",
        ),
    ],
)
def test_every_override_is_checked_up_front_and_named(
    tmp_path: Path, yaml_text: str, sets: dict[str, object] | None, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_yaml(tmp_path, yaml_text), {}, sets=sets)
    assert message in str(err.value) and "\n" not in str(err.value), err.value
    assert "(" not in str(err.value) or "(" in message  # a hint only where a field or an algorithm is near


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("yaml_text", "args", "line"),
    [
        ("overrides: {lrr: 0.1}\n", [], "error: invalid configuration: overrides.lrr: Extra inputs are not permitted"),
        ("", ["--set", "stellaris.dd=1"], "error: invalid configuration: overrides.stellaris.dd: Extra inputs"),
    ],
)
def test_a_bad_override_stops_the_cli_before_anything_starts(
    tmp_path: Path, yaml_text: str, args: list[str], line: str
) -> None:
    """One line, exit 2, no run directory; the Redis named by REDIS_URL is unreachable, so an error about
    anything but the override would mean the platform was started first."""
    out = tmp_path / "run"
    path = _yaml(tmp_path, yaml_text + f"out: {out}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("STELLARIS_GATEWAY_URL", "STELLARIS_DEBUG")}
    env |= {"REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "stellaris.cli", "train", "--config", str(path), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(line), proc.stderr
    assert not out.exists()


def test_mapping_flags_take_json_and_resources_also_name_amount_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _train(monkeypatch, "--config", str(_yaml(tmp_path, "")), "--overrides", '{"lr": 0.01}', "--set", "gamma=0.9")
    assert cfg.overrides == {"lr": 0.01, "gamma": 0.9}
    ray = _train(
        monkeypatch,
        "--config",
        str(_yaml(tmp_path, "backend: ray\n")),
        "--learner-resources",
        '{"gpu_node": 0.01}',
        "--actor-resources",
        "cpu_node=0.5",
    )
    assert (ray.learner_resources, ray.actor_resources) == ({"gpu_node": 0.01}, {"cpu_node": 0.5})
    result = CliRunner().invoke(app, ["train", "--config", str(_yaml(tmp_path, "")), "--overrides", "[1]"])
    assert result.exit_code == 2 and "--overrides: '[1]' is not a JSON object" in result.output, result.output
