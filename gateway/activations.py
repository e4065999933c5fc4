"""Activation records in the cache, with a TTL; any worker can answer for any activation and wait for its end."""

from __future__ import annotations

import redis.asyncio as aioredis

from cache.keys import GatewayKeys
from gateway.models import Activation, Status

FINAL = {Status.SUCCESS, Status.ERROR, Status.TIMEOUT, Status.REJECTED}


class ActivationStore:
    def __init__(self, client: aioredis.Redis, keys: GatewayKeys, *, ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)

    async def save(self, act: Activation) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.activation(act.id), act.model_dump_json(), px=self.ttl_ms)
            if act.status in FINAL:
                pipe.rpush(self.keys.activation_done(act.id), 1)
                pipe.pexpire(self.keys.activation_done(act.id), self.ttl_ms)
            await pipe.execute()

    async def get(self, activation_id: str) -> Activation | None:
        raw = await self.client.get(self.keys.activation(activation_id))
        return None if raw is None else Activation.model_validate_json(raw)

    async def wait(self, activation_id: str, timeout_s: float) -> Activation | None:
        """The record once final, or as it stands after `timeout_s` (blocks on a list, no polling)."""
        act = await self.get(activation_id)
        if act is None or act.status in FINAL or timeout_s <= 0:
            return act
        done = self.keys.activation_done(activation_id)
        if await self.client.blmove(done, done, timeout_s, "LEFT", "RIGHT") is not None:  # leaves it for others
            return await self.get(activation_id)
        return await self.get(activation_id)
