"""What the platform's function calls give the control plane: a finished invocation (`Call`) of one of the job's
roles (`Role`), and the error that ends a job (`TrainingError`). Records only: the round protocol (stellaris/round)
reads them, the gateway's functions (stellaris/platform/deployment.py) and serverful actors make them, so the
platform imports nothing of the round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from contract.results import device_of
from gateway.models import Activation

__all__ = ["Call", "Role", "TrainingError"]

Role = Literal["actor", "learner", "parameter"]


class TrainingError(RuntimeError):
    """The job cannot go on: invocations or actors that keep failing, a trigger that cannot fire, a bad setting."""


@dataclass(frozen=True)
class Call:
    """One finished invocation: the handler's JSON result (read through its `contract` record), the
    client-observed latency, and the gateway's metering (None for an in-process call)."""

    result: dict[str, Any]
    latency_s: float
    activation: Activation | None = None

    @property
    def handler_s(self) -> float:
        """Time inside the handler: the instance's measure, or the whole latency for an in-process call."""
        if self.activation is None:
            return self.latency_s
        return self.activation.duration_s or 0.0

    @property
    def metered(self) -> Activation | None:
        """The gateway's activation record, with the part of the handler's result that invocations.csv reports
        (its `device`) where the record carries no copy of the result."""
        if self.activation is None or self.activation.result is not None:
            return self.activation
        return self.activation.model_copy(update={"result": {"device": device_of(self.result)}})
