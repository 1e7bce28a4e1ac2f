"""The ``hloserve`` package's module-level import graph has no loop.

Every ``import``/``from ... import`` of an ``hloserve`` module anywhere in a module (also inside
functions and ``TYPE_CHECKING`` blocks) is an edge; a cycle means two modules each need the
other, which is how a package ends up with two copies of one job. Pure ``ast`` reading: nothing is
imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hloserve

ROOT = Path(hloserve.__file__).parent
PACKAGE = "hloserve"
#: Generated code (protobuf stubs) is not ours to arrange.
SKIP = ("hloserve.protos",)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest known module that ``name`` (a module or ``module.attribute``) names."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``hloserve`` modules it imports (package ``__init__`` edges left out)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = {m for m in files if not m.startswith(SKIP)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module in modules:
        path = files[module]
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                if not target.startswith(PACKAGE):
                    continue
                found = _resolve(target, modules)
                # importing a package (its __init__) is not a dependency on its modules
                if found and found != module and not module.startswith(found + "."):
                    graph[module].add(found)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_graph_sees_imports() -> None:
    graph = import_graph()
    assert "hloserve.node.tritonserver" in graph["hloserve.node.watchdog"]
    assert "hloserve.errors" in graph["hloserve.node.tritonserver"]


def test_find_cycles_finds_a_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_in_the_package() -> None:
    assert find_cycles(import_graph()) == []
