"""The live view's pure parts against hand-computed values: the history line, the ETA, the clock."""

from __future__ import annotations

import math
from pathlib import Path

from stellaris.rundir.progress import Standing, clock, sparkline


def test_the_history_line_scales_between_the_least_and_greatest_of_the_last_rounds() -> None:
    assert sparkline([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == "▁▂▃▄▅▆▇██"  # the top value is the top block
    assert sparkline([0.0, 8.0, 4.0]) == "▁█▅"  # 4/8 of the range: block int(0.5 * 8) = 4, the fifth
    assert sparkline([1.0, math.nan, 3.0]) == "▁ █"  # a round without episodes is a gap
    assert sparkline([2.0, 2.0]) == "▄▄"  # flat: mid-height
    assert sparkline([math.nan]) == " " and sparkline([]) == ""
    assert sparkline(list(range(100)), width=30) == sparkline(list(range(70, 100)))  # only the last 30


def test_the_eta_is_the_first_budget_to_run_out() -> None:
    # 10 rounds of 40 done in 100 s: 300 s to go by rounds; steps 5,000 of 10,000: 100 s to go; 3 minutes: 80 s.
    at = (100.0, 10, 5_000)
    assert Standing(*at, rounds=40, total_steps=None, max_minutes=None).eta_s() == 300.0
    assert Standing(*at, rounds=40, total_steps=10_000, max_minutes=None).eta_s() == 100.0
    assert Standing(*at, rounds=40, total_steps=10_000, max_minutes=3.0).eta_s() == 80.0
    assert Standing(5.0, 0, 0, rounds=40, total_steps=None, max_minutes=None).eta_s() is None
    assert Standing(500.0, 0, 0, rounds=None, total_steps=None, max_minutes=5.0).eta_s() == 0.0


def test_the_clock() -> None:
    assert (clock(5.4), clock(65), clock(3_725), clock(None), clock(math.inf)) == ("0:05", "1:05", "1:02:05", "-", "-")


def test_a_run_prints_its_gateway_and_a_token_file_that_scrapes_metrics(tmp_path: Path) -> None:
    """`stellaris train` (not a terminal: plain lines) names the local gateway and a 0600 token file; /metrics
    answers 200 with that token and 401 without while the run goes on; the file is gone after, and the summary
    starts on a line of its own."""
    import os
    import re
    import stat
    import subprocess

    import httpx

    from tests.stellaris.test_train import ROOT, train_cmd

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STELLARIS_GATEWAY_URL")}
    cmd = train_cmd(tmp_path, "--out", str(tmp_path / "run"), rounds=3)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:  # the gateway line comes before round 1: the run is still going when we scrape
            lines.append(line)
            found = re.match(r"gateway (\S+), token in (\S+) ", line)
            if found:
                url, token_file = found.group(1), found.group(2)
                assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
                token = Path(token_file).read_text()
                assert httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 200
                assert httpx.get(f"{url}/metrics").status_code == 401
                break
        lines += proc.stderr.readlines()
        assert proc.wait(timeout=300) == 0, "".join(lines[-20:])
    finally:
        proc.kill()
    assert found, "".join(lines)
    assert not os.path.exists(token_file)
    rounds = [ln for ln in lines if ln.startswith("round ")]
    assert len(rounds) == 3 and all(re.search(r" elapsed \d+:\d\d eta \d+:\d\d$", ln) for ln in rounds), rounds
    assert lines[-1].startswith("done: 3 rounds"), lines[-3:]


def test_spent_names_the_first_budget_used_up() -> None:
    at = (90.0, 10, 20480)
    assert Standing(*at, rounds=10, total_steps=None, max_minutes=None).spent() == "rounds: 10"
    assert Standing(*at, rounds=11, total_steps=20000, max_minutes=None).spent() == "total_steps: 20000"
    assert Standing(*at, rounds=None, total_steps=None, max_minutes=1.5).spent() == "max_minutes: 1.5"
    assert Standing(*at, rounds=11, total_steps=30000, max_minutes=2).spent() is None
    assert Standing(*at, rounds=None, total_steps=None, max_minutes=None).spent() is None
