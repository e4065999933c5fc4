"""RLlib's own PPO on one env for an env-step budget: the baseline of the `rllib` suite (paper Fig. 9).

Run with the RLlib virtual environment's interpreter (`experiments/rllib_env.py` makes it; RLlib pins a Gymnasium
other than the project's), never imported by the project:

    .venv-rllib/bin/python experiments/rllib_ppo.py --config run.json --out DIR

`run.json` says what to train (see `RunSpec`). The run is RLlib's new API stack through its public config
(`PPOConfig().environment().env_runners().learners().training().rl_module()`): no RLlib code is copied. Progress goes
to stdout, one line per training iteration; `DIR/progress.csv` gets a row per iteration (lifetime env steps, the
episodes that ended in it and their mean return, RLlib's own smoothed return, the seconds it took) and
`DIR/result.json` the run's totals when it finishes. Only the standard library is imported at module level, so the
project's tests can check the spec and the CSV rows without RLlib.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

PROGRESS_COLUMNS = (
    "iteration",
    "env_steps",
    "episodes",
    "return_mean",
    "return_mean_rllib",
    "iteration_s",
    "train_s",
    "wall_clock_s",
)
# Keys this script's episode callback logs on every EnvRunner; summed per iteration, they give the mean return of
# exactly the episodes that ended in it (RLlib's own episode_return_mean is smoothed over the last 100 episodes).
RETURN_SUM_KEY = "stellaris_episode_return_sum"
EPISODES_KEY = "stellaris_episodes"


@dataclass(frozen=True)
class PPOHyperparameters:
    """RLlib's names for the PPO hyperparameters Stellaris runs with (the suite maps ours onto these)."""

    lr: float
    gamma: float
    lambda_: float
    clip_param: float
    vf_loss_coeff: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_coeff: float
    kl_target: float
    grad_clip: float | None  # global-norm clip; None: none
    vf_clip_param: float | None  # None: the value loss is not clipped (RLlib's default clips at 10)
    train_batch_size_per_learner: int
    minibatch_size: int
    num_epochs: int
    fcnet_hiddens: tuple[int, ...]
    fcnet_activation: str
    normalize_obs: bool  # RLlib's MeanStdFilter connector, as Stellaris's observation normaliser


@dataclass(frozen=True)
class RunSpec:
    """One RLlib training run. `cores` CPUs are given to Ray; each env runner holds one."""

    env: str
    seed: int
    env_steps: int  # stop once this many env steps were sampled (lifetime)
    cores: int
    env_runners: int
    envs_per_env_runner: int
    ppo: PPOHyperparameters
    object_store_bytes: int = 200_000_000
    max_iterations: int = 100_000  # a bound on the loop, far above any budget's need
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """Raises ValueError naming a missing, unknown or bad field."""
        known, ppo_known = {f.name for f in fields(cls)}, {f.name for f in fields(PPOHyperparameters)}
        unknown = sorted(set(data) - known) + [f"ppo.{k}" for k in sorted(set(data.get("ppo") or {}) - ppo_known)]
        if unknown:
            raise ValueError(f"unknown field(s) in the run spec: {', '.join(unknown)}")
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(data)) + [f"ppo.{k}" for k in sorted(ppo_known - set(data.get("ppo") or {}))]
        if missing:
            raise ValueError(f"missing field(s) in the run spec: {', '.join(missing)}")
        ppo = dict(data["ppo"])
        ppo["fcnet_hiddens"] = tuple(int(h) for h in ppo["fcnet_hiddens"])
        spec = cls(**{**data, "ppo": PPOHyperparameters(**ppo)})
        spec.validate()
        return spec

    def validate(self) -> None:
        positive = ("env_steps", "cores", "env_runners", "envs_per_env_runner", "max_iterations")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.env_runners > self.cores:
            raise ValueError(f"env_runners ({self.env_runners}) needs one core each, but cores is {self.cores}")
        p = self.ppo
        if p.train_batch_size_per_learner % p.minibatch_size:
            raise ValueError(
                f"ppo.train_batch_size_per_learner {p.train_batch_size_per_learner} is not a multiple of "
                f"ppo.minibatch_size {p.minibatch_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def progress_row(
    iteration: int, result: dict[str, Any], *, iteration_s: float, train_s: float, wall_s: float
) -> dict[str, Any]:
    """A progress.csv row from one `Algorithm.train()` result (a dict of RLlib's metrics)."""
    runners = result.get("env_runners", {})
    episodes = int(runners.get(EPISODES_KEY, 0) or 0)
    return_sum = float(runners.get(RETURN_SUM_KEY, 0.0) or 0.0)
    steps = runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", 0))
    return {
        "iteration": iteration,
        "env_steps": int(steps),
        "episodes": episodes,
        "return_mean": return_sum / episodes if episodes else math.nan,
        "return_mean_rllib": float(runners.get("episode_return_mean", math.nan)),
        "iteration_s": round(iteration_s, 4),
        "train_s": round(train_s, 4),
        "wall_clock_s": round(wall_s, 4),
    }


def on_episode_end(*, episode: Any, metrics_logger: Any, **_: Any) -> None:
    """Runs on the EnvRunners: the episode's return and a count, summed per iteration (reduce "sum" clears on each
    reduce)."""
    metrics_logger.log_value(RETURN_SUM_KEY, float(episode.get_return()), reduce="sum")
    metrics_logger.log_value(EPISODES_KEY, 1, reduce="sum")


def build_config(spec: RunSpec) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    p = spec.ppo
    connector = None
    if p.normalize_obs:
        from ray.rllib.connectors.env_to_module import MeanStdFilter

        def connector(env: Any, spaces: Any, device: Any) -> Any:
            return MeanStdFilter()

    return (
        PPOConfig()
        .environment(spec.env, env_config=spec.env_kwargs)
        .env_runners(
            num_env_runners=spec.env_runners,
            num_envs_per_env_runner=spec.envs_per_env_runner,
            num_cpus_per_env_runner=1,
            env_to_module_connector=connector,
        )
        .learners(num_learners=0)  # one local learner in the driver process, as RLlib runs PPO on one machine
        .training(
            lr=p.lr,
            gamma=p.gamma,
            lambda_=p.lambda_,
            clip_param=p.clip_param,
            vf_loss_coeff=p.vf_loss_coeff,
            entropy_coeff=p.entropy_coeff,
            use_kl_loss=p.use_kl_loss,
            kl_coeff=p.kl_coeff,
            kl_target=p.kl_target,
            grad_clip=p.grad_clip,
            grad_clip_by="global_norm",
            vf_clip_param=math.inf if p.vf_clip_param is None else p.vf_clip_param,
            train_batch_size_per_learner=p.train_batch_size_per_learner,
            minibatch_size=p.minibatch_size,
            num_epochs=p.num_epochs,
        )
        .rl_module(
            model_config=DefaultModelConfig(fcnet_hiddens=list(p.fcnet_hiddens), fcnet_activation=p.fcnet_activation)
        )
        .callbacks(on_episode_end=on_episode_end)
        .debugging(seed=spec.seed)
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


def train(spec: RunSpec, out: Path) -> dict[str, Any]:
    """Train until the env-step budget is sampled; returns the totals written to result.json."""
    import ray

    config = build_config(spec)  # before ray.init: a broken RLlib install fails here, in seconds
    t0 = time.monotonic()
    # A private temp dir (short: Ray's socket paths are limited to 107 bytes) and no dashboard: other Ray clusters
    # run on this machine, and this one must neither find nor stop them.
    temp_dir = tempfile.mkdtemp(prefix="rllib-", dir="/tmp")
    ray.init(
        num_cpus=spec.cores,
        include_dashboard=False,
        object_store_memory=spec.object_store_bytes,
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        algo = config.build_algo()
        setup_s = time.monotonic() - t0
        print(f"RLlib PPO on {spec.env}: built in {setup_s:.1f} s; {spec.env_steps} env steps", flush=True)
        rows: list[dict[str, Any]] = []
        train_s = 0.0
        with (out / "progress.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=PROGRESS_COLUMNS)
            writer.writeheader()
            for iteration in range(1, spec.max_iterations + 1):
                t_iter = time.monotonic()
                result = algo.train()
                iteration_s = time.monotonic() - t_iter
                train_s += iteration_s
                row = progress_row(
                    iteration, result, iteration_s=iteration_s, train_s=train_s, wall_s=time.monotonic() - t0
                )
                writer.writerow(row)
                f.flush()
                rows.append(row)
                print(
                    f"iteration {iteration}: {row['env_steps']} env steps, return {row['return_mean']:.1f} over "
                    f"{row['episodes']} episodes, {iteration_s:.1f} s",
                    flush=True,
                )
                if row["env_steps"] >= spec.env_steps:
                    break
        wall_s = time.monotonic() - t0
        algo.stop()
        if not rows or rows[-1]["env_steps"] < spec.env_steps:
            raise RuntimeError(f"{spec.max_iterations} iterations sampled fewer than {spec.env_steps} env steps")
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {
        "status": "done",
        "iterations": len(rows),
        "env_steps": rows[-1]["env_steps"] if rows else 0,
        "setup_s": round(setup_s, 4),
        "train_s": round(train_s, 4),
        "wall_clock_s": round(wall_s, 4),
        "cores": spec.cores,
        "env_runners": spec.env_runners,
        "learners": 1,  # the local learner
        "ray_version": ray.__version__,
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the run spec (JSON)")
    parser.add_argument("--out", type=Path, required=True, help="directory for progress.csv and result.json")
    args = parser.parse_args(argv)
    try:
        spec = RunSpec.from_dict(json.loads(args.config.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: bad run spec {args.config}: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM (the suite being stopped) ends the run as Ctrl-C does, so ray.shutdown() runs.
    signal.signal(signal.SIGTERM, _interrupt)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Token auth with this run's own token: left alone, Ray writes one to ~/.ray/auth_token, which every Ray started
    # on the machine afterwards would pick up.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    try:
        totals = train(spec, args.out)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    write_json(args.out / "result.json", totals)
    print(f"done: {totals['env_steps']} env steps in {totals['wall_clock_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
