#!/bin/sh
# Entrypoint of the gateway image: wait until Redis at $REDIS_URL answers PING, then run the command (default
# `python -m gateway`). The wait is the gateway's own, so compose needs no healthcheck condition: podman never runs
# healthchecks by itself, and `depends_on: service_started` is enough on Docker and on podman alike. Bounded by
# $STELLARIS_WAIT_REDIS_S (default 60; 0: no wait); no REDIS_URL (an embedded Redis): no wait.
set -eu
if [ -n "${REDIS_URL:-}" ] && [ "${STELLARIS_WAIT_REDIS_S:-60}" != 0 ]; then
    python - <<'PY'
import os
import sys
import time

import redis

url, limit_s = os.environ["REDIS_URL"], float(os.environ.get("STELLARIS_WAIT_REDIS_S", "60"))
deadline = time.monotonic() + limit_s
while True:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
        break
    except redis.AuthenticationError as exc:  # a wrong password never gets better
        sys.exit(f"gateway: Redis refused the password in REDIS_URL: {exc}")
    except redis.RedisError as exc:
        if time.monotonic() > deadline:
            sys.exit(f"gateway: Redis did not answer within {limit_s:g} s: {exc}")
        time.sleep(0.5)
PY
fi
exec "$@"
