"""`gateway.late_starts.settle`: the gateway's shutdown waits for starts still in their threads and the stops they
lead to, bounded, and says how many it leaves behind."""

from __future__ import annotations

import asyncio

from gateway import late_starts


def test_settle_waits_for_a_start_and_the_stop_it_leads_to() -> None:
    async def scenario() -> tuple[int, list[str]]:
        loop = asyncio.get_running_loop()
        done: list[str] = []
        start: asyncio.Future[str] = loop.create_future()
        late_starts.hold_start(start)

        async def stop() -> None:
            await asyncio.sleep(0.05)
            done.append("stopped")

        # As the pool does: the instance that came up late is stopped by a callback of its start.
        start.add_done_callback(lambda _: late_starts.hold_stop(asyncio.ensure_future(stop())))
        loop.call_later(0.05, start.set_result, "instance")
        assert late_starts.in_flight() == 1
        left = await late_starts.settle(30.0)
        return left, done

    left, done = asyncio.run(scenario())
    assert (left, done) == (0, ["stopped"])
    assert late_starts.in_flight() == 0


def test_settle_leaves_a_start_that_outlasts_its_wait_and_counts_it() -> None:
    async def scenario() -> tuple[int, int]:
        start: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        late_starts.hold_start(start)
        left = await late_starts.settle(0.1)
        start.cancel()  # not to leak into other tests: the module's sets outlive this loop
        await asyncio.sleep(0)
        return left, late_starts.in_flight()

    assert asyncio.run(scenario()) == (1, 0)


def test_settle_with_nothing_held_returns_at_once() -> None:
    assert asyncio.run(late_starts.settle(0.0)) == 0
