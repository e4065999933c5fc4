"""Every log line carries the id of the call being served (of-watchdog's habit): a context variable set per call,
and a filter that stamps it on each record."""

from __future__ import annotations

import contextvars
import logging
import sys

# The call served by this task or handler thread ("-" outside any call).
current_call_id: contextvars.ContextVar[str] = contextvars.ContextVar("call_id", default="-")


class CallIdFilter(logging.Filter):
    """Stamp each record with the call being served, unless it carries one (Context.log passes it explicitly)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "call_id"):
            record.call_id = current_call_id.get()
        return True


def configure_logging(level: str) -> None:
    """Log to stderr, one line per record, each with its call id; stdout is kept for the READY line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(CallIdFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [call %(call_id)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
