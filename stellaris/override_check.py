"""`overrides:` (YAML and `--set`) checked before anything starts, each problem named as the user wrote it.

This is a local check in the user's process, as stellaris/env_check.py's are: `TrainConfig` builds the typed job
request from the preset and the overrides with the contract's pure functions (contract.jobspec.resolve_algo, then
resolve: the same the parameter function runs on what crosses; no cache, no gateway, no job), so what passes here
passes there. This check imports nothing of the functions, and the control plane (stellaris/round/) reaches them
only through the gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from difflib import get_close_matches

from pydantic import ValidationError

from contract.algo_config import CONFIGS, NetworkConfig, StellarisConfig


def override_problems(build: Callable[[], object], algo: str, *, at: tuple[str, ...] = ("overrides",)) -> str | None:
    """None if `build` (what validates the overrides) succeeds, else one line: `overrides.<field as written>: <what
    is wrong>` (`at`: where the validated fields sit among the user's), each problem once (several joined by '; ')."""
    try:
        build()
    except ValidationError as exc:
        seen: dict[str, None] = {}
        for error in exc.errors():
            where = ".".join([*at, *(str(part) for part in error["loc"])])
            hint = _unknown_field_hint(error["loc"], algo) if error["type"] == "extra_forbidden" else ""
            seen[f"{where}: {error['msg'].removeprefix('Value error, ')}{hint}"] = None
        return "; ".join(seen)
    return None


def _unknown_field_hint(loc: tuple[int | str, ...], algo: str) -> str:
    """For a field no config has where it was written: the algorithms that have it there, and the near spellings
    of fields that exist (e.g. ` (a setting of impact and appo; this job's --algo is ppo)`, ` (did you mean: lr?)`)."""
    name = str(loc[-1])
    nested = {"stellaris": StellarisConfig, "network": NetworkConfig}
    if len(loc) == 1 and algo in CONFIGS:
        owners = [a for a, config in CONFIGS.items() if a != algo and name in config.model_fields]
        fields = [f for f in CONFIGS[algo].model_fields if f != "algo"]
    elif len(loc) == 2 and loc[0] in nested:
        owners, fields = [], list(nested[str(loc[0])].model_fields)
    else:
        return ""
    parts = [f"a setting of {' and '.join(owners)}; this job's --algo is {algo}"] if owners else []
    if close := get_close_matches(name, fields, n=3):
        parts.append(f"did you mean: {', '.join(close)}?")
    return f" ({'; '.join(parts)})" if parts else ""
