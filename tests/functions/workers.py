"""Worker processes for the function tests: `python -m tests.functions.workers ROLE URL JOB ID`."""

from __future__ import annotations

import json
import sys
import uuid

import torch

from cache import Cache, CacheSettings
from functions.context import Context, Instance
from functions.handlers import learner, parameter


def stop_key(job: str) -> str:
    return f"stl:{{{job}}}:test:stop"


def main() -> None:
    torch.set_num_threads(1)  # small networks; several processes share 2 cores
    role, url, job_id, worker_id = sys.argv[1:5]
    with Cache(CacheSettings(url=url)) as cache:
        instance = Instance(cache)
        while not cache.client.exists(stop_key(job_id)):
            ctx = Context(uuid.uuid4().hex[:12], instance)
            if role == "learner":
                out = learner.handle({"job": job_id, "learner_id": worker_id, "block_s": 1.0}, ctx)
            elif role == "parameter":
                out = parameter.handle({"job": job_id, "max_updates": 1, "wait_s": 2.0}, ctx)
            else:
                raise SystemExit(f"unknown role {role!r}")
            if out.get("status") not in ("idle", "busy"):
                print(
                    json.dumps(
                        {k: v for k, v in out.items() if k in ("status", "base_version", "version", "decisions")}
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
