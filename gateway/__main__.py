"""`python -m gateway [--host H] [--port P]`: settings from STELLARIS_GATEWAY_* and these flags."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from gateway.server import serve
from gateway.settings import GatewaySettings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway", description="Run the Stellaris gateway.")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = GatewaySettings(**overrides)
    except ValidationError as exc:
        parser.exit(2, f"invalid gateway settings: {exc}\n")
    serve(settings, log_level=args.log_level)


if __name__ == "__main__":
    from cache.lifetime import quick_exit

    main()
    quick_exit(0)
