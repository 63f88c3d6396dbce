"""No import circles: within each package, and across the repository's packages
(ddpwatch, trainer), imports go one way, lazy ones (inside a function) counted
too. tests/unit/project/test_layout.py checks the direction between the stages; this checks
every module, so a circle inside one stage (ddpwatch/rank's automatic heartbeats
once had auto -> autoboot -> auto, hidden in function bodies) fails here.

The graph is read from the source with `ast`, nothing is imported. An edge is an
`import` or `from ... import` of a module of the repository: `from pkg import
name` goes to pkg.name when that is a module (a .py file, a package, or a C
extension built from pkg/name.c), else to pkg itself. The implicit import of a
module's parent packages is not an edge (a package whose __init__ re-exports its
modules is the usual shape, and Python imports the parent first)."""
from __future__ import annotations

import ast
import os

from conftest import REPO

PACKAGES = ("ddpwatch", "trainer")


def source_modules(root: str, packages=PACKAGES) -> dict[str, str]:
    """dotted module name -> path, for every .py file under the packages."""
    found = {}
    for package in packages:
        for dirpath, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted[:-9] if dotted.endswith(".__init__") else dotted] = path
    return found


def _is_module(root: str, dotted: str, known: dict[str, str]) -> bool:
    if dotted in known:
        return True
    base = os.path.join(root, *dotted.split("."))
    return os.path.exists(base + ".c")  # an extension module (setup.py's ext_modules)


def _containing(dotted: str, known: dict[str, str]) -> str | None:
    """The longest prefix of `dotted` that is a module of the repository."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return None


def import_edges(root: str, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported module of the repository -> line of the first such import}."""
    known = source_modules(root, packages)
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for module, path in known.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        targets: list[tuple[int, str]] = []
        for node in ast.walk(tree):  # every statement: function bodies too
            if isinstance(node, ast.Import):
                targets += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.append((node.lineno,
                                    full if _is_module(root, full, known) else source))
        for line, target in targets:
            if _is_module(root, target, known) and target not in known:
                continue  # a C extension: imports nothing of ours
            found = _containing(target, known)
            if found is not None and found != module:
                graph[module].setdefault(found, line)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative, so a deep chain of imports cannot hit the recursion limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
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
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def describe(graph, component, root=REPO) -> str:
    members = set(component)
    known = source_modules(root, {m.split(".")[0] for m in members})
    lines = [f"  {os.path.relpath(known[m], root)}:{line} imports {target}"
             for m in component for target, line in sorted(graph[m].items())
             if target in members]
    return "import circle among " + ", ".join(component) + ":\n" + "\n".join(lines)


def test_no_module_is_in_an_import_circle():
    graph = import_edges(REPO)
    assert "ddpwatch.rank.autoboot" in graph and graph["ddpwatch.rank.autoboot"], \
        "the graph missed ddpwatch/rank (its lazy imports)"
    found = circles(graph)
    assert not found, "\n".join(describe(graph, c) for c in found)


def test_the_automatic_heartbeat_modules_import_one_way():
    """autoboot (start-up) -> auto, autohook -> autowarn, the leaf."""
    graph = import_edges(REPO)
    rank = {m.rpartition(".")[2]: {t.rpartition(".")[2] for t in targets
                                   if t.startswith("ddpwatch.rank.")}
            for m, targets in graph.items() if m.startswith("ddpwatch.rank.")}
    assert {"auto", "autohook", "autowarn"} <= rank["autoboot"]
    assert "autowarn" in rank["auto"] and "autowarn" in rank["autohook"]
    assert rank["autowarn"] == set()


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    """The check itself: a circle closed by a lazy import, and one through a
    package's __init__, are reported; a C extension and the parent package are
    not edges."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import thing\n")
    (pkg / "a.py").write_text("from . import b\nthing = 1\n")
    (pkg / "b.py").write_text("def late():\n    from .a import thing\n    return thing\n")
    (pkg / "fast.c").write_text("/* built by setup.py */\n")
    (pkg / "c.py").write_text("from . import fast\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("import pkg.sub\nfrom .. import c\n")
    (pkg / "sub" / "e.py").write_text("from . import d\n")
    graph = import_edges(str(tmp_path), ("pkg",))
    assert graph["pkg.b"] == {"pkg.a": 2}
    assert graph["pkg.c"] == {} and graph["pkg.sub.e"] == {"pkg.sub.d": 1}
    assert graph["pkg.sub.d"] == {"pkg.sub": 1, "pkg.c": 2}
    assert circles(graph) == [["pkg.a", "pkg.b"]]
    (pkg / "sub" / "__init__.py").write_text("from .e import *\n")
    assert sorted(circles(import_edges(str(tmp_path), ("pkg",)))) == [
        ["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.d", "pkg.sub.e"]]
