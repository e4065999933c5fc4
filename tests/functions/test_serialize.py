"""Policies and optimizer state through the wire format: exact round trips, and a mismatch named."""

import pytest
import torch
from gymnasium import spaces

from functions.model.policies import build_policy
from functions.model.serialize import build_optimizer, load_policy_bytes, policy_to_bytes

OBS = spaces.Box(-1.0, 1.0, (11,))
ACT = spaces.Box(-1.0, 1.0, (3,))


def test_weights_and_normaliser_load_exactly_into_another_policy() -> None:
    torch.manual_seed(0)
    src = build_policy(OBS, ACT, hidden=(8, 8), normalize_obs=True)
    dst = build_policy(OBS, ACT, hidden=(8, 8), normalize_obs=True)
    src.obs_normalizer.update_from_moments(torch.full((11,), 2.0), torch.full((11,), 3.0), 5)
    assert load_policy_bytes(dst, policy_to_bytes(src, version=7)) == 7
    theirs = dst.state_dict()
    for name, value in src.state_dict().items():
        assert torch.equal(theirs[name], value), name
    ps = dict(dst.named_parameters())
    assert all(p.requires_grad for p in ps.values())  # still trainable parameters, not replaced tensors


def test_weights_of_another_network_are_refused_naming_the_mismatch() -> None:
    small = build_policy(OBS, ACT, hidden=(8, 8))
    large = build_policy(OBS, ACT, hidden=(16, 16))
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_policy_bytes(large, policy_to_bytes(small, version=1))
    with pytest.raises(RuntimeError, match=r"Missing key|Unexpected key"):
        load_policy_bytes(build_policy(OBS, ACT, hidden=(8, 8), normalize_obs=True), policy_to_bytes(small, version=1))


@pytest.mark.parametrize("eps", [1e-8, 1e-5])
def test_adam_steps_match_the_per_tensor_adam(eps: float) -> None:
    """The fused Adam the parameter function uses gives the per-tensor default's numbers, with the job's ε."""
    torch.manual_seed(1)
    a = build_policy(OBS, ACT, hidden=(8, 8))
    b = build_policy(OBS, ACT, hidden=(8, 8))
    b.load_state_dict(a.state_dict())
    fused = build_optimizer("adam", list(a.parameters()), lr=1e-2, adam_eps=eps)
    plain = torch.optim.Adam(b.parameters(), lr=1e-2, eps=eps, foreach=False)
    for _ in range(50):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            g = torch.randn_like(pa)
            pa.grad, pb.grad = g.clone(), g.clone()
        fused.step()
        plain.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-6)
