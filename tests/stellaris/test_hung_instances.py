"""Hung processes: `stellaris train` while a learner instance and then the parameter-function instance, or the local
gateway itself, or one of its serverful actors, or its embedded Redis, are stopped with SIGSTOP and never woken. A
stopped process is alive and keeps its connections open, so no call fails by itself. The gateway's busy probes find
a silent instance and kill it, the control plane replaces its call, and the job finishes with every task applied
once; before the probes, the round held until the process woke (a 25 s stop held one for 25.8 s) or its call's
timeout (an hour). A stopped local gateway is found silent by the control plane's watch and killed, and the control
plane starts it again as after a crash; a stopped actor's heartbeat stands still, and it is killed and started again
like a dead one. A stopped embedded Redis answers no PING: it is killed, and the run resumes from its last
checkpoint on a new one, as after any cache loss (before, no round ended and no error came for as long as it
stayed stopped)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.backends.process.tree import descendants
from tests.procs import pid_alive, wait_pid_gone
from tests.stellaris.test_chaos import _Output, _role, start_job
from tests.stellaris.test_train import rows

ROUNDS, TASKS_PER_ROUND = 14, 4 * 16
LEASE_S = 1200.0  # longer than the job: a stopped holder's task or update lease is freed by its kill, not by expiry
HUNG_AFTER_S = 2.0


def _stop_one(proc: subprocess.Popen[str], role: str, output: _Output, timeout_s: float = 60) -> int:
    """SIGSTOP one instance of `role` (waiting for one to exist); returns its pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        victims = sorted(p for p in descendants(proc.pid) if _role(p, proc.pid) == role)
        if victims:
            os.kill(victims[0], signal.SIGSTOP)
            return victims[0]
        time.sleep(0.05)  # polled: an instance's start is no event this test can await
    raise AssertionError(f"no {role} instance to stop; the job said:\n{output.text()[-3000:]}")


def _end(proc: subprocess.Popen[str], stopped: list[int]) -> None:
    """After the job (or a failure): a job still running goes with its whole tree, the stopped processes with it."""
    if proc.poll() is None:
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    for pid in stopped:  # never woken by the test; a leftover is freed here, and fails the test after
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _check(proc: subprocess.Popen[str], output: _Output, out: Path, stopped: list[int]) -> list[dict[str, str]]:
    """Exit 0, the stopped processes killed, and every task of every round applied once."""
    assert proc.returncode == 0, output.text()[-3000:]
    for pid in stopped:
        assert wait_pid_gone(pid, 30), f"stopped process {pid} outlived the job"
    info = rows(out / "info.csv")
    assert [int(r["round_id"]) for r in info] == list(range(1, ROUNDS + 1))
    grads = rows(out / "gradients.csv")
    assert all(n == 1 for n in Counter(g["task_id"] for g in grads).values()), "a task was applied twice"
    per_round = Counter(int(g["round"]) for g in grads)
    assert all(per_round[r] == TASKS_PER_ROUND for r in range(1, ROUNDS + 1)), per_round
    versions = sorted({int(g["applied_version"]) for g in grads})
    assert versions == list(range(1, len(versions) + 1))
    return info


# What is stopped, at which round (each waits for the round before it is stopped), what the job's output must say
# and which restarts info.csv must count.
SCENARIOS = {
    "a-learner-then-the-parameter-function": ([(3, "learner"), (7, "parameter")], [], ("learner", "parameter")),
    "the-local-gateway": (
        [(3, "gateway")],
        ["the local gateway answered no health probe", "the local gateway exited with code -9; starting it again"],
        (),
    ),
    # Before the actors' heartbeats, one stopped actor of two held the job until the 300 s batch wait ended it.
    "one-of-two-serverful-actors": ([(3, "actor")], ["gave no heartbeat for"], ("actor",)),
    # Before the cache's probe, no round ended and no error came in 240 s (stop 51's probe of a whole run).
    "the-embedded-redis": (
        [(3, "redis-server")],
        [
            "the embedded redis-server: it answered no PING for",
            "cache lost: embedded redis-server (pid",
            "was killed (it answered no PING for",
            "(1 of at most 3 such resumes)",
        ],
        (),
    ),
}


@pytest.mark.slow  # about 20 s each: CI's long stage, with the other fault runs
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_training_survives_processes_stopped_for_good(tmp_path: Path, scenario: str) -> None:
    plan, said, restarted = SCENARIOS[scenario]
    proc, output, out = start_job(
        tmp_path,
        ROUNDS,
        leases_s=LEASE_S,
        STELLARIS_GATEWAY_HUNG_AFTER_S=str(HUNG_AFTER_S),
        STELLARIS_GATEWAY_BUSY_PROBE_S="0.5",
    )
    stopped: list[int] = []
    try:
        for at_round, role in plan:
            output.await_round(at_round, timeout_s=120)
            assert output.round >= at_round, f"no round ended since {stopped} stopped:\n{output.text()[-3000:]}"
            stopped.append(_stop_one(proc, role, output))
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end:\n{''.join(output.lines)[-3000:]}") from None
    finally:
        _end(proc, stopped)
    info = _check(proc, output, out, stopped)
    for line in said:
        assert line in output.text()
    restarts = {k: sum(int(r[f"{k}_restarts"]) for r in info) for k in ("learner", "parameter", "actor")}
    assert all(restarts[k] >= 1 for k in restarted), restarts
    durations = sorted(float(r["duration"]) for r in info[1:])
    print(
        f"{scenario} stopped for good: restarts {restarts}; round seconds median {durations[len(durations) // 2]:.2f}, "
        f"max {durations[-1]:.2f}"
    )
