"""The README's Python snippets run as written (on CPU), and every path the README and docs name
exists: the documentation is tested like the code."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
        *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_python_snippets_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything a snippet writes lands here
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    text = doc.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)  # markdown links, anchors dropped
    named = re.findall(r"`((?:te_gemm_callback|recipes|scripts|benchmarks|tests|docs)/[\w./-]+)`", text)
    missing = []
    for target in links:
        if target.startswith(("http://", "https://")):
            continue
        if not (doc.parent / target).exists():
            missing.append(target)
    for target in named:
        path = target.split("::")[0]
        if not (ROOT / path).exists() and not (doc.parent / path).exists():
            missing.append(target)
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def test_no_history_in_the_product():
    """Code, docs and tests speak of the product; history lives in CHANGELOG.md and git."""
    # (bracketed letters: this line must not match itself)
    pattern = re.compile(r"sessio[n] [0-9]|issu[e] [0-9]|reviewe[r]|see[d] (tool|config|script)|see[d]'s", re.I)
    hits = []
    for base in ("te_gemm_callback", "scripts", "benchmarks", "docs", "tests", "recipes"):
        for p in (ROOT / base).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".md", ".sh", ".toml"):
                hits += [f"{p.relative_to(ROOT)}:{i}" for i, line in enumerate(p.read_text().splitlines(), 1)
                         if pattern.search(line)]
    hits += [f"README.md:{i}" for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not hits, hits


def test_every_package_ships():
    """pyproject.toml lists the packages (recipes/ installs as te_gemm_callback.recipes): every
    folder of the tree with an __init__.py is listed, and nothing else."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "te_gemm_callback").rglob("__init__.py")}
    tree |= {"te_gemm_callback." + ".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "recipes").rglob("__init__.py")}
    assert listed == tree


def test_recipes_run_from_the_checkout(tmp_path):
    """`python recipes/X.py` (sys.path[0] is recipes/) finds its shared code as the installed package."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "recipes" / "dense.py"), "--help"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--layers" in out.stdout


def report_json_names() -> set[str]:
    """Every name written as code (fenced or inline) in capture-format.md's report.json section."""
    text = (ROOT / "docs" / "capture-format.md").read_text()
    section = text.split("## `report.json`", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```.*?```|`[^`]+`", section, flags=re.S)
    return set(re.findall(r"[A-Za-z_]\w*", " ".join(code)))


def test_every_report_json_key_is_documented(tmp_path):
    """A report.json key at the top, in a recipe row or in meta that capture-format.md does not name
    fails here: the file format's page cannot fall behind the report again."""
    import json
    import shutil

    from te_gemm_callback.analysis.verdicts import RecipeAnalysis, Report
    from te_gemm_callback.reporting.run import report

    run = tmp_path / "main"
    shutil.copytree(ROOT / "docs" / "results" / "h200" / "replay" / "main", run)
    report(run, project=["B300"])  # a sweep, a bench, a replay and a projection: the meta keys they add
    d = json.loads((run / "report.json").read_text())
    # Keys a report holds only in other cases: every row field, and a GEMM time not of the step.
    timed = Report("BF16", 10.0, 4.0, [], {}, {"gemm_share_basis": "timed steps"}).to_dict()
    keys = {"top-level": set(d) | set(timed), "meta": set(d["meta"]),
            "recipes[]": {k for r in d["recipes"] for k in r} | set(RecipeAnalysis("BF16").to_dict())}
    assert "predicted_gemms_alone" in keys["recipes[]"] and "projections" in keys["meta"]
    names = report_json_names()
    missing = {where: sorted(ks - names) for where, ks in keys.items() if ks - names}
    assert not missing, f"docs/capture-format.md's report.json section does not name: {missing}"


def test_every_verdict_kind_is_named_where_report_json_is_described():
    """A verdict added to the code and not to the file formats (``not_judged`` was) is a key value no reader
    can look up."""
    from te_gemm_callback.analysis.findings import Verdict

    text = (ROOT / "docs" / "capture-format.md").read_text()
    assert [v.value for v in Verdict if f"`{v.value}`" not in text] == []
