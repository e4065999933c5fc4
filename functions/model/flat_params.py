"""A policy whose parameters are views of one flat tensor: weights load with one copy, publish as one buffer
(`contract.packed`), gradients travel packed the same way, and the parameter function's Adam steps one tensor.

Measured on the fast preset's Hopper policy (13 parameter tensors, 2 cores): a publish's encoding 254 -> 44 µs, a
weight load 258 -> 69 µs, a gradient's encoding 125 -> 13 µs, and a fused Adam step 181 -> about 100 µs.
The module stays an ordinary `nn.Module` (its `state_dict`, `load_state_dict` and forward are unchanged); moving it
to another device afterwards gives its parameters storage of their own, and `flat_params` then says None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from contract.packed import PACKED, Layout, wire_layout

_ATTR = "flat_params"


@dataclass(frozen=True)
class FlatParams:
    flat: nn.Parameter  # what an optimizer steps; the module's parameters are views of its storage
    layout: Layout  # (name, shape) of each parameter, in `named_parameters` order
    views: tuple[nn.Parameter, ...]  # the module's parameters, in layout order
    owners: tuple[tuple[str, nn.Module, str], ...]  # (state_dict name, owning module, attribute) of each buffer
    wire: list[list[object]]  # the layout as a frame's meta carries it

    def intact(self) -> bool:
        """Whether the module's parameters still share the flat storage (`.to()` to another device ends that)."""
        ptr = self.flat.untyped_storage().data_ptr()
        return all(v.untyped_storage().data_ptr() == ptr for v in self.views)

    @property
    def buffers(self) -> dict[str, Tensor]:
        """The state_dict's buffers (the observation normaliser's) as the module holds them now, read from their
        owners each time: a buffer reassigned (`self.mean = ...`) rather than updated in place is not missed."""
        current = ((name, owner._buffers.get(leaf)) for name, owner, leaf in self.owners)
        return {name: b for name, b in current if b is not None}  # None: removed, and left out of state_dict too

    def pack(self, tensors: Mapping[str, Tensor]) -> Tensor:
        """Named per-parameter tensors (a gradient) packed in layout order; `ValueError` names what does not fit."""
        if PACKED in tensors:
            packed = tensors[PACKED]
            if len(tensors) != 1 or packed.dim() != 1 or packed.numel() != self.flat.numel():
                shape = tuple(packed.shape)
                raise ValueError(f"packed gradient of shape {shape} does not fit {self.flat.numel()} parameters")
            return packed
        if tensors.keys() != {name for name, _ in self.layout}:
            missing = sorted({n for n, _ in self.layout} - tensors.keys())
            extra = sorted(tensors.keys() - {n for n, _ in self.layout})
            raise ValueError(f"gradient does not name the policy's parameters: missing {missing}, unknown {extra}")
        for name, shape in self.layout:
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"gradient {name!r} has shape {tuple(tensors[name].shape)}, the policy's is {shape}")
        return torch.cat([tensors[name].reshape(-1) for name, _ in self.layout])


def flatten_parameters(module: nn.Module) -> FlatParams:
    """Rebind each parameter of `module` to a view of one new flat tensor on the parameters' device (values and
    `requires_grad` kept); the result is also kept on the module, where `flat_params` finds it."""
    named = list(module.named_parameters())
    if not named:
        raise ValueError("a module without parameters has nothing to flatten")
    dtypes = {p.dtype for _, p in named}
    devices = {p.device for _, p in named}
    if len(dtypes) != 1 or len(devices) != 1:
        raise ValueError(f"parameters of several dtypes or devices cannot share one tensor: {dtypes}, {devices}")
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
    views = []
    offset = 0
    for name, p in named:
        owner, _, leaf = name.rpartition(".")
        view = nn.Parameter(flat[offset : offset + p.numel()].view(p.shape), requires_grad=p.requires_grad)
        setattr(module.get_submodule(owner) if owner else module, leaf, view)
        views.append(view)
        offset += p.numel()
    layout = tuple((name, tuple(p.shape)) for name, p in named)
    params = {name for name, _ in named}
    owners = []
    for name in (k for k in module.state_dict(keep_vars=True) if k not in params):  # persistent buffers, extra state
        owner, _, leaf = name.rpartition(".")
        sub = module.get_submodule(owner) if owner else module
        if leaf in sub._buffers:  # not `_extra_state`, which is no tensor
            owners.append((name, sub, leaf))
    fp = FlatParams(nn.Parameter(flat), layout, tuple(views), tuple(owners), wire_layout(layout))
    module.__dict__[_ATTR] = fp  # a plain attribute: nn.Module would register a Parameter-holding one otherwise
    return fp


def flat_params(module: nn.Module) -> FlatParams | None:
    """The module's flat parameters, or None when it has none or they no longer back its parameters."""
    fp = module.__dict__.get(_ATTR)
    return fp if fp is not None and fp.intact() else None
