"""MkDocs hook: the site's "Benchmarks and results" page is `benchmarks/README.md` itself,
so the benchmarks' one README is also a page of the docs and nothing is copied by hand."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

BENCHMARKS_README = Path(__file__).resolve().parents[1] / "benchmarks" / "README.md"


def on_files(files, config):
    files.append(File.generated(config, "benchmarks.md", abs_src_path=str(BENCHMARKS_README)))
    return files
