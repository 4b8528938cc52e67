"""The import graph of skipsearch/ has no circles: data flows one way, and a lower layer never imports a
higher one, not even inside a function.

The graph is read with ``ast`` from the source, so an import inside a function counts as much as one at
the top of a module; only ``if TYPE_CHECKING:`` imports (annotations, never run) are left out. An edge
goes to the module a name comes from: ``from skipsearch.methods import base`` is an edge to
``skipsearch.methods.base``, ``from skipsearch.methods import get`` one to ``skipsearch.methods``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "skipsearch"


# -- the graph ---------------------------------------------------------------------------------------------
def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions included), except the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the else branch does run
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The package's modules that module ``name`` imports."""
    known = set(known)
    is_package = path.name == "__init__.py"
    out = set()

    def nearest(dotted: str) -> str | None:  # the module itself, or the innermost known package holding it
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [nearest(alias.name) for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1 packages
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else nearest(base)
                       for alias in node.names]
        out.update(t for t in targets if t is not None and t != name and t.split(".")[0] == PACKAGE)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    names = module_names(root)
    return {name: imports_of(name, path, names) for name, path in names.items()}


# -- circles -----------------------------------------------------------------------------------------------
def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One circle per strongly connected group of more than one module, each as a path ``[a, b, ..., a]``
    that follows the imports, sorted by their first module."""
    graph = {k: sorted(set(v)) for k, v in graph.items()}
    return sorted((_path_through(graph, group) for group in tangles(graph)), key=lambda p: p[0])


def tangles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan): every module in one reaches every other."""
    graph = {k: sorted(set(v)) for k, v in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # iterative DFS: (node, iterator over its successors)
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, ()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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
                        groups.append(frozenset(group))
    return groups


def _path_through(graph: Mapping[str, list[str]], group: set[str]) -> list[str]:
    """A shortest circle through the group's first module, by breadth-first search inside the group."""
    first = min(group)
    parent: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for nxt in graph.get(node, ()):
                if nxt not in group:
                    continue
                if nxt == first:  # back at the start: walk the parents from node to it
                    path = [node]
                    while path[-1] != first:
                        path.append(parent[path[-1]])
                    return [*reversed(path), first]
                if nxt not in parent:
                    parent[nxt] = node
                    following.append(nxt)
        frontier = following
    return sorted(group)  # unreachable for a strongly connected group


def _shown(cycle: list[str]) -> str:
    return " -> ".join(cycle)


# -- the tests ---------------------------------------------------------------------------------------------
def test_the_cycle_finder_finds_a_circle_and_names_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}, "f": {"g"}, "g": {"f"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["f", "g", "f"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_the_graph_reader_sees_function_local_and_relative_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from skipsearch.sub import low\n")
    (pkg / "sub" / "low.py").write_text("def f():\n    from ..high import x\n")
    (pkg / "high.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import skipsearch.other\n"
                                 "from skipsearch.sub import g\n")
    (pkg / "other.py").write_text("import skipsearch.sub.low\n")
    graph = import_graph(tmp_path)
    assert graph["skipsearch.sub.low"] == {"skipsearch.high"}  # inside a function, relative
    assert graph["skipsearch.high"] == {"skipsearch.sub"}  # a name from the package: its __init__
    assert graph["skipsearch.other"] == {"skipsearch.sub.low"}
    assert find_cycles(graph) == [["skipsearch.high", "skipsearch.sub", "skipsearch.sub.low", "skipsearch.high"]]


# Circles known today, each with what ties it. The test fails on any other circle, on one of these that grew,
# and on one of these that is gone (then delete its line): the list only shrinks.
KNOWN: dict[frozenset[str], str] = {}


def test_skipsearch_has_no_import_circles_but_the_known_ones():
    graph = import_graph()
    found = set(tangles(graph))
    new = found - set(KNOWN)  # a known circle that grew is a new one
    assert not new, "import circles in skipsearch/ (function-local imports count):\n" + "\n".join(
        f"{_shown(_path_through(graph, g))}; its imports: "
        + ", ".join(f"{a} -> {b}" for a in sorted(g) for b in sorted(graph[a]) if b in g) for g in new)
    gone = [sorted(k) for k in KNOWN if k not in found]
    assert not gone, f"these circles are gone: delete them from KNOWN: {gone}"


def test_python_m_skipsearch_still_runs():
    out = subprocess.run([sys.executable, "-m", PACKAGE, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Usage" in out.stdout


# -- the layers are folders --------------------------------------------------------------------------------
# docs/development.md's layers, lowest first. The top of skipsearch/ holds only the ground floor's shared modules
# (and __main__, the entry point above everything); every other module is in its layer's folder, and a folder
# imports only folders below it (and the ground floor), not even inside a function.
GROUND = {"config", "data", "hardware", "notices", "interrupts", "tested", "measure", "memory", "checkpoints",
          "kv_cache", "kept"}
LAYERS = ("kernels", "model", "files", "servers", "engine", "methods", "profile", "search", "roofline", "export",
          "bench", "api", "cli")


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "ground"


def test_the_top_of_the_package_holds_only_the_ground_floor_and_every_layer_is_a_folder():
    top = {p.stem for p in (ROOT / PACKAGE).glob("*.py")} - {"__init__", "__main__"}
    assert top == GROUND, f"modules at the top of skipsearch/ that belong in a layer's folder: {sorted(top - GROUND)}"
    folders = {p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS), f"folders that are not a layer of LAYERS (or layers with no folder): " \
                                   f"{sorted(folders ^ set(LAYERS))}"


def test_each_layer_imports_only_the_layers_below_it():
    order = {name: i for i, name in enumerate(("ground", *LAYERS))}
    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() if a != f"{PACKAGE}.__main__"
                    for b in targets if order[_room(b)] > order[_room(a)])
    assert not upward, "imports that run up the layers (docs/development.md):\n" + "\n".join(upward)


def test_the_layer_reader_places_modules_in_their_folders():
    assert _room("skipsearch.engine.decoding") == "engine" and _room("skipsearch.config") == "ground"
    assert _room("skipsearch.methods.fractal.drafter") == "methods" and _room("skipsearch") == "ground"


# The sizes issue 61 set for a room you can read (docs/development.md, "Style"): a module over them is split where a
# name explains a part, as kernels/call_key.py and model/stack.py were.
MODULE_LINES, FUNCTION_LINES = 500, 80


def test_no_module_is_over_500_lines_and_no_function_over_80():
    long_modules, long_functions = [], []
    for name, path in sorted(module_names().items()):
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            long_modules.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {lines} lines")
    assert not long_modules, f"modules over {MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {FUNCTION_LINES} lines: {long_functions}"


# A method's internals are its own: outside methods/, code imports the registry (skipsearch.methods), the shared
# base and summary, and a method's package or module (its face), never a module inside a method's package. The
# exceptions, each with its reason; like KNOWN, the list only shrinks.
INSIDE_A_METHOD = {
    "skipsearch.methods.clasp_dynamic.dp": "the CLaSp strategy runs the method's DP over calibration prompts",
    "skipsearch.methods.hierarchical.planner": "skipsearch plan runs the hierarchical planner (no strategy of its own)",
    "skipsearch.methods.hierarchical.closed_form": "skipsearch plan prints and draws the planner's closed forms",
}


def test_nothing_outside_methods_imports_a_methods_internals_but_the_named_exceptions():
    names = module_names()
    faces = {n for n in names if n.count(".") == 2 and n.startswith(f"{PACKAGE}.methods.")}
    found = {b for a, targets in import_graph().items() if not a.startswith(f"{PACKAGE}.methods")
             for b in targets if b.startswith(f"{PACKAGE}.methods.") and b not in faces}
    assert found <= set(INSIDE_A_METHOD), f"a method's internals imported from outside methods/: " \
                                          f"{sorted(found - set(INSIDE_A_METHOD))}"
    gone = set(INSIDE_A_METHOD) - found
    assert not gone, f"no longer imported from outside methods/: delete from INSIDE_A_METHOD: {sorted(gone)}"


def test_an_old_import_path_is_the_moved_module_and_says_where_it_went():
    code = ("import warnings, sys\nwarnings.simplefilter('error')\n"
            "import skipsearch.engine.decoding as new\n"
            "try:\n    import skipsearch.decoding\nexcept DeprecationWarning as w:\n    print(w)\n"
            "warnings.simplefilter('ignore')\n"
            "from skipsearch.decoding import generate\nimport skipsearch.study.runner as old_runner\n"
            "import skipsearch.search.study.runner as runner\n"
            "assert sys.modules['skipsearch.decoding'] is new and generate is new.generate\n"
            "assert old_runner is runner and runner.__spec__.name == 'skipsearch.search.study.runner'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("skipsearch.decoding moved to skipsearch.engine.decoding; the old path goes in the "
                                  "next release")
