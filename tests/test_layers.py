"""otelprof's modules import one another without a cycle: every import counts, at module level or
inside a function (a lazy import is still a dependency), except those under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "otelprof"
COMPILED = {"otelprof._native"}  # the extension: it imports nothing of otelprof


def _modules() -> dict[str, tuple[Path, bool]]:
    """``otelprof.x.y`` -> (its file, whether it is a package's ``__init__``)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, package: bool, known: set[str]) -> None:
        self.here = module.split(".") if package else module.split(".")[:-1]
        self.known = known
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.here[: len(self.here) - node.level + 1] if node.level else []
        module = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            name = f"{module}.{alias.name}"  # `from pkg import submodule` depends on the submodule
            if name not in COMPILED:
                self.found.add(name if name in self.known else module)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, (path, package) in modules.items():
        visitor = _Imports(name, package, set(modules))
        visitor.visit(ast.parse(path.read_text("utf-8")))
        graph[name] = {d for d in visitor.found if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_lazy_imports() -> None:
    graph = import_graph()
    assert "otelprof.importer.nvprof" in graph["otelprof.importer.nsys"]  # imported at module level
    assert "otelprof.integrations" in graph["otelprof.instrumentation"]
    assert "otelprof.integrations" not in graph["otelprof.capture.session"]
    assert "otelprof.capture.session" not in graph["otelprof.integrations._steps"]
    assert "otelprof.converter" in graph["otelprof"]  # otelprof/__init__.py's lazy __getattr__


def test_no_module_imports_itself_back() -> None:
    assert cycles(import_graph()) == []


#: otelprof's parts from the ground up: a module imports only from its own part or one below it.
LAYERS = [
    "_version",
    "_logformat",
    "settings",
    "_native_module",
    "otlp",
    "converter",
    "resource",
    "export",
    "importer",
    "capture",
    "integrations",
    "instrumentation",
    "auto",
    "instrumentor",
    "report",
    "cli",
    "_launch",
    "__main__",
    "_bootstrap",
    "",  # the package itself (otelprof/__init__.py: its lazy public names)
    "_demo_train",
]


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_every_part_has_a_place() -> None:
    assert {_part(m) for m in import_graph()} <= set(LAYERS)


def test_no_arrow_runs_back_up() -> None:
    rank = {part: i for i, part in enumerate(LAYERS)}
    upward = sorted(
        f"{module} -> {dependency}"
        for module, dependencies in import_graph().items()
        for dependency in dependencies
        if rank[_part(dependency)] > rank[_part(module)]
    )
    assert upward == []
