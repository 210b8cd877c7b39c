"""bench's modules import one another one way: no cycle, counting imports inside functions (no imports run)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The bench modules ``path`` imports anywhere in its text, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from bench import peers`` names the module in the import list.
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.ImportFrom):
            # Relative: ``from . import x`` or ``from .x import y``.
            base = f"bench.{node.module}" if node.module else "bench"
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "bench" and len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
    found.discard(path.stem)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {path.stem for path in BENCH.glob("*.py")}
    return {path.stem: _imports(path, modules) for path in BENCH.glob("*.py")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path of module names, or ``None``."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            if (cycle := visit(imported, [*path, module])) is not None:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        if (cycle := visit(module, [])) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_bench_has_no_import_cycle() -> None:
    graph = _graph()
    assert {"load", "workloads", "baseline", "peers", "common"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
