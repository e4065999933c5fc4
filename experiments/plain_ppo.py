"""PPO written the plain way: one file, one process, no platform (no gateway, cache or functions).

The end-to-end baseline of `python -m experiments.bench`: the same hyperparameters as the `fast` preset (CleanRL's
MuJoCo PPO: 2048 steps per round, 32 minibatches x 10 epochs, lr 3e-4, clip 0.2, GAE 0.95, 64x64 tanh, observation
and reward normalisation, the learning rate annealed linearly over the rounds) so env steps per second compare like
for like.

    python -m experiments.plain_ppo --env Hopper-v5 --rounds 5
    python -m experiments.plain_ppo --total-steps 500000 --seed 1 --csv plain-s1.csv   # its reward, as runs report it

`--csv` writes a row per round with the columns of a run's info.csv that the reward measures read
(`experiments/summary.py`), and the run ends by printing the mean training return of the episodes in the 50k env
steps before half its steps and before its end, as the experiment suites report a run's.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import typer
from torch import nn

from experiments.summary import window_reward


@dataclass(frozen=True)
class Hyper:
    steps: int = 2048
    minibatches: int = 32
    epochs: int = 10
    lr: float = 3e-4
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    anneal_lr: bool = True  # CleanRL's default: lr * (1 - (i - 1) / rounds) in round i


def layer(i: int, o: int, gain: float = 2**0.5) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, gain)
    nn.init.zeros_(lin.bias)
    return lin


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.mu = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, act_dim, 0.01))
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.mu(obs), self.log_std.exp())


@dataclass
class RoundResult:
    seconds: float
    env_steps: int
    episode_returns: list[float]
    cpu_seconds: float = 0.0  # this process's CPU time over the round (every thread)
    collect_cpu_seconds: float = 0.0  # of it, stepping the env with the policy's inference (the rest: GAE, update)


@dataclass(frozen=True)
class Batch:
    """One round's samples, with GAE advantages and returns."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


def make_env(env_id: str, h: Hyper) -> gym.Env:
    env = gym.make(env_id)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    return gym.wrappers.NormalizeReward(env, gamma=h.gamma)


@dataclass(frozen=True)
class Rollout:
    """`h.steps` env steps as collected: observations, actions, log-probs, rewards, values and ends."""

    obs: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    rewards: np.ndarray
    values: np.ndarray
    done: np.ndarray


def collect(env: gym.Env, agent: Agent, obs: np.ndarray, h: Hyper) -> tuple[Rollout, np.ndarray, list[float]]:
    """`h.steps` env steps from `obs` with `agent`'s policy: the rollout, the observation to go on from, and the
    returns of the episodes that ended."""
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    o = np.zeros((h.steps, obs_dim), np.float32)
    a = np.zeros((h.steps, act_dim), np.float32)
    logp, rew, val = (np.zeros(h.steps, np.float32) for _ in range(3))
    done = np.zeros(h.steps, bool)
    returns: list[float] = []
    for t in range(h.steps):
        o[t] = obs
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32)
            d = agent.dist(x)
            act = d.sample()
            logp[t], val[t] = d.log_prob(act).sum().item(), agent.critic(x).item()
        a[t] = act.numpy()
        obs, r, term, trunc, info = env.step(a[t])
        rew[t], done[t] = r, term
        if term or trunc:
            returns.append(float(info["episode"]["r"]))
            obs, _ = env.reset()
            done[t] = True  # truncation treated as an end, as CleanRL does
    return Rollout(o, a, logp, rew, val, done), obs, returns


def gae_batch(r: Rollout, next_value: float, h: Hyper) -> Batch:
    """The rollout's samples with GAE(γ, λ) advantages and their returns; `next_value`: the value of the observation
    after its last step."""
    adv = np.zeros(h.steps, np.float32)
    last = 0.0
    for t in reversed(range(h.steps)):
        nv = next_value if t == h.steps - 1 else r.values[t + 1]
        nonterm = 1.0 - r.done[t]
        delta = r.rewards[t] + h.gamma * nv * nonterm - r.values[t]
        last = delta + h.gamma * h.lam * nonterm * last
        adv[t] = last
    ret = adv + r.values
    return Batch(*(torch.as_tensor(x) for x in (r.obs, r.actions, r.logp, adv, ret)))


def value_of(agent: Agent, obs: np.ndarray) -> float:
    with torch.no_grad():
        return agent.critic(torch.as_tensor(obs, dtype=torch.float32)).item()


def minibatch_loss(agent: Agent, b: Batch, idx: torch.Tensor, h: Hyper) -> torch.Tensor:
    """PPO's clipped surrogate plus the value loss over the samples `idx` of `b`, at `agent`'s parameters."""
    d = agent.dist(b.obs[idx])
    ratio = (d.log_prob(b.actions[idx]).sum(-1) - b.logp[idx]).exp()
    adv_mb = (b.advantages[idx] - b.advantages[idx].mean()) / (b.advantages[idx].std() + 1e-8)
    pg = torch.max(-adv_mb * ratio, -adv_mb * ratio.clamp(1 - h.clip, 1 + h.clip)).mean()
    v_loss = 0.5 * ((agent.critic(b.obs[idx]).squeeze(-1) - b.returns[idx]) ** 2).mean()
    return pg + h.vf_coef * v_loss


def setup(env_id: str, seed: int, h: Hyper) -> tuple[gym.Env, Agent, torch.optim.Adam, np.ndarray]:
    """The seeded env, agent, Adam and first observation of a run."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # small nets: one thread is fastest, and it is what each platform function gets
    env = make_env(env_id, h)
    agent = Agent(env.observation_space.shape[0], env.action_space.shape[0])
    opt = torch.optim.Adam(agent.parameters(), lr=h.lr, eps=1e-5)
    obs, _ = env.reset(seed=seed)
    return env, agent, opt, obs


def annealed_lr(h: Hyper, i: int, rounds: int) -> float:
    return h.lr * (1.0 - i / rounds) if h.anneal_lr else h.lr


def train(
    env_id: str, rounds: int, seed: int = 0, h: Hyper = Hyper(), on_round: Callable[[RoundResult], None] | None = None
) -> list[RoundResult]:
    env, agent, opt, obs = setup(env_id, seed, h)
    results = []
    for i in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.param_groups[0]["lr"] = annealed_lr(h, i, rounds)
        rollout, obs, returns = collect(env, agent, obs, h)
        collect_cpu = time.process_time() - c0
        batch = gae_batch(rollout, value_of(agent, obs), h)
        mb = h.steps // h.minibatches
        for _ in range(h.epochs):
            for idx in torch.randperm(h.steps).split(mb):
                loss = minibatch_loss(agent, batch, idx, h)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), h.max_grad_norm)
                opt.step()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        results.append(RoundResult(seconds, h.steps, returns, cpu, collect_cpu))
        if on_round is not None:
            on_round(results[-1])
    env.close()
    return results


def info_rows(results: list[RoundResult]) -> list[dict[str, float]]:
    """Per round, the info.csv columns the reward measures read: duration, cumulative env steps, episodes ended and
    their mean return (NaN without one)."""
    rows, steps = [], 0
    for i, r in enumerate(results, 1):
        steps += r.env_steps
        mean = float(np.mean(r.episode_returns)) if r.episode_returns else math.nan
        rows.append(
            {
                "round_id": i,
                "duration": r.seconds,
                "env_steps": steps,
                "episodes": len(r.episode_returns),
                "train_reward_mean": mean,
            }
        )
    return rows


def main(
    env: str = "Hopper-v5",
    rounds: int = typer.Option(5, min=1, help="rounds of 2048 env steps"),
    seed: int = 0,
    total_steps: int | None = typer.Option(None, min=1, help="rounds enough for this many env steps (over --rounds)"),
    csv_path: Path | None = typer.Option(None, "--csv", help="write a row per round (info.csv's reward columns)"),
) -> None:
    if total_steps is not None:
        rounds = math.ceil(total_steps / Hyper.steps)
    done: list[RoundResult] = []

    def progress(r: RoundResult) -> None:
        done.append(r)
        mean = np.mean(r.episode_returns) if r.episode_returns else math.nan
        print(
            f"round {len(done)}/{rounds}: {r.env_steps / r.seconds:,.0f} env steps/s, mean episodic return {mean:.1f}",
            flush=True,
        )

    rows = info_rows(train(env, rounds, seed, on_round=progress))
    if csv_path is not None:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    end = total_steps or rows[-1]["env_steps"]
    half = window_reward(rows, end / 2)
    print(
        f"mean training return of the episodes in the 50k env steps before {end / 2:,.0f}: {half:,.0f}; "
        f"before {end:,.0f}: {window_reward(rows, end):,.0f}"
    )


if __name__ == "__main__":
    typer.run(main)
