"""Failures a user can cause in `stellaris train` and `stellaris eval`: a real CLI process each, which prints a line or
two naming the thing, no traceback (unless STELLARIS_DEBUG=1), exits non-zero, and leaves no run directory behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.stellaris.test_train import ROOT, rows, start_until_round, train_cmd

FAIL_FAST_S = 60  # none of these trains: each fails before its first round
TASKS_PER_ROUND = 16  # FAST_CARTPOLE: 4 minibatches x 4 epochs


def cli(*args: str, debug: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL", "STELLARIS_DEBUG")}
    if debug:
        env["STELLARIS_DEBUG"] = "1"
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=FAIL_FAST_S)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_error(proc: subprocess.CompletedProcess[str], code: int, *names: str) -> str:
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 2, output
    for name in names:
        assert name in output, output
    return output


def test_an_unreachable_redis_is_named_without_its_password(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "plan.yaml").write_text("mine: 1\n")  # a directory the user made: kept, with only what was in it
    url = f"redis://alice:s3cret@127.0.0.1:{closed_port()}/0"
    proc = cli(*train_cmd(tmp_path, "--rounds", "1", "--out", str(out), "--redis-url", url))
    output = one_error(proc, 1, f"cannot reach Redis at redis://alice:***@127.0.0.1:{url.rsplit(':', 1)[1]}")
    assert "s3cret" not in output
    assert sorted(p.name for p in out.iterdir()) == ["plan.yaml"]


def test_an_unreachable_gateway_is_named_at_once(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    proc = cli(*train_cmd(tmp_path, "--rounds", "1", "--out", str(tmp_path / "run"), "--gateway-url", url))
    one_error(proc, 1, f"cannot reach the gateway at {url}")
    assert not (tmp_path / "run").exists()


def test_a_failure_after_the_platform_is_up_leaves_no_run_directory(redis_server, tmp_path: Path) -> None:
    from tests.gateway.conftest import start_gateway, stop_gateway

    gw = start_gateway(redis_server.url)
    try:
        urls = ("--redis-url", redis_server.url, "--gateway-url", gw.url, "--gateway-token", "not-the-token")
        proc = cli(*train_cmd(tmp_path, "--rounds", "1", "--out", str(tmp_path / "run"), *urls))
    finally:
        stop_gateway(gw)
    one_error(proc, 1, "401")
    assert not (tmp_path / "run").exists()


def test_an_existing_run_directory_needs_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "info.csv").write_text("round_id\n1\n")
    proc = cli(*train_cmd(tmp_path, "--rounds", "1", "--out", str(out)))
    one_error(proc, 2, str(out), f"--resume {out}")
    assert (out / "info.csv").read_text() == "round_id\n1\n"  # the first run's rows, untouched


def test_a_resume_while_the_run_still_goes_is_refused_and_the_run_loses_no_row(tmp_path: Path) -> None:
    """A second `stellaris train` on a run directory in use (a resume started too early, a scheduler that launched it
    twice) is refused at once; before the directory lock it rewound the CSVs under the running one, whose later rows
    were then lost (a 30-round run kept rounds 1-10 of info.csv)."""
    out = tmp_path / "run"
    running = start_until_round(train_cmd(tmp_path, "--rounds", "1000", "--out", str(out)), 2)
    try:
        second = cli(sys.executable, "-m", "stellaris.cli", "train", "--resume", str(out))
        one_error(second, 2, f"{out} is in use by another `stellaris train`")
        assert running.poll() is None  # it was refused by the lock, not because the run had ended
        running.send_signal(signal.SIGTERM)  # a clean stop: its checkpoint and rows agree
        assert running.wait(timeout=120) in (130, 143), (running.stderr.read() if running.stderr else "")[-4000:]
        done = json.loads((out / "state.json").read_text())["round"]
        # Rounds 1..done, and at most the one the stop caught between its row and its checkpoint (a resume rewinds it).
        logged = [int(r["round_id"]) for r in rows(out / "info.csv")]
        assert logged in (list(range(1, done + 1)), list(range(1, done + 2))), (logged, done)
        # Every task of the checkpointed rounds once (the round the stop cut short has rows a resume rewinds).
        grads = [g for g in rows(out / "gradients.csv") if int(g["round"]) <= done]
        assert Counter(int(g["round"]) for g in grads) == {k: TASKS_PER_ROUND for k in range(1, done + 1)}
        assert len({g["task_id"] for g in grads}) == len(grads)
    finally:
        if running.poll() is None:
            running.kill()


def test_resume_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("config:\n  env: CartPole-v1\n  rounds: 1\n")
    proc = cli(sys.executable, "-m", "stellaris.cli", "train", "--resume", str(out))
    one_error(proc, 2, str(out), "state.json")
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml"]  # nothing added to the directory


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: d.write_text("x"), "is not a directory"),
        (lambda d: d.mkdir(), "has no config.yaml"),  # empty
        (lambda d: d.mkdir() or (d / "config.yaml").write_text("config: {}\n"), "has no policy.safetensors"),
    ],
)
def test_eval_names_what_the_directory_lacks(tmp_path: Path, make, name: str) -> None:
    run_dir = tmp_path / "run"
    make(run_dir)
    proc = cli(sys.executable, "-m", "stellaris.cli", "eval", str(run_dir))
    one_error(proc, 2, str(run_dir), name)


def test_stellaris_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = cli(sys.executable, "-m", "stellaris.cli", "eval", str(tmp_path / "missing"), debug=True)
    assert proc.returncode != 0
    assert "Traceback" in proc.stdout + proc.stderr and "EvalError" in proc.stdout + proc.stderr


def test_an_actor_that_dies_on_every_start_ends_the_job_naming_it(tmp_path: Path) -> None:
    """An env that breaks only when stepped passes every check before the job starts; its serverful actor then dies
    at once each time it is started. Past STELLARIS_ACTOR_MAX_RESTARTS deaths in a row with no batch landed the job
    ends, naming the actor, rather than restarting it until the batch wait (300 s) runs out."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL", "STELLARIS_DEBUG")}
    args = [
        "--env-module",
        "tests.stellaris.custom_env",
        "--env",
        "PickTarget-v0",
        "--env-kwargs",
        '{"crash_on_step": true}',
        "--actors",
        "1",
        "--rounds",
        "2",
        "--out",
        str(tmp_path / "run"),
    ]
    cmd = [sys.executable, "-m", "stellaris.cli", "train", *args]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env | {"STELLARIS_ACTOR_MAX_RESTARTS": "2"},
        capture_output=True,
        text=True,
        timeout=FAIL_FAST_S,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    [error] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "actor-0 died 3 times in a row without landing a batch (last exit code 1" in error, output
    assert output.count("RuntimeError: PickTarget was made with crash_on_step") == 3, output  # each death's own error
    bad = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env | {"STELLARIS_ACTOR_MAX_RESTARTS": "many"},
        capture_output=True,
        text=True,
        timeout=FAIL_FAST_S,
    )
    one_error(bad, 1, "STELLARIS_ACTOR_MAX_RESTARTS must be a whole number from 1 to 1000, got 'many'")
