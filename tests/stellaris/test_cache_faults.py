"""What the cache's state says about a failed job (stellaris/platform/cache_faults.py), through the real CLI:

- A Redis that comes back empty mid-job (no persistence): the job's data is gone, so `stellaris train` reports the
  loss in one line (the dead epoch's functions log no traceback) and resumes from its last checkpoint in a new
  epoch, up to $STELLARIS_CACHE_LOSS_RESUMES times; past that it ends and names the resume command, which completes
  the run.
- The embedded Redis killed mid-job (kill -9): the same loss, resumed from on a new embedded Redis, and the run
  completes in the same command.
- A Redis that reaches its maxmemory mid-job: the run ends at the first refused write, naming the Redis's memory and
  the resume command, which completes the run once Redis has room.

Every task of every round is applied exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from cache import RedisServerDied
from cache.server import EmbeddedRedis
from stellaris.platform.cache_faults import RESUMES_ENV, resumes_from_env
from tests.procs import wait_pid_gone
from tests.stellaris.test_train import (
    ROOT,
    check_each_task_applied_once,
    descendants,
    read_on,
    resume_to_the_end,
    rows,
    run_train,
    start_until_round,
    train_cmd,
)

ROUNDS = 40


def _lose_the_data(server: EmbeddedRedis, rng: random.Random) -> None:
    """kill -9 at a moment inside a round, and start it again on its port: empty (no AOF, no RDB)."""
    time.sleep(rng.uniform(0.0, 0.4))
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_pid_gone(pid, 10)
    server.restart()


def _await_line(lines: list[str], proc: subprocess.Popen[str], starts: str, after: int = 0) -> int:
    """The index of the first line from `after` on that starts with `starts` (the reader thread appends them)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = [i for i, line in enumerate(lines[after:], after) if line.startswith(starts)]
        if found:
            return found[0]
        time.sleep(0.05)
    pytest.fail(f"no line starting {starts!r}; the output ends:\n{''.join(lines)[-3000:]}")


@pytest.mark.slow  # over 40 s: CI's long stage (make test-long)
def test_a_redis_restarted_empty_is_resumed_from_the_checkpoint_then_the_run_names_its_resume(tmp_path: Path) -> None:
    server = EmbeddedRedis(maxmemory_bytes=512 * 1024**2).start()
    out = tmp_path / "run"
    rng = random.Random(5)
    cmd = train_cmd(tmp_path, "--rounds", str(ROUNDS), "--out", str(out), "--redis-url", server.url)
    proc = start_until_round(cmd, 2, **{RESUMES_ENV: "1"})
    lines, reader = read_on(proc)
    try:
        # First loss: reported as such (not as whichever call failed first), and resumed in the same command.
        _lose_the_data(server, rng)
        at = _await_line(lines, proc, "cache lost: ")
        lost = lines[at]
        assert "no longer holds job" in lost and "resuming from round " in lost, lost
        assert "(1 of at most 1 such resumes)" in lost, lost
        assert server.password not in "".join(lines)
        resumed_from = int(lost.split("resuming from round ")[1].split("'")[0])
        progressed = _await_line(lines, proc, f"round {resumed_from + 2} ", after=at)  # the new epoch makes progress
        # Said in that one line: the dead epoch's functions and actors log no traceback of their own (before, five
        # or more: NOGROUP, "no policy yet" from each instance that was working on the job).
        assert all(line.startswith("round ") for line in lines[:at]), "".join(lines[: at + 1])[-3000:]
        assert "Traceback" not in "".join(lines[:progressed]), "".join(lines[:progressed])[-3000:]

        # Second loss: past the limit, the run ends (exit 1) and its last line names the resume command.
        _lose_the_data(server, rng)
        assert proc.wait(timeout=120) == 1, "".join(lines)[-3000:]
        reader.join(timeout=10)
        last = "".join(lines).strip().splitlines()[-1]
        assert last.startswith("error: the Redis at ") and "no longer holds job" in last, last
        assert last.endswith(f"resume with `stellaris train --resume {out}`"), last
        assert json.loads((out / "state.json").read_text())["epoch"] == 1

        # That command completes the run, given the Redis URL: config.yaml keeps it without its password.
        assert server.password not in (out / "config.yaml").read_text()
        refused = run_train([sys.executable, "-m", "stellaris.cli", "train", "--resume", str(out)])
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "comes without its password (a run's config.yaml keeps no secret): give it with --redis-url" in (
            refused.stderr
        )
        resume_to_the_end(out, ROUNDS, "--redis-url", server.url)
        assert json.loads((out / "state.json").read_text())["epoch"] == 2
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()


@pytest.mark.slow  # about 25 s: CI's long stage, with the other fault runs
def test_a_killed_embedded_redis_is_resumed_from_on_a_new_one_and_the_run_completes(tmp_path: Path) -> None:
    """kill -9 of the job's own redis-server at a random moment of round 3: before, the run ended (exit 1) with its
    death's message; now it resumes in a new epoch on a new embedded Redis, and every task is applied once."""
    rounds = 8
    out = tmp_path / "run"
    proc = start_until_round(train_cmd(tmp_path, "--rounds", str(rounds), "--out", str(out)), 2)
    lines, reader = read_on(proc)
    try:
        assert proc.stderr is not None
        [server] = [
            pid for pid in descendants(proc.pid) if Path(f"/proc/{pid}/comm").read_text().strip() == "redis-server"
        ]
        time.sleep(random.Random(7).uniform(0.0, 0.3))  # a moment inside the next round: no event marks one
        os.kill(server, signal.SIGKILL)
        assert proc.wait(timeout=180) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    text = "".join(lines)
    lost = [i for i, line in enumerate(lines) if line.startswith("cache lost: ")]
    assert len(lost) == 1, text[-3000:]
    at = lost[0]
    assert lines[at].startswith(f"cache lost: embedded redis-server (pid {server}, port "), lines[at]
    assert "exited with code -9; resuming from round " in lines[at] and "(1 of at most 3 such resumes)" in lines[at]
    assert lines[at + 1].startswith("its last log lines:"), text[-3000:]
    assert "Ready to accept connections" in text and "Traceback" not in text
    assert text.count("run directory:") == 1  # the resumed epoch's platform, on a new Redis (the first came before)
    assert json.loads((out / "state.json").read_text())["epoch"] == 1
    assert [int(r["round_id"]) for r in rows(out / "info.csv")] == list(range(1, rounds + 1))
    check_each_task_applied_once(out, rounds)
    assert wait_pid_gone(server, 10)


def test_a_redis_out_of_memory_ends_the_run_naming_its_memory_and_the_resume_completes_it(tmp_path: Path) -> None:
    server = EmbeddedRedis(maxmemory_bytes=512 * 1024**2).start()
    out = tmp_path / "run"
    cmd = train_cmd(tmp_path, "--rounds", str(ROUNDS), "--out", str(out), "--redis-url", server.url)
    proc = start_until_round(cmd, 2)
    lines, reader = read_on(proc)
    try:
        with redis.Redis.from_url(server.url) as admin:
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory", used // 2)  # writes are refused from here on (noeviction)
            assert proc.wait(timeout=120) == 1, "".join(lines)[-3000:]
            reader.join(timeout=10)
            error, hint = "".join(lines).strip().splitlines()[-2:]
            assert error.startswith("error: the Redis at redis://") and "is out of memory (" in error, error
            assert f"MiB used of its maxmemory {used // 2 / 2**20:.1f} MiB" in error, error
            assert server.password not in "".join(lines)
            assert hint.startswith("its checkpoint of round "), hint
            assert hint.endswith(f"is intact: resume with `stellaris train --resume {out}`"), hint
            assert "more than" not in "".join(lines)  # it ended at the first refused write, not after 64 failures

            admin.config_set("maxmemory", 512 * 1024**2)
        resume_to_the_end(out, ROUNDS, "--redis-url", server.url)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()


@pytest.mark.parametrize(("raw", "expected"), [(None, 3), ("", 3), ("0", 0), (" 7 ", 7), ("1000", 1000)])
def test_the_resume_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int):
    if raw is None:
        monkeypatch.delenv(RESUMES_ENV, raising=False)
    else:
        monkeypatch.setenv(RESUMES_ENV, raw)
    assert resumes_from_env() == expected


@pytest.mark.parametrize("raw", ["-1", "1001", "two", "1.5"])
def test_a_bad_resume_limit_ends_the_command_at_once_naming_it(tmp_path: Path, raw: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {RESUMES_ENV: raw}
    cmd = train_cmd(tmp_path, "--rounds", "1", "--out", str(tmp_path / "run"))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{RESUMES_ENV} must be" in done.stderr and repr(raw) in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def _said_after_loss(
    tmp_path: Path, lost: RedisServerDied, *, rounds_done: int | None, losses: int = 1
) -> tuple[int | None, str]:
    """`_after_cache_loss` for a 10-round run that checkpointed `rounds_done` rounds (None: none yet): its verdict and
    what it printed."""
    import io

    from rich.console import Console

    from stellaris.config import TrainConfig
    from stellaris.run import _after_cache_loss

    cfg = TrainConfig(env="CartPole-v1", rounds=10, out=tmp_path / "run")
    cfg.run_dir().mkdir(parents=True)
    if rounds_done is not None:
        (cfg.run_dir() / "state.json").write_text(json.dumps({"round": rounds_done, "env_steps": 512 * rounds_done}))
    buf = io.StringIO()
    code = _after_cache_loss(cfg, Console(file=buf, width=400), lost, losses, 3)
    return code, buf.getvalue()


def test_after_a_dead_embedded_redis_the_run_resumes_and_prints_the_log_tail_apart(tmp_path: Path) -> None:
    died = RedisServerDied("embedded redis-server (pid 7, port 9) exited with code -9", "a\nb")
    code, said = _said_after_loss(tmp_path, died, rounds_done=4)
    assert code is None
    assert said == (
        "cache lost: embedded redis-server (pid 7, port 9) exited with code -9; resuming from round 4's checkpoint "
        "(1 of at most 3 such resumes)\nits last log lines:\na\nb\n"
    )
    code, said = _said_after_loss(tmp_path / "none", died, rounds_done=None)
    assert code is None and "resuming from the start (no checkpoint yet)" in said


def test_past_the_limit_the_run_ends_naming_the_resume_on_a_line_of_its_own(tmp_path: Path) -> None:
    died = RedisServerDied("embedded redis-server (pid 7, port 9) exited with code -9", "a\nb")
    code, said = _said_after_loss(tmp_path, died, rounds_done=4, losses=4)
    assert code == 1
    assert said.startswith("error: embedded redis-server (pid 7, port 9) exited with code -9; last log lines:\na\nb\n")
    assert said.endswith(
        f"its checkpoint of round 4 is intact: resume with `stellaris train --resume {tmp_path / 'run'}`\n"
    )


def test_a_loss_after_the_last_round_leaves_a_complete_run(tmp_path: Path) -> None:
    """The job's data is deleted after its last round's checkpoint: a loss then has nothing left to resume."""
    died = RedisServerDied("embedded redis-server (pid 7, port 9) exited with code -9", "a")
    code, said = _said_after_loss(tmp_path, died, rounds_done=10, losses=4)
    assert code == 0
    assert said.startswith("cache lost after the last round: embedded redis-server (pid 7, port 9) exited with code")
    assert "the run is complete" in said and "resum" not in said
