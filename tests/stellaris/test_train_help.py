"""`stellaris train --help` is built from TrainConfig: every field a flag, with its default and its description;
and no help text nor the README points at a document the repository does not ship."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import Field
from pydantic.fields import FieldInfo
from typer.testing import CliRunner

from stellaris.cli import app
from stellaris.config import TrainConfig
from stellaris.train_options import EXTRA_OPTIONS, field_option, flag

ROOT = Path(__file__).resolve().parents[2]
# The flags `stellaris train` had before they were generated: tests and scripts use these spellings.
KEPT_FLAGS = [
    "--env",
    "--env-module",
    "--env-kwargs",
    "--rounds",
    "--total-steps",
    "--max-minutes",
    "--actors",
    "--actor-kind",
    "--envs-per-actor",
    "--learners",
    "--mode",
    "--d",
    "--v",
    "--rho",
    "--truncation",
    "--no-truncation",
    "--softsync-k",
    "--ssp-bound",
    "--billing",
    "--seed",
    "--out",
    "--redis-url",
    "--gateway-url",
    "--gateway-token",
    "--resume",
    "--backend",
    "--image",
    "--learner-image",
    "--parameter-image",
    "--actor-image",
    "--learner-gpus",
    "--parameter-gpus",
    "--device",
    "--ray-address",
    "--learner-resources",
    "--parameter-resources",
    "--actor-resources",
    "--config",
    "--algo",
    "--preset",
    "--set",
]


def _commands() -> dict[str, Any]:
    """The click commands of `stellaris` (typer's vendored click: compared by attribute, not by class)."""
    commands: dict[str, Any] = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    return commands


def _shown_default(field: FieldInfo) -> str:
    default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    return "none" if default is None else "{}" if default == {} else str(default)


def test_every_field_is_a_flag_with_its_description_and_default() -> None:
    params = {param.name: param for param in _commands()["train"].params if param.param_type_name == "option"}
    assert set(params) == set(TrainConfig.model_fields) | set(EXTRA_OPTIONS)  # derived: no more, no fewer
    for name, field in TrainConfig.model_fields.items():
        option = params[name]
        assert field.description, f"TrainConfig.{name} has no description"
        assert flag(name) in option.opts, (name, option.opts)
        assert option.help == f"{field.description} (default {_shown_default(field)})", option.help
    assert params["truncation"].secondary_opts == ["--no-truncation"]
    assert [params[n].envvar for n in ("redis_url", "gateway_url", "gateway_token")] == [
        "REDIS_URL",
        "STELLARIS_GATEWAY_URL",
        "STELLARIS_GATEWAY_TOKEN",
    ]


def test_a_new_field_becomes_a_flag_without_more_code() -> None:
    field = FieldInfo.from_annotated_attribute(int, Field(default=7, ge=1, description="a field added later"))
    annotation, option = field_option("added_later", field)
    assert option.param_decls == ("--added-later",) and option.help == "a field added later (default 7)"
    assert annotation == int | None and option.default is None  # unset: the file's value or the model's default


def test_the_help_shows_every_flag_and_default_and_the_old_spellings() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for name, field in TrainConfig.model_fields.items():
        assert flag(name) in text and f"{field.description} (default {_shown_default(field)})" in text, name
    for kept in KEPT_FLAGS:
        assert re.search(rf"(?<![\w-]){re.escape(kept)}(?![\w-])", text), kept


def _helps() -> list[tuple[str, str]]:
    """(command, text) for `stellaris --help` and every subcommand's --help."""
    runner = CliRunner()
    helps = [("stellaris", runner.invoke(app, ["--help"], env={"COLUMNS": "400"}).output)]
    helps += [(name, runner.invoke(app, [name, "--help"], env={"COLUMNS": "400"}).output) for name in _commands()]
    return helps


@pytest.mark.parametrize("source", ["help", "README.md"])
def test_no_pointer_to_a_document_the_repository_does_not_ship(source: str) -> None:
    """The design document lives outside the repository: help texts and the README state the facts instead."""
    texts = _helps() if source == "help" else [("README.md", (ROOT / "README.md").read_text())]
    assert len(texts) > 5 or source == "README.md"
    for where, text in texts:
        assert "Usage" in text or where == "README.md", text
        # The design document and the papers (seeds/) are not shipped; a paper's table is cited by what it holds
        unshipped = re.compile(r"\bSPEC\b|\bseeds/|\bTable [IVX]+\b")
        assert not unshipped.search(text), (where, [ln for ln in text.splitlines() if unshipped.search(ln)])


def test_the_first_panel_holds_the_essentials_and_fits_a_screen() -> None:
    """At 80 columns, everything from the top of `--help` to the end of its Essentials panel fits 50 lines, and the
    panel holds what a first run needs; every other flag is in a later panel."""
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    top = next(i for i, line in enumerate(lines) if "Essentials" in line)
    end = next(i for i in range(top, len(lines)) if lines[i].startswith("╰"))
    assert end + 1 <= 50, f"the Essentials panel ends on line {end + 1} at 80 columns"
    panel = "\n".join(lines[top:end])
    for essential in ("--env ", "--algo", "--preset", "--mode", "--total-steps", "--seed", "--out", "--resume"):
        assert essential in panel
    assert "--redis-url" not in panel and "--d " not in panel
    assert all(f in result.output for f in ("Where it runs", "Algorithm and the paper's knobs", "Actors and learners"))
