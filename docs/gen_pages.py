"""Pages written at build time by mkdocs-gen-files (see mkdocs.yml): nothing here is committed as Markdown.

- ``results/*.md``: the results pages, from the committed files in ``benchmarks/results/``
  (:mod:`benchmarks.results_pages`), with those files copied under ``results/files/`` so that every row's link
  resolves in the site;
- ``reference/``: one API page per module of ``distill``, ``teachers`` and ``students``, found by walking the
  packages (a renamed or new module needs no edit here), and ``reference/SUMMARY.md``, their navigation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("distill", "teachers", "students")
sys.path.insert(0, str(ROOT))  # benchmarks/ is the checkout's, not installed; mkdocs runs this file by path

from benchmarks import results_pages  # noqa: E402

# Results pages, and the files they link to.
for name, text in results_pages.pages().items():
    with mkdocs_gen_files.open(f"results/{name}", "w") as out:
        out.write(text)
for path in results_pages.result_files():
    with mkdocs_gen_files.open(f"results/files/{path}", "wb") as out:
        out.write((results_pages.RESULTS / path).read_bytes())

# API reference: one page per module, in the packages' own order.
nav = mkdocs_gen_files.Nav()
for package in PACKAGES:
    for source in sorted((ROOT / package).rglob("*.py")):
        module = source.relative_to(ROOT).with_suffix("")
        parts = module.parts
        if parts[-1] == "__main__" or any(p.startswith("_") and p != "__init__" for p in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
            page = Path(*parts, "index.md")
        else:
            page = module.with_suffix(".md")
        nav[parts] = page.as_posix()
        with mkdocs_gen_files.open(Path("reference", page), "w") as out:
            out.write(f"# `{'.'.join(parts)}`\n\n::: {'.'.join(parts)}\n")
        mkdocs_gen_files.set_edit_path(Path("reference", page), source.relative_to(ROOT))
with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as out:
    out.writelines(nav.build_literate_nav())
