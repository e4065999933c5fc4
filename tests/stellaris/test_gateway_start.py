"""Kills as `stellaris train`'s platform starts (stellaris/platform/local.py), found by a fault probe:

- A new local gateway killed as it starts, before it says READY, is started again, up to
  $STELLARIS_GATEWAY_START_ATTEMPTS starts in a row. Before, one such kill (of the gateway that had just replaced a
  killed one) ended the job with "the local gateway did not start (exit code -9)".
- The embedded Redis killed as the job starts is a cache loss, which the run starts again from. Before, the gateway,
  unable to reach it, exited, and the job ended with "the local gateway did not start (exit code 3)"."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

import stellaris.platform.local as platform_module
from cache import RedisServerDied
from cache.server import EmbeddedRedis
from stellaris.platform.local import Platform, PlatformError
from tests.procs import pid_alive, wait_pid_gone
from tests.stellaris.test_train import check_each_task_applied_once, rows, run_train, train_cmd


class _KillStarts:
    """Wraps Popen: the next `n` gateway processes are killed with SIGKILL the moment they exist (their imports
    take a second or more, so always before their READY line)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n, self.killed = 0, list[int]()
        self._popen = subprocess.Popen
        monkeypatch.setattr(platform_module.subprocess, "Popen", self._start)

    def _start(self, args: Any, *rest: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        proc = self._popen(args, *rest, **kwargs)
        if self.n > 0 and list(args)[1:3] == ["-m", "gateway"]:
            self.n -= 1
            proc.kill()
            self.killed.append(proc.pid)
        return proc


def _crash(platform: Platform) -> None:
    old = platform.gateway_proc
    assert old is not None
    os.kill(old.pid, signal.SIGKILL)
    assert wait_pid_gone(old.pid, 30)


def test_a_gateway_killed_as_it_starts_is_started_again(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    kills = _KillStarts(monkeypatch)
    with Platform(redis_url=redis_server.url, gateway_url=None, gateway_token=None) as platform:
        _crash(platform)
        kills.n = 2  # the default allows 3 starts in a row: the third comes up
        back = platform.recover_gateway()
        assert len(kills.killed) == 2 and kills.n == 0
        assert back.replaced == 1 and platform.gateway_proc is not None
        assert platform.gateway_proc.pid not in kills.killed
        assert httpx.get(f"{back.url}/healthz", timeout=5).status_code == 200
    assert capfd.readouterr().err.count("the local gateway was ended by signal 9 as it started; starting it again") == 2


def test_starts_killed_past_the_attempts_end_the_job_naming_the_setting(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STELLARIS_GATEWAY_START_ATTEMPTS", "2")
    kills = _KillStarts(monkeypatch)
    with Platform(redis_url=redis_server.url, gateway_url=None, gateway_token=None) as platform:
        _crash(platform)
        kills.n = 2
        with pytest.raises(PlatformError, match=r"exit code -9\) \(start 2 of \$STELLARIS_GATEWAY_START_ATTEMPTS=2\)"):
            platform.recover_gateway()
        assert len(kills.killed) == 2


@pytest.mark.parametrize("raw", ["0", "101", "two"])
def test_a_bad_start_attempts_setting_is_an_error_naming_it(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("STELLARIS_GATEWAY_START_ATTEMPTS", raw)
    with pytest.raises(
        ValueError, match=rf"STELLARIS_GATEWAY_START_ATTEMPTS must be a whole number from 1 to 100, got '{raw}'"
    ):
        Platform(redis_url=redis_server.url, gateway_url=None, gateway_token=None)


def test_a_bad_start_attempts_setting_stops_train_before_it_starts() -> None:
    from typer.testing import CliRunner

    from stellaris.cli import app

    result = CliRunner().invoke(app, ["train", "--env", "CartPole-v1"], env={"STELLARIS_GATEWAY_START_ATTEMPTS": "0"})
    assert result.exit_code == 2, result.output
    assert "STELLARIS_GATEWAY_START_ATTEMPTS must be a whole number from 1 to 100, got '0'" in result.output


def test_the_embedded_redis_killed_as_the_gateway_starts_is_a_death_of_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = Platform(redis_url=None, gateway_url=None, gateway_token=None)
    popen, killed = subprocess.Popen, list[int]()

    def spawned(args: Any, *rest: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        if list(args)[1:3] == ["-m", "gateway"] and platform.cache is not None and platform.cache.server is not None:
            pid = platform.cache.server.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            assert wait_pid_gone(pid, 10)
            killed.append(pid)
        return popen(args, *rest, **kwargs)

    monkeypatch.setattr(platform_module.subprocess, "Popen", spawned)
    with pytest.raises(
        RedisServerDied, match=r"embedded redis-server \(pid \d+, port \d+\) exited with code -9"
    ) as died:
        platform.__enter__()
    assert len(killed) == 1 and f"pid {killed[0]}," in str(died.value)
    assert isinstance(died.value.__cause__, PlatformError)  # what noticed first: the gateway could not start
    assert platform.gateway_proc is None or not pid_alive(platform.gateway_proc.pid)


def test_a_job_whose_redis_is_killed_as_it_starts_starts_again_and_completes(tmp_path: Path) -> None:
    out, rounds = tmp_path / "run", 3
    cmd = train_cmd(tmp_path, "--rounds", str(rounds), "--out", str(out))
    cmd[1:3] = ["-m", "tests.stellaris.redis_killed_at_start"]
    done = run_train(cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    lost = [line for line in done.stderr.splitlines() if line.startswith("cache lost: ")]
    assert len(lost) == 1 and "exited with code -9" in lost[0], done.stderr[-3000:]
    assert "resuming from the start (no checkpoint yet) (1 of at most 3 such resumes)" in lost[0]
    assert [int(r["round_id"]) for r in rows(out / "info.csv")] == list(range(1, rounds + 1))
    check_each_task_applied_once(out, rounds)
