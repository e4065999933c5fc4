#!/bin/bash
# Smoke test of deploy/kuberay/redis-cluster.yaml on podman, no Kubernetes: its redis.conf and scripts (taken from
# the ConfigMap) on 6 nodes with the DNS names the headless Service gives them, its create Job (twice: the second
# finds the cluster), a cluster client with `{job}`-tagged keys, Lua and streams; then all 6 nodes restarted at NEW
# addresses with their data: resolve-nodes-conf.sh must bring the cluster back with every key.
#   bash deploy/smoke/redis-cluster.sh    (root podman; REDIS_IMAGE: Redis >= 7 with redis-cli and getent;
#                                          RAY_NODE_IMAGE for the client (redis-py); PYTHON with pyyaml)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
IMG="${REDIS_IMAGE:-localhost/stellaris/redis:bookworm}"
CLIENT_IMG="${RAY_NODE_IMAGE:-localhost/stellaris/ray-node:0.1.0}"
SUBNET="${SMOKE_SUBNET:-10.89.77}" # a /24 of its own: node addresses are fixed so that they can change
NET=stl-smoke-redis-$$
P=$NET
WORK=$(mktemp -d /tmp/stl-smoke-redis.XXXXXX)
cleanup() {
    for i in 0 1 2 3 4 5; do podman rm -f -t 0 "$P-$i" >/dev/null 2>&1 || true; done
    podman rm -f -t 0 "$P-create" >/dev/null 2>&1 || true
    podman network rm "$NET" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

podman network create --subnet "$SUBNET.0/24" "$NET" >/dev/null
mkdir -p "$WORK/etc" && chmod 777 "$WORK"
"$PYTHON" - "$ROOT/deploy/kuberay/redis-cluster.yaml" "$WORK/etc" <<'PY'
import pathlib, sys, yaml
[cm] = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "ConfigMap"]
for name, text in cm["data"].items():
    pathlib.Path(sys.argv[2], name).write_text(text)
PY
pw=$(openssl rand -hex 16)
hosts=()
start_nodes() { # start_nodes BASE: node i at $SUBNET.(BASE+i); every node name maps to this round's addresses
    local base=$1 i
    hosts=(--add-host "stellaris-redis:$SUBNET.$base")
    for i in 0 1 2 3 4 5; do hosts+=(--add-host "stellaris-redis-$i.stellaris-redis:$SUBNET.$((base + i))"); done
    for i in 0 1 2 3 4 5; do
        mkdir -p "$WORK/data$i" && chmod 777 "$WORK/data$i"
        podman run -d --name "$P-$i" --network "$NET" --ip "$SUBNET.$((base + i))" "${hosts[@]}" \
            -e REDISCLI_AUTH="$pw" -e POD_NAME="stellaris-redis-$i" -e POD_IP="$SUBNET.$((base + i))" \
            -v "$WORK/etc:/etc/redis:ro" -v "$WORK/data$i:/data" "$IMG" sh /etc/redis/start.sh >/dev/null
    done
}
create() {
    podman run --rm --name "$P-create" --network "$NET" "${hosts[@]}" -e REDISCLI_AUTH="$pw" -e REDIS_NODES=6 \
        -e REDIS_REPLICAS=1 -v "$WORK/etc:/etc/redis:ro" "$IMG" sh /etc/redis/create-cluster.sh 2>/dev/null
}
client() { # client PYTHON-CODE: run with `c`, a RedisCluster client on the seed name
    podman run --rm --network "$NET" "${hosts[@]}" -e PW="$pw" "$CLIENT_IMG" python -c "
import os, redis.cluster
c = redis.cluster.RedisCluster.from_url('redis://:' + os.environ['PW'] + '@stellaris-redis:6379')
$1"
}

start_nodes 10
create | tail -1
create | grep -q "the cluster exists" || fail "a second create Job did not find the cluster"
client "
hosts = sorted(n.host for n in c.get_nodes())
assert all(h.endswith('.stellaris-redis') for h in hosts), hosts  # hostname endpoints, not pod IPs
for job in 'abcdefgh':
    c.set('stl:{%s}:x' % job, job)
    c.xadd('stl:{%s}:s' % job, {'v': job})
    got = c.eval('return redis.call(\"GET\", KEYS[1]) .. redis.call(\"XLEN\", KEYS[2])', 2,
                 'stl:{%s}:x' % job, 'stl:{%s}:s' % job)
    assert got == (job + '1').encode(), got
print('8 jobs: keys, streams and Lua on', len(hosts), 'nodes')
" || fail "the cluster client failed"

for i in 0 1 2 3 4 5; do podman rm -f -t 5 "$P-$i" >/dev/null; done
start_nodes 20
for _ in $(seq 60); do
    state=$(podman exec -e REDISCLI_AUTH="$pw" "$P-0" redis-cli cluster info 2>/dev/null | tr -d '\r' | grep cluster_state || true)
    linked=$(podman exec -e REDISCLI_AUTH="$pw" "$P-0" redis-cli cluster nodes 2>/dev/null | grep -c " connected" || true)
    [ "$state" = "cluster_state:ok" ] && [ "$linked" = 6 ] && break
    sleep 1
done
[ "$state" = "cluster_state:ok" ] && [ "$linked" = 6 ] || fail "after new addresses: $state, $linked nodes linked"
podman exec -e REDISCLI_AUTH="$pw" "$P-0" redis-cli cluster nodes | grep -q "$SUBNET.1[0-5]:" &&
    fail "a node still has an old address"
client "
assert [c.get('stl:{%s}:x' % j) for j in 'abcdefgh'] == [j.encode() for j in 'abcdefgh']
print('all 6 nodes at new addresses: cluster ok, every key kept')
" || fail "keys lost across the restart"
echo OK
