"""Where learner and parameter functions compute: the `STELLARIS_DEVICE` environment variable of their instance.

- ``auto`` (the default, also for an unset or empty variable): ``cuda`` when ``torch.cuda.is_available()``, else
  ``cpu``;
- ``cpu``: the CPU, even where CUDA is available;
- ``cuda`` or ``cuda:N``: that GPU (``cuda`` is the current one, usually ``cuda:0``); an error when CUDA is not
  available or there is no GPU N.

Any other value is an error that names the variable. Actors never read it: they compute on the CPU. Nothing here is
exclusive: several learner instances on one machine share its GPU. Tensors move to the device at the edges (weights
loaded, a round's batch arrays, the gradients read for aggregation) and back to the CPU for the wire
(`to_cpu`), so what the cache holds never names a device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from contract.runtime_http import DEVICE_ENV

ENV_VAR = DEVICE_ENV
CHOICES = ("auto", "cpu", "cuda")


class DeviceError(ValueError):
    """`STELLARIS_DEVICE` names no device this process can use."""


def choose_device(value: str | None = None) -> torch.device:
    """The device `value` (default: `$STELLARIS_DEVICE`) selects, with a CUDA device always indexed (``cuda:0``)."""
    raw = os.environ.get(ENV_VAR, "") if value is None else value
    choice = raw.strip().lower() or "auto"
    kind, _, index = choice.partition(":")
    if kind not in CHOICES or (index and (kind != "cuda" or not index.isdigit())):
        raise DeviceError(f"{ENV_VAR}={raw!r} is not a device: choose auto, cpu, cuda or cuda:N")
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if kind == "auto":
            return torch.device("cpu")
        raise DeviceError(
            f"{ENV_VAR}={raw!r} asks for CUDA, but torch.cuda.is_available() is False in this process "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}): set {ENV_VAR}=cpu or auto, or give "
            "the function a GPU"
        )
    n = torch.cuda.device_count()
    i = int(index) if index else torch.cuda.current_device()
    if i >= n:
        raise DeviceError(f"{ENV_VAR}={raw!r}: no GPU {i} in this process, which sees {n}")
    return torch.device("cuda", i)


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's parameters (the CPU for a module without any)."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def to_device(data: Any, device: torch.device) -> Any:
    """`data` with every array and tensor on `device`: numpy arrays become tensors (sharing memory on the CPU);
    mappings, lists, tuples and dataclasses are rebuilt around them; anything else is returned as it is."""
    if isinstance(data, Tensor):
        return data.to(device)
    if isinstance(data, np.ndarray):
        return torch.as_tensor(data).to(device)
    if isinstance(data, Mapping):
        return {k: to_device(v, device) for k, v in data.items()}
    if isinstance(data, tuple | list):
        moved = [to_device(v, device) for v in data]
        return tuple(moved) if isinstance(data, tuple) else moved
    if is_dataclass(data) and not isinstance(data, type):
        return replace(data, **{f.name: to_device(getattr(data, f.name), device) for f in fields(data) if f.init})
    return data


def to_cpu(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Named tensors on the CPU, for the wire (no copy for those already there)."""
    return {name: t.detach().cpu() for name, t in tensors.items()}
