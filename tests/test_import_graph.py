"""No import cycle inside te_gemm_callback: each module can be read, tested and moved knowing only what
it imports. The graph is read from the source (no module is imported): every ``import`` and ``from``
statement, at module level, inside functions and under ``if TYPE_CHECKING:`` alike, since a cycle
that only a function-level import closes still ties the two modules together.

``python tests/test_import_graph.py`` prints the cycles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "te_gemm_callback"


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _known(name: str, mods: dict) -> str | None:
    """The deepest module of the package that ``name`` lies in (None: outside the package)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imported(node: ast.AST, package: str, mods: dict) -> list[str]:
    """The package modules one import statement names (``package``: the importer's package)."""
    if isinstance(node, ast.Import):
        return [m for a in node.names if (m := _known(a.name, mods))]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    out = []
    for alias in node.names:
        # ``from pkg import sub`` imports the submodule; ``from pkg import name``, pkg's __init__.
        sub = f"{base}.{alias.name}"
        if m := sub if sub in mods else _known(base, mods):
            out.append(m)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package modules its import statements run. Importing ``a.b.c`` also runs the
    ``__init__`` of ``a`` and ``a.b``: edges too, except to the importer's own enclosing packages,
    which are already being imported when it runs (a package whose ``__init__`` imports its own
    submodules is not a cycle)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in imported(node, package, mods):
                parts = target.split(".")
                for t in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
                    if t in mods and t != name and not name.startswith(t + "."):
                        graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
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
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def describe(group: list[str], graph: dict[str, set[str]]) -> str:
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & set(group)))}" for m in group)


def _report(groups: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "import cycles:\n" + "\n".join(describe(g, graph) for g in groups)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The check can fail: a cycle closed by a function-level, a relative or a TYPE_CHECKING import
    is found, and a package importing its own submodules is not one."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("A = 1\n\ndef f():\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("from . import a\nB = 2\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..sub import d\n")
    (pkg / "sub" / "d.py").write_text("import pkg.sub.c\n")
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]


def test_the_graph_reads_the_package():
    graph = import_graph()
    assert "te_gemm_callback.capture.stepping" in graph["te_gemm_callback.capture.profiler"]
    # A function-level import counts: capture/__init__ loads the profiler only when asked for it.
    assert "te_gemm_callback.capture.profiler" in graph["te_gemm_callback.capture"]


def test_no_import_cycle_in_capture():
    graph = import_graph()
    groups = [g for g in cycles(graph) if any(m.startswith("te_gemm_callback.capture.") for m in g)]
    assert not groups, _report(groups, graph)


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    groups = cycles(graph)
    assert not groups, _report(groups, graph)


if __name__ == "__main__":
    g = import_graph()
    found = cycles(g)
    print(_report(found, g) if found else "no import cycle")
    sys.exit(1 if found else 0)
