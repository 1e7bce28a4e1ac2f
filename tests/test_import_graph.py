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


#: The package's layers, bottom first: a module may import its own layer and the ones below,
#: never one above. Top-level modules are named by their module, packages by theirs.
#: The bottom layer holds what several packages use (errors, names, the model-control key,
#: free ports, the Prometheus text parser).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset(
        {
            "hloserve",
            "hloserve.errors",
            "hloserve.names",
            "hloserve.units",
            "hloserve.metric_names",
            "hloserve.settings",
            "hloserve.model_parameters",
            "hloserve.triton_messages",
            "hloserve.model_control",
            "hloserve.ports",
            "hloserve.prometheus_text",
            "hloserve.jax_on_cpu",
            "hloserve.triton_backend",  # a docstring: the map of its process folders
        }
    ),
    frozenset({"hloserve.bundle", "hloserve.observability"}),
    frozenset({"hloserve.export", "hloserve.triton_backend.channel"}),
    # front and runtime are two processes: one layer, kept apart by KEPT_APART
    frozenset({"hloserve.triton_backend.front", "hloserve.triton_backend.runtime"}),
    frozenset({"hloserve.model_repository_tools"}),
    frozenset({"hloserve.meta"}),
    frozenset({"hloserve.triton_backend.backends"}),
    frozenset({"hloserve.gateway"}),
    frozenset({"hloserve.node"}),
    frozenset({"hloserve.cli", "hloserve.cli_options", "hloserve.cli_serve"}),
)
#: Units of one layer that never import each other (either way).
KEPT_APART = [("hloserve.triton_backend.front", "hloserve.triton_backend.runtime")]
#: Subpackages that are units of their own (a process side each), not part of their parent's.
SPLIT_PACKAGES = ("hloserve.triton_backend",)


def _unit(module: str) -> str:
    """The package (or top-level module) ``module`` belongs to: ``hloserve.node.plan`` ->
    ``hloserve.node``; in a split package one level down: ``hloserve.triton_backend.front.core``
    -> ``hloserve.triton_backend.front``."""
    parts = module.split(".")
    return ".".join(
        parts[:3] if module.startswith(tuple(p + "." for p in SPLIT_PACKAGES)) else parts[:2]
    )


def _layer(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"{unit} is in no layer of tests/test_import_graph.py: add it")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``"a -> b"`` for each import of a module from a higher layer."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(_unit(target)) > _layer(_unit(module))
    )


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between packages (and top-level modules)."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(_unit(module), set())
        edges.update(_unit(t) for t in targets if _unit(t) != _unit(module))
    return packages


def test_layers_find_an_upward_import_and_a_package_cycle() -> None:
    graph = {"hloserve.gateway.app": {"hloserve.node.plan"}, "hloserve.node.plan": set()}
    assert upward_imports(graph) == ["hloserve.gateway.app -> hloserve.node.plan"]
    both = {**graph, "hloserve.node.plan": {"hloserve.gateway.config"}}
    assert find_cycles(package_graph(both)) == [["hloserve.gateway", "hloserve.node"]]


def test_no_upward_import_and_no_package_cycle() -> None:
    graph = import_graph()
    assert upward_imports(graph) == []
    assert find_cycles(package_graph(graph)) == []


def test_front_and_runtime_import_neither_the_other() -> None:
    packages = package_graph(import_graph())
    for a, b in KEPT_APART:
        assert b not in packages[a] and a not in packages[b], (a, b)


def _path(module: str) -> Path:
    path = ROOT.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported_names(module: str, *, at_import: bool) -> set[str]:
    """The dotted names ``module`` imports (``from a import b`` gives ``a`` and ``a.b``): all of
    them, or with ``at_import`` those run when it is imported (outside functions and
    ``if TYPE_CHECKING:`` blocks)."""
    path = _path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.update([base, *(f"{base}.{a.name}" for a in node.names)])
        elif at_import and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        elif not at_import or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            todo.extend(ast.iter_child_nodes(node))
    return found


def loaded_by_importing(roots: set[str]) -> set[str]:
    """``roots`` and every ``hloserve`` module importing them imports, directly or not."""
    modules = set(import_graph())
    seen, todo = set(), list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in imported_names(module, at_import=True):
            found = _resolve(name, modules) if name.startswith(PACKAGE) else None
            # importing a.b.c runs a/__init__ and a/b/__init__ too
            while found:
                todo.append(found)
                found = found.rpartition(".")[0] if found.count(".") > 1 else None
    return seen


def test_the_front_process_holds_no_jax_code() -> None:
    """A front stub never imports JAX (docs/serving.md): no module the front's modules and its
    shim load when imported holds an ``import jax``/``jaxlib``, even inside a function (a
    lazy import would be one call away). tests/triton_backend/test_front.py checks a running
    process."""
    graph = import_graph()
    shim = "hloserve.triton_backend.backends.hloserve_front.model"
    front = {m for m in graph if _unit(m) == "hloserve.triton_backend.front"}
    # the config parser: what a front loaded with a config override reads its config with
    loaded = loaded_by_importing(front | {shim, "hloserve.model_repository_tools.config"})
    assert "hloserve.bundle.front_spec" in loaded  # the walk follows imports

    def jax_in(module: str) -> bool:
        names = imported_names(module, at_import=False)
        return any(n.split(".")[0] in ("jax", "jaxlib") for n in names)

    assert jax_in("hloserve.triton_backend.runtime.core")  # ... and sees a lazy import
    assert sorted(m for m in loaded if jax_in(m)) == []
