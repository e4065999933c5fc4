"""A workflow defined only in config (docs/workflows.md): `stellaris train` on CartPole with learners
triggered every 4 batches and the parameter function every 4 gradients; triggers.csv, gradients.csv and the
activation records show every invocation happened when the trigger definitions say."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.stellaris.test_train import rows, run_train, train_cmd

ROUNDS = 4
BATCHES = 4  # each actor's batch is half a train batch (2 actors), so the default trigger would fire on 2
GRADIENTS = 4
PER_ROUND = 16  # 4 epochs x 4 minibatches (FAST_CARTPOLE)


def test_config_defined_workflow(tmp_path: Path) -> None:
    out = tmp_path / "run"
    triggers = {"learner": {"batches": BATCHES}, "parameter": {"gradients": GRADIENTS}}
    # 4 batches of 2 actors need a queue of 4: 2 per actor (the default, 1, would refuse the trigger)
    cmd = train_cmd(tmp_path, "--rounds", str(ROUNDS), "--out", str(out), triggers=triggers, seed=3, actor_run_ahead=2)
    done = run_train(cmd)
    assert done.returncode == 0, done.stderr[-3000:]

    fired = rows(out / "triggers.csv")
    learner = [r for r in fired if r["trigger"] == "learner"]
    parameter = [r for r in fired if r["trigger"] == "parameter"]

    # Learners: one firing per round, each on at least BATCHES claimed batches; from round 2 on a firing's batches
    # are exactly the BATCHES it claimed (round 1 is each actor's first batch, the others carried into round 2).
    assert [int(r["round"]) for r in learner] == list(range(1, ROUNDS + 1))
    for r in learner[1:]:
        facts = json.loads(r["facts"])
        assert facts["batches"] == int(r["count"]) == BATCHES
        assert "batches" in facts["held"] and "steps" not in facts["held"]
    assert int(learner[0]["count"]) == 2  # round 1: each actor's first batch, whatever the trigger
    claimed = [b for r in learner for b in json.loads(r["claimed"])]
    assert len(claimed) == len(set(claimed)) == 2 + (ROUNDS - 1) * BATCHES  # no batch in two firings
    info = rows(out / "info.csv")
    assert int(info[-1]["env_steps"]) == 512 * (1 + (ROUNDS - 1) * BATCHES // 2)

    # Every learner invocation started after its round's firing and before the next one: the trigger invoked them.
    fire_times = [json.loads(r["facts"])["fired_unix"] for r in learner] + [float("inf")]
    starts = sorted(float(r["start"]) for r in rows(out / "invocations.csv") if "learner" in r["function"])
    per_round = Counter(next(k for k in range(ROUNDS) if fire_times[k] <= s < fire_times[k + 1]) for s in starts)
    assert per_round == {k: 2 for k in range(ROUNDS)}, per_round  # 2 learners a round, none before a firing

    # Parameter function: every applied version is a group of whole multiples of GRADIENTS, and every gradient is
    # applied exactly once.
    grads = rows(out / "gradients.csv")
    assert len(grads) == ROUNDS * PER_ROUND and len({g["gradient_id"] for g in grads}) == len(grads)
    assert len({(g["round"], g["task_id"]) for g in grads}) == len(grads)
    groups = Counter(int(g["applied_version"]) for g in grads)
    assert all(n % GRADIENTS == 0 for n in groups.values()), groups
    assert [int(r["count"]) for r in parameter] == [groups[v] for v in sorted(groups)]
    applied = [g for r in parameter for g in json.loads(r["claimed"])]
    assert sorted(applied) == sorted(g["gradient_id"] for g in grads)
    print(
        f"learner firings {len(learner)}, batches claimed {len(claimed)}, learner invocations {len(starts)}, "
        f"parameter firings {len(parameter)}, group sizes {sorted(Counter(groups.values()).items())}"
    )
