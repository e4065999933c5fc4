"""`experiments.proc_cpu` against real processes: a live grandchild's CPU and a reaped child's count, also by command
line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from experiments.proc_cpu import busy, descendants_running, tree_cpu_by_kind

# Burns 0.3 s of CPU time (not wall time: the machine may be busy), then touches argv[1] and, with argv[2] "stay",
# sleeps on.
BURNER = """import pathlib, sys, time
while time.process_time() < 0.3:
    pass
pathlib.Path(sys.argv[1]).touch()
if sys.argv[2] == "stay":
    time.sleep(60)
"""


def test_a_live_descendant_and_a_reaped_child_are_counted(tmp_path: Path) -> None:
    burner, reaped, live = tmp_path / "burner.py", tmp_path / "reaped", tmp_path / "live"
    burner.write_text(BURNER)
    # The shell runs one burner to its end (reaped: its CPU moves to the shell's cutime), then one that stays.
    script = f"{sys.executable} {burner} {reaped} go && exec {sys.executable} {burner} {live} stay"
    proc = subprocess.Popen(["bash", "-c", f"( {script} ) & wait"])
    try:
        deadline = time.monotonic() + 60
        while not live.exists():  # the second burner is done burning
            assert proc.poll() is None and time.monotonic() < deadline, "the burners never finished"
            time.sleep(0.02)
        assert reaped.exists()
        # Two burners' 0.3 s each, less clock ticks rounding down.
        assert sum(tree_cpu_by_kind(proc.pid, lambda _: "all").values()) >= 0.55
        # By command line: the subshell that reaped the first burner exec'd the second, so both count as the live
        # burner's; the outer shell burnt next to nothing.
        by_kind = tree_cpu_by_kind(proc.pid, lambda cmdline: "burner" if cmdline.startswith(sys.executable) else "sh")
        assert by_kind.keys() == {"burner", "sh"}
        assert by_kind["burner"] >= 0.55 and by_kind["sh"] < 0.2
    finally:
        subprocess.run(["pkill", "-f", str(live)], check=False)
        proc.wait(timeout=30)


def test_a_gone_process_counts_nothing() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert tree_cpu_by_kind(proc.pid, lambda _: "any") == {}


def test_descendants_running_finds_a_grandchild_by_its_command_line_and_never_the_root() -> None:
    marker = "stellaris-descendant-marker"
    proc = subprocess.Popen(["bash", "-c", f"( exec -a {marker} sleep 60 ) & wait"])
    try:
        deadline = time.monotonic() + 30
        while not (found := descendants_running(proc.pid, marker)):
            assert time.monotonic() < deadline, "the grandchild never showed"
            time.sleep(0.02)
        assert len(found) == 1 and found[0] != proc.pid
        assert descendants_running(proc.pid, "no-such-marker") == []
    finally:
        subprocess.run(["pkill", "-f", marker], check=False)
        proc.wait(timeout=30)


def test_busy_tells_a_process_burning_cpu_from_one_waiting() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True:\n    pass"])
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 30
        while not _asleep_in_sleep(sleeper.pid):  # past its exec and start-up, which spend CPU
            assert time.monotonic() < deadline, "sleep never went to sleep"
            time.sleep(0.01)
        # A 0.3 s window: the spinner gets CPU in it even with both cores taken by other work.
        assert busy([spinner.pid, sleeper.pid], window_s=0.3) == [spinner.pid]
        sleeper.kill()
        sleeper.wait()
        assert busy([sleeper.pid], window_s=0.01) == []  # gone: left out
    finally:
        spinner.kill()
        spinner.wait()


def _asleep_in_sleep(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(" (", 1)[1].startswith("sleep)") and stat.rsplit(")", 1)[1].split()[0] == "S"
