"""The pure checks of a gradient read from the cache (functions/parameter/checks.py), on hand-made tensors."""

from __future__ import annotations

import math

import numpy as np
import torch

from functions.parameter.checks import moments_problem, tensors_problem

EXPECTED = {"w": (2, 3), "b": (3,)}


def test_tensors_of_the_policy_s_names_and_shapes_with_finite_values_pass() -> None:
    assert tensors_problem({"w": torch.ones(2, 3), "b": torch.zeros(3)}, EXPECTED) is None
    assert tensors_problem({"w": torch.ones(2, 3, dtype=torch.bfloat16), "b": torch.zeros(3)}, EXPECTED) is None
    assert tensors_problem({}, {}) is None


def test_other_names_or_shapes_are_named() -> None:
    assert tensors_problem({"w": torch.ones(2, 3)}, EXPECTED) == (
        "gradient does not name the policy's parameters: missing ['b'], unknown []"
    )
    assert tensors_problem({"w": torch.ones(2, 3), "b": torch.zeros(3), "x": torch.zeros(1)}, EXPECTED) == (
        "gradient does not name the policy's parameters: missing [], unknown ['x']"
    )
    assert tensors_problem({"w": torch.ones(3, 2), "b": torch.zeros(3)}, EXPECTED) == (
        "gradient 'w' has shape (3, 2), the policy's is (2, 3)"
    )


def test_nan_and_infinity_are_named_by_tensor() -> None:
    w = torch.ones(2, 3)
    w[1, 2] = math.nan
    b = torch.tensor([0.0, math.inf, 1.0])
    assert tensors_problem({"w": w, "b": b}, EXPECTED) == "gradient has non-finite values in w, b"
    assert tensors_problem({"w": torch.ones(2, 3), "b": -b}, EXPECTED) == "gradient has non-finite values in b"
    half = torch.full((3,), 7e4, dtype=torch.float32).to(torch.float16)  # past float16's range: infinite
    assert tensors_problem({"w": torch.ones(2, 3), "b": half}, EXPECTED) == "gradient has non-finite values in b"


def test_observation_moments_must_fit_the_normaliser() -> None:
    mean, var = np.array([0.5, -1.0]), np.array([1.0, 0.25])
    assert moments_problem(mean, var, 64.0, (2,)) is None
    assert moments_problem(mean, var, 64.0, None) is None  # no normaliser: the moments are not used
    assert moments_problem(np.full(2, np.nan), var, 64.0, None) is None
    assert moments_problem(mean, var, 64.0, (3,)) == "observation moments of shapes (2,), (2,) do not fit (3,)"
    assert moments_problem(mean, var[:1], 64.0, (2,)) == "observation moments of shapes (2,), (1,) do not fit (2,)"
    assert moments_problem(mean, var, 0.0, (2,)) == "observation moments need a positive finite count, got 0.0"
    assert moments_problem(mean, var, math.inf, (2,)) == "observation moments need a positive finite count, got inf"
    assert moments_problem(np.array([0.0, np.nan]), var, 8.0, (2,)) == "observation moments have non-finite values"
    assert moments_problem(mean, np.array([1.0, -0.5]), 8.0, (2,)) == "observation moments have a negative variance"
