#!/bin/bash
# Smoke test of deploy/kuberay/gateway.yaml's pattern on podman, no Kubernetes: a Ray head and a CPU worker
# (declaring cpu_node as the RayCluster's group does) from the Ray node image, and a gateway container running
# gateway.yaml's script verbatim: it joins as a 0-CPU Ray node, serves /healthz, drives an actor placed by
# cpu_node=0.01 on the worker, and on SIGTERM stops the gateway, then its Ray node, exiting 0.
#   bash deploy/smoke/ray-gateway.sh      (root podman; images: RAY_NODE_IMAGE, REDIS_IMAGE; PYTHON with pyyaml)
# Containers run on podman's default bridge network and are removed on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
IMG="${RAY_NODE_IMAGE:-localhost/stellaris/ray-node:0.1.0}"
REDIS_IMG="${REDIS_IMAGE:-localhost/stellaris/redis:bookworm}"
PORT="${SMOKE_PORT:-18765}"
P=stl-smoke-ray-$$
cleanup() { podman rm -f -t 0 "$P-head" "$P-cpu" "$P-gw" "$P-redis" >/dev/null 2>&1 || true; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; podman logs "$P-gw" 2>&1 | tail -20 >&2; exit 1; }

pw=$(openssl rand -hex 16)
podman run -d --name "$P-redis" "$REDIS_IMG" redis-server --requirepass "$pw" >/dev/null
podman run -d --name "$P-head" --shm-size=512m "$IMG" bash -lc 'ray start --head --port=6379 --num-cpus=0 \
    --include-dashboard=false --disable-usage-stats --object-store-memory=100000000 --block' >/dev/null
head_ip=$(podman inspect -f '{{.NetworkSettings.IPAddress}}' "$P-head")
redis_ip=$(podman inspect -f '{{.NetworkSettings.IPAddress}}' "$P-redis")
# The CPU group's rayStartParams resources, quoted as KubeRay pastes them into `ray start` (bash -lc, as KubeRay).
podman run -d --name "$P-cpu" --shm-size=512m "$IMG" bash -lc "ray start --address=$head_ip:6379 --num-cpus=1 \
    --resources=\"{\\\"cpu_node\\\": 1}\" --object-store-memory=100000000 --disable-usage-stats --block" >/dev/null
script=$("$PYTHON" - "$ROOT/deploy/kuberay/gateway.yaml" <<'PY'
import sys, yaml
[deployment] = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "Deployment"]
print(deployment["spec"]["template"]["spec"]["containers"][0]["args"][0])
PY
)
podman run -d --name "$P-gw" --shm-size=512m -p "127.0.0.1:$PORT:8000" \
    -e RAY_HEAD_ADDRESS="$head_ip:6379" -e STELLARIS_GATEWAY_HOST=0.0.0.0 -e STELLARIS_GATEWAY_PORT=8000 \
    -e STELLARIS_GATEWAY_TOKEN=smoke-token -e STELLARIS_GATEWAY_NAMESPACE=smoke -e STELLARIS_GATEWAY_RAY_ADDRESS=auto \
    -e REDIS_URL="redis://:$pw@$redis_ip:6379/0" \
    "$IMG" /bin/bash -c "export POD_IP=\$(hostname -I | awk '{print \$1}'); $script" >/dev/null
for _ in $(seq 120); do
    health=$(curl -sf "http://127.0.0.1:$PORT/healthz" || true)
    [ -n "$health" ] && break
    sleep 1
done
[ -n "$health" ] || fail "the gateway did not answer /healthz"
echo "healthz: $health"
podman exec -i "$P-gw" python - <<'PY' || fail "no actor placed by cpu_node from the gateway's node"
import ray
ray.init(address="auto", namespace="smoke", logging_level="ERROR")

@ray.remote(num_cpus=0, resources={"cpu_node": 0.01})
class Where:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

node = ray.get(Where.remote().node.remote(), timeout=120)
placed = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}[node]
mine = [n["Resources"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ray.util.get_node_ip_address()]
assert placed.get("cpu_node") == 1.0, placed
assert mine and "CPU" not in mine[0] and "GPU" not in mine[0], mine
print("actor on the cpu_node worker; the gateway's node offers", sorted(mine[0]))
PY
podman stop -t 30 "$P-gw" >/dev/null
code=$(podman inspect -f '{{.State.ExitCode}}' "$P-gw")
[ "$code" = 0 ] || fail "the gateway container exited $code on SIGTERM"
echo "OK: SIGTERM stopped the gateway and its Ray node, exit 0"
