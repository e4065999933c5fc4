"""The scale model's latency model (docs/scale-model.md): how long a learner task would take on an N-learner
serverless cluster, given the compute time this machine measured for it.

A task's modelled seconds = its measured seconds × the learner's fixed slowdown × a straggler factor (with probability
`straggler_p`) × a lognormal stretch of mean 1 (σ = `jitter_sigma`), + `task_overhead_s`. A learner whose instance
starts cold is ready `cold_start_s` after the instance starts: round 1's always (no instance exists yet), a later
round's with probability `cold_start_p` (warm pools keep the instances between rounds). With `prewarm` the instance
starts as the round's collection does, as the platform pre-warms learners, so the start overlaps the collection.
Pure: every draw comes from a `random.Random` seeded by (seed, N, what is drawn), so the same seed gives the same
draws, and one knob's draws never shift another's.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field


class LatencyModel(BaseModel):
    """The serverless variance the model adds to the measured compute times (docs/scale-model.md has each default's
    reason)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    cold_start_s: float = Field(
        default=1.5,
        ge=0.0,
        le=3600.0,
        description="seconds a learner invocation that starts cold waits before its first task",
    )
    cold_start_p: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="probability that a learner invocation after round 1 starts cold (round 1's always do)",
    )
    straggler_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="probability that a task straggles (takes straggler_factor x longer)"
    )
    straggler_factor: float = Field(
        default=4.0, ge=1.0, le=1000.0, description="how many times longer a straggling task takes"
    )
    jitter_sigma: float = Field(
        default=0.0, ge=0.0, le=3.0, description="σ of a lognormal stretch of mean 1 on every task (0: none)"
    )
    speed_spread: float = Field(
        default=0.0,
        ge=0.0,
        le=100.0,
        description="each learner's fixed slowdown is drawn uniformly from [1, 1 + speed_spread]",
    )
    task_overhead_s: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="seconds added to every task besides its compute: the cache round trip and transfers",
    )
    apply_overhead_s: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="seconds added to every apply besides its compute: the parameter function's publish",
    )
    apply_per_gradient_s: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="seconds each gradient after an aggregation's first adds to a fixed apply (--apply-s, or "
        "calibrated): its decoding and accumulation, which a measured apply includes",
    )
    prewarm: bool = Field(
        default=True, description="learner instances start as the round's collection starts, as the platform's do"
    )


def _stream(seed: int, learners: int, name: str) -> random.Random:
    """One seeded stream of draws: a str seed is hashed with SHA-512, the same in every process and Python run."""
    return random.Random(f"stellaris-plan:{seed}:{learners}:{name}")


def draw_slowdowns(spread: float, learners: int, rng: random.Random) -> tuple[float, ...]:
    """Each learner's fixed slowdown, uniform on [1, 1 + spread]: learner i takes slowdown_i × a task's time."""
    return tuple(1.0 + spread * rng.random() for _ in range(learners))


def task_seconds(
    model: LatencyModel, measured_s: float, slowdown: float, rng: random.Random, overhead_s: float | None = None
) -> float:
    """A task's modelled seconds: its compute stretched, plus the fixed overhead (the model's, or `overhead_s`: its
    round's). Two draws every time, whatever the knobs, so that the draws line up across runs that differ in a
    knob."""
    straggles = rng.random() < model.straggler_p
    z = rng.gauss(0.0, 1.0)
    stretch = math.exp(model.jitter_sigma * z - model.jitter_sigma**2 / 2)  # E[stretch] = 1
    compute_s = measured_s * slowdown * (model.straggler_factor if straggles else 1.0) * stretch
    return compute_s + (model.task_overhead_s if overhead_s is None else overhead_s)


def starts_cold(model: LatencyModel, round_k: int, rng: random.Random) -> bool:
    """Whether a learner invocation of round `round_k` starts cold: always in round 1, then with `cold_start_p`.
    One draw every time."""
    cold_later = rng.random() < model.cold_start_p
    return round_k == 1 or cold_later


def ready_times(
    model: LatencyModel, cold: Sequence[bool], invoked_at: float, started_at: float | None = None
) -> list[float]:
    """When each learner invoked at `invoked_at` (the batch's landing) can claim its first task: at once when warm;
    when cold, `cold_start_s` after its instance starts, and never before it is invoked. The instance starts at
    `started_at` (the round's start: the platform pre-warms learners as the collection begins, and before round 1 at
    launch) when `prewarm`, else when invoked."""
    warming = invoked_at if started_at is None or not model.prewarm else min(started_at, invoked_at)
    return [max(invoked_at, warming + model.cold_start_s) if c else invoked_at for c in cold]


@dataclass
class ClusterLatency:
    """The draws of one modelled cluster: its learners' slowdowns and the streams of cold starts and task times."""

    model: LatencyModel
    slowdowns: tuple[float, ...]
    cold_rng: random.Random
    task_rng: random.Random
    round_rng: random.Random

    @classmethod
    def draw(cls, model: LatencyModel, learners: int, seed: int) -> ClusterLatency:
        if learners < 1:
            raise ValueError(f"a cluster needs at least 1 learner, got {learners}")
        slowdowns = draw_slowdowns(model.speed_spread, learners, _stream(seed, learners, "speed"))
        return cls(model, slowdowns, *(_stream(seed, learners, name) for name in ("cold", "task", "round")))

    @classmethod
    def given(cls, model: LatencyModel, slowdowns: Sequence[float], seed: int = 0) -> ClusterLatency:
        """A cluster with the slowdowns given rather than drawn (a worked example, a measured cluster)."""
        if not slowdowns or any(s <= 0 for s in slowdowns):
            raise ValueError(f"slowdowns must be positive, one per learner, got {list(slowdowns)}")
        n = len(slowdowns)
        return cls(model, tuple(slowdowns), *(_stream(seed, n, name) for name in ("cold", "task", "round")))

    @property
    def learners(self) -> int:
        return len(self.slowdowns)

    def cold(self, round_k: int) -> list[bool]:
        """Which learners' instances start cold in round `round_k` (one draw each)."""
        return [starts_cold(self.model, round_k, self.cold_rng) for _ in self.slowdowns]

    def ready_at(self, round_k: int, invoked_at: float, started_at: float | None = None) -> list[float]:
        """When each learner of round `round_k` can claim its first task (`ready_times` of this round's draws)."""
        return ready_times(self.model, self.cold(round_k), invoked_at, started_at)

    def task_seconds(self, learner: int, measured_s: float, overhead_s: float | None = None) -> float:
        return task_seconds(self.model, measured_s, self.slowdowns[learner], self.task_rng, overhead_s)

    def round_timing(self, timings: Sequence[RoundTiming]) -> RoundTiming | None:
        """One calibration round's timings for the next modelled round, drawn uniformly (one draw every time; None
        when there are none to draw from)."""
        index = self.round_rng.randrange(len(timings)) if timings else None
        return None if index is None else timings[index]


@dataclass(frozen=True)
class RoundTiming:
    """One calibration round's timings (`calibrated_overheads`): a task's compute and its overhead, an apply in all,
    the batch's collection. A modelled round takes one round's together, so that its slow and fast moments come as a
    real machine's do: a round whose applies outlast its tasks builds a queue, as the real one does."""

    compute_s: float
    task_overhead_s: float
    apply_s: float
    collect_s: float
    start_s: float = 0.0  # the round's seconds outside its tasks, applies and collection: before its first task


@dataclass(frozen=True)
class CalibrationRun:
    """One real one-learner run as the calibration reads it: its info.csv rows (as floats); its gradients' arrival
    stamps in ms, sorted, by round (`arrival_stamps`; empty: not recorded); its learner and parameter invocations'
    (start, end) in epoch seconds (invocations.csv; empty: not recorded)."""

    rows: Sequence[dict[str, float]]
    arrivals_ms: Mapping[int, Sequence[float]] = field(default_factory=dict)
    spans_s: Sequence[tuple[float, float]] = ()


@dataclass(frozen=True)
class Overheads:
    """What real one-learner runs measured for the model (`calibrated_overheads`), medians over their rounds after
    the first: a task's compute and its overhead beyond it, an apply's seconds in all (update, publish and ack), a
    batch's collection, and the tasks' jitter (None: the runs' gradient arrivals were not given, or were sync's)."""

    task_overhead_s: float
    apply_s: float
    compute_s: float
    collect_s: float
    rounds: int  # the rounds they were measured over, all runs together
    start_s: float | None = None  # None: no round's start was measured (no arrivals or no invocations)
    jitter_sigma: float | None = None
    per_round: tuple[RoundTiming, ...] = ()  # each round's, to draw from


def calibrated_overheads(runs: Sequence[CalibrationRun], *, waits_for_applies: bool = False) -> Overheads:
    """What one-learner runs' info.csv rows measured, medians over their rounds after the first (round 1 pays the
    cold start), all runs pooled.

    - A task's compute: the learner's compute over the gradients it applied. The model takes it in place of its own
      measurement: the real learner computes beside the parameter function, Redis and the actors on the same cores,
      and so more slowly than the model's gradients computed alone (docs/scale-model.md#calibration).
    - A task's overhead: the round's cadence, the mean gap between its gradients' arrivals, beyond the learner's
      compute: at N = 1 the learner is the bottleneck and its gradients arrive one task apart. Without a round's
      arrivals, the round's learning phase (its duration after the collection) beyond the compute, shared by the
      gradients it applied; that phase also holds the drain of the parameter function's queue after the last
      arrival, which the model plays out itself, so the cadence is the better measure (a round whose applies outlast
      its tasks builds a queue in the model as in the real run; docs/scale-model.md#calibration). With
      `waits_for_applies` (sync: each step waits for its update) the applies ran one after another with the tasks,
      and their time is taken out too; otherwise they overlapped the tasks.
    - An apply's seconds in all: the parameter function's compute plus its busy time beyond it, shared by its
      aggregations; its busy time is the round's `cache_time` (both functions' handler time neither computing nor
      waiting) less the learner's part of it (its time beyond compute and waiting).
    - A batch's collection: the round's `actor_time`.
    - A round's start: its learning phase less the stretch from its first arrival to the end of its last function
      invocation and less the first task: the batch's dispatch, the learners' invocation and first claim, and the
      round's close after the functions return (measured only with both arrivals and invocations; else 0, and the
      phase-based overhead holds it).
    - The tasks' jitter (`jitter_sigma`): from the same gaps' spread within each round (`arrival_jitter`), when
      given, except with `waits_for_applies`: a sync learner's gaps also hold the applies and its waits for them.
    - Each round's four timings together (`per_round`), for the model to draw a round's from.

    Negative shares (clock noise) count as 0. ValueError when a run had more than one learner (its learning phase
    overlaps tasks) or no round after the first applied anything."""
    info = [r for run in runs for r in run.rows[1:]]
    several = sorted({int(r["learners"]) for r in info if math.isfinite(r.get("learners", 1.0))} - {1})
    if several:
        raise ValueError(f"calibrate from a one-learner run: this one ran {several[0]} learners")
    per_round = [
        timing for run in runs for r in run.rows[1:] if (timing := _round_timing(r, waits_for_applies, run)) is not None
    ]
    if not per_round:
        raise ValueError(f"no round after the first applied a gradient ({len(info)} rounds): nothing to calibrate")
    compute = statistics.median(t.compute_s for t in per_round)
    all_gaps = [_gaps(stamps) for run in runs for k, stamps in run.arrivals_ms.items() if k > 1]
    starts = [t.start_s for t in per_round if t.start_s > 0.0]
    # a sync learner's gaps also hold its applies and its waits for them: they spread as those do, not as tasks
    jitter = arrival_jitter(all_gaps, compute) if sum(map(len, all_gaps)) >= 2 and not waits_for_applies else None
    return Overheads(
        task_overhead_s=statistics.median(t.task_overhead_s for t in per_round),
        apply_s=statistics.median(t.apply_s for t in per_round),
        compute_s=compute,
        collect_s=statistics.median(t.collect_s for t in per_round),
        rounds=len(per_round),
        start_s=statistics.median(starts) if starts else None,
        jitter_sigma=jitter,
        per_round=tuple(per_round),
    )


def _round_timing(r: dict[str, float], waits_for_applies: bool, run: CalibrationRun) -> RoundTiming | None:
    """One round's timings (`calibrated_overheads`), its task's from its arrivals when the run has them; None when it
    applied nothing."""
    gradients = r["gradients_applied"]
    if r["aggregations"] <= 0 or gradients <= 0:
        return None
    learner_busy = max(0.0, r["learner_time"] - r["learner_compute_time"] - r["learner_wait_time"])
    applying = r["parameter_compute_time"] + max(0.0, r["cache_time"] - learner_busy)  # the round's applies in all
    compute = r["learner_compute_time"] / gradients
    phase = r["duration"] - r["actor_time"]
    stamps = run.arrivals_ms.get(int(r["round_id"]), ()) if run.arrivals_ms else ()
    cadence = statistics.fmean(_gaps(stamps)) / 1e3 if len(stamps) >= 2 else phase / gradients
    task = max(compute, cadence - (applying / gradients if waits_for_applies else 0.0))
    return RoundTiming(
        compute_s=compute,
        task_overhead_s=task - compute,
        apply_s=applying / r["aggregations"],
        collect_s=r["actor_time"],
        start_s=_round_start(phase, task, stamps[0] / 1e3, run.spans_s) if len(stamps) >= 2 else 0.0,
    )


def _round_start(
    phase_s: float, task_s: float, first_arrival_s: float, spans_s: Sequence[tuple[float, float]]
) -> float:
    """A round's start (`calibrated_overheads`): its learning phase less its first task and less the stretch from its
    first arrival to the end of the last function invocation running then; 0 without such an invocation."""
    ends = [end for start, end in spans_s if start <= first_arrival_s <= end]
    return max(0.0, phase_s - task_s - (max(ends) - first_arrival_s)) if ends else 0.0


def _gaps(stamps: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(stamps)]


MS_ROUNDING_VAR = 1 / 6  # ms²: a gap between two whole-millisecond stamps, each rounded down (2 x 1/12)


def arrival_jitter(gaps_ms: Sequence[Sequence[float]], compute_s: float) -> float:
    """The lognormal σ of `task_seconds`' stretch that gives a one-learner run's spread of arrivals within a round
    (one list of gaps a round): at N = 1 the learner is the bottleneck and claims ahead, so consecutive gradients
    arrive one task (its compute plus its overhead) apart, and their gaps' spread is the tasks'. Each gap is taken
    from its own round's mean (the spread between rounds is `RoundTiming`'s). The gaps are whole milliseconds (Redis
    stream ids): their rounding's variance is taken out. The model's overhead is fixed and its stretch scales the
    compute alone, so the spread is the compute's: σ = √ln(1 + (sd / compute)²). 0 when the gaps spread no more than
    their rounding does."""
    if compute_s <= 0:
        raise ValueError(f"a task's compute must be positive to spread it, got {compute_s!r} s")
    squares = sum((g - statistics.fmean(gaps)) ** 2 for gaps in gaps_ms if len(gaps) >= 2 for g in gaps)
    freedom = sum(len(gaps) - 1 for gaps in gaps_ms if len(gaps) >= 2)
    if freedom < 1:
        raise ValueError("the spread of arrivals needs a round with two gaps or more")
    spread_ms2 = max(0.0, squares / freedom - MS_ROUNDING_VAR)
    cv = math.sqrt(spread_ms2) / 1e3 / compute_s
    return math.sqrt(math.log1p(cv * cv))


def arrival_stamps(gradients: Sequence[tuple[int, str]]) -> dict[int, list[float]]:
    """Each round's gradients' arrival stamps in ms, sorted (round → its stamps), from (round, gradient id) pairs: a
    gradient's id is its Redis stream id, `<ms>-<seq>`, stamped as it was stored."""
    by_round: dict[int, list[float]] = {}
    for round_k, gradient_id in gradients:
        by_round.setdefault(round_k, []).append(float(gradient_id.split("-", 1)[0]))
    return {k: sorted(stamps) for k, stamps in by_round.items()}
