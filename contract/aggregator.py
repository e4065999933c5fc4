"""The parameter function's aggregator state: what it keeps between updates and invocations (and a checkpoint keeps
between runs). Written by the parameter function with each publish; learners read `kl_coef` and `target_version`
with each claim (inside the task board's Lua); the control plane checkpoints and restores it whole."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Self

from contract.errors import RecordError

# The field names the task board's claim script reads inside Redis.
KL_COEF_FIELD = "kl_coef"
TARGET_VERSION_FIELD = "target_version"


@dataclass(frozen=True)
class AggregatorState:
    """`round_k`: the round the rule is in; `delta_max`: the rule's calibrated staleness bound (None until round 1
    ends); `kl_sum`/`kl_n`: the round's observed KL so far; `kl_coef`: PPO's adaptive coefficient (None: the
    config's); `target_version`/`target_round`: IMPACT's target network and when it was last refreshed."""

    round_k: int = 1
    delta_max: int | None = None
    aggregations: int = 0
    flushes: int = 0
    kl_sum: float = 0.0
    kl_n: int = 0
    kl_coef: float | None = None
    target_version: int | None = None
    target_round: int = 0

    def to_fields(self) -> dict[str, str]:
        """The Redis hash's fields: numbers as strings; a None field is left out."""
        return {k: repr(v) if isinstance(v, float) else str(v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_fields(cls, raw: Mapping[Any, Any]) -> Self:
        """From a hash as Redis returns it (bytes or str keys and values); unknown fields are ignored, so an older
        checkpoint's extra fields do not stop a resume."""
        data = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in raw.items()}
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            text = value.decode() if isinstance(value, bytes) else str(value)
            try:
                number = float(text)
            except ValueError as exc:
                raise RecordError(f"aggregator state: field {f.name!r} is not a number: {text!r}") from exc
            out[f.name] = number if f.name in ("kl_sum", "kl_coef") else int(number)
        return cls(**out)

    def with_(self, **changes: Any) -> Self:
        return replace(self, **changes)
