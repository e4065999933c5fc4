"""`python -m gateway [--host H] [--port P]`: settings from STELLARIS_GATEWAY_* and these flags."""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

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
    if settings.fork_server_env is not None and settings.fork_servers > 0:
        from gateway.backends.process.backend import instances_base_env
        from gateway.backends.process.fork_servers import STARTUP_TIMEOUT_S, start_early

        # Before the gateway's own imports: the fork server's import as many again, meanwhile (gateway/service.py
        # would start it only once those are done and Redis is reached). Its environment is the one the process
        # backend will ask for, with the Redis URL the gateway will use (an embedded one's is not known yet).
        redis_url = settings.redis_url or os.environ.get("REDIS_URL")
        base = instances_base_env(os.environ, settings.instance_env_inherit, {}, redis_url)
        start_early(sys.executable, base, settings.fork_server_env, STARTUP_TIMEOUT_S, settings.fork_server_retry_s)
    from gateway.server import serve

    serve(settings, log_level=args.log_level)


if __name__ == "__main__":
    from host.lifetime import quick_exit

    main()
    quick_exit(0)
