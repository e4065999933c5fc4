"""One job's trajectory stream (`JobKeys.traj`): actors push batches (`TrajectoryQueue`, with backpressure), and the
control plane's learner gate claims them in rounds (`BatchClaims`); learners then read a batch's arrays by id.

Atomic claims of landed trajectory batches by a trigger (docs/workflows.md).

A claim is all or nothing: one Lua step counts the batches no one has claimed yet (those after the consumer group's
last-delivered id) and, only when at least `at_least` have landed, delivers up to `at_most` of them to the claimer
through the group (XREADGROUP). The group's last-delivered id moves in that same step, so a batch goes to exactly
one claim: two triggers racing over one stream never both get a batch, and a trigger that needs N batches never
takes fewer and strands them. Waiting is event-driven: a refused claim blocks on the stream (XREAD from its newest
entry) until something lands, then tries again.

Every claimed entry is checked before it is handed out (`contract.batch_checks`): one that cannot be trained on (an
undecodable header, a behaviour version never published, a header without its arrays) is given up on into the job's
dead letters at once, and the claim returns the others: a poisoned batch costs itself, not the claim or the round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from cache.dead_letters import DeadLetters
from cache.replay.store import ReplayStore, is_replay_id
from cache.streams import MAX_BLOCK_S, BoundedStream, Entry, _entry
from contract.batch_checks import checked_batch
from contract.codec import DEFAULT_MAX_BYTES, encode_fields
from contract.records import BatchMeta, TrajectoryBatch

log = logging.getLogger(__name__)

# KEYS: stream, then (optional) the policy version. ARGV: group, claimer, at_least, at_most. Returns {newest id in the
# stream, claimed entries, the newest published policy version (false when none, or not asked for)}.
_CLAIM = """
local version = false
if #KEYS > 1 then version = redis.call('GET', KEYS[2]) end
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
if #ahead < tonumber(ARGV[3]) then return {tail, {}, version} end
local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4], 'STREAMS', KEYS[1], '>')
if not got then return {tail, {}, version} end
return {tail, got[1][2], version}
"""

Claimed = list[tuple[str, BatchMeta]]  # (batch id, header), in landing order


class TrajectoryQueue:
    """Trajectory batches on a stream; the control plane's consumer group forms rounds from them, reading each
    batch's header only. Learners read a batch's arrays by id."""

    def __init__(
        self,
        stream: BoundedStream,
        replay: ReplayStore | None = None,
        *,
        backpressure_timeout_s: float,
        payload_bytes_max: int,
    ) -> None:
        self.stream = stream
        self.backpressure_timeout_s, self.payload_bytes_max = backpressure_timeout_s, payload_bytes_max
        self.replay = replay  # where replayed batches (ids `r<stream id>`, cache/replay) are read from

    def put(self, batch: TrajectoryBatch, *, timeout_s: float | None = None) -> str:
        timeout = self.backpressure_timeout_s if timeout_s is None else timeout_s
        return self.stream.add(batch.fields(), timeout_s=timeout)

    def put_header(self, meta: BatchMeta, *, timeout_s: float | None = None) -> str:
        """A batch's header without its arrays (the gradients_at_actors profile: the control plane counts it)."""
        timeout = self.backpressure_timeout_s if timeout_s is None else timeout_s
        return self.stream.add(encode_fields({}, meta.to_dict()), timeout_s=timeout)

    def take(self, consumer: str, *, count: int = 1, block_s: float = 0.0) -> list[tuple[str, BatchMeta]]:
        """New batches for `consumer`: ids and headers (no array is decoded)."""
        return [
            (e.id, BatchMeta.from_fields(e.fields)) for e in self.stream.read(consumer, count=count, block_s=block_s)
        ]

    def get(self, batch_id: str) -> TrajectoryBatch | None:
        if self.replay is not None and is_replay_id(batch_id):
            fields = self.replay.read(batch_id)
            return None if fields is None else TrajectoryBatch.from_fields(fields, max_bytes=self.payload_bytes_max)
        entry = self.stream.get(batch_id)
        if entry is None:
            return None
        return TrajectoryBatch.from_fields(entry.fields, max_bytes=self.payload_bytes_max)

    def ack(self, batch_ids: Sequence[str]) -> int:
        return self.stream.ack(batch_ids)

    def reclaim(self, consumer: str, *, min_idle_s: float, count: int = 16) -> list[tuple[str, BatchMeta]]:
        entries = self.stream.reclaim(consumer, min_idle_s=min_idle_s, count=count)
        return [(e.id, BatchMeta.from_fields(e.fields)) for e in entries]


class BatchClaims:
    """Claims over one trajectory stream's consumer group. A claimed batch is pending for its claimer until it is
    acknowledged (`BoundedStream.ack`, after the learners' gradients are stored), as any group delivery is.

    `dead_letters`: where poisoned batches go. `version_key`: the job's policy version key, read with each claim, so
    that a batch claiming a version never published is poisoned (None: not checked). `payloads`: batches must carry
    their arrays (the `trajectories` profile: they are then decoded and checked, no copy made)."""

    def __init__(
        self,
        stream: BoundedStream,
        dead_letters: DeadLetters,
        *,
        version_key: str | None = None,
        payloads: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.stream, self.dead_letters = stream, dead_letters
        self.keys = [stream.key] if version_key is None else [stream.key, version_key]
        self.payloads, self.max_bytes = payloads, max_bytes
        self.given_up = 0  # poisoned batches this claimer dead-lettered
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
        tail, items, version = self._claim(keys=self.keys, args=[self.stream.group, claimer, at_least, at_most])
        entries: list[Entry] = []
        for raw_id, flat in items:
            fields = {flat[i]: flat[i + 1] for i in range(0, len(flat or []), 2)}
            if (entry := _entry(raw_id, fields)) is not None:
                entries.append(entry)
        newest = tail.decode() if isinstance(tail, bytes) else str(tail)
        return newest, self._sound(entries, None if version is None else int(version))

    def _sound(self, entries: list[Entry], published: int | None) -> Claimed:
        """The entries that can be trained on, with their headers; the others are given up on (dead-lettered)."""
        out: Claimed = []
        for e in entries:
            checked = checked_batch(e.fields, payloads=self.payloads, published=published, max_bytes=self.max_bytes)
            if isinstance(checked, BatchMeta):
                out.append((e.id, checked))
                continue
            log.warning("dead-lettering trajectory batch %s: %s", e.id, checked)
            self.given_up += self.dead_letters.give_up(self.stream, e.id, checked, kind="trajectory")
        return out

    def orphaned(self, claimer: str, *, known: set[str]) -> Claimed:
        """Batches delivered to `claimer` that it does not know of (`known`: the ids it holds): a claim whose reply
        was lost with its connection (Redis killed mid-call, the call retried) left them pending for it, where no
        later claim would return them."""
        entries = self.stream.delivered(claimer, count=self.stream.maxlen)
        raw = self.stream.client.get(self.keys[1]) if len(self.keys) > 1 else None
        return self._sound([e for e in entries if e.id not in known], None if raw is None else int(raw))

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
