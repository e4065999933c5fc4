#!/usr/bin/env bash
# CI's long stage, after `make test` (so that stays under 10 minutes on 2 cores): `make test-long`, the learning
# tests (`slow`: CartPole learned through the gateway and cache, each algorithm) and the tests that start Ray
# clusters (`cluster`, issue 14: the ray backend through a real gateway, `stellaris train --backend ray` learning
# CartPole with learners on the GPU-declaring node of a 2-node loopback cluster, a job that loses that node mid-run).
# Each test stops its own Ray and Redis processes by PID and checks they are gone; this stage checks again, from
# outside, that no Ray or Redis process started during it outlived it. Prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
ours() { # pids of Ray and Redis processes (raylet, gcs_server, ray:: workers, redis-server) on this machine
    pgrep -f 'raylet|gcs_server|ray::|ray/_private/workers|redis-server|ray start' 2>/dev/null | sort -n || true
}
before="$(ours)"
make test-long
# A process stopped by SIGTERM may take a moment to be reaped: wait for it (bounded), then name what is left.
for _ in $(seq 1 30); do
    left="$(comm -13 <(echo "$before") <(ours))"
    [ -z "$left" ] && break
    sleep 1
done
if [ -n "$left" ]; then
    echo "long-stage: Ray/Redis processes outlived the stage:" >&2
    for pid in $left; do echo "  $pid $(tr '\0' ' ' < /proc/"$pid"/cmdline 2>/dev/null)" >&2; done
    exit 1
fi
echo "long-stage: the stage in $((SECONDS - start)) s, no Ray or Redis process left" >&2
