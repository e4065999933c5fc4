"""Finding a pool's idle instances dead before a call runs into them: an instance idle for over PROBE_IDLE_AFTER_S
is probed (backend.alive) when a call is about to reuse it, and by the gateway's periodic sweep
(`GatewaySettings.idle_probe_s`), so a crash while idle fails no call and a pool keeps its min_warm while no call
comes. Mixed into `gateway.pool.FunctionPool`."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gateway.instances import Live

if TYPE_CHECKING:
    from gateway.backends.base import Backend
    from gateway.metering import Metrics
    from gateway.models import FunctionSpec

PROBE_IDLE_AFTER_S = 1.0


class IdleProbes:
    spec: FunctionSpec
    backend: Backend
    metrics: Metrics
    instances: dict[str, Live]
    swept: list[str]  # ids of instances the sweep found dead, not yet reported by a call

    async def _discard(self, live: Live, *, replace: bool, kill: bool = False) -> None: ...

    def _stale(self, live: Live) -> bool:
        return live.in_flight == 0 and time.monotonic() - live.idle_since > PROBE_IDLE_AFTER_S

    async def _found_dead(self, live: Live, found: str) -> bool:
        """Probe an idle instance; a dead one is counted (`found`: "idle" on a call's way, "sweep") and replaced."""
        if await asyncio.to_thread(self.backend.alive, live.handle):
            return False
        if live.in_flight or live.handle.id not in self.instances:
            return False  # a call took it meanwhile: that call finds out
        self.metrics.instance_deaths.labels(self.spec.name, found).inc()
        await self._discard(live, replace=True)
        return True

    async def probe_idle(self) -> list[str]:
        """The sweep: every stale idle instance probed, the dead replaced before a call needs them; the pool's next
        call reports them (`Outcome.found_dead`). Returns the ids of the dead."""
        dead = []
        for live in [lv for lv in self.instances.values() if self._stale(lv)]:
            if await self._found_dead(live, "sweep"):
                dead.append(live.handle.id)
        self.swept += dead
        return dead
