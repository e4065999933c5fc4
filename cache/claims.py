"""Atomic claims of landed trajectory batches by a trigger (README, "Declarative triggers").

A claim is all or nothing: one Lua step counts the batches no one has claimed yet (those after the consumer group's
last-delivered id) and, only when at least `at_least` have landed, delivers up to `at_most` of them to the claimer
through the group (XREADGROUP). The group's last-delivered id moves in that same step, so a batch goes to exactly
one claim: two triggers racing over one stream never both get a batch, and a trigger that needs N batches never
takes fewer and strands them. Waiting is event-driven: a refused claim blocks on the stream (XREAD from its newest
entry) until something lands, then tries again.
"""

from __future__ import annotations

import time

from cache.records import BatchMeta
from cache.streams import MAX_BLOCK_S, BoundedStream, Entry, _entry

# KEYS: stream. ARGV: group, claimer, at_least, at_most. Returns {newest id in the stream, claimed entries}.
_CLAIM = """
local last = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name == ARGV[1] then last = delivered end
end
if not last then return redis.error_reply('NOGROUP no consumer group ' .. ARGV[1]) end
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local tail = '0-0'
if #newest > 0 then tail = newest[1][1] end
local ahead = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', ARGV[3])
if #ahead < tonumber(ARGV[3]) then return {tail, {}} end
local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4], 'STREAMS', KEYS[1], '>')
if not got then return {tail, {}} end
return {tail, got[1][2]}
"""

Claimed = list[tuple[str, BatchMeta]]  # (batch id, header), in landing order


class BatchClaims:
    """Claims over one trajectory stream's consumer group. A claimed batch is pending for its claimer until it is
    acknowledged (`BoundedStream.ack`, after the learners' gradients are stored), as any group delivery is."""

    def __init__(self, stream: BoundedStream) -> None:
        self.stream = stream
        self._claim = stream.client.register_script(_CLAIM)

    def try_claim(self, claimer: str, *, at_least: int = 1, at_most: int | None = None) -> tuple[str, Claimed]:
        """One atomic attempt: (the stream's newest entry id, the batches claimed: none unless `at_least` were
        unclaimed, else up to `at_most`, default `at_least`)."""
        at_most = at_least if at_most is None else at_most
        if at_least < 1 or at_least > self.stream.maxlen:
            raise ValueError(f"at_least must lie in [1, {self.stream.maxlen}] (the stream's maxlen), got {at_least}")
        if at_most < at_least:
            raise ValueError(f"at_most ({at_most}) must be at least at_least ({at_least})")
        if not claimer:
            raise ValueError("claimer must be a non-empty name")
        self.stream.ensure_group()
        tail, items = self._claim(keys=[self.stream.key], args=[self.stream.group, claimer, at_least, at_most])
        entries: list[Entry] = []
        for raw_id, flat in items:
            fields = {flat[i]: flat[i + 1] for i in range(0, len(flat or []), 2)}
            if (entry := _entry(raw_id, fields)) is not None:
                entries.append(entry)
        newest = tail.decode() if isinstance(tail, bytes) else str(tail)
        return newest, [(e.id, BatchMeta.from_fields(e.fields)) for e in entries]

    def orphaned(self, claimer: str, *, known: set[str]) -> Claimed:
        """Batches delivered to `claimer` that it does not know of (`known`: the ids it holds): a claim whose reply
        was lost with its connection (Redis killed mid-call, the call retried) left them pending for it, where no
        later claim would return them."""
        entries = self.stream.delivered(claimer, count=self.stream.maxlen)
        return [(e.id, BatchMeta.from_fields(e.fields)) for e in entries if e.id not in known]

    def claim(self, claimer: str, *, at_least: int = 1, at_most: int | None = None, block_s: float = 0.0) -> Claimed:
        """Claim as `try_claim` does, waiting up to `block_s` for enough batches to land (woken by each landing)."""
        deadline = time.monotonic() + block_s
        while True:
            newest, got = self.try_claim(claimer, at_least=at_least, at_most=at_most)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            block_ms = max(1, int(min(remaining, MAX_BLOCK_S) * 1000))
            self.stream.client.xread({self.stream.key: newest}, count=1, block=block_ms)
