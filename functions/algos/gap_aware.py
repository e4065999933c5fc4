"""Staleness by parameter distance, as Gap-aware SGD does (Barkai, Hakimi and Schuster, ICLR 2020): a gradient
computed on θ_base is divided, element by element, by how many typical steps each parameter has moved since:

    G = max(1, |θ_now − θ_base| / C)        g ← g / G

C is a running mean of one update's |Δθ|, element by element. A version count says how many updates a gradient
missed; the gap says how far they moved the parameters it was computed on, which differs with the learning rate's
schedule and with how many gradients each update averaged (docs/algorithms.md#staleness-by-parameter-distance).

`gap_penalties` is the equation; `ParameterGaps` keeps what it needs (a bounded history of the published parameters
by version, and C) beside the parameter function's warm model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

STEP_DECAY = 0.9  # C ← 0.9·C + 0.1·|Δθ| per update: about the last ten updates' mean step
EPS = 1e-12  # a parameter that has not moved yet has C = 0: its gap is 0/ε = 0, never a division by zero


def gap_penalties(current: Sequence[Tensor], base: Sequence[Tensor], step: Sequence[Tensor]) -> list[Tensor]:
    """G = max(1, |θ_now − θ_base| / C) per element: 1 where a parameter moved at most one typical step since."""
    return [
        torch.clamp_min((now - then).abs_() / (c + EPS), 1.0) for now, then, c in zip(current, base, step, strict=True)
    ]


def update_step(step: list[Tensor] | None, before: Sequence[Tensor], after: Sequence[Tensor]) -> list[Tensor]:
    """C after one update from `before` to `after`: its |Δθ| at first, then a running mean (`STEP_DECAY`)."""
    moved = [(a - b).abs_() for a, b in zip(after, before, strict=True)]
    if step is None:
        return moved
    return [c.mul_(STEP_DECAY).add_(m, alpha=1.0 - STEP_DECAY) for c, m in zip(step, moved, strict=True)]


@dataclass
class ParameterGaps:
    """The newest `keep` published parameter sets by version, and C. A gradient whose base version is not kept (the
    instance started cold, or the version is older than `keep`) has no gap: the caller falls back to its version
    count."""

    keep: int
    history: OrderedDict[int, list[Tensor]] = field(default_factory=OrderedDict)
    step: list[Tensor] | None = None

    def record(self, version: int, params: Sequence[Tensor]) -> None:
        """`params` (copied) as `version`; C moves by the update from the version before, when that one is kept."""
        copy = [p.detach().clone() for p in params]
        before = self.history.get(version - 1)
        if before is not None:
            self.step = update_step(self.step, before, copy)
        self.history[version] = copy
        while len(self.history) > self.keep:
            self.history.popitem(last=False)

    def newest(self) -> int | None:
        return next(reversed(self.history)) if self.history else None

    def penalties(self, base_version: int, current: Sequence[Tensor]) -> list[Tensor] | None:
        """G for a gradient computed on `base_version`, or None when that version is not kept or C is not known."""
        base = self.history.get(base_version)
        if base is None or self.step is None:
            return None
        return gap_penalties([p.detach() for p in current], base, self.step)
