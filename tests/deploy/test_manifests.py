"""deploy/ without a cluster: every YAML under it parses, and the fields the code relies on match the code.

No network, no cluster: `kubectl apply --dry-run=client` needs an API server even to read a manifest (discovery),
so these tests read the manifests themselves. They check what a deployment depends on and a refactor can break:
the Ray version (RayCluster, images, `ray up`), the placement resources (gpu_node / cpu_node, GPU limits), every
STELLARIS_GATEWAY_* value against GatewaySettings, the REDIS_URL schemes the cache accepts, the probe path against
the gateway's routes, ports and service names end to end, the Secrets' keys, the train Job's flags against `stellaris
train`, and the `ray up` config against Ray's own schema (ray up's prepare_config + validate_config). Where the
optional `kubernetes_validate` package is installed, the Kubernetes objects are also checked against the
Kubernetes JSON schemas (strict: an unknown field fails).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fastapi.routing import APIRoute

from gateway.api.routes import docs, functions, invoke, system
from gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERAY = DEPLOY / "kuberay"
RAY_UP = DEPLOY / "ray" / "cluster.yaml"
RAY_VERSION = importlib.metadata.version("ray")
# The schemes cache/ accepts (redis+cluster: a Redis Cluster client); each must appear in cache/'s source.
CACHE_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")
GPU_RESOURCE, CPU_RESOURCE = "gpu_node", "cpu_node"
# What `ray up`'s placeholders are filled with here (deploy/README.md fills them with envsubst).
RAY_UP_PLACEHOLDERS = {
    "STELLARIS_AMI": "ami-0123456789abcdef0",
    "STELLARIS_REGISTRY": "123456789012.dkr.ecr.us-west-2.amazonaws.com",
    "STELLARIS_INSTANCE_PROFILE_ARN": "arn:aws:iam::123456789012:instance-profile/stellaris-ray",
}


def yaml_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml"))


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects(*names: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of deploy/kuberay/ (all files but kustomization.yaml, or the files named)."""
    files = [KUBERAY / n for n in names] if names else sorted(KUBERAY.glob("*.yaml"))
    return [doc for f in files if f.name != "kustomization.yaml" for doc in load(f)]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and (name is None or o["metadata"].get("name") == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in deploy/kuberay, found {len(found)}"
    return found[0]


def containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of a Deployment, StatefulSet, Job or RayCluster (head and worker groups)."""
    spec = obj["spec"]
    if obj["kind"] == "RayCluster":
        templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    else:
        templates = [spec["template"]]
    for template in templates:
        yield from template["spec"]["containers"]


def env_of(container: dict[str, Any], placeholders: dict[tuple[str, str], str] | None = None) -> dict[str, str]:
    """A container's environment as the kubelet makes it: secretKeyRefs become placeholder values (by secret and
    key), fieldRefs a marker, and $(VAR) references to earlier variables are expanded."""
    placeholders = placeholders or {}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = placeholders.get((ref["name"], ref["key"]), f"{ref['name']}-{ref['key']}-placeholder")
        else:
            env[var["name"]] = "<fieldRef>"
    return env


def gateway_env(assignments: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in assignments.items() if k.startswith("STELLARIS_GATEWAY_")}


def validate_gateway_settings(assignments: dict[str, str], where: str) -> GatewaySettings:
    """Every STELLARIS_GATEWAY_* assignment names a GatewaySettings field and the whole set validates."""
    values = {}
    for name, value in gateway_env(assignments).items():
        field = name.removeprefix("STELLARIS_GATEWAY_").lower()
        assert field in GatewaySettings.model_fields, f"{where}: {name} is not a gateway setting (gateway/settings.py)"
        values[field] = value
    # Only these values: not this machine's environment (GatewaySettings also reads STELLARIS_GATEWAY_* from it).
    settings = GatewaySettings.model_validate(values)
    return settings


def redis_urls(env: dict[str, str]) -> list[str]:
    return [v for k, v in env.items() if k == "REDIS_URL"]


# -- every file -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_under_deploy_parses(path: Path) -> None:
    docs_ = load(path)
    assert docs_, f"{path} holds no document"
    if path.parent == KUBERAY and path.name != "kustomization.yaml":
        for doc in docs_:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path}: {doc.get('kind')} lacks a header"
            meta = doc["metadata"]
            assert meta.get("name") or meta.get("generateName"), f"{path}: a {doc['kind']} without a name"


def test_kustomization_lists_every_manifest_but_the_per_run_and_example_files() -> None:
    [kustomization] = load(KUBERAY / "kustomization.yaml")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in KUBERAY.glob("*.yaml")} - {
        "kustomization.yaml",
        "train-job.yaml",
        "secrets.example.yaml",
    }
    assert listed == on_disk, f"kustomization.yaml lists {sorted(listed)}, deploy/kuberay holds {sorted(on_disk)}"
    images = {i["name"] for i in kustomization["images"]}
    workloads = [
        o for o in k8s_objects(*sorted(listed)) if o["kind"] in {"RayCluster", "Deployment", "StatefulSet", "Job"}
    ]
    used = {c["image"].rsplit(":", 1)[0] for o in workloads for c in containers(o)}
    project_images = {i for i in used if i.startswith("stellaris/")}
    assert project_images <= images, f"images without a kustomization override: {sorted(project_images - images)}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl on PATH")
def test_kustomize_renders_offline() -> None:
    """`kubectl kustomize` needs no API server (unlike `kubectl apply --dry-run=client`): what `apply -k` sends."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(KUBERAY)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert all(d["metadata"].get("namespace") == "stellaris" for d in rendered)
    assert {d["kind"] for d in rendered} >= {"RayCluster", "Deployment", "Service", "StatefulSet", "Job", "ConfigMap"}


# -- Ray versions and placement ---------------------------------------------------------------------------------


def test_ray_version_is_the_installed_one_everywhere() -> None:
    cluster = one("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["spec"]["rayVersion"] == RAY_VERSION, "RayCluster rayVersion != the installed ray"
    dockerfile = (ROOT / "docker" / "Dockerfile.ray-node").read_text()
    pins = re.findall(r"ray(?:\[[a-z,]+\])?==([0-9.]+)", dockerfile)
    assert pins and set(pins) == {RAY_VERSION}, f"docker/Dockerfile.ray-node pins ray {pins}, installed {RAY_VERSION}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"ray=={RAY_VERSION}"' in pyproject, "pyproject's ray extra pins another ray"
    # One image family on every Ray node and on the gateway, which joins the cluster as a node.
    head_image = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    for obj in (cluster, one("Deployment", "stellaris-gateway")):
        for c in containers(obj):
            assert c["image"].rsplit(":", 1)[0] in {"stellaris/ray-node", "stellaris/ray-node-gpu"}, c["image"]
            assert c["image"].rsplit(":", 1)[1] == head_image.rsplit(":", 1)[1], "ray node images of two tags"


def ray_start_resources(params: dict[str, str]) -> dict[str, float]:
    """rayStartParams' `resources`: JSON as one double-quoted shell word (KubeRay pastes it into `ray start`), so
    its inner quotes are backslash-escaped."""
    raw = params.get("resources")
    if raw is None:
        return {}
    assert raw.startswith('"') and raw.endswith('"'), f"resources must be a quoted JSON string, got {raw!r}"
    return json.loads(raw[1:-1].replace('\\"', '"'))


def worker_groups() -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in one("RayCluster")["spec"]["workerGroupSpecs"]}


def group_declaring(resource: str) -> dict[str, Any]:
    found = [g for g in worker_groups().values() if resource in ray_start_resources(g["rayStartParams"])]
    assert len(found) == 1, f"expected one worker group declaring {resource}, found {len(found)}"
    return found[0]


def test_gpu_and_cpu_groups_declare_their_placement_resources() -> None:
    gpu, cpu = group_declaring(GPU_RESOURCE), group_declaring(CPU_RESOURCE)
    assert gpu is not cpu
    [gpu_container] = gpu["template"]["spec"]["containers"]
    limits = gpu_container["resources"]["limits"]
    assert int(limits.get("nvidia.com/gpu", 0)) >= 1, "the gpu_node group has no nvidia.com/gpu limit"
    assert gpu_container["image"].startswith("stellaris/ray-node-gpu:"), "GPU workers need the CUDA image"
    for c in cpu["template"]["spec"]["containers"]:
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {}), "the cpu_node group asks for a GPU"
    head = one("RayCluster")["spec"]["headGroupSpec"]
    assert head["rayStartParams"].get("num-cpus") == "0", "actors must not land on the head"
    assert not ray_start_resources(head["rayStartParams"]).keys() & {GPU_RESOURCE, CPU_RESOURCE}
    for group in worker_groups().values():
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]


# -- the gateway ----------------------------------------------------------------------------------------------------


def gateway_container() -> dict[str, Any]:
    [c] = containers(one("Deployment", "stellaris-gateway"))
    return c


def test_gateway_env_is_valid_gateway_settings() -> None:
    env = env_of(gateway_container(), {("stellaris-gateway", "invoke-token"): "an-invoke-only-token"})
    settings = validate_gateway_settings(env, "deploy/kuberay/gateway.yaml")
    assert settings.backend == "ray", "the deployed gateway's default backend must be ray"
    assert settings.ray_address == "auto", "the gateway joins the Ray node its pod starts"
    assert settings.token, "a gateway on a pod address needs its token"


def gateway_get_routes() -> set[str]:
    return {
        r.path
        for module in (docs, functions, invoke, system)
        for r in module.router.routes
        if isinstance(r, APIRoute) and "GET" in r.methods
    }


def test_gateway_probes_and_ports_match_the_gateway() -> None:
    container = gateway_container()
    routes = gateway_get_routes()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(container)
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes, f"{probe} path {get['path']} is no GET route of the gateway"
        assert get["path"] == "/healthz", "only /healthz answers without the token"
        assert ports[get["port"]] == int(env["STELLARIS_GATEWAY_PORT"]), f"{probe} port != STELLARIS_GATEWAY_PORT"
    service = one("Service", "stellaris-gateway")
    assert service["spec"]["selector"].items() <= one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in ports, "the gateway Service targets no port of the gateway container"
    # The gateway joins the head through KubeRay's head Service (<cluster name>-head-svc) on the GCS port.
    cluster = one("RayCluster")
    host, _, gcs_port = env["RAY_HEAD_ADDRESS"].partition(":")
    assert host == f"{cluster['metadata']['name']}-head-svc"
    head_ports = {
        p["containerPort"] for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert int(gcs_port) in head_ports
    assert "--num-cpus=0" in container["args"][0] and "--num-gpus=0" in container["args"][0]
    assert "python -m gateway" in container["args"][0]


# -- the cache --------------------------------------------------------------------------------------------------


def test_cache_accepts_the_schemes_checked_here() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "cache").rglob("*.py"))
    for scheme in CACHE_SCHEMES:
        assert f'"{scheme}' in source or f"'{scheme}" in source, f"cache/ does not handle {scheme}://"


def all_redis_urls() -> list[tuple[str, str]]:
    found = []
    for obj in k8s_objects():
        if obj["kind"] in {"Deployment", "StatefulSet", "Job"}:
            for c in containers(obj):
                found += [
                    (obj["metadata"].get("name") or obj["metadata"]["generateName"], u) for u in redis_urls(env_of(c))
                ]
    return found


def test_redis_urls_use_cache_schemes_and_reach_the_redis_service() -> None:
    from cache import connection

    urls = all_redis_urls()
    assert {name for name, _ in urls} >= {"stellaris-gateway", "stellaris-train-"}, "who sets REDIS_URL changed"
    service = one("Service", "stellaris-redis")
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    for name, url in urls:
        parts = urlsplit(url)
        assert parts.scheme in CACHE_SCHEMES, f"{name}: REDIS_URL scheme {parts.scheme!r} is not one the cache takes"
        assert parts.scheme.endswith("+cluster"), f"{name}: the StatefulSet is a Redis Cluster: use redis+cluster://"
        schemes = getattr(connection, "SCHEMES", None)  # the cache's own list, where it keeps one
        assert schemes is None or url.startswith(tuple(schemes)), f"{name}: cache/connection.py refuses {url}"
        assert parts.hostname == service["metadata"]["name"] and parts.port in service_ports, f"{name}: {url}"
        assert parts.password == "stellaris-redis-password-placeholder", f"{name}: the password is not the Secret's"


def test_redis_cluster_sizes_agree() -> None:
    statefulset, job = one("StatefulSet", "stellaris-redis"), one("Job", "stellaris-redis-cluster-create")
    [create] = containers(job)
    env = env_of(create)
    nodes, replicas = int(env["REDIS_NODES"]), int(env["REDIS_REPLICAS"])
    assert nodes == statefulset["spec"]["replicas"], "the create Job waits for another number of nodes"
    assert nodes % (1 + replicas) == 0 and nodes // (1 + replicas) >= 3, "a Redis Cluster needs >= 3 masters"
    conf = one("ConfigMap", "stellaris-redis")["data"]["redis.conf"]
    for line in ("cluster-enabled yes", "appendonly yes", "maxmemory-policy noeviction"):
        assert line in conf
    [redis] = containers(statefulset)
    assert {p["name"] for p in redis["ports"]} >= {
        p["targetPort"] for p in one("Service", "stellaris-redis")["spec"]["ports"]
    }


def test_resolve_nodes_conf_rewrites_addresses_by_hostname(tmp_path: Path) -> None:
    """The shipped script, run: a peer whose announced hostname resolves gets its current address; lines without a
    hostname (and the vars line) stay as they were."""
    script = tmp_path / "resolve.sh"
    script.write_text(one("ConfigMap", "stellaris-redis")["data"]["resolve-nodes-conf.sh"])
    conf = tmp_path / "nodes.conf"
    lines = [  # as Redis 7.2 writes them: hostname, then aux fields
        "a1 10.0.0.9:6379@16379,localhost,tls-port=0,shard-id=f0 myself,master - 0 0 1 connected 0-5460",
        "b2 10.0.0.8:6379@16379,,tls-port=0,shard-id=f1 master - 0 1700000000000 2 connected 5461-10922",
        "c3 10.0.0.7:6379@16379 master - 0 1700000000000 3 connected 10923-16383",
        "vars currentEpoch 3 lastVoteEpoch 0",
    ]
    conf.write_text("\n".join(lines) + "\n")
    subprocess.run(["sh", str(script), str(conf)], check=True, timeout=30)
    rewritten = conf.read_text().splitlines()
    assert rewritten[0].startswith("a1 127.0.0.1:6379@16379,localhost,tls-port=0,shard-id=f0 myself")
    assert rewritten[1:] == lines[1:]
    subprocess.run(["sh", str(script), str(tmp_path / "absent.conf")], check=True, timeout=30)  # first start


# -- secrets and the train Job --------------------------------------------------------------------------------


def test_every_secret_reference_is_a_documented_key() -> None:
    documented = {(s["metadata"]["name"], k) for s in k8s_objects("secrets.example.yaml") for k in s["stringData"]}
    for obj in k8s_objects():
        if obj["kind"] in {"Deployment", "StatefulSet", "Job", "RayCluster"}:
            for c in containers(obj):
                for var in c.get("env", []):
                    ref = var.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert (ref["name"], ref["key"]) in documented, f"{var['name']}: secret {ref} undocumented"


def train_options() -> dict[str, Any]:
    """`stellaris train`'s options by flag."""
    import typer.main

    from stellaris.cli import app

    command = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    return {opt: p for p in command.params for opt in p.opts}


def test_train_job_flags_are_train_options_and_place_by_the_groups_resources() -> None:
    [job] = k8s_objects("train-job.yaml")
    [c] = containers(job)
    assert c["command"] == ["stellaris", "train"]
    options = train_options()
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in c["args"])
    unknown = sorted(f"--{f}" for f in flags if f"--{f}" not in options)
    assert not unknown, f"train-job.yaml passes flags `stellaris train` lacks: {unknown}"
    assert flags["backend"] == "ray"
    for flag, resource in (
        ("learner-resources", GPU_RESOURCE),
        ("parameter-resources", GPU_RESOURCE),
        ("actor-resources", CPU_RESOURCE),
    ):
        assert flags[flag].split("=")[0] == resource, f"--{flag} must ask for {resource}"
        group_declaring(resource)
    gateway = urlsplit(flags["gateway-url"])
    service = one("Service", "stellaris-gateway")
    assert gateway.hostname == service["metadata"]["name"]
    assert gateway.port == service["spec"]["ports"][0]["port"]
    # The token and the cache reach `stellaris train` through its options' environment variables.
    envvars = {p.envvar for p in options.values() if p.envvar}
    env = env_of(c)
    assert {"STELLARIS_GATEWAY_TOKEN", "REDIS_URL"} <= env.keys() <= envvars | {"RUN_NAME", "REDIS_PASSWORD"}
    volumes = {m["mountPath"] for m in c["volumeMounts"]}
    assert any(flags["out"].startswith(v + "/") for v in volumes), "the run directory is on no volume"


# -- ray up -----------------------------------------------------------------------------------------------------


def ray_up_config() -> dict[str, Any]:
    text = RAY_UP.read_text()
    placeholders = set(re.findall(r"\$\{([A-Z_]+)\}", text))
    assert placeholders == RAY_UP_PLACEHOLDERS.keys(), f"cluster.yaml placeholders changed: {sorted(placeholders)}"
    readme = (DEPLOY / "README.md").read_text()
    for name in placeholders:
        assert name in readme, f"deploy/README.md does not say what {name} is"
        text = text.replace("${" + name + "}", RAY_UP_PLACEHOLDERS[name])
    return yaml.safe_load(text)


def test_ray_up_config_validates_as_ray_up_does() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = ray_up_config()
    for field in ("cluster_name", "provider", "available_node_types", "head_node_type", "max_workers"):
        assert field in config, f"ray up needs {field}"
    validate_config(prepare_config(config))  # Ray's schema (ray-schema.json) and its own checks


def test_ray_up_node_types_place_and_run_the_gateway() -> None:
    config = ray_up_config()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("CPU") == 0, "actors must not land on the head"
    gpu = [t for t in types.values() if t["resources"].get(GPU_RESOURCE)]
    cpu = [t for t in types.values() if t["resources"].get(CPU_RESOURCE)]
    assert len(gpu) == 1 and len(cpu) == 1 and gpu[0] is not cpu[0]
    assert gpu[0]["resources"].get("GPU", 0) >= 1 and "--gpus all" in gpu[0]["docker"]["worker_run_options"]
    assert gpu[0]["docker"]["worker_image"].endswith("/stellaris/ray-node-gpu:0.1.0")
    assert config["docker"]["image"].endswith("/stellaris/ray-node:0.1.0")
    commands = "\n".join(config["head_start_ray_commands"])
    assignments = dict(re.findall(r"\b(STELLARIS_GATEWAY_[A-Z_]+)=(\S+)", commands))
    settings = validate_gateway_settings(
        {**assignments, "STELLARIS_GATEWAY_TOKEN": "from-the-env-file"}, "cluster.yaml"
    )
    assert settings.backend == "ray" and settings.ray_address == "auto"
    assert f"127.0.0.1:{settings.port}/healthz" in commands and "/healthz" in gateway_get_routes()
    assert "~/stellaris.env" in config["file_mounts"], "the gateway's secrets come from the mounted env file"
    assert "python -m gateway" in commands and "ray start --head" in commands


# -- Kubernetes schemas (optional package) ----------------------------------------------------------------------

BUILTIN_KINDS = {
    "ConfigMap",
    "Service",
    "StatefulSet",
    "Deployment",
    "Job",
    "Secret",
    "PersistentVolumeClaim",
    "PodDisruptionBudget",
}


def test_kubernetes_objects_match_the_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (offline k8s schemas)")
    version = "1.33.0"
    for obj in k8s_objects():
        if obj["kind"] in BUILTIN_KINDS:
            kv.validate(obj, version, strict=True)
        else:  # a RayCluster: its pod templates are core PodTemplateSpecs
            assert obj["kind"] == "RayCluster", f"no schema check for {obj['kind']}"
            spec = obj["spec"]
            for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
                template = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": "t"},
                    "template": group["template"],
                }
                kv.validate(template, version, strict=True)
