"""The function runtime, served in real subprocesses and driven over HTTP."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache import Cache
from cache.connection import REDIS_URL_ENV
from cache.server import EmbeddedRedis
from contract.runtime_http import EMBEDDED_RUNTIME, SECRET_ENV, SECRET_HEADER, runtime_argv
from functions.runtime import Runtime, RuntimeSettings
from functions.runtime.cli import parser
from functions.runtime.embedded import start_embedded
from tests.functions import sample_handlers

REPO = Path(__file__).resolve().parents[2]
HANDLERS = "tests.functions.sample_handlers"
START_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 10.0


class LineLog:
    """Collects a stream's lines on a thread so a test can wait for a given line instead of sleeping."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        for raw in stream:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, text: str, timeout_s: float = HTTP_TIMEOUT_S) -> str:
        def first() -> str | None:
            return next((line for line in self.lines if text in line), None)

        with self._cond:
            line = self._cond.wait_for(first, timeout_s)
            assert line is not None, f"no line containing {text!r} in:\n" + "\n".join(self.lines)
            return line

    def join(self) -> None:
        self._thread.join(timeout=5)


class Served:
    """One runtime process that printed READY."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, stderr: LineLog) -> None:
        self.proc, self.port, self.stderr = proc, port, stderr
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=HTTP_TIMEOUT_S)

    def invoke(self, event: Any = None, *, content: bytes | None = None, call_id: str | None = None) -> httpx.Response:
        headers = {"X-Call-Id": call_id} if call_id else {}
        body = content if content is not None else json.dumps(event if event is not None else {}).encode()
        # A fresh connection per call, so calls made from several threads never share one.
        with httpx.Client(base_url=self.url, timeout=HTTP_TIMEOUT_S) as http:
            return http.post("/invoke", content=body, headers=headers)


def _launch(handler: str, *flags: str, redis_url: str | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != REDIS_URL_ENV}
    if redis_url is not None:
        env[REDIS_URL_ENV] = redis_url
    cmd = [sys.executable, "-m", "functions.runtime", "--handler", f"{HANDLERS}:{handler}", *flags]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _read_ready(proc: subprocess.Popen[bytes], stderr: LineLog) -> int:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline().decode() if ready else ""
    assert line.startswith("READY "), f"expected READY, got {line!r}; stderr:\n" + "\n".join(stderr.lines)
    return int(line.split()[1])


@pytest.fixture
def spawn() -> Iterator[Callable[..., Served]]:
    """Start runtime processes; every one is killed at teardown, whatever the test did."""
    started: list[tuple[subprocess.Popen[bytes], LineLog]] = []
    served: list[Served] = []

    def start(handler: str, *flags: str, redis_url: str | None = None) -> Served:
        proc = _launch(handler, *flags, redis_url=redis_url)
        stderr = LineLog(proc.stderr)
        started.append((proc, stderr))
        served.append(Served(proc, _read_ready(proc, stderr), stderr))
        return served[-1]

    yield start
    for each in served:
        each.http.close()
    for proc, stderr in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        stderr.join()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _children(pid: int) -> list[str]:
    tasks = Path(f"/proc/{pid}/task")
    return [c for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def test_ready_line_then_health_and_readiness(spawn: Callable[..., Served]) -> None:
    served = spawn("echo")
    health = served.http.get("/health")
    assert health.status_code == 200
    assert health.json() == {
        "status": "ok",
        "handler": f"{HANDLERS}:echo",
        "pid": served.proc.pid,
        "in_flight": 0,
        "queued": 0,
        "timed_out": 0,
    }
    assert served.http.get("/ready").json() == {"status": "ready"}
    assert served.invoke({}).status_code == 200
    # The cache is lazy: a handler that never touches it starts no embedded redis-server.
    assert _children(served.proc.pid) == []


def test_invoke_round_trips_event_and_call_id(spawn: Callable[..., Served]) -> None:
    served = spawn("echo")
    response = served.invoke({"obs": [1, 2], "id": "abc"}, call_id="call-42")
    assert response.status_code == 200
    assert response.headers["X-Call-Id"] == "call-42"
    assert response.json() == {"event": {"obs": [1, 2], "id": "abc"}, "call_id": "call-42"}
    assert float(response.headers["X-Duration-Ms"]) >= 0

    generated = served.invoke({})
    call_id = generated.headers["X-Call-Id"]
    assert len(call_id) == 32 and int(call_id, 16) >= 0
    assert generated.json()["call_id"] == call_id
    # Both the handler's own log line and the runtime's carry the call id.
    assert "echo of 2 key(s)" in served.stderr.wait_for("[call call-42] echo")
    served.stderr.wait_for("[call call-42] invoke 200")


def test_handler_error_is_500_with_traceback_tail(spawn: Callable[..., Served]) -> None:
    served = spawn("fail")
    response = served.invoke({"message": "no such env"}, call_id="c-err")
    assert response.status_code == 500
    assert response.headers["X-Call-Id"] == "c-err"
    error = response.json()["error"]
    assert error["type"] == "ValueError"
    assert error["message"] == "no such env"
    assert "sample_handlers.py" in error["traceback"]
    assert error["traceback"].splitlines()[-1] == "ValueError: no such env"
    assert len(error["traceback"].splitlines()) <= 20
    served.stderr.wait_for("[call c-err] handler raised ValueError")


def test_body_that_is_not_a_json_object_is_400(spawn: Callable[..., Served]) -> None:
    served = spawn("echo")
    not_json = served.invoke(content=b"{obs: [1,")
    assert not_json.status_code == 400
    assert not_json.json()["error"]["type"] == "InvalidJSON"
    assert "not JSON" in not_json.json()["error"]["message"]
    not_utf8 = served.invoke(content=b'{"a": "\xff"}')
    assert not_utf8.status_code == 400
    array = served.invoke([1, 2])
    assert array.status_code == 400
    assert array.json()["error"] == {
        "type": "InvalidEvent",
        "message": "the event must be a JSON object, got a JSON array",
    }
    assert served.invoke({"still": "serving"}).status_code == 200


def test_result_that_is_not_a_json_object_is_500_invalid_result(spawn: Callable[..., Served]) -> None:
    served = spawn("bad_result")
    for kind, problem in [("list", "returned a list"), ("set", "set is not JSON"), ("nan", "Out of range float")]:
        response = served.invoke({"kind": kind})
        assert response.status_code == 500, kind
        error = response.json()["error"]
        assert error["type"] == "InvalidResult"
        assert problem in error["message"], error


def test_call_past_timeout_is_504_and_asks_for_recycle(spawn: Callable[..., Served]) -> None:
    served = spawn("sleep", "--timeout-s", "0.3")
    response = served.invoke({"seconds": 30})
    assert response.status_code == 504
    assert response.json()["error"] == {"type": "Timeout", "message": "handler ran past 0.3 s", "recycle": True}
    # The loop stays responsive while the thread still runs; readiness asks for a replacement.
    assert served.http.get("/health").json()["in_flight"] == 1
    assert served.http.get("/ready").json() == {"status": "recycle"}
    assert served.http.get("/ready").status_code == 503


@pytest.fixture
def keys(cache_conn: Cache) -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:12]
    pair = (f"test:runtime:{tag}:started", f"test:runtime:{tag}:release")
    yield pair
    cache_conn.client.delete(*pair)


def test_full_queue_is_429(
    spawn: Callable[..., Served], redis_server: EmbeddedRedis, cache_conn: Cache, keys: tuple[str, str]
) -> None:
    started_key, release_key = keys
    served = spawn("wait_for_release", "--concurrency", "1", "--queue-max", "1", redis_url=redis_server.url)
    event = {"started_key": started_key, "release_key": release_key}
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(served.invoke, event, call_id="first")
        assert cache_conn.client.blpop([started_key], timeout=HTTP_TIMEOUT_S) == (started_key.encode(), b"first")
        # One of these two waits in the queue; the other finds it full.
        others = [pool.submit(served.invoke, event, call_id=f"other-{i}") for i in range(2)]
        done, _ = wait(others, timeout=HTTP_TIMEOUT_S, return_when=FIRST_COMPLETED)
        rejected = done.pop().result()
        assert rejected.status_code == 429
        assert rejected.headers["Retry-After"] == "1"
        assert rejected.json()["error"]["type"] == "QueueFull"
        assert served.http.get("/health").json()["queued"] == 1
        cache_conn.client.rpush(release_key, "go", "go")
        queued = next(f for f in others if f.result(timeout=HTTP_TIMEOUT_S) is not rejected).result()
        assert first.result(timeout=HTTP_TIMEOUT_S).json() == {"released": True}
        assert queued.status_code == 200 and queued.json() == {"released": True}


def test_memo_survives_between_invocations(spawn: Callable[..., Served]) -> None:
    served = spawn("count")
    first, second = served.invoke({}).json(), served.invoke({}).json()
    assert (first["calls"], second["calls"]) == (1, 2)
    assert first["pid"] == second["pid"] == served.proc.pid


def test_sigterm_finishes_the_call_in_flight_and_exits_0(
    spawn: Callable[..., Served], redis_server: EmbeddedRedis, cache_conn: Cache, keys: tuple[str, str]
) -> None:
    started_key, release_key = keys
    served = spawn("wait_for_release", redis_url=redis_server.url)
    event = {"started_key": started_key, "release_key": release_key}
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(served.invoke, event, call_id="in-flight")
        assert cache_conn.client.blpop([started_key], timeout=HTTP_TIMEOUT_S) is not None
        served.proc.send_signal(signal.SIGTERM)
        served.stderr.wait_for("draining: 1 call(s) running")
        assert served.http.get("/ready").status_code == 503
        refused = served.invoke(event)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "Draining"
        cache_conn.client.rpush(release_key, "go")
        response = in_flight.result(timeout=HTTP_TIMEOUT_S)
    assert response.status_code == 200 and response.json() == {"released": True}
    assert served.proc.wait(timeout=HTTP_TIMEOUT_S) == 0
    served.stderr.wait_for("cache closed")


def test_handler_that_kills_its_process_fails_the_call_fast(spawn: Callable[..., Served]) -> None:
    served = spawn("crash")
    with pytest.raises(httpx.TransportError):
        served.invoke({"code": 3})
    assert served.proc.wait(timeout=HTTP_TIMEOUT_S) == 3


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (["--host", "0.0.0.0"], 2, "--allow-remote"),
        (["--concurrency", "0"], 2, "concurrency"),
        (["--handler", f"{HANDLERS}:no_such_handler"], 1, "no attribute 'no_such_handler'"),
        (["--handler", "no_colon"], 1, "package.module:function"),
    ],
)
def test_bad_settings_exit_without_ready(flags: list[str], code: int, message: str) -> None:
    proc = _launch("echo", *flags)
    stdout, stderr = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == code
    assert b"READY" not in stdout
    assert message in stderr.decode()


def test_runtime_embedded_in_a_thread_stops_on_request() -> None:
    """The embedding a Ray actor uses: no signals, `stop()` from another thread."""
    settings = RuntimeSettings(handler=f"{HANDLERS}:count", port=0)
    runtime = Runtime(settings, sample_handlers.count)
    ports: queue.Queue[int] = queue.Queue()
    codes: queue.Queue[int] = queue.Queue()
    thread = threading.Thread(target=lambda: codes.put(asyncio.run(runtime.run(on_ready=ports.put))))
    thread.start()
    try:
        port = ports.get(timeout=START_TIMEOUT_S)
        response = httpx.post(f"http://127.0.0.1:{port}/invoke", json={}, timeout=HTTP_TIMEOUT_S)
        assert response.json()["calls"] == 1
        assert runtime.instance.invocations == 1
    finally:
        runtime.stop()
        thread.join(timeout=HTTP_TIMEOUT_S)
    assert codes.get_nowait() == 0


def test_the_cli_derives_every_flag_and_default_from_the_settings() -> None:
    """A flag not given is left to RuntimeSettings: the CLI restates no default."""
    cli = parser()
    given = vars(cli.parse_args(["--handler", f"{HANDLERS}:echo"]))
    assert set(given) == {"handler", "log_level"}
    settings = RuntimeSettings(**{k: v for k, v in given.items() if k != "log_level"})
    assert settings == RuntimeSettings(handler=f"{HANDLERS}:echo")
    flags = {option for action in cli._actions for option in action.option_strings}
    assert {"--" + name.replace("_", "-") for name in RuntimeSettings.model_fields} <= flags
    help_text = " ".join(cli.format_help().split())
    assert f"(default: {RuntimeSettings.model_fields['queue_max'].default})" in help_text


def test_the_argv_a_spawner_builds_is_what_the_cli_reads() -> None:
    """The gateway's backends build the command line from the contract; the runtime's CLI must read it back."""
    argv = runtime_argv(f"{HANDLERS}:echo", host="0.0.0.0", port=8080, concurrency=3, timeout_s=2.5)
    args = vars(parser().parse_args(argv))
    args.pop("log_level")
    assert RuntimeSettings(**args) == RuntimeSettings(
        handler=f"{HANDLERS}:echo", host="0.0.0.0", allow_remote=True, port=8080, concurrency=3, timeout_s=2.5
    )
    local = vars(parser().parse_args(runtime_argv(f"{HANDLERS}:echo", port=0, concurrency=1, timeout_s=60)))
    assert "host" not in local and "allow_remote" not in local


# -- the secret (a runtime off loopback: the ray backend's actors) ------------------------------------------------


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = uuid.uuid4().hex
    monkeypatch.setenv(SECRET_ENV, value)  # _launch copies the environment into the runtime process
    return value


def test_with_a_secret_every_request_must_carry_it(spawn: Callable[..., Served], secret: str) -> None:
    served = spawn("count")
    for method, path in [("GET", "/health"), ("GET", "/ready"), ("POST", "/invoke")]:
        for headers in [{}, {SECRET_HEADER: "wrong"}, {SECRET_HEADER: secret[:-1]}, {SECRET_HEADER: secret + "x"}]:
            refused = served.http.request(method, path, json={}, headers=headers)
            assert refused.status_code == 401, (method, path, headers)
            assert refused.json()["error"]["type"] == "Unauthorized"
            assert SECRET_HEADER in refused.json()["error"]["message"]
    ok = {SECRET_HEADER: secret}
    assert served.http.get("/health", headers=ok).json()["status"] == "ok"
    assert served.http.get("/ready", headers=ok).json() == {"status": "ready"}
    # Every refused /invoke stayed out of the handler: the first call that carries the secret is its first.
    assert served.http.post("/invoke", json={}, headers=ok).json()["calls"] == 1
    served.stderr.wait_for(f"401: POST /invoke without the right {SECRET_HEADER} header")


def test_without_a_secret_no_header_is_asked_for(spawn: Callable[..., Served]) -> None:
    assert SECRET_ENV not in os.environ
    served = spawn("count")
    assert served.invoke({}).json()["calls"] == 1
    assert served.http.post("/invoke", json={}, headers={SECRET_HEADER: "anything"}).json()["calls"] == 2


def test_the_embedded_runtime_serves_off_loopback_with_its_secret_and_drains(secret: str) -> None:
    """What the ray backend's actor runs: on a given address (a node's), from a thread, stopped by a drain."""
    served = start_embedded(f"{HANDLERS}:count", host="127.0.0.5", concurrency=2, timeout_s=5)
    try:
        url = f"http://127.0.0.5:{served.port}/invoke"
        assert httpx.post(url, json={}, timeout=HTTP_TIMEOUT_S).status_code == 401
        answer = httpx.post(url, json={}, headers={SECRET_HEADER: secret}, timeout=HTTP_TIMEOUT_S)
        assert answer.json()["calls"] == 1
    finally:
        assert served.stop(timeout_s=5) is True
    assert not served.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.post(url, json={}, headers={SECRET_HEADER: secret}, timeout=HTTP_TIMEOUT_S)


def test_the_embedded_runtime_raises_what_stops_it_from_serving() -> None:
    with pytest.raises(ValueError, match="no attribute 'no_such_handler'"):
        start_embedded(f"{HANDLERS}:no_such_handler", host="127.0.0.1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            start_embedded(f"{HANDLERS}:count", host="127.0.0.1", port=taken.getsockname()[1])


def test_the_embedded_entry_is_where_the_contract_says() -> None:
    module, _, name = EMBEDDED_RUNTIME.partition(":")
    assert getattr(importlib.import_module(module), name) is start_embedded
