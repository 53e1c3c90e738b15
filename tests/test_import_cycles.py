"""No import cycles inside hvd_train: when two modules import each other, a third concept is
hiding between them. Imports inside functions count too: a lazy import hides a cycle from
Python, not from the design."""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.stack
PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hvd_train"


def imports_of(path: pathlib.Path) -> set[str]:
    """The hvd_train modules `path` imports, anywhere in it (module level or in a function)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from hvd_train import a, b` imports the modules a and b.
            if node.module == "hvd_train":
                names = [f"hvd_train.{a.name}" for a in node.names]
            else:
                names = [node.module]
        else:
            continue
        found.update(n.split(".")[1] for n in names if n.startswith("hvd_train."))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    return {m: imports_of(p) & set(modules) - {m} for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle
    through them: the first module, a path back to it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_through(graph, c) for c in components]


def _cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to it, inside the component."""
    start, members = component[0], set(component)
    paths = [[start]]
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & members):
            if w == start:
                return [*path, start]
            if w not in path:
                paths.append([*path, w])
    raise AssertionError(f"no cycle through {component}")  # a component always has one


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_lazy_imports_count(tmp_path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from hvd_train.trainer import train\n    import hvd_train.data\n"
    )
    assert imports_of(module) == {"trainer", "data"}


def test_no_import_cycles_inside_hvd_train() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles inside hvd_train: " + "; ".join(" -> ".join(c) for c in found)
