"""The architecture's doors (docs/architecture.md) as import-linter contracts ([tool.importlinter] in pyproject.toml,
run by `lint-imports` in make test): they hold on the tree, and they catch an import that breaks one, in a copy of
the tree with that import added (a contract that could not fail would guard nothing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contract", "host", "cache", "functions", "gateway", "stellaris", "experiments")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the packages under `root`, with `root`'s contracts (no cache: a copy is read afresh)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_doors_hold() -> None:
    checked = lint_imports(ROOT)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert "Contracts: 2 kept, 0 broken" in checked.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    return root


@pytest.mark.parametrize(
    ("module", "line", "door"),
    [
        ("contract/__init__.py", "import cache.keys", "contract is not allowed to import cache"),
        ("cache/__init__.py", "from stellaris import config", "cache is not allowed to import stellaris"),
        (
            "functions/handlers/__init__.py",
            "from gateway.client import GatewayClient",
            "functions is not allowed to import gateway",
        ),
        ("gateway/backends/__init__.py", "import functions.model.warm", "gateway is not allowed to import functions"),
        (
            "stellaris/round/__init__.py",
            "from functions.algos.stellaris import Rule",
            "stellaris.round is not allowed to import functions",
        ),
        ("stellaris/cli.py", "import experiments.bench", "stellaris is not allowed to import experiments"),
    ],
)
def test_an_import_through_a_door_is_caught(tree_copy: Path, module: str, line: str, door: str) -> None:
    path = tree_copy / module
    before = path.read_text()
    path.write_text(f"{before}\n{line}\n")
    try:
        checked = lint_imports(tree_copy)
    finally:
        path.write_text(before)
    assert checked.returncode == 1, checked.stdout[-3000:]
    assert door in checked.stdout, checked.stdout[-3000:]
