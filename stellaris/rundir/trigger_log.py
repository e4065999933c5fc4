"""triggers.csv: one row per trigger firing (docs/workflows.md). Learner firings are written as the learner gate
fires (stellaris/round/wiring.py); parameter firings are read from the applied log, one per published version, when
the round's gradients.csv rows are written (the parameter function runs behind the gateway and logs them there)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

TRIGGER_COLUMNS = ["trigger", "round", "fired_s", "facts", "count", "claimed"]


def learner_row(round_k: int, fired_s: float, facts: dict[str, Any], claimed: Sequence[str]) -> dict[str, Any]:
    """A learner firing: the facts it fired on (and which conditions held) and the batches it claimed."""
    return {
        "trigger": "learner",
        "round": round_k,
        "fired_s": round(fired_s, 4),
        "facts": json.dumps(facts, sort_keys=True),
        "count": len(claimed),
        "claimed": json.dumps(list(claimed)),
    }


def parameter_rows(gradient_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """gradients.csv rows (one per applied gradient) grouped by the version they went into: one row per firing
    whose group the rule applied, in version order. `fired_s` is empty: the applied log records no clock."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for row in gradient_rows:
        groups.setdefault(int(row["applied_version"]), []).append(row)
    return [
        {
            "trigger": "parameter",
            "round": max(int(r["round"]) for r in rows),
            "fired_s": "",
            "facts": json.dumps({"applied_version": version, "gradients": len(rows)}),
            "count": len(rows),
            "claimed": json.dumps([r["gradient_id"] for r in rows]),
        }
        for version, rows in sorted(groups.items())
    ]
