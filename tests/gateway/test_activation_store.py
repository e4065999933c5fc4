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


def test_a_read_on_another_worker_waits_for_a_record_about_to_be_written(redis_server: EmbeddedRedis) -> None:
    """Two workers (stores on one namespace): the caller's read reaches worker B before worker A, which answered the
    call, has written its record. B waits for it rather than answering 404."""

    async def blocked_readers(client: aioredis.Redis) -> int:
        return sum(1 for c in await client.client_list() if c.get("cmd") == "blmove")

    async def scenario() -> tuple[Activation | None, Activation | None, Activation | None]:
        clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(3)]
        try:
            keys = GatewayKeys(f"t{uuid.uuid4().hex[:8]}")
            a, b = (ActivationStore(c, keys, ttl_s=60, max_records=100) for c in clients[:2])
            act = Activation(id=uuid.uuid4().hex, function="f", status=Status.SUCCESS, start=time.time())
            read = asyncio.ensure_future(b.wait(act.id, 30.0))
            while await blocked_readers(clients[2]) == 0:  # B found no record and blocks on its completion
                assert not read.done(), "B answered before A wrote the record"
                await asyncio.sleep(0.01)
            a.save_later(act)
            await a.drain()
            found = await read
            never = await b.wait(uuid.uuid4().hex, 0.2)  # our id form, never written: None once the grace ends
            odd = await b.wait("not-an-activation-id", 30.0)  # not an id the gateway gives: not waited for
            return found, never, odd
        finally:
            for c in clients:
                await c.aclose()

    found, never, odd = asyncio.run(scenario())
    assert found is not None and found.id and found.status == Status.SUCCESS
    assert never is None and odd is None
