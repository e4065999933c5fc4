"""How far a stale gradient is from a fresh one, in PPO as the fast preset runs it.

The plain loop's PPO (`experiments.plain_ppo`, the fast preset's hyperparameters) is trained with every minibatch's
gradient taken `--delay` D updates late, as a Stellaris learner's gradient is applied D versions after its base
version. For every minibatch the gradient is also taken at the current parameters θ_t, the one sync would apply, and
compared with others, by cosine and by relative error |g - g_fresh| / |g_fresh|:

- stale: at θ_{t-D}, what a gradient of staleness D is (the one this run applies);
- look-ahead: at θ_{t-D} + D·(θ_{t-D} - θ_{t-D-1}), the stale point moved D updates along the last update (a
  DANA-style correction a learner could make from the last two versions it loaded);
- another minibatch: at θ_t over as many other samples of the round's batch, the yardstick: how much a gradient
  moves with the samples it is taken over, which every PPO update has in it.

    python -m experiments.stale_gradient --delay 3 --rounds 120 --seed 1 --csv stale.csv

It prints the medians of each quarter of the run and writes a row per round (medians over its minibatches).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import typer
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from experiments.plain_ppo import Agent, Batch, Hyper, annealed_lr, collect, gae_batch, minibatch_loss, setup, value_of
from experiments.summary import window_reward


def closeness(fresh: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """Cosine of `other` with `fresh`, and |other - fresh| / |fresh|."""
    norm = float(torch.linalg.vector_norm(fresh))
    if norm == 0.0:
        raise ValueError("the fresh gradient is zero: no direction to compare with")
    cosine = float(torch.dot(fresh, other)) / (norm * float(torch.linalg.vector_norm(other)) or math.inf)
    return cosine, float(torch.linalg.vector_norm(other - fresh)) / norm


def extrapolated(base: torch.Tensor, previous: torch.Tensor, updates: int) -> torch.Tensor:
    """`base` moved `updates` steps further along the step from `previous` to it."""
    return base + updates * (base - previous)


def gradient_at(probe: Agent, point: torch.Tensor, batch: Batch, idx: torch.Tensor, h: Hyper) -> torch.Tensor:
    """The loop's clipped minibatch gradient at the flat parameters `point` (computed on `probe`)."""
    vector_to_parameters(point, probe.parameters())
    probe.zero_grad()
    minibatch_loss(probe, batch, idx, h).backward()
    nn.utils.clip_grad_norm_(probe.parameters(), h.max_grad_norm)
    return parameters_to_vector([p.grad for p in probe.parameters() if p.grad is not None])


def set_gradient(agent: Agent, flat: torch.Tensor) -> None:
    at = 0
    for p in agent.parameters():
        p.grad = flat[at : at + p.numel()].view_as(p).clone()
        at += p.numel()


FIGURES = ("cos_stale", "cos_lookahead", "err_stale", "err_lookahead", "cos_other", "err_other")


@dataclass(frozen=True)
class RoundCloseness:
    round: int
    cos_stale: float
    cos_lookahead: float
    err_stale: float
    err_lookahead: float
    cos_other: float
    err_other: float
    episodes: int
    train_reward_mean: float


def train_late(
    env_id: str,
    rounds: int,
    seed: int,
    delay: int,
    h: Hyper | None = None,
    *,
    compare: bool = True,
    apply_lookahead: bool = False,
) -> list[RoundCloseness]:
    """The loop trained with each gradient taken `delay` updates late (at the look-ahead point with
    `apply_lookahead`); per round, the medians of `closeness` (NaN without `compare`: then only the applied gradient
    is computed, as fast as the plain loop)."""
    h = h or Hyper()
    if delay < 0:
        raise ValueError(f"delay must be >= 0, got {delay}")
    env, agent, opt, obs = setup(env_id, seed, h)
    with torch.random.fork_rng():  # its initial weights are never used: the run's random stream stays the loop's
        probe = Agent(env.observation_space.shape[0], env.action_space.shape[0])
    history = deque([parameters_to_vector(agent.parameters()).detach().clone()] * (delay + 2), maxlen=delay + 2)
    draws = torch.Generator().manual_seed(seed)  # the other minibatches' own: the run's random stream stays the loop's
    rows = []
    for i in range(rounds):
        opt.param_groups[0]["lr"] = annealed_lr(h, i, rounds)
        rollout, obs, returns = collect(env, agent, obs, h)
        batch = gae_batch(rollout, value_of(agent, obs), h)
        figures: list[tuple[float, ...]] = []
        for _ in range(h.epochs):
            for idx in torch.randperm(h.steps).split(h.steps // h.minibatches):
                base, previous = history[-1 - delay], history[-2 - delay]
                point = extrapolated(base, previous, delay) if apply_lookahead else base
                applied = gradient_at(probe, point, batch, idx, h)
                set_gradient(agent, applied)
                if compare:
                    figures.append(
                        _figures(
                            probe, history[-1], base, previous, delay, batch, idx, draws, h, applied, apply_lookahead
                        )
                    )
                opt.step()
                history.append(parameters_to_vector(agent.parameters()).detach().clone())
        mean = float(np.mean(returns)) if returns else math.nan
        columns = zip(*figures, strict=True)
        medians = [statistics.median(c) for c in columns] if figures else [math.nan] * len(FIGURES)
        rows.append(RoundCloseness(i + 1, *medians, episodes=len(returns), train_reward_mean=mean))
    env.close()
    return rows


def _figures(
    probe: Agent,
    current: torch.Tensor,
    base: torch.Tensor,
    previous: torch.Tensor,
    delay: int,
    batch: Batch,
    idx: torch.Tensor,
    draws: torch.Generator,
    h: Hyper,
    applied: torch.Tensor,
    applied_lookahead: bool,
) -> tuple[float, ...]:
    """`closeness` to the fresh gradient (at `current`, over `idx`) of the stale one, the look-ahead one and another
    minibatch's, as (cos stale, cos look-ahead, err stale, err look-ahead, cos other, err other); `applied`, the
    gradient the run applies (the look-ahead one when `applied_lookahead`), is not taken again."""
    size = len(idx)
    fresh = gradient_at(probe, current, batch, idx, h)
    stale = gradient_at(probe, base, batch, idx, h) if applied_lookahead else applied
    ahead = applied if applied_lookahead else gradient_at(probe, extrapolated(base, previous, delay), batch, idx, h)
    mask = torch.ones(h.steps, dtype=torch.bool)
    mask[idx] = False
    others = mask.nonzero().squeeze(-1)
    other = gradient_at(probe, current, batch, others[torch.randperm(len(others), generator=draws)[:size]], h)
    (c, e), (ca, ea), (co, eo) = closeness(fresh, stale), closeness(fresh, ahead), closeness(fresh, other)
    return c, ca, e, ea, co, eo


def quarter_medians(rows: list[RoundCloseness]) -> list[tuple[int, int, RoundCloseness]]:
    """Per quarter of the run (first and last round), the medians of its rounds' figures."""
    out = []
    n = len(rows)
    for q in range(4):
        part = rows[q * n // 4 : (q + 1) * n // 4]
        if not part:
            continue
        med = {f: statistics.median(getattr(r, f) for r in part) for f in FIGURES}
        rewards = [r.train_reward_mean for r in part if not math.isnan(r.train_reward_mean)]
        summary = RoundCloseness(
            part[-1].round,
            **med,
            episodes=sum(r.episodes for r in part),
            train_reward_mean=statistics.mean(rewards) if rewards else math.nan,
        )
        out.append((part[0].round, part[-1].round, summary))
    return out


def main(
    env: str = "Hopper-v5",
    delay: int = typer.Option(3, min=0, help="updates between a gradient's parameters and its application"),
    rounds: int = typer.Option(120, min=1, help="rounds of 2048 env steps (the learning rate anneals over them)"),
    seed: int = 1,
    csv_path: Path | None = typer.Option(None, "--csv", help="write a row per round"),
    compare: bool = typer.Option(True, help="take the other gradients too (--no-compare: train only, 4x faster)"),
    apply_lookahead: bool = typer.Option(False, help="apply the look-ahead gradient instead of the stale one"),
) -> None:
    rows = train_late(env, rounds, seed, delay, compare=compare, apply_lookahead=apply_lookahead)
    if csv_path is not None:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
    applied = "look-ahead" if apply_lookahead else "stale"
    print(f"{env}, {applied} gradients {delay} updates late, seed {seed}: medians of each quarter's rounds")
    for first, last, s in quarter_medians(rows):
        figures = (
            f"cosine with the fresh gradient stale {s.cos_stale:.4f}, look-ahead {s.cos_lookahead:.4f}, another "
            f"minibatch {s.cos_other:.4f}; relative error stale {s.err_stale:.4f}, look-ahead {s.err_lookahead:.4f}, "
            f"another minibatch {s.err_other:.4f}; "
        )
        print(f"rounds {first}-{last}: {figures if compare else ''}mean training return {s.train_reward_mean:,.0f}")
    steps = [
        {"env_steps": r.round * Hyper.steps, "episodes": r.episodes, "train_reward_mean": r.train_reward_mean}
        for r in rows
    ]
    end = steps[-1]["env_steps"]
    print(
        f"mean training return of the episodes in the 50k env steps before {end / 2:,.0f}: "
        f"{window_reward(steps, end / 2):,.0f}; before {end:,.0f}: {window_reward(steps, end):,.0f}"
    )


if __name__ == "__main__":
    typer.run(main)
