"""No import cycles among the project's own modules (issue 28): ``portal``, ``workers``,
``scheduler`` and ``benchmarks``.

The graph is read from the source, not from ``sys.modules``: every ``import`` statement, at
module level and inside functions alike, so a lazy import cannot hide an edge. One edge per
name a statement imports: ``from a.b import c`` leads to the module ``a.b.c`` when there is one,
else to ``a.b`` (``c`` is a name defined or re-exported there); ``import a.b.c`` leads to the
longest prefix that is one of our modules. The parent packages Python runs on the way are not
edges: an ``__init__`` that re-exports its submodules would otherwise close a circle with each
of them. Migrations and ``apps.py`` are in the graph like any module: nothing here needs
excluding them.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("portal", "workers", "scheduler", "benchmarks")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            found[name.removesuffix(".__init__")] = path
    return found


def _known_prefix(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules its source imports (itself excluded)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(filter(None, (_known_prefix(a.name, modules) for a in node.names)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the package, up level - 1 packages
                    base = package[: len(package) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    target = sub if sub in modules else _known_prefix(source, modules)
                    if target:
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The shortest circle through each module that is on one, as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iteratively (no recursion limit)
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
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)

    for name in sorted(graph):
        if name not in index:
            visit(name)

    found: set[tuple[str, ...]] = set()
    for group in groups:
        for start in group:  # the shortest circle through each member, breadth first
            previous: dict[str, str] = {}
            queue = deque([start])
            while queue:
                node = queue.popleft()
                if start in graph[node]:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    circle = list(reversed(path))
                    first = circle.index(min(circle))  # one spelling per circle
                    circle = circle[first:] + circle[:first]
                    found.add((*circle, circle[0]))
                    break
                for child in sorted(graph[node] & group):
                    if child not in previous and child != start:
                        previous[child] = node
                        queue.append(child)
    return sorted(list(c) for c in found)


def test_the_project_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_check_sees_a_cycle_and_a_function_local_import(tmp_path, monkeypatch):
    """The check can fail: a circle closed by an import inside a function is found."""
    package = tmp_path / "portal"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from portal.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from portal import a\n    return a\n")
    (package / "c.py").write_text("from . import a\n")
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = import_graph()
    assert graph["portal.c"] == {"portal.a"}
    assert cycles(graph) == [["portal.a", "portal.b", "portal.a"]]
