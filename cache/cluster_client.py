"""The client for a Redis Cluster URL (`redis+cluster://`, `rediss+cluster://`): redis-py's `RedisCluster`, counting
its round trips like the single-server client and riding out a lost node with the cache's retry policy.

Every key of a job carries the job's hash tag (cache/keys.py), so its scripts, transactions and blocking reads all
go to the one master that owns the job's slot.
"""

from __future__ import annotations

import functools
from typing import Any

import redis
import redis.cluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError

from cache.retry import ReconnectRetry

CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}
# What a cluster client retries within the reconnect window: a lost connection, and the cluster refusing commands
# while a master is down (CLUSTERDOWN, TRYAGAIN) or its slots are not yet known again.
CLUSTER_RETRY_ON: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
)


def is_cluster_url(url: str) -> bool:
    return url.startswith(tuple(CLUSTER_SCHEMES))


def node_url(url: str) -> str:
    """A cluster URL as redis-py parses it: the scheme of one node (`redis+cluster://h:p` -> `redis://h:p`)."""
    for cluster, plain in CLUSTER_SCHEMES.items():
        if url.startswith(cluster):
            return plain + url[len(cluster) :]
    raise ValueError(f"not a Redis Cluster URL (expected {' or '.join(CLUSTER_SCHEMES)}): {url!r}")


def _ignore(error: Exception) -> None:
    """The failure callback: redis-py's cluster client already dropped the connection and refreshed its slot map."""


class GuardedCluster(redis.cluster.RedisCluster):
    """A cluster client that counts its round trips (`round_trips`: a command or a whole pipeline count one, a
    command sent to every master too) and retries per `reconnect` (cache/retry.py). Build it with redis-py's own
    retries off (`retry=Retry(NoBackoff(), 0)`, as cache.Cache does): they would resend a timed-out command. A MOVED
    redirection is still followed, and a dropped connection still refreshes the slot map before `reconnect` retries."""

    def __init__(self, *args: Any, reconnect: ReconnectRetry, **kwargs: Any) -> None:
        self.round_trips = 0  # approximate under threads (+= is not atomic); a measure, not an invariant
        self.reconnect = reconnect
        self.script_texts: dict[str, Any] = {}  # sha -> source of the scripts registered on this client
        super().__init__(*args, **kwargs)

    def register_script(self, script: Any) -> Any:
        registered = super().register_script(script)
        self.script_texts[registered.sha] = script
        return registered

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        return self.reconnect.call_with_retry(functools.partial(super().execute_command, *args, **kwargs), _ignore)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> CountedClusterPipeline:
        if shard_hint:
            raise redis.cluster.RedisClusterException("shard_hint is deprecated in cluster mode")
        return CountedClusterPipeline(
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            read_from_replicas=self.read_from_replicas,
            load_balancing_strategy=self.load_balancing_strategy,
            reinitialize_steps=self.reinitialize_steps,
            retry=self.retry,
            lock=self._lock,
            transaction=transaction,
            event_dispatcher=self._event_dispatcher,
            owner=self,
        )


class CountedClusterPipeline(redis.cluster.ClusterPipeline):
    """A cluster pipeline (a MULTI/EXEC with transaction=True: its keys must share one slot) counted as one round
    trip on its client, and retried whole within the reconnect window like a single-server pipeline."""

    def __init__(self, *args: Any, owner: GuardedCluster, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner = owner

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """A registered script queued here is sent whole (EVAL): a node that restarted has an empty script cache,
        and inside MULTI a NOSCRIPT would fail that one command while the others still ran."""
        script = self._owner.script_texts.get(sha)
        if script is None:
            return super().evalsha(sha, numkeys, *keys_and_args)
        return self.execute_command("EVAL", script, numkeys, *keys_and_args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued = [(command.args, command.options) for command in self._execution_strategy.command_queue]
        if not queued:
            return super().execute(raise_on_error)
        self._owner.round_trips += 1
        first = True

        def run() -> list[Any]:
            nonlocal first
            if not first:  # a failed execute() emptied the queue: queue the same commands again
                for args, options in queued:
                    self.execute_command(*args, **options)
            first = False
            return super(CountedClusterPipeline, self).execute(raise_on_error)

        return self._owner.reconnect.call_with_retry(run, _ignore)
