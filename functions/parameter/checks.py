"""Whether a gradient read from the cache can be applied: pure checks of what was read (no I/O). A gradient that
fails one is poisoned, as an undecodable one is: the parameter function dead-letters it and goes on without it,
rather than failing (and every replacement instance with it, on the same entry) or applying NaNs to the policy.

The base version is judged from the header alone (`contract.batch_checks.version_ahead`: no learner can have held a
version that was never published); the tensors, once decoded, against the parameters the optimizer steps (their
names and shapes) and for NaN or infinite values; the observation moments against the policy's normaliser.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


def tensors_problem(tensors: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why a gradient's tensors cannot be stepped by an optimizer over parameters of shapes `expected` (name ->
    shape): other names, other shapes, or values that are not finite. None when they can."""
    if tensors.keys() != expected.keys():
        missing, unknown = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected.keys())
        return f"gradient does not name the policy's parameters: missing {missing}, unknown {unknown}"
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            return f"gradient {name!r} has shape {tuple(tensors[name].shape)}, the policy's is {tuple(shape)}"
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return f"gradient has non-finite values in {', '.join(bad)}" if bad else None


def moments_problem(mean: Any, var: Any, count: float, shape: tuple[int, ...] | None) -> str | None:
    """Why observation moments (a mean, a variance, a count) cannot be folded into a normaliser of `shape` (None:
    the policy has none, so they are not used and nothing is judged). None when they can."""
    if shape is None:
        return None
    mean, var = torch.as_tensor(mean), torch.as_tensor(var)
    if tuple(mean.shape) != tuple(shape) or tuple(var.shape) != tuple(shape):
        return f"observation moments of shapes {tuple(mean.shape)}, {tuple(var.shape)} do not fit {tuple(shape)}"
    if not (math.isfinite(count) and count > 0):
        return f"observation moments need a positive finite count, got {count}"
    if not (bool(torch.isfinite(mean).all()) and bool(torch.isfinite(var).all())):
        return "observation moments have non-finite values"
    if bool((var < 0).any()):
        return "observation moments have a negative variance"
    return None
