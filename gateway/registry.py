"""The function registry, kept in the cache so several gateway workers share it."""

from __future__ import annotations

import logging

from pydantic import ValidationError
from starlette.exceptions import HTTPException

from cache.keys import GatewayKeys
from gateway.models import FunctionSpec
from gateway.redis_client import GatewayRedis

log = logging.getLogger("stellaris.gateway")


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


class Registry:
    def __init__(self, client: GatewayRedis, keys: GatewayKeys) -> None:
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
        if raw is None:
            return None
        try:
            return FunctionSpec.model_validate_json(raw)
        except ValidationError as exc:  # stored before a bound it breaks: kept, for its owner to register again
            why = f"function {name!r} is stored as this gateway no longer accepts: {_problems(exc)}"
            raise HTTPException(409, f"{why}; register it again (PUT) or delete it") from exc

    async def all(self) -> list[FunctionSpec]:
        """Every registration this gateway can read; one it cannot (stored before a bound it breaks) is named in the
        log and left as it is, for its owner to register again, rather than keep the gateway from starting."""
        specs = []
        for name, raw in (await self.client.hgetall(self.keys.functions)).items():
            try:
                specs.append(FunctionSpec.model_validate_json(raw))
            except ValidationError as exc:
                log.warning(
                    "function %r is stored as this gateway no longer accepts, left out: %s", name, _problems(exc)
                )
        return sorted(specs, key=lambda s: s.name)

    async def exists(self, name: str) -> bool:
        return bool(await self.client.hexists(self.keys.functions, name))

    async def names(self) -> set[str]:
        return {n.decode() if isinstance(n, bytes) else str(n) for n in await self.client.hkeys(self.keys.functions)}

    async def delete(self, name: str) -> bool:
        return bool(await self.client.hdel(self.keys.functions, name))
