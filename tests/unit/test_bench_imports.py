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
    # The fixed-rate mode: orchestrator, report, load process, its targets and the lean queue,
    # the systems' checks.
    assert {"rate", "rate_report", "rate_load", "rate_targets", "rate_lean", "rate_systems"} <= set(
        graph
    )
    # The lean queue table, the checks of a jobs table, sibling databases, the second peer.
    assert {"lean", "checks", "databases", "procrastinate_peer"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def _top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """What ``path`` imports as it is imported (not inside functions): bench's modules by name,
    other packages by their top-level name."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "bench":
                found.add(parts[0])
            elif len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
    return found


def test_python_m_bench_imports_the_peers_packages_only_with_peers() -> None:
    """``python -m bench`` without ``--peers`` runs where PGQueuer and Procrastinate are absent."""
    modules = {path.stem for path in BENCH.glob("*.py")}
    seen: set[str] = set()
    todo = ["__main__"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        imported = _top_level_imports(BENCH / f"{module}.py", modules)
        assert not imported & {"pgqueuer", "procrastinate"}, module
        todo += sorted(imported & modules)
    assert "lean" in seen
    assert not seen & {"peers", "procrastinate_peer"}
