"""policy.safetensors, the portable policy of a run: the weights (observation-normaliser statistics included, as
buffers of the state_dict) and, in the safetensors metadata, everything that rebuilds the network without the run.

How the description gets there without the control plane importing functions/ (docs/architecture.md): the functions
side knows
the spaces and the network, so ``functions.model.policies.build_policy`` puts a *card* on every policy it builds
(``ActorCritic.card``: network config, observation and action spaces as JSON), and every policy frame that
``functions.model.serialize.policy_to_bytes`` writes carries the card in its meta. The control plane copies that card,
plus the env and algorithm from the job spec, into the file's metadata (``policy_metadata``); it never decodes a
space or builds a network. ``stellaris.api.load_policy`` reads the file back (``read_policy_file``).

Metadata (all strings, JSON where structured): format, version (the policy version), stellaris (package version),
network, observation_space, action_space, env_id, env_kwargs, env_module, algo, seed.

This module imports neither functions/ nor torch: the control plane writes the file through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

FILE_NAME = "policy.safetensors"
FORMAT = "stellaris-policy/1"
CARD_KEYS = ("network", "observation_space", "action_space")  # from the policy frame's card (the functions side)
REQUIRED_KEYS = (*CARD_KEYS, "env_id", "algo")


class PolicyFileError(ValueError):
    """A policy file that cannot be loaded; the message names the file and what it lacks."""


def _package_version() -> str:
    try:
        return version("stellaris")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "unknown"


def policy_metadata(frame_meta: dict[str, Any], job_spec: dict[str, Any]) -> dict[str, str]:
    """The file's metadata from a policy frame's meta (version, card) and the job's resolved spec (JSON)."""
    card = frame_meta.get("card") or {}
    algo = job_spec.get("algo") or {}
    meta = {
        "format": FORMAT,
        "version": str(frame_meta.get("version", "")),
        "stellaris": _package_version(),
        "env_id": str(job_spec.get("env_id", "")),
        "env_kwargs": json.dumps(job_spec.get("env_kwargs") or {}),
        "env_module": job_spec.get("env_module") or "",
        "algo": str(algo.get("algo", "")) if isinstance(algo, dict) else "",
        "seed": str(job_spec.get("seed", "")),
    }
    meta |= {key: json.dumps(card[key]) for key in CARD_KEYS if key in card}
    return {key: value for key, value in meta.items() if value != ""}


@dataclass(frozen=True)
class PolicyFile:
    """A read policy file: its path, its description (metadata, JSON decoded) and its arrays."""

    path: Path
    card: dict[
        str, Any
    ]  # network, observation_space, action_space: `functions.model.policies.policy_from_card` takes it
    metadata: dict[str, str]
    arrays: dict[str, np.ndarray]

    @property
    def env_id(self) -> str:
        return self.metadata["env_id"]

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return dict(json.loads(self.metadata.get("env_kwargs", "{}")))

    @property
    def env_module(self) -> str | None:
        return self.metadata.get("env_module") or None

    @property
    def algo(self) -> str:
        return self.metadata["algo"]

    @property
    def version(self) -> int | None:
        raw = self.metadata.get("version", "")
        return int(raw) if raw.lstrip("-").isdigit() else None


def policy_path(run_dir_or_file: str | Path) -> Path:
    """The policy file a run directory holds, or the file itself."""
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / FILE_NAME
    if not path.is_file():
        raise PolicyFileError(f"{path} does not exist (give a run directory or its {FILE_NAME})")
    return path


def read_policy_file(run_dir_or_file: str | Path) -> PolicyFile:
    """Reads and checks the file; a PolicyFileError names what is wrong (not a KeyError)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    path = policy_path(run_dir_or_file)
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = dict(f.metadata() or {})
        arrays = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise PolicyFileError(f"{path} is not a safetensors file ({exc})") from exc
    missing = [key for key in REQUIRED_KEYS if key not in metadata]
    if missing:
        raise PolicyFileError(
            f"{path} lacks {', '.join(missing)} in its metadata: it was written before policy files described their "
            "network, so it holds weights only (rebuild the network with functions.model.policies.build_policy from "
            "the run's config.yaml and load_state_dict them, or train again)"
        )
    try:
        card = {key: json.loads(metadata[key]) for key in CARD_KEYS}
    except json.JSONDecodeError as exc:
        raise PolicyFileError(f"{path}: metadata {exc.doc[:60]!r} is not JSON ({exc})") from exc
    return PolicyFile(path=path, card=card, metadata=metadata, arrays=arrays)
