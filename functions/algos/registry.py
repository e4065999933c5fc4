"""The one name table: algorithm name (a config's ``algo`` field) -> its implementation behind the seam. Adding an
algorithm: its config class (``config``), its module (``<name>_algo``), and a row here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from contract.algo_config import AlgoConfig
from functions.algos.algorithm import Algorithm
from functions.algos.appo_algo import APPO
from functions.algos.impact_algo import IMPACT
from functions.algos.ppo_algo import PPO

ALGORITHMS: Mapping[str, Algorithm] = MappingProxyType({a.name: a for a in (PPO, IMPACT, APPO)})


def algorithm_of(cfg: AlgoConfig) -> Algorithm:
    """The implementation of the algorithm `cfg` configures."""
    try:
        return ALGORITHMS[cfg.algo]
    except KeyError:
        raise ValueError(f"no implementation of algorithm {cfg.algo!r}; known: {sorted(ALGORITHMS)}") from None
