"""Activation records against a real Redis: a synchronous call's record is written after its answer has left
(`save_later`), so a caller that asks for it right after the answer must still find it."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio as aioredis

from cache.keys import GatewayKeys
from cache.server import EmbeddedRedis
from gateway.activations import ActivationStore
from gateway.models import Activation, Status


def test_a_record_saved_after_the_answer_is_found_by_a_read_right_after(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> tuple[Activation | None, Activation | None]:
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            store = ActivationStore(client, GatewayKeys(f"t{uuid.uuid4().hex[:8]}"), ttl_s=60, max_records=100)
            act = Activation(id=uuid.uuid4().hex, function="f", status=Status.SUCCESS, start=time.time())
            store.save_later(act)  # queued: the write runs on a later turn of the event loop
            found = await store.wait(act.id, 5.0)  # its GET goes out before that write
            unknown = await store.wait("nope", 0.5)  # nothing of ours in flight: not waited for
            return found, unknown
        finally:
            await client.aclose()

    found, unknown = asyncio.run(scenario())
    assert found is not None and found.status == Status.SUCCESS
    assert unknown is None
