"""The typed contract between the control plane, the functions and the gateway: handler results, the aggregator's
state and the function runtime's HTTP contract. The ground floor: it imports nothing of theirs."""

from contract.aggregator import AggregatorState
from contract.results import (
    ActorResult,
    AppliedGradient,
    AppliedRow,
    DecisionRow,
    InitResult,
    LearnerResult,
    ParameterResult,
    ResultError,
    RoundShape,
)

__all__ = [
    "ActorResult",
    "AggregatorState",
    "AppliedGradient",
    "AppliedRow",
    "DecisionRow",
    "InitResult",
    "LearnerResult",
    "ParameterResult",
    "ResultError",
    "RoundShape",
]
