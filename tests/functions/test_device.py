"""Devices: `STELLARIS_DEVICE` picks where learner and parameter functions compute; tensors move to it at the edges
and back to the CPU for the wire. The plumbing runs through the real handlers and a real Redis with the device
forced to `cpu`; the tests marked `gpu` run the same on CUDA and skip, saying why, where there is none."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cache import Cache, JobCache
from contract import InitResult, LearnerResult, ParameterResult
from contract.algo_config import Rule
from contract.codec import decode
from contract.results import device_of
from functions.handlers import learner, parameter
from functions.model.device import ENV_VAR, DeviceError, choose_device, module_device, to_cpu, to_device
from functions.model.policies import build_policy
from functions.model.serialize import load_policy_bytes
from functions.runtime.context import Context, Instance
from tests.functions.driver import Driver
from tests.functions.test_learning import cartpole, ppo
from tests.functions.test_pipeline import small_spec, spawn, stop

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=needs_cuda)]


def expected(choice: str) -> str:
    return "cpu" if choice == "cpu" else f"cuda:{torch.cuda.current_device()}"


def test_the_variable_selects_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = expected("cuda") if torch.cuda.is_available() else "cpu"
    for value, device in [("cpu", "cpu"), (" CPU ", "cpu"), ("auto", auto), ("", auto)]:
        assert str(choose_device(value)) == device
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert str(choose_device()) == auto  # unset: auto
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert choose_device() == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "tpu", "cuda:x", "cpu:0", "auto:1"])
def test_a_bad_value_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(DeviceError, match=f"{ENV_VAR}='{value}' is not a device: choose auto, cpu, cuda or cuda:N"):
        choose_device(value)


def test_cuda_without_cuda_is_refused_naming_the_variable() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: asking for it is not an error here")
    for value in ("cuda", "cuda:0"):
        with pytest.raises(DeviceError, match=f"{ENV_VAR}='{value}' asks for CUDA, but torch.cuda.is_available"):
            choose_device(value)


def test_a_handler_refuses_a_bad_device_before_it_takes_work(
    monkeypatch: pytest.MonkeyPatch, cache_conn: Cache, job: JobCache
) -> None:
    monkeypatch.setenv(ENV_VAR, "tpu")
    instance = Instance(cache_conn, jobs={job.keys.job: job})
    for handle, event in [(learner.handle, {"round": 1}), (parameter.handle, {"init": True})]:
        with pytest.raises(DeviceError, match=ENV_VAR):
            handle({"job": job.keys.job, **event}, Context("bad-device", instance))
    assert job.board.outstanding() == 0 and job.policies.version() is None


@dataclass(frozen=True)
class Round:
    obs: torch.Tensor
    steps: int


def test_data_moves_to_a_device_with_its_structure_and_back_to_the_cpu() -> None:
    """The `meta` device stands in for a second device where there is no GPU: torch allows it everywhere."""
    meta = torch.device("meta")
    batch = {"obs": np.arange(6, dtype=np.float32).reshape(3, 2), "done": np.array([True, False, True])}
    moved = to_device((batch, Round(torch.ones(2), 4), [torch.zeros(1)], "name"), meta)
    assert moved[0]["obs"].device == meta and moved[0]["obs"].shape == (3, 2) and moved[0]["done"].dtype == torch.bool
    assert moved[1].obs.device == meta and moved[1].steps == 4 and moved[2][0].device == meta and moved[3] == "name"
    on_cpu = to_device(batch, torch.device("cpu"))
    assert np.shares_memory(on_cpu["obs"].numpy(), batch["obs"])  # no copy on the CPU
    policy = build_policy_for_test().to(meta)
    assert module_device(policy) == meta
    grads = {"w": torch.ones(2, requires_grad=True) * 2}
    assert to_cpu(grads)["w"].device.type == "cpu" and not to_cpu(grads)["w"].requires_grad


def build_policy_for_test() -> torch.nn.Module:
    import gymnasium as gym

    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    return build_policy(obs, gym.spaces.Discrete(2), hidden=(8, 8), kind="mlp", activation="tanh")


@pytest.mark.parametrize("choice", DEVICES)
def test_a_gradient_and_an_update_on_the_device_through_the_handlers(
    monkeypatch: pytest.MonkeyPatch, cache_conn: Cache, job_id: str, choice: str
) -> None:
    """A learner invocation's gradients and a parameter invocation's update on the chosen device: the device is in
    each gradient's stats and in the results; what the cache holds loads on the CPU (an actor's policy)."""
    monkeypatch.setenv(ENV_VAR, choice)
    driver = Driver(cache_conn, small_spec(job_id))
    try:
        device = expected(choice)
        assert str(driver.instance.device) == device
        model = driver.instance.memo.models[(job_id, "adam")]  # warmed by init
        assert str(module_device(model.policy)) == device
        driver.round = 1
        driver.enqueue(driver.tasks(driver.collect(), range(1)), close=True)
        out = LearnerResult.from_dict(driver.learner({"job": job_id, "round": 1}))
        assert out.status == "done" and out.gradients == 4 and out.device == device
        records = [driver.job.gradients.record(e) for e in driver.job.gradients.read("0-0", count=16)]
        assert len(records) == 4 and {r.meta.stats["device"] for r in records} == {device}
        assert all(t.device.type == "cpu" for r in records for t in r.tensors.values())  # decoded from the wire
        raw = driver.parameter({"job": job_id, "round": 1})
        update = ParameterResult.from_dict(raw)
        assert update.status == "ok" and update.version is not None and update.version >= 1
        assert update.device == device == device_of(raw)
        assert str(module_device(model.policy)) == device
        version, blob = driver.job.policies.latest()
        assert version == update.version and "device" not in decode(blob).meta
        cpu_policy = build_policy_for_test_spec(driver)
        load_policy_bytes(cpu_policy, blob)  # saved from `device`, loaded on the CPU
        on_device = {k: v.cpu() for k, v in model.policy.state_dict().items()}
        assert all(torch.equal(on_device[k], v) for k, v in cpu_policy.state_dict().items())
        state = decode(driver.job.policies.optimizer_state()).tensors()
        assert state and all(t.device.type == "cpu" for t in state.values())
    finally:
        driver.job.delete()


def build_policy_for_test_spec(driver: Driver) -> torch.nn.Module:
    from functions.model.warm import new_policy

    return new_policy(Context("cpu-policy", driver.instance), driver.spec)  # actors': on the CPU


def test_results_without_a_device_read_as_the_cpu() -> None:
    assert device_of({"batch_id": "1-0", "version": 0, "env_steps": 8}) == "cpu"  # an actor's
    assert device_of(None) == ""  # a failed call
    assert InitResult.from_dict({"version": 0, "spec": {}}).device == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_a_short_cartpole_training_on_cuda_with_two_learners_sharing_the_gpu(
    monkeypatch: pytest.MonkeyPatch, cache_conn: Cache, job_id: str
) -> None:
    """Two learner processes on one GPU and the parameter function on it too; actors on the CPU. CartPole's mean
    return over the last 10 episodes must pass 200 (a random policy gets about 20)."""
    monkeypatch.setenv(ENV_VAR, "cuda")
    driver = Driver(cache_conn, cartpole(job_id, ppo(Rule.STELLARIS)))
    procs = spawn("learner", cache_conn.url, job_id, 2)
    start, mean, devices = time.monotonic(), 0.0, set()
    try:
        for _ in range(200):
            devices.add(driver.run_round(mode="stellaris", learn_inline=False).device)
            recent = driver.returns[-10:]
            mean = sum(recent) / max(len(recent), 1)
            if len(driver.returns) >= 10 and mean >= 200:
                break
    finally:
        results = stop(driver.job, procs)
        driver.job.delete()
    print(f"CartPole on CUDA: mean return {mean:.0f} in {time.monotonic() - start:.0f} s")
    assert mean >= 200
    assert devices == {expected("cuda")}
    assert {r["device"] for r in results} == {expected("cuda")}
