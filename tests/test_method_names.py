"""No module outside ``skipsearch/methods/`` branches on a method's name: what differs between methods is asked of
the registry (``Method.record``, ``Method.replan``, ``Method.predict``, ...), so that adding a method touches its
own package and one registry line.

The source is read with ``ast``, as the import-graph test reads it. A module *branches on a method's name* where it
compares something with a registered method's name, or looks something up by one: a string literal equal to a
registered name (``"ngram"``), or a method record's ``.name`` (``NGRAM.name``, ``ngram.METHOD.name``, where
``NGRAM`` was imported as some package's ``METHOD``), inside a comparison (``==``, ``!=``, ``in``, ``not in``,
also as an element of a tuple, list or set compared against), a subscript (``table["hybrid"]``), a ``.get(...)``
call or a ``match`` case. Naming a method to build a candidate or to write a profile is not branching.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from skipsearch import methods

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "skipsearch"
OWN = PACKAGE / "methods"  # where a method may name itself and the methods it builds on


def _method_records(tree: ast.AST) -> set[str]:
    """Local names bound to a method package's ``METHOD`` record (``from skipsearch.methods.x import METHOD as X``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("skipsearch.methods"):
            out.update(alias.asname or alias.name for alias in node.names if alias.name == "METHOD")
    return out


def _names_a_method(node: ast.AST, records: set[str], names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_method(e, records, names) for e in node.elts)
    if isinstance(node, ast.Attribute) and node.attr == "name":  # X.name, pkg.METHOD.name
        owner = node.value
        return (isinstance(owner, ast.Name) and owner.id in records) or (
            isinstance(owner, ast.Attribute) and owner.attr == "METHOD")
    return False


def branches_on_method_names(source: str, names: Iterable[str], filename: str = "<source>") -> list[str]:
    """Each place in ``source`` that compares with, or looks up by, one of ``names`` (see the module's docstring),
    as ``<file>:<line>: <code>``."""
    tree, names = ast.parse(source, filename=filename), set(names)
    records = _method_records(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = any(_names_a_method(n, records, names) for n in (node.left, *node.comparators))
        elif isinstance(node, ast.Subscript):
            hit = _names_a_method(node.slice, records, names)
        elif isinstance(node, ast.Call):
            hit = (isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                   and any(_names_a_method(a, records, names) for a in node.args[:1]))
        elif isinstance(node, ast.MatchValue):
            hit = _names_a_method(node.value, records, names)
        else:
            continue
        if hit:
            found.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_checker_finds_literals_records_and_lookups():
    names = ("ngram", "layer-skip")
    source = '''
from skipsearch.methods.ngram import METHOD as NGRAM
from skipsearch.methods import hybrid
a = candidate.method == "ngram"
b = method in ("layer-skip", "x")
c = candidate.method != NGRAM.name
d = table["ngram"]
e = methods.get("layer-skip")
f = hybrid.METHOD.name == m
match m:
    case "ngram":
        pass
g = Candidate("ngram", draft)       # building a candidate is not branching
h = method == "hybrid"              # not a name in ``names``
i = f"{NGRAM.name} fp16"            # a message
'''
    found = branches_on_method_names(source, names)
    assert [line.split(":")[1] for line in found] == ["4", "5", "6", "7", "8", "9", "11"], found


def test_no_module_outside_methods_branches_on_a_method_name():
    names = set(methods.names())
    assert {"layer-skip", "ngram", "hybrid"} <= names  # the registry the check reads is the real one
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if OWN in path.parents:
            continue
        found += branches_on_method_names(path.read_text(), names, str(path.relative_to(ROOT)))
    assert not found, ("modules outside skipsearch/methods/ branch on a method's name; ask the registry "
                       "(skipsearch.methods) instead:\n" + "\n".join(found))
