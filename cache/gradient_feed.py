"""The parameter function's reader of its job's gradient and control streams (`JobKeys.grad`, `JobKeys.control`).

It is the gradients' only reader (it holds the update lease), so it keeps its own place in each stream, without a
consumer group: every gradient is read once, when it lands, and leaves the stream only with the publish of the version
it went into (`PolicyStore.publish_and_ack`). Only its header is decoded here (`GradientStream.meta`); one that cannot
be, or that names a base version never published, is poison, returned apart for the reader to `drop` into the dead
letters. A blocking read waits on both streams, so a stop event (`JobCache.stop_round`) ends a wait as a gradient's
landing does."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cache.job import JobCache
from cache.streams import Entry
from contract.errors import CodecError, RecordError
from contract.records import GradientMeta

READ_COUNT = 256  # the most gradients one read returns


@dataclass(frozen=True)
class Landed:
    """What one read brought: the gradients by header, with their entries (their arrays are decoded only when they
    are aggregated), and the poisoned ones by id, with the reason."""

    gradients: list[tuple[Entry, GradientMeta]]
    poisoned: list[tuple[str, str]]


class GradientFeed:
    """One reader's place in a job's gradient and control streams. Control events sent before it was made are not
    its own: it reads those sent after. `stopped`: it read a stop event."""

    def __init__(self, job: JobCache, *, count: int = READ_COUNT) -> None:
        self.client, self.keys, self.count = job.client, job.keys, count
        self.gradients, self.dead_letters = job.gradients, job.dead_letters
        self.after = "0-0"  # the last gradient read
        last: Any = self.client.xrevrange(self.keys.control, count=1)
        self.control_after = _id(last[0][0]) if last else "0-0"
        self.stopped = False

    def take(self, entries: Iterable[Entry], *, held: int) -> Landed:
        """Entries read elsewhere (a publish returns those that landed meanwhile), the reader's place moved past them.
        `held`: the version the reader last published; a gradient based on a newer one that the store never published
        is poison, and a store moved past `held` raises `FencingError` (another holder published)."""
        gradients: list[tuple[Entry, GradientMeta]] = []
        poisoned: list[tuple[str, str]] = []
        for e in entries:
            self.after = e.id
            try:
                gradients.append((e, self.gradients.meta(e, held=held)))
            except (CodecError, RecordError) as exc:
                poisoned.append((e.id, f"{type(exc).__name__}: {exc}"))
        return Landed(gradients, poisoned)

    def read(self, *, held: int, count: int | None = None) -> Landed:
        """The gradients landed since the last read, at most `count` (the reader's own by default), without waiting."""
        return self.take(self.gradients.read(self.after, count=count or self.count), held=held)

    def wait(self, block_s: float, *, held: int) -> Landed:
        """The gradients landed since the last read, waiting up to `block_s` (1 ms at least) for one to land or for a
        control event (a stop sets `stopped`)."""
        streams: dict[Any, Any] = {self.keys.grad: self.after, self.keys.control: self.control_after}
        reply: Any = self.client.xread(streams, count=self.count, block=max(1, int(block_s * 1000)))
        entries: list[Entry] = []
        for stream, items in reply or []:
            if _id(stream) == self.keys.grad:
                entries = [Entry(_id(i), f) for i, f in items if f]
            else:
                self.control_after = _id(items[-1][0])
                self.stopped |= any(f.get(b"event") == b"stop" for _, f in items)
        return self.take(entries, held=held)

    def drop(self, gradient_id: str, reason: str) -> bool:
        """Take a poisoned gradient off the stream into the dead letters, with `reason`; False when it was gone."""
        return self.dead_letters.drop(self.keys.grad, gradient_id, reason, kind="gradient")


def _id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
