"""uvicorn's httptools protocol with a deadline on request heads (slowloris): a connection that has not sent a whole
request head within `header_timeout_s` of opening, or of its previous response, is closed. uvicorn's keep-alive
timer does not cover this: every byte received resets it, so a client trickling a header byte at a time would hold
the connection forever. httptools (C) rather than h11: 15-20 % more no-op invocations a second through the gateway
(`experiments/bench_gateway.py`)."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class TimedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float  # a subclass's, made by `timed_httptools`
    _head_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

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

    def on_headers_complete(self) -> None:
        self._disarm()  # its body has a deadline of its own (gateway/limits.py)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # a request whose head came already starts now: no head to wait for
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm()  # the next request's head


def timed_httptools(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`: it closes a connection whose request head takes longer than
    `header_timeout_s`."""
    deadline_s = header_timeout_s

    class Timed(TimedHttpToolsProtocol):
        header_timeout_s = deadline_s

    return Timed
