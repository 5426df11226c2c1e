"""The code's shape, checked on every module of `medtpe`: no module over `MAX_MODULE_LINES` lines,
no function over `MAX_FUNCTION_LINES` (from its `def` to its last line, docstring included), and
no import circle among the modules as they import each other when they load (at module level or
in a class body; not inside a function, not under `if TYPE_CHECKING:`).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.support.paths import ROOT

PACKAGE = ROOT / "medtpe"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    """Every module of `medtpe` by its dotted name (a package's `__init__` under the package's)."""
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def loaded_imports(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements among `nodes` and inside them that run when their module loads:
    none in a function's body, none under `if TYPE_CHECKING:` (its `else` runs)."""
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from loaded_imports(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from loaded_imports(ast.iter_child_nodes(node))


def imported_when_loaded(source: str, known: Iterable[str]) -> set[str]:
    """The modules of `known` that a module of text `source` imports when it loads: `import a.b`
    imports `a.b`; `from a import b` imports `a`, and `a.b` where that is a module."""
    targets = set()
    for node in loaded_imports(ast.parse(source).body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif node.module and not node.level:
            targets.add(node.module)
            targets.update(f"{node.module}.{alias.name}" for alias in node.names)
    return targets & set(known)


def load_graph() -> dict[str, set[str]]:
    """Each module of `medtpe` and the other modules of `medtpe` it imports when it loads."""
    found = modules()
    return {
        name: imported_when_loaded(path.read_text(), found) - {name} for name, path in found.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per group of modules that reach each other (the graph's strongly connected
    components over one module), each as a path from its first module back to it, in name order."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(name: str) -> None:
        order[name] = low[name] = len(order)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in order:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], order[target])
        if low[name] == order[name]:
            group = {stack.pop()}
            while name not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return sorted(_shortest_circle(graph, group) for group in groups)


def _shortest_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path from the group's first module back to it, within the group."""
    start = min(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        name = queue.popleft()
        for target in sorted(graph[name] & group):
            if target == start:
                path = [name]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = name
                queue.append(target)
    raise AssertionError(f"{sorted(group)} holds no circle")


def test_no_module_is_over_the_line_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == [], (
        f"modules over {MAX_MODULE_LINES} lines (split each into modules named for what they "
        "do):\n" + "\n".join(long)
    )


def test_no_function_is_over_the_line_limit() -> None:
    long = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert long == [], (
        f"functions over {MAX_FUNCTION_LINES} lines, docstring included (split each into named "
        "helpers):\n" + "\n".join(long)
    )


def test_no_import_circle_among_the_modules() -> None:
    found = [" -> ".join(circle) for circle in circles(load_graph())]
    assert found == [], (
        "modules of medtpe that import each other when they load (a circle each, from a module "
        "back to it; import the name from the module that defines it, or move what both "
        "need):\n" + "\n".join(found)
    )


def test_the_import_graph_counts_only_what_runs_at_load() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import medtpe.x.one\n"
        "from medtpe.x import two, NAME\n"
        "if TYPE_CHECKING:\n"
        "    import medtpe.x.three\n"
        "else:\n"
        "    import medtpe.x.four\n"
        "class Holder:\n"
        "    import medtpe.x.five\n"
        "def lazy():\n"
        "    import medtpe.x.six\n"
    )
    known = {f"medtpe.x.{n}" for n in ("one", "two", "three", "four", "five", "six")}
    assert imported_when_loaded(source, {"medtpe.x", *known}) == {
        "medtpe.x",
        "medtpe.x.one",
        "medtpe.x.two",
        "medtpe.x.four",
        "medtpe.x.five",
    }


def test_circles_are_found_and_named_as_paths() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert circles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []
