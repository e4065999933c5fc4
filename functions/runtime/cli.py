"""`python -m functions.runtime --handler pkg.mod:func [...]`: one flag per RuntimeSettings field, derived from it
(name, type, help, default), so a default is declared once, in the settings.

Writes exactly one stdout line, `READY <port>`, once it accepts connections (no READY and a non-zero exit when the
settings are invalid, the handler cannot be loaded or the port bound). SIGTERM or SIGINT drains: new calls get 503,
running ones finish within --drain-timeout-s; exit 0, or 1 when a running call had to be abandoned.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import types
import typing
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from contract.runtime_http import READY_PREFIX, RUNTIME_MODULE
from functions.runtime.call_log import configure_logging
from functions.runtime.server import Runtime
from functions.runtime.settings import RuntimeSettings

LOG_LEVEL_ENV = "STELLARIS_LOG_LEVEL"
log = logging.getLogger("stellaris.runtime")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(annotation: Any) -> type:
    """`float` of `float | None`: the type argparse converts a flag's value to."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (inner,) = (a for a in typing.get_args(annotation) if a is not type(None))
        return inner  # type: ignore[no-any-return]
    return annotation  # type: ignore[no-any-return]


def _add_setting(parser: argparse.ArgumentParser, name: str, field: FieldInfo) -> None:
    # SUPPRESS: a flag not given is absent from the namespace, and RuntimeSettings applies its own default.
    kind = _scalar_type(field.annotation)
    help_text = field.description or ""
    if field.is_required():
        parser.add_argument(flag(name), required=True, help=help_text)
    elif kind is bool:
        parser.add_argument(flag(name), action="store_true", default=argparse.SUPPRESS, help=help_text)
    else:
        default = "" if field.default is PydanticUndefined else f" (default: {field.default})"
        parser.add_argument(flag(name), type=kind, default=argparse.SUPPRESS, help=help_text + default)


def parser() -> argparse.ArgumentParser:
    described = argparse.ArgumentParser(
        prog=f"python -m {RUNTIME_MODULE}", description="Serve one function handler over HTTP."
    )
    for name, field in RuntimeSettings.model_fields.items():
        _add_setting(described, name, field)
    described.add_argument(
        "--log-level", default=os.environ.get(LOG_LEVEL_ENV, "INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return described


def _announce_ready(port: int) -> None:
    sys.stdout.write(f"{READY_PREFIX}{port}\n")
    sys.stdout.flush()
    # From here on stdout carries nothing for the spawner: point it at stderr, so that a spawner may stop reading
    # the pipe without a chatty handler's prints filling it and blocking the handler.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = vars(cli.parse_args(argv))
    log_level = args.pop("log_level")
    try:
        settings = RuntimeSettings(**args)
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        cli.error("; ".join(problems).replace("Value error, ", ""))

    configure_logging(log_level)
    try:
        runtime = Runtime(settings)
    except Exception:
        log.exception("cannot load handler %s", settings.handler)
        return 1
    try:
        code = asyncio.run(runtime.run(on_ready=_announce_ready))
    except OSError as exc:  # e.g. the port is taken
        log.error("cannot serve on %s:%d: %s", settings.host, settings.port, exc)
        return 1
    if runtime.abandoned:
        # Abandoned handler threads cannot be killed, and the interpreter would wait for them at exit.
        logging.shutdown()
        os._exit(code)
    return code
