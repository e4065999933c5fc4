"""TrainConfig's elastic-actor fields (docs/workflows.md): the actor count's bounds and damping, and a learner
capacity schedule. A mixin, so that the fields are flags and YAML keys like every other (stellaris/train_options.py)
and their checks name the field."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

MAX_LEARNERS = 256  # TrainConfig.learners' own bound
_ENTRY = re.compile(r"^\s*(\d+)\s*@\s*(\d+)\s*$")


def parse_learner_schedule(text: str) -> list[tuple[int, int]]:
    """`"2@1,4@15"` -> [(1, 2), (15, 4)]: (first round, learners) pairs, rounds strictly increasing; raises
    ValueError naming the field and the bad entry."""
    pairs: list[tuple[int, int]] = []
    for entry in text.split(","):
        m = _ENTRY.match(entry)
        if m is None:
            raise ValueError(f'learner_schedule: {entry.strip()!r} is not LEARNERS@ROUND (e.g. "2@1,4@15")')
        learners, round_k, where = int(m.group(1)), int(m.group(2)), entry.strip()
        if not 1 <= learners <= MAX_LEARNERS:
            raise ValueError(f"learner_schedule: {learners} learners in {where!r} is outside [1, {MAX_LEARNERS}]")
        if round_k < 1:
            raise ValueError(f"learner_schedule: rounds count from 1, got {where!r}")
        if pairs and round_k <= pairs[-1][0]:
            raise ValueError(f"learner_schedule: rounds must increase, {where!r} comes after round {pairs[-1][0]}")
        pairs.append((round_k, learners))
    return pairs


class ElasticOptions(BaseModel):
    elastic_actors: bool = Field(
        default=False,
        description="adapt the actor count each round to the learners' consumption and the trajectory backlog "
        "(false: `actors` throughout)",
    )
    min_actors: int = Field(default=1, ge=1, le=1024, description="elastic actors: the fewest actors")
    max_actors: int = Field(default=8, ge=1, le=1024, description="elastic actors: the most actors")
    elastic_window: int = Field(
        default=5, ge=1, le=100, description="elastic actors: rounds in the demand window (ARTOS: 5)"
    )
    elastic_lambda: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="elastic actors: dead band, a change under this fraction of the actors is ignored (ARTOS: 0.2)",
    )
    learner_schedule: str | None = Field(
        default=None, description='learner capacity by round, e.g. "2@1,4@15" (2 from round 1, 4 from round 15)'
    )

    @field_validator("learner_schedule")
    @classmethod
    def _schedule_parses(cls, text: str | None) -> str | None:
        if text is not None:
            parse_learner_schedule(text)
        return text

    @model_validator(mode="before")
    @classmethod
    def _run_ahead_default(cls, data: Any) -> Any:
        # Run-ahead 0 waits for an actor's trajectory batch to be trained on; actors that ship gradients push none.
        if isinstance(data, dict) and data.get("distribution") == "gradients_at_actors":
            return {"actor_run_ahead": 1, **data}
        return data

    @model_validator(mode="after")
    def _actor_bounds(self) -> Any:
        actors, learners = int(getattr(self, "actors", 1)), int(getattr(self, "learners", 1))
        if self.min_actors > self.max_actors:
            raise ValueError(f"min_actors: {self.min_actors} is above max_actors: {self.max_actors}")
        if self.elastic_actors and not self.min_actors <= actors <= self.max_actors:
            raise ValueError(
                f"actors: {actors} is outside [min_actors, max_actors] = [{self.min_actors}, {self.max_actors}]"
            )
        if int(getattr(self, "actor_run_ahead", 1)) == 0 and getattr(self, "distribution", "") == "gradients_at_actors":
            raise ValueError(
                "actor_run_ahead: 0 waits for an actor's trajectory batch to be trained on, and distribution "
                "gradients_at_actors ships no trajectory batch; use 1 or more (its default is 1)"
            )
        first = self.schedule[0] if self.schedule else None
        if first is not None and first[0] == 1 and first[1] != learners:
            raise ValueError(
                f"learner_schedule: round 1 has {first[1]} learners but learners is {learners}; make them agree"
            )
        return self

    @property
    def schedule(self) -> list[tuple[int, int]]:
        return parse_learner_schedule(self.learner_schedule) if self.learner_schedule else []

    def learners_at(self, round_k: int) -> int:
        """The learner capacity of round `round_k`: `learners` until the schedule's first entry, then the newest
        entry at or before it."""
        current = int(getattr(self, "learners", 1))
        for first_round, learners in self.schedule:
            if first_round <= round_k:
                current = learners
        return current

    @property
    def actor_capacity(self) -> int:
        """The most actors the job may run at once: what its queue bound, actor pool and thread pool are sized for."""
        return self.max_actors if self.elastic_actors else int(getattr(self, "actors", 1))

    @property
    def queue_bound(self) -> int:
        """Trajectory batches landed and not yet trained on, or in training, before actors block: `actor_run_ahead`
        per actor (0 counts as 1). With 1, an actor's next batch waits until the round training on its last one
        ends; with 0, its collection does."""
        return self.actor_capacity * max(1, int(getattr(self, "actor_run_ahead", 1)))

    @property
    def learner_capacity(self) -> int:
        """The most learners the job may run at once (the learner pool's max instances)."""
        return max([int(getattr(self, "learners", 1))] + [n for _, n in self.schedule])
