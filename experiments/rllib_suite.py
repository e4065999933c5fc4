"""The `rllib` suite (paper Fig. 9): RLlib's own PPO against Stellaris PPO on Hopper, at equal env steps and cores.

Each seed gets two runs: Stellaris PPO (the algorithms suite's `stellaris` configuration, on the preset's `rllib`
budget) and RLlib PPO on the same env, the same env-step budget (rounds × train batch), the same seed and
hyperparameters mapped onto RLlib's names, with one env runner per Stellaris actor on the same cores. RLlib runs with
the interpreter of its own venv (`rllib_env`), through `rllib_ppo.py`; its per-iteration progress is then written into
the layout of a Stellaris run (info.csv, state.json), so summaries and figures read both alike.

Cost (docs/experiments.md): RLlib is serverful, charged for what it holds for its whole wall-clock time, from
`ray.init` to its
last iteration: its cores at the actor price per core-second and its one learner at the learner price. Stellaris is
charged as its own run reports it.

Not mapped onto RLlib: reward normalisation (RLlib has no such connector; returns are the env's own in both) and the
Stellaris knobs (RLlib's PPO is synchronous).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.runner import Outcome, run_dir
from experiments.suites import RunPlan, plan
from experiments.summary import write_csv
from gateway.models import ACTOR_PRICING, LEARNER_PRICING
from host.lifetime import dies_with_us

SCRIPT = Path(__file__).with_name("rllib_ppo.py")
VARIANT = "rllib"
VARIANTS = ("stellaris", VARIANT)
LEARNERS = 1  # RLlib's PPO on one machine: one local learner
RUN_TIMEOUT_S = 4 * 3600.0
STOP_WAIT_S = 30.0
INFO_COLUMNS = [
    "round_id",
    "duration",
    "episodes",
    "train_reward_mean",
    "train_reward_rllib",
    "env_steps",
    "cost",
    "cost_learner",
    "cost_actor",
    "wall_clock_s",
]


def is_rllib(p: RunPlan) -> bool:
    return p.config.get("mode") == VARIANT


def serverful_cost_usd(wall_clock_s: float, *, cores: int, learners: int = LEARNERS) -> tuple[float, float]:
    """(learner, actor) cost in USD of a serverful run holding `cores` actor cores and `learners` learner slots for
    `wall_clock_s` (docs/experiments.md: a c6a.32xlarge core and a quarter of a p3.2xlarge per second)."""
    if wall_clock_s < 0 or cores < 0 or learners < 0:
        raise ValueError(f"wall_clock_s, cores and learners must be >= 0, got {wall_clock_s}, {cores}, {learners}")
    return (
        wall_clock_s * learners * LEARNER_PRICING.usd_per_second,
        wall_clock_s * cores * ACTOR_PRICING.usd_per_second,
    )


def run_spec(stellaris: RunPlan, *, cores: int) -> dict[str, Any]:
    """`rllib_ppo.RunSpec` fields for RLlib's PPO with the Stellaris run's env, seed, env-step budget, actors (as env
    runners, one core each, at most `cores`) and resolved hyperparameters."""
    from contract.jobspec import JobRequest, resolve
    from stellaris.config import TrainConfig

    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    train = TrainConfig.model_validate(stellaris.config)
    algo = resolve(JobRequest.model_validate(train.job_request("rllib-baseline"))).algo
    if algo.algo != "ppo" or train.rounds is None:
        raise ValueError(f"the RLlib baseline runs PPO for a number of rounds, not {algo.algo} for {train.rounds}")
    return {
        "env": train.env,
        "seed": train.seed,
        "env_steps": train.rounds * algo.train_batch_size,
        "cores": cores,
        "env_runners": min(train.actors, cores),
        "envs_per_env_runner": train.envs_per_actor,
        "ppo": {
            "lr": algo.lr,
            "gamma": algo.gamma,
            "lambda_": algo.lam,
            "clip_param": algo.clip,
            "vf_loss_coeff": algo.vf_coef,
            "entropy_coeff": algo.ent_coef,
            "use_kl_loss": algo.kl_coef > 0,
            "kl_coeff": algo.kl_coef,
            "kl_target": algo.kl_target,
            "grad_clip": algo.max_grad_norm,
            "vf_clip_param": algo.vf_clip,
            "train_batch_size_per_learner": algo.train_batch_size,
            "minibatch_size": algo.train_batch_size // algo.num_minibatches,
            "num_epochs": algo.num_epochs,
            "fcnet_hiddens": list(algo.network.hidden),
            "fcnet_activation": algo.network.activation,
            "normalize_obs": algo.normalize_obs,
        },
    }


def rllib_plan(stellaris: RunPlan, *, cores: int) -> RunPlan:
    """The RLlib run of the same budget as `stellaris`: its row is `rllib`, its run id names mode `rllib`."""
    spec = run_spec(stellaris, cores=cores)
    config = {"env": spec["env"], "algo": "ppo", "mode": VARIANT, "seed": spec["seed"], "rounds": stellaris.rounds}
    return RunPlan(stellaris.group, VARIANT, stellaris.seed, {**config, "rllib": spec})


def plans(
    preset: str, seeds: int, variants: Sequence[str] | None = None, *, cores: int, first_seed: int = 0
) -> list[RunPlan]:
    """The suite's runs: per seed, Stellaris then RLlib (only the rows in `variants` when given)."""
    unknown = [v for v in variants or () if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)} of rllib; choose from {', '.join(VARIANTS)}")
    ours = plan("rllib", preset, seeds, first_seed=first_seed)
    rows = [p for s in ours for p in (s, rllib_plan(s, cores=cores))]
    return [p for p in rows if variants is None or p.variant in variants]


# -- from RLlib's progress to a run directory ---------------------------------------------------------------------
def _float(value: str | None) -> float:
    return float(value) if value not in (None, "") else math.nan


def info_rows(progress: list[dict[str, str]], *, cores: int) -> list[dict[str, Any]]:
    """info.csv rows (the columns the summary reads) from progress.csv rows; cost is what the run held until the end
    of each iteration, counted from `ray.init`."""
    rows = []
    for p in progress:
        wall = _float(p["wall_clock_s"])
        learner, actor = serverful_cost_usd(wall, cores=cores)
        rows.append(
            {
                "round_id": int(p["iteration"]),
                "duration": _float(p["iteration_s"]),
                "episodes": int(p["episodes"]),
                "train_reward_mean": _float(p["return_mean"]),
                "train_reward_rllib": _float(p["return_mean_rllib"]),
                "env_steps": int(p["env_steps"]),
                "cost": learner + actor,
                "cost_learner": learner,
                "cost_actor": actor,
                "wall_clock_s": wall,
            }
        )
    return rows


def run_state(result: dict[str, Any], *, cores: int) -> dict[str, Any]:
    """state.json of a finished RLlib run: rounds done, env steps, wall-clock and the cost of the whole run."""
    learner, actor = serverful_cost_usd(float(result["wall_clock_s"]), cores=cores)
    return {
        "round": int(result["iterations"]),
        "env_steps": int(result["env_steps"]),
        "elapsed_s": float(result["wall_clock_s"]),
        "cost": learner + actor,
        "cost_learner": learner,
        "cost_actor": actor,
        "system": VARIANT,
        "ray_version": result.get("ray_version"),
    }


def finish(path: Path, p: RunPlan) -> None:
    """Write info.csv and state.json of a finished RLlib run from its progress.csv and result.json."""
    cores = int(p.config["rllib"]["cores"])
    with (path / "progress.csv").open(newline="") as f:
        progress = list(csv.DictReader(f))
    write_csv(path / "info.csv", INFO_COLUMNS, info_rows(progress, cores=cores))
    state = run_state(json.loads((path / "result.json").read_text()), cores=cores)
    (path / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))


def is_finished(root: Path, p: RunPlan) -> bool:
    return (run_dir(root, p) / "state.json").exists() and (run_dir(root, p) / "result.json").exists()


# -- running --------------------------------------------------------------------------------------------------------
def _run_one(root: Path, p: RunPlan, python: Path, echo: Callable[[str], None], timeout_s: float) -> Outcome:
    path = run_dir(root, p)
    if is_finished(root, p):
        return Outcome(p, "skipped")
    if path.exists():  # an unfinished RLlib run starts over: RLlib's checkpoints are pickles, which we do not read
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(p.config["rllib"], indent=2, sort_keys=True))
    cmd = [str(python), str(SCRIPT), "--config", str(path / "run.json"), "--out", str(path)]
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # one torch thread per process, as Stellaris's functions
    t0 = time.monotonic()
    with (path / "log.txt").open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **env}, preexec_fn=dies_with_us()
        )

        def pump() -> None:  # the script's own lines (progress) to the console and the log; Ray's logging is stderr
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                echo(f"{p.run_id}: {line.rstrip()}")

        reader = threading.Thread(target=pump, name="rllib-output", daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            reader.join(timeout=STOP_WAIT_S)
            return Outcome(p, "failed", time.monotonic() - t0, f"over the {timeout_s:.0f} s limit; stopped")
        except BaseException:  # Ctrl-C or SIGTERM: the script shuts its Ray down on SIGTERM
            _stop(proc)
            raise
        reader.join(timeout=STOP_WAIT_S)
    seconds = time.monotonic() - t0
    if code == 0 and (path / "result.json").exists():
        finish(path, p)
        return Outcome(p, "done", seconds)
    if code in (130, -signal.SIGINT, -signal.SIGTERM):
        return Outcome(p, "interrupted", seconds, "interrupted; run the suite again to rerun it")
    tail = (path / "log.txt").read_text(errors="replace").strip().splitlines()[-3:]
    return Outcome(p, "failed", seconds, f"exit code {code}: {' | '.join(tail)}")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def execute(
    root: Path,
    rllib_plans: list[RunPlan],
    python: Path,
    *,
    on_outcome: Callable[[Outcome], None],
    echo: Callable[[str], None] = print,
    timeout_s: float = RUN_TIMEOUT_S,
) -> list[Outcome]:
    """Run every unfinished RLlib plan, one at a time (each holds all its cores); an interrupted run starts over."""
    outcomes = []
    for p in rllib_plans:
        outcome = _run_one(root, p, python, echo, timeout_s)
        on_outcome(outcome)
        outcomes.append(outcome)
        if outcome.status == "interrupted":
            break
    return outcomes
