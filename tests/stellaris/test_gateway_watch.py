"""The watch on `stellaris train`'s gateway (stellaris/platform/gateway_watch.py).

The local one is judged only once it said it was ready: a restarted one is not probed while it starts, nor at its
predecessor's URL. Before, the watch saw the new process at once, probed the dead one's port, and killed the new
gateway as it started once that silence passed `hung_after_s`: the job then ended with "the local gateway did not
start (exit code -9)" (CI, under load, with `hung_after_s` 2 s). A given one is never killed, but its silence is
named."""

from __future__ import annotations

import os
import queue
import signal
import subprocess

import httpx
import pytest

from cache.server import EmbeddedRedis
from gateway.settings import HangSettings
from stellaris.platform.gateway_watch import GatewayStuck, GatewayWatch
from stellaris.platform.local import Platform
from tests.gateway.conftest import start_gateway, stop_gateway
from tests.procs import wait_pid_gone

# Far shorter than a gateway's start (its imports alone take longer): a watch that judged a starting gateway would
# kill it every time.
HUNG_AFTER_S, BUSY_PROBE_S = 0.2, 0.1


def test_a_restarted_local_gateway_is_not_taken_for_hung_while_it_starts(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STELLARIS_GATEWAY_HUNG_AFTER_S", str(HUNG_AFTER_S))
    monkeypatch.setenv("STELLARIS_GATEWAY_BUSY_PROBE_S", str(BUSY_PROBE_S))
    with Platform(redis_url=redis_server.url, gateway_url=None, gateway_token=None) as platform:
        for restart in (1, 2):
            old = platform.gateway_proc
            assert old is not None
            os.kill(old.pid, signal.SIGKILL)
            assert wait_pid_gone(old.pid, 30)
            back = platform.recover_gateway()  # raised PlatformError("... did not start (exit code -9)") before
            assert back.replaced == restart and platform.gateway_proc is not old
            assert platform.gateway_proc is not None and platform.gateway_proc.poll() is None
            assert httpx.get(f"{back.url}/healthz", timeout=5).status_code == 200
            with pytest.raises(subprocess.TimeoutExpired):  # ready and watched: it answers, and the watch leaves it be
                platform.gateway_proc.wait(timeout=10 * HUNG_AFTER_S)


def test_a_given_gateway_that_stops_answering_is_named_and_so_is_its_return(redis_server: EmbeddedRedis) -> None:
    """Not ours to kill: the watch says that it is silent (a job waiting on it would otherwise wait without a word, up
    to its calls' hour), then that it answers again."""
    gw = start_gateway(redis_server.url)
    said: queue.Queue[str] = queue.Queue()
    watch = GatewayWatch(
        lambda: (None, gw.url),
        HangSettings(hung_after_s=HUNG_AFTER_S, busy_probe_s=BUSY_PROBE_S),
        owned=False,
        say=said.put,
    )
    watch.start()
    try:
        os.kill(gw.proc.pid, signal.SIGSTOP)
        line = said.get(timeout=30)
        assert line.startswith(f"the gateway at {gw.url} answered no health probe for ") and "not ours" in line
        os.kill(gw.proc.pid, signal.SIGCONT)
        assert said.get(timeout=30).startswith(f"the gateway at {gw.url} answers again, after ")
        assert gw.proc.poll() is None  # never killed
    finally:
        watch.stop()
        os.kill(gw.proc.pid, signal.SIGCONT)
        stop_gateway(gw)
    assert said.empty()


def test_a_given_gateway_silent_past_the_wait_ends_the_job_blocked_on_it(redis_server: EmbeddedRedis) -> None:
    """Silent past `give_up_s`, a given gateway ends the job as one away that long does: the main thread, blocked in a
    call to it, is interrupted with GatewayStuck. Before, the call waited out its timeout (an hour in a job)."""
    gw = start_gateway(redis_server.url)
    said: queue.Queue[str] = queue.Queue()
    before = signal.getsignal(signal.SIGUSR2)
    watch = GatewayWatch(
        lambda: (None, gw.url),
        HangSettings(hung_after_s=HUNG_AFTER_S, busy_probe_s=BUSY_PROBE_S),
        owned=False,
        say=said.put,
        give_up_s=1.0,
    )
    watch.start()
    try:
        os.kill(gw.proc.pid, signal.SIGSTOP)
        with pytest.raises(GatewayStuck, match=rf"^the gateway at {gw.url} answered no health probe for \d+ s: ending"):
            httpx.get(f"{gw.url}/healthz", timeout=120)  # the job's call, blocked on the stopped gateway
        assert "for 1 s at most (it is not ours to restart)" in said.get(timeout=5)
    finally:
        watch.stop()
        os.kill(gw.proc.pid, signal.SIGCONT)
        stop_gateway(gw)
    assert signal.getsignal(signal.SIGUSR2) == before  # the previous handler is back
    assert gw.proc.returncode is not None and gw.proc.returncode != -signal.SIGKILL  # never killed by the watch
