"""The one accessor of a job's aggregator state (`contract.AggregatorState`) in Redis. The parameter function
also writes it atomically with each publish (`PolicyStore.publish_and_ack`, from `AggregatorState.to_fields`)."""

from __future__ import annotations

from cache.keys import JobKeys
from cache.redis_types import RedisClient, hash_fields
from contract.aggregator import AggregatorState


class AggregatorStore:
    def __init__(self, client: RedisClient, keys: JobKeys, *, ttl_s: float) -> None:
        self.client, self.key, self.ttl_ms = client, keys.aggregator, int(ttl_s * 1000)

    def get(self) -> AggregatorState:
        """The stored state, or the initial one when the job has none yet."""
        return AggregatorState.from_fields(self.client.hgetall(self.key))

    def put(self, state: AggregatorState) -> None:
        """Replace the stored state (a field that is None now is removed)."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.key)
            pipe.hset(self.key, mapping=hash_fields(state.to_fields()))
            pipe.pexpire(self.key, self.ttl_ms)
            pipe.execute()

    def restore(self, state: AggregatorState) -> bool:
        """Put a checkpoint's state unless the job already has one (a resumed epoch's own wins). True if put."""
        if self.client.exists(self.key):
            return False
        self.put(state)
        return True
