"""Packed policies (functions.model.flat_params): one tensor behind every parameter, and the same numbers as before."""

import pytest
import torch
from gymnasium import spaces

from contract.codec import decode
from contract.packed import PACKED
from functions.learner.learn import gradients
from functions.model.flat_params import flat_params, flatten_parameters
from functions.model.policies import build_policy
from functions.model.serialize import (
    build_optimizer,
    load_optimizer_bytes,
    load_policy_bytes,
    optimizer_to_bytes,
    policy_to_bytes,
)

OBS = spaces.Box(-1.0, 1.0, (11,))
ACT = spaces.Box(-1.0, 1.0, (3,))


def _pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two policies with the same weights; the second one packed."""
    torch.manual_seed(seed)
    plain = build_policy(OBS, ACT, hidden=(8, 8), normalize_obs=True)
    packed = build_policy(OBS, ACT, hidden=(8, 8), normalize_obs=True)
    packed.load_state_dict(plain.state_dict())
    flatten_parameters(packed)
    return plain, packed


def test_flattening_keeps_the_weights_and_backs_every_parameter_with_one_tensor() -> None:
    plain, packed = _pair()
    for name, value in plain.state_dict().items():
        assert torch.equal(packed.state_dict()[name], value), name
    fp = flat_params(packed)
    assert fp is not None and fp.flat.numel() == sum(p.numel() for p in plain.parameters())
    with torch.no_grad():
        fp.flat.add_(1.0)  # one write moves every parameter
    for (name, p), (_, q) in zip(plain.named_parameters(), packed.named_parameters(), strict=True):
        assert torch.equal(q, p + 1.0), name
    assert all(p.requires_grad for p in packed.parameters())


def test_a_module_moved_after_flattening_is_no_longer_packed() -> None:
    _, packed = _pair()
    packed.to(torch.float64)  # parameters get storage of their own, as with another device
    assert flat_params(packed) is None
    assert len(decode(policy_to_bytes(packed, version=1)).arrays) == len(packed.state_dict())


def test_a_packed_publish_loads_into_packed_and_plain_policies_and_back() -> None:
    plain, packed = _pair()
    packed.obs_normalizer.update_from_moments(torch.full((11,), 2.0), torch.full((11,), 3.0), 5)
    blob = policy_to_bytes(packed, version=9)
    assert set(decode(blob).arrays) == {PACKED, "obs_normalizer.mean", "obs_normalizer.var", "obs_normalizer.count"}
    _, other_packed = _pair(seed=1)
    for dst in (plain, other_packed):
        assert load_policy_bytes(dst, blob) == 9
        for name, value in packed.state_dict().items():
            assert torch.equal(dst.state_dict()[name], value), name
    _, packed_again = _pair(seed=2)
    load_policy_bytes(packed_again, policy_to_bytes(plain, version=3))  # an older, per-tensor frame
    for name, value in plain.state_dict().items():
        assert torch.equal(packed_again.state_dict()[name], value), name


def test_a_buffer_reassigned_rather_than_updated_in_place_still_publishes_and_loads() -> None:
    _, packed = _pair()
    packed.obs_normalizer.mean = torch.full((11,), 4.0, dtype=torch.float64)  # a new tensor, not an in-place update
    frame = decode(policy_to_bytes(packed, version=2))
    assert torch.equal(frame.tensors()["obs_normalizer.mean"], torch.full((11,), 4.0, dtype=torch.float64))
    _, other = _pair(seed=1)
    other.obs_normalizer.var = torch.ones(11, dtype=torch.float64)  # reassigned before a load: the load reaches it
    assert load_policy_bytes(other, policy_to_bytes(packed, version=2)) == 2
    for name, value in packed.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name


def test_a_packed_frame_of_another_network_is_refused_naming_the_mismatch() -> None:
    small = build_policy(OBS, ACT, hidden=(8, 8))
    flatten_parameters(small)
    large = build_policy(OBS, ACT, hidden=(16, 16))
    flatten_parameters(large)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_policy_bytes(large, policy_to_bytes(small, version=1))


def test_packed_gradients_are_the_per_tensor_ones_end_to_end_clipped_alike() -> None:
    plain, packed = _pair()
    obs = torch.randn(32, 11)
    for max_norm in (None, 0.05):
        ours = gradients(packed, packed.evaluate(obs, torch.zeros(32, 3))[0].sum(), max_norm)
        theirs = gradients(plain, plain.evaluate(obs, torch.zeros(32, 3))[0].sum(), max_norm)
        assert list(ours) == [PACKED]
        expected = torch.cat([g.reshape(-1) for g in theirs.values()])
        torch.testing.assert_close(ours[PACKED], expected, rtol=1e-5, atol=1e-7)
        fp = flat_params(packed)
        assert fp is not None
        torch.testing.assert_close(fp.pack(theirs), expected, rtol=0, atol=0)  # named ones pack to the same


def test_a_gradient_that_does_not_fit_is_refused_naming_it() -> None:
    _, packed = _pair()
    fp = flat_params(packed)
    assert fp is not None
    with pytest.raises(ValueError, match="does not fit"):
        fp.pack({PACKED: torch.zeros(3)})
    with pytest.raises(ValueError, match=r"missing \['log_std'\]"):
        fp.pack({k: torch.zeros(s) for k, s in fp.layout if k != "log_std"})
    with pytest.raises(ValueError, match="'log_std' has shape"):
        fp.pack({k: torch.zeros(s if k != "log_std" else (7,)) for k, s in fp.layout})


def test_adam_on_the_packed_tensor_matches_adam_per_parameter_and_resumes_from_its_state() -> None:
    plain, packed = _pair()
    fp = flat_params(packed)
    assert fp is not None
    per_param = build_optimizer("adam", list(plain.parameters()), lr=1e-2, adam_eps=1e-5)
    flat = build_optimizer("adam", [fp.flat], lr=1e-2, adam_eps=1e-5)
    for step in range(20):
        grads = [torch.randn_like(p) for p in plain.parameters()]
        for p, g in zip(plain.parameters(), grads, strict=True):
            p.grad = g
        fp.flat.grad = torch.cat([g.reshape(-1) for g in grads])
        per_param.step()
        flat.step()
        if step == 9:  # a checkpoint of the per-parameter state resumes the packed optimizer
            flat = build_optimizer("adam", [fp.flat], lr=1e-2, adam_eps=1e-5)
            load_optimizer_bytes(flat, optimizer_to_bytes(per_param))
    for (name, p), (_, q) in zip(plain.named_parameters(), packed.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=name)
    again = build_optimizer("adam", [fp.flat], lr=1e-2, adam_eps=1e-5)
    load_optimizer_bytes(again, optimizer_to_bytes(flat))
    assert torch.equal(again.state_dict()["state"][0]["exp_avg"], flat.state_dict()["state"][0]["exp_avg"])


def test_optimizer_state_of_another_network_is_refused() -> None:
    small = build_policy(OBS, ACT, hidden=(4, 4))
    opt = build_optimizer("adam", list(small.parameters()), lr=1e-2)
    for p in small.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    _, packed = _pair()
    fp = flat_params(packed)
    assert fp is not None
    with pytest.raises(ValueError, match="does not fit the packed parameters"):
        load_optimizer_bytes(build_optimizer("adam", [fp.flat], lr=1e-2), optimizer_to_bytes(opt))
