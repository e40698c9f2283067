"""No import cycles among etmlx's modules: each stage imports the ones below it only.

An edge is any import statement in a module (at its top or inside a function: a lazy
import still ties the two modules together), plus the package ``__init__`` that importing
a module of another package runs first. Generated code is left out."""

import ast

from .layout import source_modules


def _imports(name: str, path, modules: dict) -> set:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    found.add(f"{module}.{alias.name}")
                elif module in modules:
                    found.add(module)
    for target in list(found):  # the __init__ of each package entered from outside it
        parts = target.split(".")
        found |= {p for p in (".".join(parts[:i]) for i in range(2, len(parts))) if p in modules and not name.startswith(p + ".")}
    found.discard(name)
    return found


def import_graph() -> dict:
    modules = {name: path for name, path in source_modules().items() if ".generated" not in name}
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict):
    """One cycle as a list of modules, or None."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return path[path.index(successor):] + [successor]
            if successor not in state:
                cycle = visit(successor)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 90 and "etmlx.lowering.fusions.fused_calls" in graph  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_sees_lazy_and_package_imports():
    graph = import_graph()
    assert "etmlx.parallel.ranks" in graph["etmlx"]  # imported inside load()
    assert "etmlx.partitioner" in graph["etmlx.pipeline"]  # the package, entered from etmlx
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
