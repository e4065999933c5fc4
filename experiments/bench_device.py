"""A learner gradient on the CPU vs on CUDA, for the paper preset (PPO, 4096 env steps a round in 4 minibatches of
1,024 samples, actor and critic 2×256 tanh, Hopper-v5's shapes: 11 observations, 3 actions), and 4 learner
processes sharing one GPU (the paper's 4 learners per V100).

One gradient is what a learner task computes: the algorithm's loss and backward pass on the device, truncation
against `--others` policies other learners hold, and the gradient tensors copied back to the CPU for the wire. The
round's data is prepared once (GAE on the CPU, then moved to the device), as a warm learner does. CPU and CUDA are
timed in A B A B pairs, so drift in machine load hits both alike; the ratios printed are medians of the pairs with
their range. Without CUDA the CUDA parts are skipped, saying why.

    python -m experiments.bench_device --pairs 10
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import typer

from contract.algo_config import PPOConfig
from contract.records import LearnerTask
from functions.algos.algorithm import LearnInputs
from functions.algos.ppo_algo import PPO
from functions.model.device import to_cpu, to_device
from functions.model.policies import ActorCritic, build_policy

OBS_DIM, ACT_DIM = 11, 3  # Hopper-v5
NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"


def paper_config() -> PPOConfig:
    return PPOConfig()  # the paper preset's MuJoCo defaults: 4096 steps, 4 minibatches, 2×256 tanh


def _policy(cfg: PPOConfig, device: torch.device) -> ActorCritic:
    obs = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    net = cfg.network
    return build_policy(obs, act, hidden=net.hidden, kind=net.kind, activation=net.activation).to(device)


def _batch(cfg: PPOConfig, envs: int, seed: int) -> dict[str, np.ndarray]:
    """One round's trajectory arrays as an actor sends them ([T, N, ...]), random but of the right shapes."""
    rng = np.random.default_rng(seed)
    t = cfg.train_batch_size // envs
    f32 = np.float32
    return {
        "observations": rng.standard_normal((t, envs, OBS_DIM)).astype(f32),
        "actions": rng.uniform(-1, 1, (t, envs, ACT_DIM)).astype(f32),
        "rewards": rng.standard_normal((t, envs)).astype(f32),
        "terminations": rng.random((t, envs)) < 0.01,
        "truncations": np.zeros((t, envs), bool),
        "behaviour_log_probs": rng.standard_normal((t, envs)).astype(f32) - 3,
        "values": rng.standard_normal((t, envs)).astype(f32),
        "truncation_values": np.zeros((t, envs), f32),
        "last_observations": rng.standard_normal((envs, OBS_DIM)).astype(f32),
        "last_values": rng.standard_normal(envs).astype(f32),
    }


@dataclass
class Learner:
    """A warm learner on one device: its policy, the policies it truncates against, the round's data."""

    cfg: PPOConfig
    policy: ActorCritic
    inputs: LearnInputs
    data: Any
    device: torch.device

    @classmethod
    def on(cls, device: torch.device, *, others: int = 1, envs: int = 1, seed: int = 0) -> Learner:
        cfg = paper_config()
        torch.manual_seed(seed)
        policy = _policy(cfg, device)
        held = [_policy(cfg, device) for _ in range(others)]
        data = to_device(PPO.prepare([_batch(cfg, envs, seed)], cfg), device)
        return cls(cfg, policy, LearnInputs(others=held), data, device)

    def gradient_s(self, task_index: int = 0) -> float:
        """Seconds for one task's gradient, back on the CPU (the copy waits for the device to finish)."""
        m = self.cfg.num_minibatches
        task = LearnerTask(1, ("bench",), task_index // m, task_index % m, m)
        t0 = time.perf_counter()
        grads, _ = PPO.gradient(self.policy, self.data, task, self.cfg, self.inputs)
        to_cpu(grads)
        return time.perf_counter() - t0

    def median_s(self, gradients: int) -> float:
        return statistics.median(self.gradient_s(i) for i in range(gradients))


def _shared_worker(args: tuple[int, int, Any]) -> list[float]:
    """One of several learner processes on the GPU: warm up, wait for the others, time `gradients` gradients."""
    index, gradients, barrier = args
    torch.set_num_threads(1)
    learner = Learner.on(torch.device("cuda"), seed=index)
    learner.median_s(3)  # warm: kernels loaded, allocator primed
    barrier.wait()
    return [learner.gradient_s(i) for i in range(gradients)]


def shared_gpu_rate(processes: int, gradients: int) -> tuple[float, float]:
    """(gradients/s of all `processes` learner processes sharing the GPU, median seconds of one gradient)."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(processes + 1)
        with ctx.Pool(processes) as pool:
            pending = pool.map_async(_shared_worker, [(i, gradients, barrier) for i in range(processes)])
            barrier.wait()
            t0 = time.perf_counter()
            times = pending.get(timeout=600)
            wall_s = time.perf_counter() - t0
    return processes * gradients / wall_s, statistics.median(t for ts in times for t in ts)


def spread(ratios: list[float]) -> str:
    return (
        f"median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} pairs"
    )


def main(
    pairs: int = typer.Option(10, help="A B pairs (CPU, CUDA) timed"),
    gradients: int = typer.Option(5, help="gradients per timing (its median is the pair's time)"),
    threads: int = typer.Option(1, help="torch CPU threads (a serverless learner has one core)"),
    others: int = typer.Option(1, help="other learners' policies each gradient truncates against"),
    processes: int = typer.Option(4, help="learner processes sharing one GPU"),
) -> None:
    torch.set_num_threads(threads)
    cpu = Learner.on(torch.device("cpu"), others=others)
    cpu.median_s(2)
    cfg = cpu.cfg
    print(
        f"paper preset: PPO, {cfg.train_batch_size} steps in {cfg.num_minibatches} minibatches, "
        f"{len(cfg.network.hidden)}x{cfg.network.hidden[0]} network, Hopper-v5 shapes ({OBS_DIM} obs, {ACT_DIM} act), "
        f"truncation against {others} policies; CPU with {threads} torch thread(s)"
    )
    if not torch.cuda.is_available():
        times = [cpu.median_s(gradients) for _ in range(pairs)]
        low, mid, high = (f(times) * 1e3 for f in (min, statistics.median, max))
        print(f"CPU: one gradient {mid:.1f} ms (range {low:.1f}-{high:.1f} ms over {pairs} timings of {gradients})")
        print(f"CUDA: skipped ({NO_CUDA})")
        return
    gpu = Learner.on(torch.device("cuda"), others=others)
    gpu.median_s(3)
    cpu_s, gpu_s = [], []
    for _ in range(pairs):  # A B A B
        cpu_s.append(cpu.median_s(gradients))
        gpu_s.append(gpu.median_s(gradients))
    ratios = [c / g for c, g in zip(cpu_s, gpu_s, strict=True)]
    cpu_ms, gpu_ms = statistics.median(cpu_s) * 1e3, statistics.median(gpu_s) * 1e3
    name = torch.cuda.get_device_name()
    print(f"CPU: one gradient {cpu_ms:.1f} ms; {name}: {gpu_ms:.1f} ms; CPU/CUDA time {spread(ratios)}")
    shared, single = [], []
    for _ in range(max(1, pairs // 5)):  # A B: one learner on the GPU, then `processes` sharing it
        single.append(1 / gpu.median_s(gradients * 4))
        shared.append(shared_gpu_rate(processes, gradients * 4))
    per_gradient = statistics.median(s for _, s in shared)
    print(
        f"{processes} learner processes sharing the GPU: {statistics.median(r for r, _ in shared):.1f} gradients/s "
        f"in all ({per_gradient * 1e3:.1f} ms each) vs {statistics.median(single):.1f}/s for one; "
        f"throughput {spread([r / s for (r, _), s in zip(shared, single, strict=True)])}; "
        f"vs {processes} CPU learners of {threads} thread(s) each "
        f"{statistics.median(r for r, _ in shared) / (processes / statistics.median(cpu_s)):.2f}x"
    )


if __name__ == "__main__":
    typer.run(main)
