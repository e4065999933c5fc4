#!/bin/sh
# Entrypoint of the function images: serve one handler with the function runtime on the container port.
# The handler is $STELLARIS_HANDLER (package.module:function) unless the command passes --handler; arguments
# given as the container's command come last, so they win (the gateway's docker backend passes --port,
# --concurrency and --timeout-s, and --handler when the function spec names a target: runtime_argv in
# contract/runtime_http.py). 8080 is the docker backend's CONTAINER_PORT (gateway/backends/docker/config.py).
set -eu
if [ -n "${STELLARIS_HANDLER:-}" ]; then
    set -- --handler "$STELLARIS_HANDLER" "$@"
fi
exec python -m functions.runtime --host 0.0.0.0 --allow-remote --port "${STELLARIS_PORT:-8080}" "$@"
