"""No import cycle inside te_gemm_callback, and every import follows the stage map (docs/design.md):
each module can be read, tested and moved knowing only what it imports, and a stage never reaches
into one that comes after it. The graph is read from the source (no module is imported): every ``import`` and ``from``
statement, at module level, inside functions and under ``if TYPE_CHECKING:`` alike, since a cycle
that only a function-level import closes still ties the two modules together.

A function-level import is kept where deferring is the point: the last test checks that
``import te_gemm_callback.cli`` loads no torch, matplotlib or training framework.

``python tests/test_import_graph.py`` prints the cycles.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "te_gemm_callback"
# Folders outside the package tree that install as its subpackages (pyproject.toml's package-dir).
MAPPED = {"te_gemm_callback.recipes": PACKAGE.parent / "recipes"}

# The stage map, in order: a module may import its own stage and the stages before it. "base" is
# what every stage shares (the GEMM convention, TE's recipes, printing, the CUDA probe, files);
# the package's __init__ (the public API) may import anything.
STAGES = ("base", "capture", "sweep", "microbench", "analysis", "projection", "reporting", "schedule",
          "adapters", "recipes", "cli")
BASE = {"shapes", "precisions", "printable", "torch_cuda", "options", "files"}


def modules(root: Path, mapped: dict[str, Path] | None = None) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for every module under ``root``, and under
    each folder of ``mapped`` (dotted package name -> folder)."""
    out = {}
    trees = [(root, root.name)] + sorted((folder, name) for name, folder in (mapped or {}).items())
    for folder, prefix in trees:
        for path in sorted(folder.rglob("*.py")):
            parts = prefix.split(".") + list(path.relative_to(folder).with_suffix("").parts)
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


def import_graph(root: Path = PACKAGE, mapped: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the package modules its import statements run. Importing ``a.b.c`` also runs the
    ``__init__`` of ``a`` and ``a.b``: edges too, except to the importer's own enclosing packages,
    which are already being imported when it runs (a package whose ``__init__`` imports its own
    submodules is not a cycle)."""
    mods = modules(root, MAPPED if root == PACKAGE and mapped is None else mapped)
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


def stage(module: str) -> str | None:
    """The stage a module belongs to (None: the package's own __init__, the public API)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return "base" if parts[1] in BASE else parts[1]


def against_the_map(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a later stage (or of a folder the map does not name), as 'a -> b'."""
    bad = []
    for a in sorted(graph):
        sa = stage(a)
        for b in sorted(graph[a]):
            sb = stage(b)
            if sa is None or sb is None:
                continue
            if sa not in STAGES or sb not in STAGES or STAGES.index(sb) > STAGES.index(sa):
                bad.append(f"{a} ({sa}) -> {b} ({sb})")
    return bad


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
    assert "te_gemm_callback.capture.attach" in graph["te_gemm_callback.capture.profiler"]
    # A function-level import counts: capture/__init__ loads the profiler only when asked for it.
    assert "te_gemm_callback.capture.profiler" in graph["te_gemm_callback.capture"]


def test_no_import_cycle_in_capture():
    graph = import_graph()
    groups = [g for g in cycles(graph) if any(m.startswith("te_gemm_callback.capture.") for m in g)]
    assert not groups, _report(groups, graph)


def test_every_import_follows_the_stage_map():
    bad = against_the_map(import_graph())
    assert not bad, "imports against the stage map (tests/test_import_graph.py STAGES):\n" + "\n".join(bad)


def test_the_stage_map_check_can_fail():
    """An earlier stage importing a later one is found, even from inside a function; a later one
    importing an earlier one, or the public API importing any, is not; a folder the map does not
    name is."""
    graph = {"te_gemm_callback": {"te_gemm_callback.cli"},
             "te_gemm_callback.sweep.engine": {"te_gemm_callback.analysis.plan", "te_gemm_callback.capture"},
             "te_gemm_callback.analysis.plan": {"te_gemm_callback.sweep.plan", "te_gemm_callback.files.jsonio"},
             "te_gemm_callback.newstage.x": {"te_gemm_callback.shapes"}}
    assert against_the_map(graph) == [
        "te_gemm_callback.newstage.x (newstage) -> te_gemm_callback.shapes (base)",
        "te_gemm_callback.sweep.engine (sweep) -> te_gemm_callback.analysis.plan (analysis)"]
    # The real graph holds the recipes folder as the package's, and the map names every stage.
    real = import_graph()
    assert "te_gemm_callback.recipes.demo" in real
    assert {stage(m) for m in real} - {None} <= set(STAGES)


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    groups = cycles(graph)
    assert not groups, _report(groups, graph)


# What `import te_gemm_callback` and the CLI must start without: the commands import what loads these
# inside themselves, so that a wrong flag or `te-gemm cache list` costs no torch start-up.
HEAVY = ("torch", "matplotlib", "transformers", "pytorch_lightning")


def test_the_package_and_the_cli_import_without_torch():
    code = ("import sys, te_gemm_callback, te_gemm_callback.cli; "
            f"print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", f"`import te_gemm_callback.cli` loaded {proc.stdout.strip()}"


def test_every_help_prints_without_torch():
    """`te-gemm --help` and each command's help build the whole parser (the project command's GPU
    list among it): none of it may load torch (it did, through the projection's bench results)."""
    code = ("import contextlib, io, sys\n"
            "from te_gemm_callback.cli import build_parser, main\n"
            "names = [''] + sorted(next(a for a in build_parser()._actions if a.dest == 'cmd').choices)\n"
            "for name in names:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main([name, '--help'] if name else ['--help'])\n"
            "print(len(names))\n"
            f"print('loaded:', *sorted(m for m in {HEAVY!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, loaded = proc.stdout.splitlines()[-2:]
    assert int(count) > 5, proc.stdout
    assert loaded == "loaded:", f"a --help {loaded}"


if __name__ == "__main__":
    g = import_graph()
    found = cycles(g)
    print(_report(found, g) if found else "no import cycle")
    against = against_the_map(g)
    print("\n".join(against) if against else "every import follows the stage map")
    sys.exit(1 if found or against else 0)


def test_importing_the_package_draws_nothing_from_a_seeded_stream():
    """A job that seeds Python's random stream and then imports us draws what it drew without us
    (rich draws once at its import)."""
    code = ("import random\n"
            "random.seed(0)\n"
            "import te_gemm_callback, te_gemm_callback.reporting.speedups, te_gemm_callback.schedule\n"
            "print(random.random() == random.Random(0).random())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"
