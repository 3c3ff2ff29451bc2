"""The tests mirror the package tree: the tests of a stage sit in tests/<stage>/, named after a
package of te_gemm_callback (or recipes/, installed as te_gemm_callback.recipes), so the test of a
module is found beside its stage's name; only the suites that cross stages sit at the top.

pytest imports each test file by its name, with its own folder on sys.path (no __init__.py, the
default import mode): names are unique across tests/, and a test imports another test module only
from its own folder. What tests of several folders share lives in tests/helpers/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# At the top: the suites that cross stages, and those of what is no stage (the docs, benchmarks/).
TOP = {"test_benchmark_stats.py", "test_docs.py", "test_faults.py", "test_faults_files.py", "test_faults_jobs.py",
       "test_gpu.py", "test_import_graph.py", "test_job_left_as_it_was.py", "test_layout.py", "test_options.py",
       "test_torch_cuda.py"}


def stages(root: Path = ROOT) -> set[str]:
    """The folders a test may sit in: the packages of te_gemm_callback, and recipes."""
    return {p.parent.name for p in (root / "te_gemm_callback").glob("*/__init__.py")} | {"recipes"}


def _imported_tests(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {n for n in names if n.split(".")[0].startswith("test_")}


def misplaced(tests: Path = TESTS, allowed: set[str] | None = None, top: set[str] = TOP) -> list[str]:
    """Every way the tests under ``tests`` leave the layout, one line each."""
    allowed = stages() if allowed is None else allowed
    problems, seen = [], {}
    files = sorted(p for p in tests.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        rel = path.relative_to(tests)
        if rel.parts[0] == "helpers":
            continue
        if path.name == "__init__.py":
            problems.append(f"{rel}: no __init__.py in tests/ (pytest imports each test file by its name)")
            continue
        if not path.name.startswith("test_"):
            if len(rel.parts) > 1:
                problems.append(f"{rel}: only test files in a stage's folder (shared code: tests/helpers/)")
            continue
        if path.name in seen:
            problems.append(f"{rel}: the same name as {seen[path.name]} (pytest imports test files by name)")
        seen[path.name] = rel
        if len(rel.parts) == 1 and path.name not in top:
            problems.append(f"{rel}: at the top of tests/, which holds only {sorted(top)}; "
                            f"a stage's tests go to tests/<stage>/")
        elif len(rel.parts) == 2 and rel.parts[0] not in allowed:
            problems.append(f"{rel}: {rel.parts[0]}/ is no package of te_gemm_callback ({', '.join(sorted(allowed))})")
        elif len(rel.parts) > 2:
            problems.append(f"{rel}: one folder deep at most (tests/<stage>/test_x.py)")
    for path in files:
        rel = path.relative_to(tests)
        if rel.parts[0] == "helpers":
            continue
        for name in sorted(_imported_tests(path)):
            if not (path.parent / f"{name.split('.')[0]}.py").exists():
                problems.append(f"{rel}: imports {name}, not in its own folder (shared code: tests/helpers/)")
    problems += [f"{name}: listed at the top of tests/ but not there" for name in sorted(top - {
        p.name for p in tests.glob("test_*.py")})]
    return problems


def test_the_tests_mirror_the_package_tree():
    assert not misplaced(), "\n".join(misplaced())


def test_the_layout_check_can_fail(tmp_path):
    tests = tmp_path / "tests"
    for rel, text in [("test_docs.py", ""), ("capture/test_profiler.py", ""), ("test_bench.py", ""),
                      ("widgets/test_widget.py", ""), ("sweep/test_profiler.py", ""), ("sweep/__init__.py", ""),
                      ("sweep/deeper/test_deep.py", ""), ("sweep/test_rounds.py", "from test_bench import x\n"),
                      ("capture/test_graphs.py", "import test_profiler\n"), ("helpers/models.py", "")]:
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text(text)
    found = misplaced(tests, allowed={"capture", "sweep"}, top={"test_docs.py", "test_gpu.py"})
    said = "\n".join(found)
    assert len(found) == 7, said
    for needle in ("sweep/__init__.py: no __init__.py", "test_bench.py: at the top of tests/",
                   "widgets/ is no package of te_gemm_callback",
                   "sweep/test_profiler.py: the same name as capture/test_profiler.py", "one folder deep at most",
                   "sweep/test_rounds.py: imports test_bench, not in its own folder",
                   "test_gpu.py: listed at the top of tests/ but not there"):
        assert needle in said, said
    # A test module of its own folder is imported, and tests/helpers/ holds no tests: both fine.
    assert not [line for line in found if line.startswith(("capture/test_graphs.py", "helpers/"))], said
