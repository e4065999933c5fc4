"""The documentation: its generated reference pages are current, the README stays short, and no file of the
repository points readers at a design document the repository does not ship."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
MISSING_DOC = "SPEC" + ".md"  # spelled in two parts, so that this file is no match for its own search


def test_generated_reference_pages_are_current() -> None:
    """docs/gen_reference.py --check exits 1 naming each stale page: regenerate it after changing the config or the
    gateway's API."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{done.stdout}{done.stderr}".strip()


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def _repo_files() -> list[Path]:
    """Every file of the repository git tracks or would track (untracked but not ignored); README.md and docs/ when
    git cannot say (no checkout)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        paths = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*") if p.is_file())]
    return sorted(p for p in paths if p.is_file())


def test_no_file_mentions_a_missing_design_document() -> None:
    """Code, tests, docs and scripts cite docs/ pages, never a document outside the repository."""
    files = _repo_files()
    assert ROOT / "README.md" in files and any(p.suffix == ".md" for p in files if p.parent != ROOT)
    mentions = [
        p.relative_to(ROOT).as_posix() for p in files if MISSING_DOC in p.read_bytes().decode("utf-8", errors="replace")
    ]
    assert not mentions, f"{MISSING_DOC} is not in the repository; state its content directly in: {mentions}"
