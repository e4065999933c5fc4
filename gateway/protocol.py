"""uvicorn's h11 protocol with a deadline on request headers (slowloris): a connection that has not sent a whole
request head within `header_timeout_s` of opening, or of its previous response, is closed. uvicorn's keep-alive
timer does not cover this: every byte received resets it, so a client trickling a header byte at a time would hold
the connection forever."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


def timed_h11(header_timeout_s: float) -> type[H11Protocol]:
    class TimedH11Protocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._head_deadline = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a request head was parsed: its body has its own deadline
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's head

    return TimedH11Protocol
