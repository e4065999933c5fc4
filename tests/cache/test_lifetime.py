"""`quick_exit`: a process that skips the interpreter's teardown still does what a normal exit does first (waits for
its other threads, runs atexit handlers, flushes logs and stdio) and exits with its code. Each case runs in a real
child process; the runtime case stops a real function instance with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from contract.runtime_http import READY_PREFIX

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MARK": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=60
    )


def test_quick_exit_waits_for_threads_runs_atexit_and_flushes(tmp_path: Path) -> None:
    done = _run(
        """
        import atexit, logging, os, sys, threading, time
        from pathlib import Path
        from host.lifetime import quick_exit

        mark = Path(os.environ["MARK"])
        atexit.register(lambda: (mark / "atexit").write_text("ran"))
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

        def work():
            time.sleep(0.3)
            (mark / "thread").write_text("finished")

        threading.Thread(target=work).start()
        print("buffered line", end="")  # no newline: flushed only by an exit that flushes
        logging.getLogger("t").info("a log line")
        quick_exit(3)
        """,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "thread").read_text() == "finished"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert done.stdout == "buffered line"
    assert "a log line" in done.stderr


def test_quick_exit_leaves_the_normal_way_when_a_thread_outlives_the_wait(tmp_path: Path) -> None:
    # The normal exit waits for the thread however long it takes: its work is not cut off.
    done = _run(
        """
        import os, threading, time
        from pathlib import Path
        from host.lifetime import quick_exit

        def work():
            time.sleep(1.0)
            (Path(os.environ["MARK"]) / "thread").write_text("finished")

        threading.Thread(target=work).start()
        quick_exit(4, join_s=0.05)
        """,
        tmp_path,
    )
    assert done.returncode == 4, done.stderr
    assert (tmp_path / "thread").read_text() == "finished"


def test_a_function_instance_stopped_by_sigterm_drains_logs_and_exits_0() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "functions.runtime", "--handler", "experiments.noop:handle", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "STELLARIS_LOG_LEVEL": "INFO"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(READY_PREFIX)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "drained" in err  # the last log line before the quick exit reached stderr


def test_die_with_parent_ends_a_child_whose_parent_was_gone_before_it_asked(tmp_path: Path) -> None:
    """A parent killed between its fork and the child's call never sends the death signal: told whom it was forked
    from, the child sees another parent and ends itself rather than run on as an orphan."""
    forked_from_us = _run(
        """
        import os
        from host.lifetime import die_with_parent
        die_with_parent(os.getppid())
        print("alive")
        """,
        tmp_path,
    )
    assert forked_from_us.returncode == 0 and forked_from_us.stdout == "alive\n", forked_from_us.stderr
    orphaned = _run(
        """
        import os
        from host.lifetime import die_with_parent
        die_with_parent(os.getppid() + 1_000_000)  # a parent that is not ours: ours is gone, as it reads here
        print("alive")
        """,
        tmp_path,
    )
    assert orphaned.returncode == -signal.SIGKILL and orphaned.stdout == ""


def test_dies_with_us_names_this_process_as_the_parent() -> None:
    from host.lifetime import dies_with_us

    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getppid())"],
        preexec_fn=dies_with_us(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0 and child.stdout == f"{os.getpid()}\n", child.stderr
