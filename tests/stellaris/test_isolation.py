"""Code in a job reaches nothing outside it: a user's env (tests/stellaris/isolation_probe.py), made inside job A's
learner, parameter and actor processes, looks through its environment for tokens and URLs and tries each against
Redis and the gateway: another job's keys, the keyspace at large, the admin and invoke routes. Every attempt must
be refused, on the process backend with fork servers here; tests/stellaris/test_train_docker.py and
test_train_ray.py run the same probe on containers and on Ray.

The probe writes what it found to its own job's keys, which the job deletes as it ends: the test reads each report
as it lands (a keyspace notification, not a poll)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cache import Cache, JobCache
from stellaris.platform.serverful_actors import ACTOR_MODULE
from tests.gateway.conftest import TOKEN, start_gateway, stop_gateway
from tests.stellaris.isolation_probe import REPORT
from tests.stellaris.test_train import run_train, train_cmd

INVOKE_TOKEN = "isolation-invoke-token"
PROBE_ENV = "tests.stellaris.isolation_probe:BreakoutProbe"


@dataclass
class ProbeReports:
    """Reports pushed under any job's `isolation-probe` key, taken (LPOP, as the deployment's own user) as they land."""

    client: redis.Redis
    found: list[dict[str, Any]] = field(default_factory=list)

    def take(self, key: str) -> None:
        job = key.split("{", 1)[1].split("}", 1)[0]
        while (raw := self.client.lpop(key)) is not None:
            self.found.append({**json.loads(raw), "job": job})

    def role(self, report: dict[str, Any]) -> str:
        """learner, parameter or actor: an instance's id is <job>-<role>-<n>; a serverful actor runs the actor loop."""
        instance = report["env"].get("STELLARIS_INSTANCE_ID")
        if instance is None:
            loop = ACTOR_MODULE.replace(".", "/")  # argv[0] is the module's file, forked or not
            return "actor" if any(loop in a for a in report["argv"]) else "?"
        return str(instance).removeprefix(f"{report['job']}-").split("-")[0]


@contextmanager
def probe_reports(client: redis.Redis) -> Iterator[ProbeReports]:
    reports = ProbeReports(client)
    before = client.config_get("notify-keyspace-events")["notify-keyspace-events"]
    client.config_set("notify-keyspace-events", "Kl")  # keyspace events of list commands
    pubsub = client.pubsub()
    pubsub.psubscribe(f"__keyspace@0__:stl:{{*}}:{REPORT}")
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.5)  # blocks up to 0.5 s for the next event
            if message is not None and message["type"] == "pmessage" and message["data"] == b"rpush":
                reports.take(message["channel"].decode().split(":", 1)[1])

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        yield reports
    finally:
        stop.set()
        listener.join(5)
        pubsub.close()
        client.config_set("notify-keyspace-events", before)


def victim_job(cache: Cache) -> tuple[str, JobCache]:
    """Job B: a policy version another job's code would like to read, in the same Redis."""
    victim = f"victim-{uuid.uuid4().hex[:8]}"
    theirs = JobCache(cache.client, victim)
    theirs.policies.initialise(b"job B's weights")
    return victim, theirs


def assert_nothing_got_through(reports: ProbeReports, secrets: list[str], roles: set[str], theirs: JobCache) -> None:
    assert roles <= {reports.role(r) for r in reports.found}, [(reports.role(r), r["argv"]) for r in reports.found]
    for report in reports.found:
        where = f"{reports.role(report)} pid {report['pid']}"
        assert report["breaches"] == [], f"{where}: {report['breaches']}"
        held = [name for name, value in report["env"].items() if any(s in value for s in secrets)]
        assert held == [], f"{where} holds the deployment's credentials in {held}"
    assert theirs.policies.latest() == (0, b"job B's weights")  # untouched
    assert not theirs.client.exists(f"stl:{{{theirs.keys.job}}}:{REPORT}:breach")
    tried = sum(r["tried"] for r in reports.found)
    print(
        f"{len(reports.found)} processes of the job probed ({sorted({reports.role(r) for r in reports.found})}): "
        f"{tried} attempts, all refused"
    )


def test_code_in_a_job_reaches_nothing_outside_it_on_the_process_backend(
    tmp_path: Path, redis_server, cache_conn: Cache
) -> None:
    victim, theirs = victim_job(cache_conn)
    gw = start_gateway(redis_server.url, STELLARIS_GATEWAY_INVOKE_TOKEN=INVOKE_TOKEN)  # fork servers: the default
    try:
        with probe_reports(cache_conn.client) as reports:
            cmd = train_cmd(
                tmp_path,
                "--gateway-url",
                gw.url,
                "--gateway-token",
                TOKEN,
                "--redis-url",
                redis_server.url,
                "--rounds",
                "2",
                "--out",
                str(tmp_path / "run"),
                env=PROBE_ENV,
                env_kwargs={"victim": victim, "gateway_url": gw.url},
            )
            proc = run_train(cmd)
            assert proc.returncode == 0, proc.stderr[-3000:]
        secrets = [TOKEN, INVOKE_TOKEN, redis_server.password]
        assert_nothing_got_through(reports, secrets, {"learner", "parameter", "actor"}, theirs)
    finally:
        stop_gateway(gw)
        theirs.delete()
