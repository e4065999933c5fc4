"""`stellaris train` exits when it stops (Ctrl-C, an error) while calls still wait on a gateway that answers nothing
but keeps its connections open (a given gateway, stopped). Before, a job stopped in a round printed that it had
stopped cleanly and then never exited: the interpreter's exit joined the call threads, each waiting up to its
hour-long timeout, and a second Ctrl-C changed nothing (measured: still running 125 s after two; kill -9 was the only
way out). The exit now waits a grace (`EXIT_GRACE_S`) for them, then leaves them behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from cache.server import EmbeddedRedis
from tests.gateway.conftest import ROOT, TOKEN, start_gateway, stop_gateway

# A call of the round's learner pool, as `Rounds` makes it, to a gateway that answers nothing; then the CLI's exit.
STOPPED_IN_A_ROUND = textwrap.dedent(
    """
    import sys, threading
    from concurrent.futures import ThreadPoolExecutor
    from gateway.client import GatewayClient
    from stellaris import cli
    from stellaris.round import protocol as rounds

    client = GatewayClient(sys.argv[1], token=sys.argv[2], timeout_s=3600)
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=rounds.CALL_THREADS[0][:-1])
    call = pool.submit(client.invoke, "learner", {})
    sent = threading.Event()
    pool.submit(sent.set)
    sent.wait(30)
    pool.shutdown(wait=False, cancel_futures=True)  # as Rounds.close: calls in flight are not waited for
    cli._exit_with(lambda: 130)  # as after Ctrl-C: the run returned 130
    """
)


def test_the_cli_exits_leaving_calls_stuck_on_a_gateway_that_answers_nothing(redis_server: EmbeddedRedis) -> None:
    gw = start_gateway(redis_server.url)
    os.kill(gw.proc.pid, signal.SIGSTOP)
    try:
        # Before: TimeoutExpired, the exit waiting on the call.
        run = [sys.executable, "-c", STOPPED_IN_A_ROUND, gw.url, TOKEN]
        proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        os.kill(gw.proc.pid, signal.SIGCONT)
        stop_gateway(gw)
    assert proc.returncode == 130, proc.stderr
    assert "leaving 1 call(s) that still wait on a gateway that answers nothing" in proc.stderr


def test_the_exit_grace_is_read_from_the_environment(monkeypatch) -> None:
    from stellaris import cli

    monkeypatch.delenv(cli.EXIT_GRACE_ENV, raising=False)
    assert cli.exit_grace_s() == cli.EXIT_GRACE_S
    monkeypatch.setenv(cli.EXIT_GRACE_ENV, "0.5")
    assert cli.exit_grace_s() == 0.5


@pytest.mark.parametrize(
    ("name", "bounds"), [("STELLARIS_EXIT_GRACE_S", "0 to 3600"), ("STELLARIS_GIVEN_GATEWAY_WAIT_S", "1 to 86400")]
)
def test_a_bad_wait_limit_stops_train_before_it_starts(name: str, bounds: str) -> None:
    from typer.testing import CliRunner

    from stellaris.cli import app

    for bad in ("soon", "-1", "nan", "1e9"):
        result = CliRunner().invoke(app, ["train", "--env", "CartPole-v1"], env={name: bad})
        assert result.exit_code == 2, result.output
        assert f"{name} must be a number of seconds from {bounds}, got {bad!r}" in result.output
