"""Finding a pool's busy instances hung: every instance with a call in flight is asked for its /health every
`GatewaySettings.busy_probe_s`, and one that answered none of its probes for `hung_after_s` is killed. A stopped
process (SIGSTOP, a frozen cgroup), a runtime whose event loop is stuck or a host cut off keeps its TCP connections
open, so its calls would otherwise wait for their own timeouts (a learner call's runs a whole round, by default an
hour), holding what they hold. The kill breaks the call's connection: it ends as a 502 `InstanceHung`, which a
caller treats like a crash, and the pool replaces the instance. The runtime answers /health on its event loop while
handlers run in threads, so a busy but healthy instance answers. Mixed into `gateway.pool.FunctionPool`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from contract.runtime_http import HEALTH_PATH, SECRET_HEADER
from gateway.backends.base import BackendError

if TYPE_CHECKING:
    from gateway.backends.base import Backend
    from gateway.instances import Live
    from gateway.metering import Metrics
    from gateway.models import FunctionSpec

log = logging.getLogger("stellaris.gateway")


class BusyProbes:
    spec: FunctionSpec
    backend: Backend
    metrics: Metrics
    http: aiohttp.ClientSession
    instances: dict[str, Live]

    async def probe_busy(self, *, timeout_s: float, hung_after_s: float) -> list[str]:
        """One probe of every instance under a call, at once; kills the ones silent for `hung_after_s` over at least
        `silence.MIN_MISSES` probes in a row. Returns their ids."""
        for live in self.instances.values():
            if not live.in_flight:  # a run counts only probes of a call in flight
                live.silence.answered()
        busy = [live for live in self.instances.values() if live.in_flight and live.hung_s is None]
        sent = time.monotonic()
        answers = await asyncio.gather(*(self._answers(live, timeout_s) for live in busy))
        hung = []
        for live, answered in zip(busy, answers, strict=True):
            live.silence.answered() if answered else live.silence.missed(sent)
            if live.silence.hung(time.monotonic(), hung_after_s):
                await self._kill_hung(live)
                hung.append(live.handle.id)
        return hung

    async def _answers(self, live: Live, timeout_s: float) -> bool:
        headers = {SECRET_HEADER: live.handle.secret} if live.handle.secret is not None else {}
        try:
            async with self.http.get(
                f"{live.handle.url}{HEALTH_PATH}", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _kill_hung(self, live: Live) -> None:
        """Kill it; its calls then fail on their broken connections and the pool discards and replaces it there
        (`death`). Marked first, so that those calls say why."""
        live.hung_s = live.silence.silent_s(time.monotonic())
        self.metrics.instance_deaths.labels(self.spec.name, "hung").inc()
        log.warning(
            "instance %s of %r answered no health probe for %.1f s under a call: killed",
            live.handle.id,
            self.spec.name,
            live.hung_s,
        )
        with contextlib.suppress(BackendError):  # gone already: its calls fail as crashes would
            await asyncio.to_thread(self.backend.kill, live.handle)

    def death(self, live: Live, exc: BaseException) -> dict[str, Any]:
        """The error of a call whose connection to `live` broke: killed as hung, or died (counted here)."""
        if live.hung_s is not None:
            message = f"instance {live.handle.id} answered no health probe for {live.hung_s:.1f} s under a call: killed"
            return {"type": "InstanceHung", "message": message}
        self.metrics.instance_deaths.labels(self.spec.name, "call").inc()
        return {"type": "InstanceCrashed", "message": f"instance {live.handle.id} died: {exc}"}
