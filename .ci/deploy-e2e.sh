#!/usr/bin/env bash
# CI's deployment stage, after `make test` (so that stays fast): build the CPU function, gateway and Redis images
# from a local Debian base (docker/build-local.sh: no registry), then tests/deploy/, which brings compose.yaml up on
# podman's Docker API, trains CartPole with `stellaris train --backend docker` against it, and takes it down.
# Reuses .ci/podman-setup.sh's service (started here when .ci/run has not). Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
exports="$(bash .ci/podman-setup.sh)"
eval "$exports" # DOCKER_HOST (podman's Docker API), STELLARIS_REQUIRE_DOCKER=1
if [ "${STELLARIS_PODMAN_OWNER:-}" != ci-run ]; then
    trap 'bash .ci/podman-setup.sh --stop >/dev/null 2>&1 || true' EXIT
fi
bash docker/build-local.sh base redis function-cpu gateway
echo "deploy-e2e: images built in $((SECONDS - start)) s" >&2
export STELLARIS_DEPLOY_E2E=1 STELLARIS_REDIS_IMAGE=localhost/stellaris/redis:bookworm
tests=$SECONDS
.venv/bin/pytest -p no:cacheprovider -p no:xdist -s -ra tests/deploy
echo "deploy-e2e: tests in $((SECONDS - tests)) s; the stage in $((SECONDS - start)) s" >&2
