"""Worker processes for the function tests: `python -m tests.functions.workers ROLE URL JOB ROUND [LOOP]`.

One handler invocation (learner or parameter) for round ROUND, its result printed as one JSON line, so tests can
kill an invocation's process with SIGKILL at any moment; with LOOP=loop, one invocation per round from ROUND on,
like a warm instance invoked every round, until the job's stop key is set; a looping worker prints its results
when it stops (nobody reads its stdout before then, and a full pipe would block it). Job limits come from
STELLARIS_JOB_*."""

from __future__ import annotations

import json
import sys
import uuid

import torch

from cache import Cache, CacheSettings
from functions.handlers import learner, parameter
from functions.runtime.context import Context, Instance


def stop_key(job: str) -> str:
    return f"stl:{{{job}}}:test:stop"


def main() -> None:
    torch.set_num_threads(1)  # small networks; several processes share 2 cores
    role, url, job_id, round_k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    loop = sys.argv[5:] == ["loop"]
    handlers = {"learner": learner.handle, "parameter": parameter.handle}
    if role not in handlers:
        raise SystemExit(f"unknown role {role!r}")
    with Cache(CacheSettings(url=url)) as cache:
        instance = Instance(cache)
        print("READY", flush=True)
        lines: list[str] = []
        while True:
            ctx = Context(uuid.uuid4().hex[:12], instance)
            out = handlers[role]({"job": job_id, "round": round_k, "max_s": 300}, ctx)
            lines.append(json.dumps({k: v for k, v in out.items() if k != "decisions"}))
            if not loop or cache.client.exists(stop_key(job_id)):
                break
            round_k += 1
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
