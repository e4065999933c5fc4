"""`--standby N`: warm spare learner and parameter-function instances. A killed instance's replacement call is served
by a spare (a warm start) instead of waiting for a new instance's cold start, and every task is still applied once.
Real CLI, a real gateway the test can ask which instance is busy, subprocess instances, SIGKILL."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.client import GatewayClient
from tests.stellaris.test_train import FAST_CARTPOLE, read_on, rows, start_until_round, train_cmd

ROUNDS = 6
LEARNERS = 2


def _busy_instance(client: GatewayClient, role: str, timeout_s: float = 60) -> tuple[int, int]:
    """(pid of an instance of the job's `role` function with a call in flight, how many instances it has)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in (f["name"] for f in client.functions()):
            if name.endswith(f"-{role}"):
                instances = client.function(name)["status"]["instances"]
                busy = [i["pid"] for i in instances if i["in_flight"]]
                if busy:
                    return busy[0], len(instances)
        time.sleep(0.005)  # polling the gateway's status: the call's start is not an event we can await
    pytest.fail(f"no {role} call was in flight within {timeout_s} s")


@pytest.mark.slow  # a 6-round job with two kills: CI's long stage, with the other fault runs
def test_a_killed_instance_is_replaced_by_a_warm_spare(redis_server, tmp_path: Path) -> None:
    from tests.gateway.conftest import TOKEN, start_gateway, stop_gateway

    gw = start_gateway(redis_server.url)
    try:
        out = tmp_path / "run"
        # 256 tasks a round (16 minibatches x 16 epochs): the round's calls run long enough to be caught in flight.
        overrides = {**FAST_CARTPOLE["overrides"], "num_minibatches": 16, "num_epochs": 16}
        cmd = train_cmd(
            tmp_path,
            "--rounds",
            str(ROUNDS),
            "--learners",
            str(LEARNERS),
            "--standby",
            "1",
            "--out",
            str(out),
            "--redis-url",
            redis_server.url,
            "--gateway-url",
            gw.url,
            "--gateway-token",
            TOKEN,
            overrides=overrides,
        )
        proc = start_until_round(cmd, 2)
        lines, reader = read_on(proc)
        with gw.client() as client:
            for role, warm in (("parameter", 1 + 1), ("learner", LEARNERS + 1)):
                pid, instances = _busy_instance(client, role)
                assert instances == warm, f"{role}: {instances} instances, expected {warm} with one spare"
                os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=600)
        reader.join(60)
        assert code == 0, "".join(lines)[-3000:]
    finally:
        stop_gateway(gw)

    info = rows(out / "info.csv")
    assert sum(int(r["parameter_restarts"]) for r in info) >= 1
    assert sum(int(r["learner_restarts"]) for r in info) >= 1
    calls = [r for r in rows(out / "invocations.csv") if r["function"].endswith(("-learner", "-parameter"))]
    cold = [(r["function"], r["instance"]) for r in calls if r["cold"] == "True"]
    # Every instance was warm before its first call (min_warm, pre-warming), and each replacement call found a spare.
    assert cold == [], f"calls that waited for a cold start: {cold}"
    grads = rows(out / "gradients.csv")
    assert all(n == 1 for n in Counter(g["task_id"] for g in grads).values()), "a task was applied twice"
    per_round = Counter(int(g["round"]) for g in grads)
    assert all(per_round[k] == 16 * 16 for k in range(1, ROUNDS + 1)), per_round
