"""The process backend's fork server (gateway/backends/process/zygote.py, functions/runtime/zygote.py): instances forked
from it are real instances of their own (env, working directory, memory limit, command line, exit codes), a kill -9
of an instance or of the server itself is seen and survived, and an environment that only a fresh interpreter would
honour gets a fork server started with it, up to a bound, then a fresh interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis

from cache.server import EmbeddedRedis
from contract.instance_env import INHERITED_ENV
from contract.runtime_http import READY_PREFIX, RUNTIME_MODULE, runtime_argv
from contract.zygote import SpawnRequest, load_time_changes
from gateway.backends.base import InstanceHandle
from gateway.backends.process.backend import ProcessBackend, instances_base_env
from gateway.backends.process.tree import descendants, wait_gone
from gateway.backends.process.zygote import ForkedProcess, ForkServer, first_line
from gateway.models import FunctionSpec
from tests.gateway.conftest import start_gateway, stop_gateway
from tests.procs import parent_pid

ROOT = Path(__file__).resolve().parents[2]


def _spec(name: str = "proc", handler: str = "process", **extra: object) -> FunctionSpec:
    return FunctionSpec.model_validate({"name": name, "target": f"tests.functions.sample_handlers:{handler}", **extra})


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _call(handle: InstanceHandle, event: dict[str, object]) -> dict[str, object]:
    response = httpx.post(f"{handle.url}/invoke", json=event, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.fixture
def backend() -> Iterator[ProcessBackend]:
    b = ProcessBackend(cwd=ROOT)
    yield b
    for proc in list(b._procs.values()):
        proc.kill()
    b.close()


def _server_pid(b: ProcessBackend, flavour: tuple[tuple[str, str], ...] = ()) -> int:
    assert b.forks is not None
    proc = b.forks.servers[flavour]._proc
    assert proc is not None
    return proc.pid


def test_a_forked_instance_has_its_own_env_limits_and_command_line(backend: ProcessBackend) -> None:
    spec = _spec(env={"STELLARIS_DEVICE": "cpu"}, resources={"memory_bytes": 3 << 30})
    first = backend.start(spec, instance_id="a-1")
    second = backend.start(spec, instance_id="a-2")
    draws = []
    for handle in (first, second):
        assert isinstance(backend._procs[handle.id], ForkedProcess)
        got = _call(handle, {"env": ["STELLARIS_DEVICE", "STELLARIS_INSTANCE_ID", "REDIS_URL"], "draw": True})
        draws.append(got["draws"])
        assert got["pid"] == handle.pid
        assert got["ppid"] == _server_pid(backend)  # forked by the server, not started by us
        assert got["env"] == {"STELLARIS_DEVICE": "cpu", "STELLARIS_INSTANCE_ID": handle.id, "REDIS_URL": None}
        assert got["cwd"] == str(ROOT)
        assert got["rlimit_data"] == 3 << 30
        assert got["gc_frozen"] > 10_000  # what the server imported (torch's objects among them) is frozen
        cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
        assert (
            cmdline == f"{sys.executable} -m functions.runtime --handler tests.functions.sample_handlers:process "
            "--port 0 --concurrency 1 --timeout-s 60"
        )
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1]  # not the server's generators, twice
    # SIGTERM drains, and the exit code comes through the server.
    proc = backend._procs["a-1"]
    backend.stop(first)
    assert proc.returncode == 0
    assert backend.alive(second)


def test_a_kill_9_of_an_instance_reads_as_sigkill(backend: ProcessBackend) -> None:
    handle = backend.start(_spec(), instance_id="k-1")
    proc = backend._procs[handle.id]
    os.kill(handle.pid or 0, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not backend.alive(handle)
    backend.stop(handle)  # idempotent on a dead one


def test_a_kill_9_of_the_server_takes_its_instances_and_the_next_start_brings_a_new_one(
    backend: ProcessBackend,
) -> None:
    handles = [backend.start(_spec(), instance_id=f"s-{i}") for i in range(2)]
    server = _server_pid(backend)
    os.kill(server, signal.SIGKILL)
    assert not wait_gone({server, *(h.pid or 0 for h in handles)}, timeout_s=10)
    for h in handles:
        assert backend._procs[h.id].wait(timeout=10) == -signal.SIGKILL  # gone with it: reads as killed
        assert not backend.alive(h)
        backend.stop(h)
    again = backend.start(_spec(), instance_id="s-2")
    assert _server_pid(backend) != server
    assert _call(again, {"env": []})["ppid"] == _server_pid(backend)


def test_a_server_killed_while_it_serves_a_start_is_replaced_for_that_start(redis_server: EmbeddedRedis) -> None:
    """Killed between a request and its answer (here: while it imports the request's handler), the server's end of
    the start's status socket goes with it; the waiting start sees that at once, brings a new server and asks it. It
    never waits out the startup timeout for an answer that cannot come (62 s in a chaos run, then a fresh
    interpreter), which reads here as the start failing: "no answer"."""
    key = f"test:{uuid.uuid4().hex}"
    env = {**os.environ, "STELLARIS_TEST_HELD_START_KEY": key, "STELLARIS_TEST_HELD_START_REDIS": redis_server.url}
    server = ForkServer(sys.executable, str(ROOT), env, 20.0)
    handler = "tests.functions.held_start_handlers:pid"
    argv = ["-m", RUNTIME_MODULE, *runtime_argv(handler, port=0, concurrency=1, timeout_s=60)]
    request = SpawnRequest(module=RUNTIME_MODULE, argv=argv[2:], env=env, cwd=str(ROOT), memory_bytes=None, title=key)
    got: list[ForkedProcess | BaseException] = []

    def start() -> None:
        try:
            got.append(server.spawn(request))
        except BaseException as exc:  # the test reads it
            got.append(exc)

    redis = Redis.from_url(redis_server.url, socket_timeout=90)  # the BLPOPs below have their own
    starting = threading.Thread(target=start)
    try:
        starting.start()
        _, first = redis.blpop([f"{key}:started"], timeout=60) or (None, None)
        assert first is not None, "the server never began to import the handler"
        os.kill(int(first), signal.SIGKILL)  # the server itself imports the handler a request names, then forks
        _, second = redis.blpop([f"{key}:started"], timeout=60) or (None, None)
        assert second is not None and int(second) != int(first), f"no new server took the start: {got}"
        redis.rpush(f"{key}:release", 1)
        starting.join(60)
        [child] = got
        assert isinstance(child, ForkedProcess), child
        assert child.stdout is not None and first_line(child.stdout, 30).startswith(READY_PREFIX)
        assert parent_pid(child.pid) == int(second)
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        redis.rpush(f"{key}:release", 1, 1)
        starting.join(60)
        server.close()
        redis.delete(f"{key}:started", f"{key}:release")


def test_a_load_time_env_gets_a_fork_server_started_with_it(backend: ProcessBackend) -> None:
    plain = backend.start(_spec(), instance_id="e-1")
    one = backend.start(_spec("one", env={"OMP_NUM_THREADS": "1"}), instance_id="e-2")
    other = backend.start(_spec("one-too", env={"OMP_NUM_THREADS": "1"}), instance_id="e-3")
    got = {h.id: _call(h, {"env": ["OMP_NUM_THREADS"], "torch": True}) for h in (plain, one, other)}
    server = _server_pid(backend, (("OMP_NUM_THREADS", "1"),))
    assert server != _server_pid(backend)
    assert got["e-1"]["ppid"] == _server_pid(backend)
    assert got["e-2"]["ppid"] == got["e-3"]["ppid"] == server  # one server per load-time env, not per function
    assert got["e-2"]["env"] == {"OMP_NUM_THREADS": "1"}
    assert got["e-2"]["torch_threads"] == 1  # honoured: torch read it when the server loaded it
    if os.environ.get("OMP_NUM_THREADS") is None and len(os.sched_getaffinity(0)) > 1:
        assert got["e-1"]["torch_threads"] > 1  # the check above can fail: without the variable torch takes more


def test_beyond_fork_servers_an_instance_starts_a_fresh_interpreter() -> None:
    b = ProcessBackend(cwd=ROOT, fork_servers=1)
    try:
        plain = b.start(_spec(), instance_id="f-1")
        fresh = b.start(_spec(env={"OMP_NUM_THREADS": "1"}), instance_id="f-2")
        assert isinstance(b._procs[plain.id], ForkedProcess)
        assert isinstance(b._procs[fresh.id], subprocess.Popen)
        got = _call(fresh, {"env": ["OMP_NUM_THREADS"], "torch": True})
        assert got["ppid"] == os.getpid() and got["torch_threads"] == 1
        assert got["gc_frozen"] == 0  # nothing froze a fresh interpreter's imports
    finally:
        for proc in b._procs.values():
            proc.kill()
        b.close()


def test_a_handler_that_cannot_load_fails_its_start_and_the_server_stays(backend: ProcessBackend) -> None:
    with pytest.raises(Exception, match="exited with code 1"):
        backend.start(FunctionSpec(name="bad", target="tests.functions.no_such_module:handle"), instance_id="b-1")
    server = _server_pid(backend)
    assert _call(backend.start(_spec(), instance_id="b-2"), {"env": []})["ppid"] == server


def test_a_handler_that_starts_a_thread_at_import_leaves_forking_to_fresh_interpreters(
    backend: ProcessBackend,
) -> None:
    backend.start(_spec(), instance_id="t-0")  # the server is up and forks
    spec = FunctionSpec(name="threaded", target="tests.functions.threaded_handler:handle")
    for i in (1, 2):  # the server imported it, saw the thread and refused; it is not asked again
        handle = backend.start(spec, instance_id=f"t-{i}")
        assert isinstance(backend._procs[handle.id], subprocess.Popen)
        assert _call(handle, {})["ppid"] == os.getpid()
    assert backend.forks is not None and backend.forks.servers[()].failed


def test_a_server_that_failed_to_start_is_tried_again_after_its_wait() -> None:
    b = ProcessBackend(cwd=ROOT, fork_server_retry_s=3600)
    try:
        assert b.forks is not None
        server = b.forks.for_env({})
        assert server is not None
        server.python = "/nonexistent/python"  # the start fails (no such interpreter); instances start fresh
        first = b.start(_spec(), instance_id="r-1")
        assert isinstance(b._procs[first.id], subprocess.Popen)
        assert server.failed and server.failed_starts == 1
        server.python = sys.executable  # it would start now, but its wait (an hour) has not run out
        second = b.start(_spec(), instance_id="r-2")
        assert isinstance(b._procs[second.id], subprocess.Popen) and server.failed_starts == 1
        server.retry_s = 0  # a wait of 0 after the next failure: the one after it is tried at once
        server._retry_at = 0.0
        server.python = "/bin/false"  # starts, but exits without its READY line
        assert isinstance(b._procs[b.start(_spec(), instance_id="r-3").id], subprocess.Popen)
        assert server.failed_starts == 2 and not server.failed
        server.python = sys.executable
        forked = b.start(_spec(), instance_id="r-4")
        assert isinstance(b._procs[forked.id], ForkedProcess)
        assert _call(forked, {"env": []})["ppid"] == _server_pid(b)
        assert server.failed_starts == 0  # a start that worked ends the run of failures
    finally:
        for proc in list(b._procs.values()):
            proc.kill()
        b.close()


def test_a_module_the_server_imported_runs_as_main_without_a_warning(capfd: pytest.CaptureFixture[str]) -> None:
    module = "tests.functions.main_module"
    server = ForkServer(sys.executable, str(ROOT), dict(os.environ), 60.0, preload=(module,))
    try:
        request = SpawnRequest(
            module=module, argv=["a", "b"], env=dict(os.environ), cwd=str(ROOT), memory_bytes=None, title=module
        )
        child = server.spawn(request)
        assert child.stdout is not None
        assert child.stdout.read().decode() == "main ['a', 'b']\n" and child.wait(timeout=30) == 0
    finally:
        server.close()
    assert "RuntimeWarning" not in capfd.readouterr().err  # runpy's "found in sys.modules" warning


def test_closing_the_backend_stops_the_server(backend: ProcessBackend) -> None:
    handle = backend.start(_spec(), instance_id="c-1")
    server = _server_pid(backend)
    backend.stop(handle)
    backend.close()
    assert not wait_gone({server}, timeout_s=10)


def test_load_time_changes_names_what_only_a_fresh_interpreter_would_honour() -> None:
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "2", "MUJOCO_GL": "egl"}
    same = {**base, "STELLARIS_DEVICE": "cuda", "REDIS_URL": "redis://x:1", "CUDA_VISIBLE_DEVICES": "1"}
    assert load_time_changes(same, base) == []
    changed = {**same, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    del changed["MUJOCO_GL"]
    assert load_time_changes(changed, base) == ["MKL_NUM_THREADS", "MUJOCO_GL", "OMP_NUM_THREADS"]


def test_fork_server_off_starts_fresh_interpreters() -> None:
    b = ProcessBackend(cwd=ROOT, fork_servers=0)
    handle = b.start(_spec(), instance_id="o-1")
    try:
        assert isinstance(b._procs[handle.id], subprocess.Popen)
        assert _call(handle, {"env": []})["ppid"] == os.getpid()
    finally:
        b.stop(handle)
        b.close()


def test_a_gateway_told_the_env_starts_that_fork_server_before_any_instance(redis_server: EmbeddedRedis) -> None:
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_FORK_SERVER_ENV='{"OMP_NUM_THREADS": "1"}')
    try:
        deadline = time.monotonic() + 60
        servers: set[int] = set()
        while not servers and time.monotonic() < deadline:  # started in the background as the gateway starts
            servers = {p for p in descendants(gw.proc.pid) if b"functions.runtime.zygote" in _cmdline(p)}
            time.sleep(0.05)  # a look at /proc, not an event: nothing to wait on
        assert len(servers) == 1, "no fork server started with the gateway"
        client = gw.client()
        client.register(_spec("told", env={"OMP_NUM_THREADS": "1"}))
        got = client.invoke("told", {"env": ["OMP_NUM_THREADS"], "torch": True})
        assert got["ppid"] in servers and got["torch_threads"] == 1
    finally:
        stop_gateway(gw)
    assert not wait_gone(servers, timeout_s=10)


def test_a_server_started_early_is_adopted_by_the_backend_that_asks_for_its_environment() -> None:
    """`python -m gateway` starts its fork server before its own imports; the backend built later takes that one
    (no second start) when it asks for the same environment, and stops one started for another."""
    from gateway.backends.process.fork_servers import start_early

    url = "redis://127.0.0.1:1/0"  # the backend's base environment names its Redis; nothing is asked of it here
    told = {"OMP_NUM_THREADS": "1"}
    base = instances_base_env(os.environ, INHERITED_ENV, {}, url)  # what `python -m gateway` gives it
    early = start_early(sys.executable, base, told, 60.0, 10.0)
    b = ProcessBackend(redis_url=url)
    try:
        assert b.forks is not None
        assert b.forks.for_env(told) is early  # adopted: the same server, its start already under way
        handle = b.start(_spec("early", env=told), instance_id="e-1")
        assert isinstance(b._procs[handle.id], ForkedProcess)
        assert early._proc is not None and _call(handle, {})["ppid"] == early._proc.pid  # forked from it
        b.kill(handle)
    finally:
        b.close()
    assert early._proc is None  # closed with the backend that adopted it

    stray = start_early(sys.executable, {**os.environ, "REDIS_URL": "redis://elsewhere:6379/0"}, told, 60.0, 10.0)
    b = ProcessBackend(redis_url=url)
    try:
        assert b.forks is not None
        adopted = b.forks.for_env(told)
        assert adopted is not None and adopted is not stray and stray._proc is None  # another env: stopped
    finally:
        b.close()
