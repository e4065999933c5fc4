"""A full disk under the run directory mid-run: the run ends with one line that names the directory, says its last
checkpoint is intact and gives the resume command; no half-written file is left beside the checkpoint; and once
there is room again, that command completes the run with every task of every round applied exactly once."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stellaris.test_train import (
    read_on,
    resume_to_the_end,
    start_until_round,
    train_cmd,
)

ROUNDS = 30

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a disk to fill) needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def _fill(path: Path) -> None:
    """Take every free byte of `path`'s filesystem (unbuffered writes, down to single bytes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = 1 << 20
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                size //= 2
    finally:
        os.close(fd)


def test_a_full_disk_ends_the_run_naming_its_intact_checkpoint_and_the_resume_completes_it(
    small_disk: Path, tmp_path: Path
) -> None:
    out = small_disk / "run"
    proc = start_until_round(train_cmd(tmp_path, "--rounds", str(ROUNDS), "--out", str(out)), 3)
    lines, reader = read_on(proc)
    try:
        filler = small_disk / "filler"
        _fill(filler)
        assert proc.wait(timeout=120) == 1, "".join(lines)[-3000:]
        reader.join(timeout=10)
        last = "".join(lines).strip().splitlines()[-1]
        assert last.startswith(f"error: no room to write the run directory {out} ("), last
        assert "No space left on device" in last, last
        assert ": make room; its checkpoint of round " in last, last
        assert last.endswith(f"is intact: resume with `stellaris train --resume {out}`"), last
        assert not list(out.glob("*.tmp")), "a half-written file was left beside the checkpoint"

        filler.unlink()
        resume_to_the_end(out, ROUNDS)
    finally:
        if proc.poll() is None:
            proc.kill()
