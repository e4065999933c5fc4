"""The function registry, kept in the cache so several gateway workers share it."""

from __future__ import annotations

import redis.asyncio as aioredis

from cache.keys import GatewayKeys
from gateway.models import FunctionSpec


class Registry:
    def __init__(self, client: aioredis.Redis, keys: GatewayKeys) -> None:
        self.client = client
        self.keys = keys

    async def put(self, spec: FunctionSpec, *, create: bool) -> bool:
        """Store `spec`; with create=True only if the name is free. Returns whether it was written."""
        data = spec.model_dump_json()
        if create:
            return bool(await self.client.hsetnx(self.keys.functions, spec.name, data))
        await self.client.hset(self.keys.functions, spec.name, data)
        return True

    async def get(self, name: str) -> FunctionSpec | None:
        raw = await self.client.hget(self.keys.functions, name)
        return None if raw is None else FunctionSpec.model_validate_json(raw)

    async def all(self) -> list[FunctionSpec]:
        raw = await self.client.hgetall(self.keys.functions)
        return sorted((FunctionSpec.model_validate_json(v) for v in raw.values()), key=lambda s: s.name)

    async def names(self) -> set[str]:
        return {n.decode() if isinstance(n, bytes) else str(n) for n in await self.client.hkeys(self.keys.functions)}

    async def delete(self, name: str) -> bool:
        return bool(await self.client.hdel(self.keys.functions, name))
