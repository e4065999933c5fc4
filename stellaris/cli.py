"""The `stellaris` command line."""

from __future__ import annotations

import typer

app = typer.Typer(help="Stellaris: serverless asynchronous-learner deep RL.", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as dist_version

    typer.echo(dist_version("stellaris"))
