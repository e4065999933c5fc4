"""The architecture as a test (docs/architecture.md): the one-way doors between the packages, and modules small enough
to read.

Imports are read from the source with `ast`, not by importing anything: every `import x` and `from x import y`
anywhere in a module (top level, inside functions, under `if TYPE_CHECKING:`, in `try:` blocks), relative imports
resolved against the module's package, and `importlib.import_module("x")` / `__import__("x")` with a literal name.
A failure names the module, the line and what it imports.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cache", "functions", "gateway", "stellaris")
MAX_LINES = 300

# Which top-level packages the modules under a path must not import (docs/architecture.md). A path ending in "/" is a
# package and covers everything below it.
FORBIDDEN: dict[str, frozenset[str]] = {
    # The cache is the ground floor: everything imports it, it imports none of them.
    "cache/": frozenset({"functions", "gateway", "stellaris"}),
    # A handler sees only its event and the cache; it never knows who invoked it.
    "functions/": frozenset({"gateway", "stellaris"}),
    # The gateway runs functions across a process/container boundary and knows them only by registry entries.
    "gateway/": frozenset({"functions", "stellaris"}),
    # The control plane reaches functions only through the gateway's HTTP API, and data only through cache/.
    "stellaris/control/": frozenset({"functions"}),
    "stellaris/config.py": frozenset({"functions"}),
}
# Not listed, so free to import functions/: stellaris/evaluate.py, the offline policy evaluator behind
# `stellaris eval`. It runs after training, in the user's process, with no gateway, cache or job: it loads the
# run's saved policy into the same network builder the functions use and steps fresh envs with it. Going through
# the gateway would mean deploying a function only to read a file; sharing `build_policy` is what guarantees the
# evaluated network is the trained one.


@dataclass(frozen=True)
class Import:
    line: int
    name: str  # dotted module name, relative imports resolved

    @property
    def top(self) -> str:
        return self.name.split(".")[0]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, *, is_package: bool = False) -> list[Import]:
    """Every module that `source` (the text of `module`) imports, wherever the import statement stands."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # `from . import x` / `from ..y import z`: relative to this module's package
                base = package[: len(package) - (node.level - 1)]
                found.append(Import(node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            else:
                found.append(Import(node.lineno, node.module or ""))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(Import(node.lineno, first.value))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def product_modules(root: Path = ROOT) -> list[Path]:
    return sorted(path for package in PACKAGES for path in (root / package).rglob("*.py"))


def forbidden_for(where: str) -> frozenset[str]:
    """The packages that the module at `where` (a path relative to the root) must not import."""
    banned: frozenset[str] = frozenset()
    for prefix, packages in FORBIDDEN.items():
        if where == prefix or (prefix.endswith("/") and where.startswith(prefix)):
            banned |= packages
    return banned


def import_violations(root: Path = ROOT) -> list[str]:
    """One line per import that breaks a rule: module, line, what it imports, which rule."""
    violations = []
    for path in product_modules(root):
        where = path.relative_to(root).as_posix()
        banned = forbidden_for(where)
        source = path.read_text(encoding="utf-8")
        for imp in imports_in(source, module_name(path, root), is_package=path.name == "__init__.py"):
            if imp.top in banned:
                violations.append(f"{where}:{imp.line} imports {imp.name} ({where} must not import {imp.top}/)")
    return violations


def oversized(root: Path = ROOT) -> list[str]:
    """One line per module over MAX_LINES lines."""
    too_long = []
    for path in product_modules(root):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            too_long.append(f"{path.relative_to(root).as_posix()} has {lines} lines (at most {MAX_LINES})")
    return too_long


def test_the_product_packages_are_all_there() -> None:
    """Guards the other tests against passing on nothing (a moved root, a renamed package)."""
    found = {path.relative_to(ROOT).as_posix() for path in product_modules()}
    for expected in ("cache/keys.py", "functions/handlers/learner.py", "gateway/app.py", "stellaris/control/run.py"):
        assert expected in found, f"{expected} not among the modules this test reads from {ROOT}"


def test_dependency_rules_hold() -> None:
    """docs/architecture.md: cache/ imports none of the others; functions/ and gateway/ only cache/ (and not each
    other);
    the control plane (stellaris/control/, stellaris/config.py) never imports functions/."""
    violations = import_violations()
    assert not violations, "imports that break docs/architecture.md:\n" + "\n".join(violations)


def test_no_module_exceeds_the_line_limit() -> None:
    too_long = oversized()
    assert not too_long, "modules to split along a seam they already have:\n" + "\n".join(too_long)


def test_the_parser_sees_every_form_of_import() -> None:
    source = textwrap.dedent(
        """
        import os, functions.policies as fp
        from gateway.client import GatewayClient
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from stellaris.config import TrainConfig
        try:
            import functions.handlers
        except ImportError:
            pass
        def later():
            from gateway import app
            import importlib
            return importlib.import_module("functions.runtime"), __import__("stellaris")
        from . import keys
        from .codec import encode
        """
    )
    names = [(imp.line, imp.name) for imp in imports_in(source, "cache.server")]
    assert sorted(names) == sorted(
        [
            (2, "os"),
            (2, "functions.policies"),
            (3, "gateway.client"),
            (4, "typing"),
            (6, "stellaris.config"),
            (8, "functions.handlers"),
            (12, "gateway"),
            (13, "importlib"),
            (14, "functions.runtime"),
            (14, "stellaris"),
            (15, "cache"),
            (16, "cache.codec"),
        ]
    ), names
    assert [imp.name for imp in imports_in("from . import records", "cache", is_package=True)] == ["cache"]


@pytest.fixture(scope="module")
def scratch_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """A copy of the product packages' sources (to inject imports into without touching the real tree), and the
    violations it has before any injection."""
    root = tmp_path_factory.mktemp("tree")
    for path in product_modules():
        copy = root / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return root, set(import_violations(root))


@pytest.mark.parametrize(
    ("where", "statement", "breaks"),
    [
        ("cache/keys.py", "from functions.jobspec import JobSpec", "functions"),
        ("cache/contract/__init__.py", "import gateway.models", "gateway"),
        ("cache/__init__.py", "from stellaris import config", "stellaris"),
        ("functions/handlers/__init__.py", "from gateway.client import GatewayClient", "gateway"),
        ("functions/__init__.py", "from stellaris.config import TrainConfig", "stellaris"),
        ("gateway/__init__.py", "from functions.handlers import learner", "functions"),
        ("gateway/backends/__init__.py", "import importlib; importlib.import_module('functions.warm')", "functions"),
        ("stellaris/control/__init__.py", "from functions.algos.staleness import Rule", "functions"),
        ("stellaris/config.py", "import functions.algos.config", "functions"),
        ("functions/__init__.py", "from cache import JobCache", None),
        ("gateway/__init__.py", "from cache.keys import GatewayKeys", None),
        ("stellaris/control/__init__.py", "from gateway.client import GatewayClient", None),
        ("stellaris/evaluate.py", "from functions.policies import build_policy", None),
    ],
)
def test_an_injected_import_is_caught(
    scratch_tree: tuple[Path, set[str]], where: str, statement: str, breaks: str | None
) -> None:
    """One import added inside a function of a copied module is reported, naming the module and the import, iff
    it breaks a rule (`breaks` is the package it must not import; None: allowed)."""
    root, before = scratch_tree
    path = root / where
    original = path.read_text(encoding="utf-8")
    path.write_text(original + f"\n\ndef _injected() -> None:\n    {statement}\n", encoding="utf-8")
    try:
        new = [v for v in import_violations(root) if v not in before]
    finally:
        path.write_text(original, encoding="utf-8")
    if breaks is None:
        assert not new, new
    else:
        assert len(new) == 1 and new[0].startswith(f"{where}:") and f"must not import {breaks}/" in new[0], new
