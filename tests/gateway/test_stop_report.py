"""A gateway whose stop lingers says where it waits: `stop_report_s` after its stop began it prints every thread's
stack and every pending task's to stderr (gateway/server.py), one report after the other (their lines whole), and
the stop still ends as it would have."""

from __future__ import annotations

import queue
import subprocess
import threading
import uuid

import httpx

from cache import Cache
from cache.connection import credentials_env
from gateway.models import FunctionSpec
from tests.gateway.conftest import start_gateway, stop_gateway


def test_a_stop_that_lingers_prints_every_threads_stack_and_still_ends(
    redis_server, cache_conn: Cache, fname: str
) -> None:
    gw = start_gateway(redis_server.url, stderr=subprocess.PIPE, STELLARIS_GATEWAY_STOP_REPORT_S="0.5")
    assert gw.proc.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in gw.proc.stderr or ()], daemon=True).start()
    key = f"test:{uuid.uuid4().hex}"
    event = {"started_key": f"{key}:started", "release_key": f"{key}:release", "timeout_s": 60}
    answers: list[httpx.Response] = []
    try:
        with gw.client() as client:
            target = "tests.functions.sample_handlers:wait_for_release"
            client.register(FunctionSpec(name=fname, target=target, env=credentials_env(cache_conn.url)))
            call = threading.Thread(target=lambda: answers.append(client.http.post(f"/function/{fname}", json=event)))
            call.start()
            assert cache_conn.client.blpop([f"{key}:started"], timeout=30) is not None
            gw.proc.terminate()  # the call in flight holds the stop (uvicorn waits for it)
            seen = []
            while not any(line.startswith("Current thread 0x") for line in seen):
                seen.append(lines.get(timeout=30))  # the report: each thread's stack (faulthandler's), the loop's first
            while not any(line.startswith("Stack for <Task") and "_wait_tasks_to_complete" in line for line in seen):
                seen.append(lines.get(timeout=10))  # and the pending tasks': uvicorn's wait for the call among them
            assert gw.proc.poll() is None, "the report came only after the gateway had stopped"
            cache_conn.client.rpush(f"{key}:release", 1)
            call.join(30)
        assert answers and answers[0].status_code == 200 and answers[0].json()["released"] is True
        assert gw.proc.wait(timeout=30) == 0  # the stop ended as it would have, once its call was done
    finally:
        if gw.proc.poll() is None:
            stop_gateway(gw)
        cache_conn.client.delete(f"{key}:started", f"{key}:release")
