"""`stellaris train`'s options, built from TrainConfig's fields, so that `--help` lists every field (config-only
ones included) with its default and description, and a field added to the model is a flag without more code.

A field `name` is the flag `--name` (underscores as dashes); a bool is `--name/--no-name`; a Literal or an enum
(`Rule`) shows its choices as the metavar; a mapping takes JSON (the `*_resources` fields `name=amount,...` too).
Every flag defaults to None, so that an unset flag leaves the YAML file's value or the model's default. The values
are checked by TrainConfig, which names the field. Besides the fields: `--config`, `--resume` and `--set key=value`
(repeatable; into `overrides`).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

import typer
import yaml
from pydantic.fields import FieldInfo

from contract.knobs import StellarisKnobs
from stellaris.config import ConfigError, TrainConfig

# Options that are no field: what `train` does with the fields rather than a value of one.
EXTRA_OPTIONS: dict[str, Any] = {
    "config": typer.Option(None, "--config", help="YAML file with these fields (a flag given beats it)"),
    "resume": typer.Option(None, "--resume", help="continue the run in this directory (its config.yaml is the file)"),
    "sets": typer.Option(
        None,
        "--set",
        metavar="KEY=VALUE",
        help="an algorithm field over the preset, e.g. --set lr=1e-4 --set stellaris.d=0.9 --set "
        "network.hidden=[64,64] (repeatable; VALUE is YAML; a dotted KEY nests into overrides; beats the file's)",
    ),
}
EXTRA_TYPES: dict[str, Any] = {"config": Path | None, "resume": Path | None, "sets": list[str] | None}
# `--help` in panels, essentials first (in this order); a field no panel names goes to the last, "More".
PANELS: dict[str, tuple[str, ...]] = {
    "Essentials": (
        "env",
        "algo",
        "preset",
        "mode",
        "total_steps",
        "rounds",
        "max_minutes",
        "seed",
        "out",
        "resume",
        "config",
    ),
    "Environment": ("env_module", "env_kwargs"),
    "Algorithm and the paper's knobs": (
        "sets",
        "overrides",
        "d",
        "v",
        "rho",
        "truncation",
        "softsync_k",
        "ssp_bound",
        "learner_schedule",
        "distribution",
    ),
    "Actors and learners": (
        "actors",
        "actor_kind",
        "envs_per_actor",
        "actor_run_ahead",
        "actor_policy_refresh",
        "learners",
        "standby",
        "torch_threads",
    ),
    "Elastic actors and triggers": (
        "elastic_actors",
        "min_actors",
        "max_actors",
        "elastic_window",
        "elastic_lambda",
        "triggers",
    ),
    "Evaluation": ("eval_every", "eval_episodes", "eval_max_episode_steps"),
    "Where it runs": (
        "backend",
        "device",
        "image",
        "learner_image",
        "parameter_image",
        "actor_image",
        "learner_gpus",
        "parameter_gpus",
        "ray_address",
        "learner_resources",
        "parameter_resources",
        "actor_resources",
        "redis_url",
        "gateway_url",
        "gateway_token",
        "billing",
    ),
}
MORE = "More"


def panel_of(name: str) -> str:
    return next((panel for panel, names in PANELS.items() if name in names), MORE)


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")  # YAML 1.1 reads 1e-4 as a string


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        args = [arg for arg in get_args(annotation) if arg is not NoneType]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _default(field: FieldInfo) -> Any:
    return field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]


def choices(kind: Any) -> list[str]:
    """The values a Literal or an enum (`Rule`) field takes, as written in YAML; none for another type."""
    if get_origin(kind) is Literal:
        return [str(c) for c in get_args(kind)]
    if isinstance(kind, type) and issubclass(kind, Enum):
        return [str(member.value) for member in kind]
    return []


def field_option(name: str, field: FieldInfo) -> tuple[Any, Any]:
    """The (annotation, typer.Option) of a field's flag; its help is the description with the default."""
    kind = _without_none(field.annotation)
    help_text = field.description or ""
    default = _default(field)
    shown = "none" if default is None else json.dumps(default) if isinstance(default, dict) else default
    help_text += f" (default {shown})"
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    envvar = extra.get("envvar")
    if kind is bool:
        return bool | None, typer.Option(
            None, f"{flag(name)}/--no-{flag(name)[2:]}", help=help_text, show_default=False
        )
    if get_origin(kind) is dict:
        metavar = "JSON|NAME=AMOUNT,..." if name.endswith("_resources") else "JSON"
        return str | None, typer.Option(None, flag(name), help=help_text, show_default=False, metavar=metavar)
    if kind in (int, float, Path):
        return kind | None, typer.Option(None, flag(name), help=help_text, show_default=False, envvar=envvar)
    metavar = "|".join(str(c) for c in choices(kind)) or None
    return str | None, typer.Option(
        None,
        flag(name),
        help=help_text,
        show_default=False,
        envvar=envvar,
        metavar=metavar,  # type: ignore[arg-type]
    )


def field_order() -> list[str]:
    """TrainConfig's fields in declaration order, the inherited knobs right after `mode` (the rule) rather than
    first."""
    knobs = [name for name in StellarisKnobs.model_fields if name in TrainConfig.model_fields]
    own = [name for name in TrainConfig.model_fields if name not in knobs]
    at = own.index("mode") + 1 if "mode" in own else len(own)
    return own[:at] + knobs + own[at:]


def train_signature() -> inspect.Signature:
    """`train`'s parameters: the extra options and each TrainConfig field (`field_order`), panel by panel (`PANELS`:
    typer shows the panels in the order their first option comes)."""
    options = {name: (EXTRA_TYPES[name], option) for name, option in EXTRA_OPTIONS.items()}
    options |= {name: field_option(name, TrainConfig.model_fields[name]) for name in field_order()}
    order = [
        *(n for names in PANELS.values() for n in names if n in options),
        *(n for n in options if panel_of(n) == MORE),
    ]
    params = []
    for name in order:
        annotation, option = options[name]
        option.rich_help_panel = panel_of(name)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return inspect.Signature(params, return_annotation=None)


def with_train_signature(body: Callable[..., None]) -> Callable[..., None]:
    """`body(**given)` with the generated signature, which typer reads to build the options."""
    body.__signature__ = train_signature()  # type: ignore[attr-defined]
    body.__annotations__ = {}
    return body


def field_values(given: dict[str, Any]) -> dict[str, Any]:
    """The given flags (None: not given) as field values: mappings parsed, each error naming its flag."""
    values = dict(given)
    for name, field in TrainConfig.model_fields.items():
        text = values.get(name)
        if text is None or get_origin(_without_none(field.annotation)) is not dict or name == "env_kwargs":
            continue  # env_kwargs: TrainConfig parses its JSON and names what is wrong
        values[name] = resources(flag(name), text) if name.endswith("_resources") else _json_object(flag(name), text)
    return values


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: {text!r} is not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{option}: {text!r} is not a JSON object")
    return value


def resources(option: str, text: str) -> dict[str, float]:
    """A JSON object or `name=amount[,name=amount]` as a mapping; raises ConfigError naming the flag and the bad
    part."""
    if text.lstrip().startswith("{"):
        return _json_object(option, text)
    amounts: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, amount = part.partition("=")
        try:
            amounts[name.strip()] = float(amount)
        except ValueError as exc:  # no '=' leaves amount empty: an error too
            raise ConfigError(f"{option}: {part!r} is not name=amount (e.g. gpu_node=0.01)") from exc
    return amounts


def parsed_sets(sets: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE`s as nested overrides (a dotted KEY nests; a later one wins); raises ConfigError naming the
    bad one."""
    nested: dict[str, Any] = {}
    for given in sets:
        key, equals, text = given.partition("=")
        if not equals:
            raise ConfigError(f"--set {given!r} is not KEY=VALUE (e.g. --set lr=1e-4)")
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"--set {given!r} has an empty key or key part (e.g. --set stellaris.d=0.9)")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {given!r}: the value is not YAML ({' '.join(str(exc).split())})") from exc
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value)
        node = nested
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {given!r}: {'.'.join(parts[: depth + 1])} is set to a value, not fields")
        node[parts[-1]] = value
    return nested
