"""No import cycles between the project's modules, imports under `if TYPE_CHECKING:` counted. The layers of
tests/test_architecture.py order the packages; inside a package two modules that each import the other are one
module in all but name. Break a cycle along the design's seams: move what both need down into a module of its own,
or pass a callable; never by hiding an import inside a function (grimp sees those too)."""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp

PACKAGES = ("contract", "host", "cache", "functions", "gateway", "stellaris", "experiments")


def import_graph() -> dict[str, set[str]]:
    """Each module of PACKAGES with the modules of PACKAGES it imports directly."""
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)  # never a stale cache
    return {module: graph.find_modules_directly_imported_by(module) & graph.modules for module in graph.modules}


def import_cycles(imports: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted, sorted."""
    order: dict[str, int] = {}  # when the search first reached each module
    low: dict[str, int] = {}  # the earliest module on the stack reachable from it
    stack: list[str] = []  # reached modules whose group is still open
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(imports.get(module, ())):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:  # the root of a group: it is everything above it on the stack
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(imports):
        if module not in order:
            visit(module)
    return sorted(groups)


def test_import_cycles_finds_each_group() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}, "g": set()}
    assert import_cycles(imports) == [["a", "b", "c"], ["d", "e"]]


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph())
    listed = "\n".join(f"  {len(group)} modules: {', '.join(group)}" for group in cycles)
    assert not cycles, f"{len(cycles)} import cycle(s), imports under TYPE_CHECKING counted:\n{listed}"
