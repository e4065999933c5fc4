"""Full batch: today's on-policy consume-and-delete. A round trains on its fresh batches only; nothing is stored."""

from __future__ import annotations

from cache.replay.pattern import ReplayPattern


class FullBatch(ReplayPattern):
    name = "full_batch"
