"""The learner gate (docs/workflows.md): a round's learners are invoked when the job's learner trigger
fires over the batches landed in the cache. The gate claims landed batches atomically (`cache.claims`: a batch goes
to exactly one firing), reads only their headers, and fires once every condition of the trigger holds; the firing's
batches are the round's. A claimed batch that cannot be trained on (an undecodable header, a version never
published, a header without its arrays) is dead-lettered by the claim and the gate claims on: it costs the round
nothing but itself. Round 1 is every actor's first batch, in actor order, as before triggers, whatever the
trigger says (docs/training.md); batches landed beyond that are carried, already claimed, into round 2.

Event-driven: a claim blocks on the stream until a batch lands; conditions that no landing changes (a period, a
predicate, a version) are looked at again at least every `ACTOR_CHECK_S`. Dead serverful actors are looked for (a
non-blocking wait on each process) before every claim: at once when collection starts, and at least every
`ACTOR_CHECK_S` while it waits; hung ones (a heartbeat that stands still) too, once it has waited that long.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from cache import JobCache
from cache.claims import BatchClaims
from stellaris.platform.serverful_actors import ServerfulActors
from stellaris.round.batches import Landed, actors_in, first_of_each
from stellaris.round.protocol import RoundStats, TrainingError
from stellaris.round.triggers import LandedFacts, LearnerTrigger

BATCH_WAIT_S = 300.0  # no batch landing for this long: the actors are taken for dead
ACTOR_CHECK_S = 1.0  # while waiting, how often dead serverful actors (and time-based conditions) are looked at
CLAIMER = "control"  # the consumer-group name the control plane's learner trigger claims under

ROUND_ONE = LearnerTrigger()  # a train batch of steps, with each actor's first batch (below)


@dataclass(frozen=True)
class Intake:
    """What the gate reads while it collects round `round_k`: the round's train batch size, the actor count (round 1
    waits for each actor's first batch), the serverful actors (hung ones killed, dead ones restarted, landings noted;
    none under serverless actors) and the policy version now (a round trip: read only where a condition needs it)."""

    round_k: int
    train_batch_size: int
    actors: int
    crew: ServerfulActors
    version: Callable[[], int | None]


@dataclass(frozen=True)
class Collected:
    """A firing: the round's batches, those claimed beyond round 1's choice (the next round's first), each landing
    actor's newest reward-scaler moments, and the facts the trigger fired on (its triggers.csv row's)."""

    batches: list[Landed]
    carried: list[Landed]
    reward_scalers: dict[str, list[float]]
    fired: dict[str, Any]

    @property
    def ids(self) -> list[str]:
        return [bid for bid, _ in self.batches]

    @property
    def env_steps(self) -> int:
        return sum(meta.env_steps for _, meta in self.batches)


class LearnerGate:
    """One job's learner trigger and what it remembers between firings (when and at which version it fired)."""

    def __init__(
        self, trigger: LearnerTrigger, job: JobCache, saved: Mapping[str, Any] | None = None, *, payloads: bool = True
    ) -> None:
        """`saved`: a checkpoint's `state()`, so a resumed run's `version_changed` and `period_s` conditions count
        from the dead run's last firing (its downtime not included). `payloads`: batches carry their arrays (the
        `trajectories` profile; a header alone is the whole batch under `gradients_at_actors`)."""
        self.trigger = trigger
        self.claims = BatchClaims(
            job.trajectories.stream, job.dead_letters, version_key=job.keys.policy_version, payloads=payloads,
            max_bytes=job.limits.payload_bytes_max,
        )  # fmt: skip
        saved = saved or {}
        since = saved.get("since_fire_s")
        self.fired_at: float | None = None if since is None else time.monotonic() - float(since)
        version = saved.get("fired_version")
        self.fired_version: int | None = None if version is None else int(version)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the last firing's version and how long ago it was."""
        since = None if self.fired_at is None else round(time.monotonic() - self.fired_at, 4)
        return {"fired_version": self.fired_version, "since_fire_s": since}

    def facts(self, round_k: int, batches: list[Landed], version: int) -> LandedFacts:
        since = math.inf if self.fired_at is None else time.monotonic() - self.fired_at
        return LandedFacts(
            round=round_k,
            batches=len(batches),
            steps=sum(m.env_steps for _, m in batches),
            actors=actors_in(batches),
            version=version,
            fired_version=self.fired_version,
            since_fire_s=since,
        )

    def _wait_s(self, facts: LandedFacts) -> float:
        """How long a claim may block: until a period condition comes due, at most ACTOR_CHECK_S."""
        period = self.trigger.period_s
        if period is None or math.isinf(facts.since_fire_s):
            return ACTOR_CHECK_S
        return min(ACTOR_CHECK_S, max(0.001, period - facts.since_fire_s))

    def collect(self, intake: Intake, carried: list[Landed], rs: RoundStats) -> Collected:
        """Claim batches after `carried` (the last round's beyond its own) until the trigger fires (round 1: and
        every actor has landed one). Dead serverful actors are restarted, hung ones killed, while it waits."""
        k, crew, need = intake.round_k, intake.crew, intake.train_batch_size
        batches = list(carried)
        scalers: dict[str, list[float]] = {}  # each landing actor's newest reward-scaler moments
        last_landing = time.monotonic()
        while True:
            # Every look, not only after a claim that came back empty: an actor that died while the learners worked
            # would otherwise be found only once the others' batches are in and a claim has waited in vain.
            if time.monotonic() - last_landing >= ACTOR_CHECK_S:  # waiting: an actor may be hung (actor_watch.py)
                crew.kill_hung()
            rs.actor_restarts += crew.restart_dead()
            # The version costs a round trip: read it per look only where a condition needs it.
            facts = self.facts(k, batches, intake.version() or 0 if self.trigger.needs_version else -1)
            # Round 1 is every actor's first batch whatever the trigger (a serverful actor waits after its first
            # batch for the policy it trains, so no count beyond one batch per actor could be met).
            trigger = self.trigger if k > 1 else ROUND_ONE
            held = trigger.held(facts, train_batch_size=need)
            if all(held.values()) and (k != 1 or actors_in(batches) >= intake.actors):
                break
            if len(batches) >= self.claims.stream.maxlen and not (held.get("batches", 1) and held.get("steps", 1)):
                raise TrainingError(
                    f"triggers.learner: {len(batches)} batches ({facts.steps} steps) fill the trajectory queue's bound "
                    "and the trigger's counts still do not hold; ask for fewer steps or raise actor_run_ahead"
                )
            if time.monotonic() - last_landing > BATCH_WAIT_S:
                raise TrainingError(f"no trajectory batch arrived within {BATCH_WAIT_S:.0f} s: are the actors alive?")
            want = trigger.batches_short(len(batches))
            got = self.claims.claim(CLAIMER, at_least=want, at_most=want, block_s=self._wait_s(facts))
            # Nothing landed: a claim whose reply died with Redis may hold batches no later claim returns.
            got = got or self.claims.orphaned(CLAIMER, known={bid for bid, _ in batches})
            batches += got
            crew.landed({b.actor_id for _, b in got})
            scalers |= {b.actor_id: b.info["reward_scaler"] for _, b in got if "reward_scaler" in b.info}
            rs.redis_round_trips += sum(int(b.info.get("redis_round_trips", 0)) for _, b in got)
            if got:
                last_landing = time.monotonic()
        beyond: list[Landed] = []
        if k == 1:  # the same seed, the same round 1 (docs/training.md)
            batches, beyond = first_of_each(batches)
        facts = replace(facts, version=intake.version() or 0) if facts.version < 0 else facts
        self.fired_at, self.fired_version = time.monotonic(), facts.version
        fired = {**asdict(facts), "since_fire_s": _finite(facts.since_fire_s), "held": sorted(held)}
        fired["fired_unix"] = time.time()  # to set against the activation records' clocks
        return Collected(batches, beyond, scalers, fired)


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 4)
