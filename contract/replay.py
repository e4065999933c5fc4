"""Replay settings: which pattern, how much replay per trained step, and the store's bounds. They are fields of the
V-trace algorithms' configs (IMPACT, APPO: `--set replay=uniform`), and the control plane reads them back from the
job's resolved spec (`of_spec`), so both sides validate the same declaration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

ReplayName = Literal["full_batch", "fifo", "uniform", "prioritized"]


class ReplaySettings(BaseModel):
    """``replay_ratio`` is replayed env steps per trained env step: a round trains on its F fresh batches plus
    R replayed ones with R/(F+R) = replay_ratio on average (0.5: half fresh, half replayed; R is rounded down and
    the remainder carried to the next round). It must stay below 1, as every round trains on its fresh data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replay: ReplayName = Field(
        default="full_batch",
        description="full_batch: consume and delete (no replay); fifo: per-actor queues, replayed oldest first; "
        "uniform: a bounded ring sampled uniformly; prioritized: sampled ∝ priority^alpha",
    )
    replay_ratio: float = Field(default=0.5, gt=0.0, lt=1.0, description="replayed env steps per trained env step")
    replay_capacity: int = Field(default=256, gt=0, le=1_000_000, description="batches the replay store keeps")
    replay_capacity_mb: float = Field(default=512.0, gt=0.0, description="payload megabytes the replay store keeps")
    replay_per_actor: int | None = Field(
        default=None, gt=0, description="fifo: batches kept per actor (None: replay_capacity)"
    )
    replay_alpha: float = Field(default=0.6, ge=0.0, description="prioritized: P(i) ∝ p_i^alpha")
    replay_beta: float = Field(default=0.4, ge=0.0, le=1.0, description="prioritized: weight (N·P(i))^-beta")

    @property
    def bytes_max(self) -> int:
        return int(self.replay_capacity_mb * 1024 * 1024)

    @classmethod
    def of_spec(cls, spec: Mapping[str, Any]) -> Self:
        """The settings in a resolved job spec's `algo` section; an algorithm without them (PPO) has full_batch."""
        algo = spec.get("algo") or {}
        return cls.model_validate({k: v for k, v in algo.items() if k in cls.model_fields})


REPLAY_FIELDS = tuple(ReplaySettings.model_fields)
