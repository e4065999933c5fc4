"""Stellaris: serverless asynchronous-learner RL. The Python API (`train`, `load_policy`, `TrainConfig`, `RunResult`,
`TrainingError`, `Policy`) is imported on first use, so `import stellaris` (as the CLI does) stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stellaris.api import Policy, RunResult, TrainingError, load_policy, train
    from stellaris.config import TrainConfig

__all__ = ["Policy", "RunResult", "TrainConfig", "TrainingError", "load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name == "TrainConfig":
        from stellaris.config import TrainConfig

        return TrainConfig
    if name in __all__:
        from stellaris import api

        return getattr(api, name)
    raise AttributeError(f"module 'stellaris' has no attribute {name!r}")
