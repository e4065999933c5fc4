"""A script call sent now and read later: the server runs it while the caller computes, and its reply waits in the
socket. No thread and no wake-up: on this project's 2-vCPU machines a PING across the cores costs 91-113 µs against
22-32 µs with both ends on one core (`experiments.bench_cores`), most of it the kernel waking the other side, and a
thread that makes the call for the caller adds its own wake-ups and contends for the interpreter lock.

The call has a connection of its own from the client's pool until it is read. Whatever goes wrong before its reply
is read (a lost connection, a script the server no longer has) runs the call again through the client's ordinary
path, retry policy included: the same as a call whose reply was lost (cache/retry.py), which the hot-path scripts
are written to survive. A client that is not a plain pooled `redis.Redis` (a Redis Cluster client, a single-connection
client) runs the call when it is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script


class Deferred:
    """`script(keys, args)`, sent on construction; `result()` reads (or, after a failure, repeats) it, once."""

    def __init__(self, client: Any, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self._client, self._script, self._keys, self._args = client, script, list(keys), list(args)
        self._conn: redis.connection.AbstractConnection | None = None
        self._value: Any = None
        self._error: Exception | None = None  # the call's failure, raised by `result` (as a sent call's would be)
        self._done = False
        if not isinstance(client, redis.Redis) or client.connection is not None:
            self._done = True
            try:
                self._value = self._again()
            except Exception as exc:
                self._error = exc
            return
        pool, lost = client.connection_pool, (redis.ConnectionError, redis.TimeoutError, OSError)
        try:
            conn = pool.get_connection()  # connects when the pool has no connection open
        except lost:
            return  # `result` runs it on the ordinary path, which rides out a restart
        try:
            conn.send_command("EVALSHA", script.sha, len(self._keys), *self._keys, *self._args)
        except lost:
            pool.release(conn)
            conn.disconnect()
            return  # likewise
        self._conn = conn
        if hasattr(client, "round_trips"):
            client.round_trips += 1

    @property
    def pending(self) -> bool:
        """Sent and not yet read."""
        return not self._done

    def result(self) -> Any:
        """The script's reply: read from the socket (the call has usually finished by now), or the call run again
        when the first try failed before its reply was read. The call's failure (a script's own error among them)
        is raised, and raised again if asked again."""
        if not self._done:
            self._done = True
            try:
                self._value = self._read()
            except Exception as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._value

    def _read(self) -> Any:
        conn, self._conn = self._conn, None
        if conn is None:
            return self._again()
        try:
            return self._client.parse_response(conn, "EVALSHA")
        except (redis.ConnectionError, OSError, redis.exceptions.NoScriptError):
            conn.disconnect()  # a reply half read, or none: the connection starts afresh when next used
            return self._again()
        except redis.ResponseError:
            raise  # the script's own error, read whole: the connection is fine
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._client.connection_pool.release(conn)

    def _again(self) -> Any:
        """The call on the client's ordinary path (loading the script when the server lacks it; riding out a lost
        connection within the retry window)."""
        return self._script(keys=self._keys, args=self._args, client=self._client)
