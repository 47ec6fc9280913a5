"""The documentation: the site builds strictly (no broken link or anchor), the settings page
is the generated one, no page narrates the history of the work, the README stays short, and
every benchmark script is documented in benchmarks/README.md, and no test imports one (what
a test exercises lives in the package or a helper under tests/)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
HISTORY = re.compile(r"\b(stop|round) \d+", re.IGNORECASE)


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted(BENCHMARKS.rglob("*.md"))]


def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it is in the dev extras)")
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()  # benchmarks/README.md


def test_the_settings_page_is_the_generated_one():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "settings_docs.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_no_page_narrates_the_history_of_the_work():
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
             for page in doc_pages()
             for n, line in enumerate(page.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "history belongs in git, not in the docs:\n" + "\n".join(found)


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines; move detail into docs/"


def test_every_benchmark_script_is_documented_and_no_reverted_patch_is_kept():
    readme = (BENCHMARKS / "README.md").read_text()
    scripts = [p for p in BENCHMARKS.rglob("*") if p.suffix in (".py", ".sh", ".toml")
               and "results" not in p.parts]
    assert scripts
    missing = [str(p.relative_to(BENCHMARKS)) for p in scripts
               if str(p.relative_to(BENCHMARKS)) not in readme]
    assert not missing, f"benchmarks/README.md does not name: {missing}"
    assert not list(BENCHMARKS.rglob("*_tried_*.patch"))


def benchmark_imports(text: str, scripts: set[str]) -> list[str]:
    """Where a test's source imports a benchmark script: an import of a script's module name
    (after a ``sys.path`` insert), ``sys.path`` given a benchmarks path, or an import by file
    path (``spec_from_file_location``) in a file that names benchmarks/."""
    found = []
    for node in ast.walk(ast.parse(text)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [f"{node.lineno}: imports {n}" for n in names if n.split(".")[0] in scripts | {"benchmarks"}]
    for n, line in enumerate(text.splitlines(), 1):
        if re.search(r"sys\.path\.(insert|append)\(|sys\.path\[", line) and "benchmarks" in line:
            found.append(f"{n}: {line.strip()}")
        if "spec_from_file_location" in line and "benchmarks" in text:
            found.append(f"{n}: {line.strip()}")
    return found


def test_no_test_imports_a_benchmark_script():
    tests = sorted(p for p in Path(__file__).parent.glob("*.py") if p.name != Path(__file__).name)
    scripts = {p.stem for p in BENCHMARKS.rglob("*.py")} - {p.stem for p in tests}  # tests/ wins
    assert benchmark_imports("import sys\nsys.path.insert(0, 'benchmarks/gpu_serving')\n"
                             "from bench_gpu_serve import parse_arms\n", scripts) == [
        "3: imports bench_gpu_serve", "2: sys.path.insert(0, 'benchmarks/gpu_serving')"]
    found = [f"{path.name}:{where}" for path in tests for where in benchmark_imports(path.read_text(), scripts)]
    assert not found, ("tests import benchmark scripts: move what they exercise into voxline/ "
                       "or a helper under tests/, or run the script as a subprocess:\n"
                       + "\n".join(found))
