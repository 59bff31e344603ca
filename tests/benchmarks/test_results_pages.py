"""The results pages and the README's headline table are generated from ``benchmarks/results/``, never typed.

The docs site itself is built by ``make docs`` (``mkdocs build --strict``, in CI's ``.ci/run``), not here: these
tests check the generated content, which needs only the standard library and the committed files.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import results_pages
from tests.conftest import REPO


def test_the_readme_table_is_what_the_committed_results_give() -> None:
    assert results_pages.readme_is_current(), f"README.md's results table is out of date: {results_pages.FIX}"


def test_every_readme_and_page_link_names_a_committed_results_file() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split(results_pages.BEGIN, 1)[1].split(results_pages.END, 1)[0]
    targets = re.findall(r"\]\((benchmarks/results/[^)]+)\)", block)
    assert len(targets) >= 10
    assert all((REPO / t).is_file() for t in targets)
    pages = results_pages.pages()
    assert set(pages) == set(results_pages.PAGES)
    for name, text in pages.items():
        linked = re.findall(r"\]\(files/([^)]+)\)", text)
        assert linked, name
        assert all((results_pages.RESULTS / f).is_file() for f in linked), name


def test_a_figure_follows_its_results_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Change the committed BM25 figure in a copy of the results: the README block and the teachers page follow."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)
    path = results / results_pages.EVAL_DL19
    data = json.loads(path.read_text())
    data["results"]["dl19-bm25-smollm2/first_stage"]["nDCG@10"] = 12.3456
    path.write_text(json.dumps(data))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{results_pages.BEGIN}\nSTALE-LINE\n{results_pages.END}\n\nafter\n")
    monkeypatch.setattr(results_pages, "RESULTS", results)
    assert not results_pages.readme_is_current(readme)
    assert results_pages.write_readme(readme)
    text = readme.read_text()
    assert "| 12.35 |" in text and "STALE-LINE" not in text and text.endswith("\n\nafter\n")
    assert results_pages.readme_is_current(readme)
    assert "**12.35**" in results_pages.pages()["teachers.md"]


def test_a_missing_results_file_or_block_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results_pages, "RESULTS", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"benchmarks/results/eval-dl19-bm25-smollm2\.json: no such file"):
        results_pages.headline(results_pages.Links(""))
    with pytest.raises(ValueError, match="no <!-- results:begin -->"):
        results_pages.replace_block("# a README without the block\n", "x")


def test_check_exits_1_on_an_out_of_date_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{results_pages.BEGIN}\nstale\n{results_pages.END}\n")
    monkeypatch.setattr(results_pages, "README", readme)
    assert results_pages.main(["check"]) == 1
    assert results_pages.main(["readme"]) == 0
    assert results_pages.main(["check"]) == 0


def test_the_serving_figures_follow_serve_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load benchmark's run (``serve-cpu/serve.json``): its cells, targets and plot on the serving page, and the
    README's serving row, each read from the file."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)
    path = results / results_pages.SERVE
    data = json.loads(path.read_text())
    batched = next(c for c in data["servers"]["batched"]["cells"] if (c["documents"], c["concurrency"]) == (10, 8))
    batched["queries_per_s"] = 123.456
    path.write_text(json.dumps(data))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    assert "123.5 queries/s" in results_pages.headline(results_pages.Links(""))
    page = results_pages.pages()["serving-cpu.md"]
    assert "| 123.46 |" in page and "![serving](files/serve-cpu/serve.png)" in page
    assert all(t["target"] in page for t in data["targets"]) and data["command"] in page


def test_the_cpu_rows_name_their_student_and_cpu_and_read_their_bench_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The headline's CPU reranking row of the final student's architecture reads its ``bench.json`` (p50 and the
    CPU's flags); the MiniLM row names its own CPU."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)
    path = results / results_pages.BENCH_FINAL
    data = json.loads(path.read_text())
    auto = next(c for c in data["cells"] if c["method"].startswith("student auto"))
    onnx = next(c for c in data["cells"] if c["method"] == "student onnx-fp32" and c["workload"] == auto["workload"])
    auto["p50_s"], onnx["p50_s"] = 1.234, 4.936
    data["environment"]["cpu_features"] = "GenuineIntel avx2 amx_tile"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    table = results_pages.headline(results_pages.Links(""))
    large = next(line for line in table.splitlines() if "final one's architecture" in line)
    assert "1.23 s: 4.00× ONNX fp32" in large and "AMD EPYC: avx2 amx_tile)" in large
    minilm = next(line for line in table.splitlines() if "with a MiniLM-L6 student, 100 candidates" in line)
    assert "AMD EPYC: avx2 avx512_bf16 avx512_vnni avx512f)" in minilm


def test_a_recorded_command_of_a_moved_benchmark_names_todays() -> None:
    """The committed files keep the command that ran; a page gives today's beside a script's or module's old name."""
    assert results_pages.now("python benchmarks/teacher.py --device cuda") == (
        " (now `python -m benchmarks.teacher_throughput`)"
    )
    assert results_pages.now("python -m distill.bench.load run --model m") == " (now `python -m benchmarks.load`)"
    assert results_pages.now("python -m distill.bench.scale") == " (now `python -m benchmarks.scale`)"
    assert results_pages.now("distill bench --student s") == ""  # the package's own benchmark did not move
    assert results_pages.now("python -m benchmarks.scale --sizes '[10]'") == ""


def test_a_selection_against_the_final_student_is_a_row_of_the_levers_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed ``select ... --against <final student>`` record lands in the students page's levers table, its
    figures read from the file; a record that compares with another student does not."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)
    quality = results / "quality"
    record = json.loads((quality / "selection-dl21-lr6e-5.json").read_text())
    row = next(r for r in record["rows"] if r["name"] == "mpnet-student-dl22s-lr6e-5")
    row["name"] = "a-new-lever"
    row["student_vs"][record["against"][0]]["splade"].update(difference=4.321, interval=[1.5, 7.25])
    row["splade"].update(fused=77.777, alpha=0.35)
    (quality / "selection-dl21-new-lever.json").write_text(json.dumps(record))
    row["name"] = "a-reseeded-student"
    base = next(r for r in record["rows"] if r["name"] == record["against"][0])
    row["commands"] = [c + " --seed_everything 7" if c.startswith("distill train") else c for c in base["commands"]]
    (quality / "selection-dl21-reseeded.json").write_text(json.dumps(record))
    record["against"] = ["some-other-student"]
    row["name"] = "not-against-the-final"
    (quality / "selection-dl21-other.json").write_text(json.dumps(record))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    page = results_pages.pages()["students.md"]
    levers = page.split("## Levers tried against the final student", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in levers.splitlines() if line.startswith("| `a-new-lever`"))
    assert "| `--model.lr 6.0e-5` |" in line and "+4.32 [+1.50, +7.25]" in line and "77.78 (0.35)" in line
    assert "files/quality/selection-dl21-new-lever.json" in line
    assert "not-against-the-final" not in page
    assert "| `mpnet-student-dl22s-lr6e-5` |" in levers
    reseeded = next(line for line in levers.splitlines() if line.startswith("| `a-reseeded-student`"))
    assert "| `--seed_everything 7` |" in reseeded
    noise = [line for line in levers.splitlines() if "training noise alone" in line]
    assert len(noise) == 1 and "`a-reseeded-student`" in noise[0] and "`mpnet-student-dl22s-lr6e-5`" not in noise[0]


def test_a_final_student_chosen_as_a_lever_keeps_the_levers_of_the_student_it_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a lever becomes the final student, its own row is marked and the levers compared with the final student
    it replaced (its selection's ``final_before``) stay in the table, each beside the student it was compared with."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)
    quality = results / "quality"
    record = json.loads((quality / "selection-dl21-lr6e-5.json").read_text())
    replaced = record["against"][0]
    lever = next(r for r in record["rows"] if r["name"] not in (replaced, record["reference"]))
    lever["name"] = "a-chosen-lever"
    record["final_before"] = replaced
    (quality / "selection-dl21-chosen.json").write_text(json.dumps(record))
    final = json.loads((results / results_pages.FINAL).read_text())
    final.update(student="a-chosen-lever", selection="quality/selection-dl21-chosen.json")
    final["dl21_validation"] = {stage: lever[stage] for stage in ("bm25", "splade")}
    (results / results_pages.FINAL).write_text(json.dumps(final))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    levers = results_pages.pages()["students.md"].split("## Levers tried against the final student", 1)[1]
    levers = levers.split("\n## ", 1)[0]
    assert f"`a-chosen-lever`, or with the final student it replaced, `{replaced}`" in levers
    assert f"| `a-chosen-lever` (the final student) | `{replaced}` | `--model.lr 6.0e-5` |" in levers
    others = [line for line in levers.splitlines() if line.startswith("| `") and "(the final student)" not in line]
    assert others and all(line.split(" | ")[1] == f"`{replaced}`" for line in others)
    assert any(line.startswith("| `mpnet-student-dl22s-d40` |") for line in others)


def test_a_comparison_over_seeds_is_a_table_of_the_students_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed ``first_stages.py seeds`` record gets a table on the students page, each figure read from it."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)

    def stage(student: float, fused: float, delta: float) -> dict[str, object]:
        d = {"difference": delta, "interval": [delta - 1, delta + 1], "p": 0.5, "queries": 53}
        return {"student": student, "fused": fused, "student_vs": d, "fused_vs": d}

    record = {
        "command": "python experiments/first_stages.py seeds a --against b --record t",
        "against": "b",
        "split": "some queries",
        "rows": [
            {"name": "a", "seeds": ["a", "a-seed1"], "bm25": stage(61.234, 62.5, 1.5), "splade": stage(66, 71, -0.25)},
            {"name": "b", "seeds": ["b", "b-seed1", "b-seed2"], "bm25": stage(60, 61, 0), "splade": stage(65, 70, 0)},
        ],
    }
    (results / "quality" / "seeds-dl21-t.json").write_text(json.dumps(record))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    page = results_pages.pages()["students.md"]
    seeds = page.split("## Settings compared over seeds", 1)[1].split("\n## ", 1)[0]
    assert "files/quality/seeds-dl21-t.json" in seeds and "Δ against `b`'s seeds" in seeds
    assert (
        "| `a` | 2 | 61.23 | +1.50 [+0.50, +2.50] | 62.50 | +1.50 [+0.50, +2.50] | 66.00 | -0.25 [-1.25, +0.75] |"
        in seeds
    )
    assert "| `b` | 3 | 60.00 |" in seeds
    mine = seeds.split("files/quality/seeds-dl21-t.json", 1)[1]  # the last record: its sorted name
    assert "scored together" not in mine  # a record without ensembles gets no ensembles table

    def scored(student: float, alpha: float, delta: float) -> dict[str, object]:
        d = {"difference": delta, "interval": [delta - 1, delta + 1], "p": 0.5, "queries": 53}
        return {
            "student": student,
            "fused": student + 5,
            "alpha": alpha,
            **{f"{k}_vs_seed_mean": d for k in ("student", "fused")},
        }

    record["ensembles"] = [
        {
            "name": "every setting's seeds",
            "members": ["a", "a-seed1", "b"],
            "bm25": scored(61.5, 0.9, -0.5),
            "splade": scored(65.125, 0.55, 0.25),
        }
    ]
    (results / "quality" / "seeds-dl21-t.json").write_text(json.dumps(record))
    page = results_pages.pages()["students.md"]
    seeds = page.split("## Settings compared over seeds", 1)[1].split("\n## ", 1)[0]
    assert (
        "| every setting's seeds | 3 | 61.50 | -0.50 [-1.50, +0.50] | 66.50 (0.9) | -0.50 [-1.50, +0.50] | 65.12 "
        "| +0.25 [-0.75, +1.25] | 70.12 (0.55) | +0.25 [-0.75, +1.25] |" in seeds
    )


def test_a_rerank_depth_record_is_a_table_of_the_students_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed ``first_stages.py depth`` record gets a table on the students page, each figure read from it."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)

    def row(stage: str, k: int, student: float, delta: float) -> dict[str, object]:
        d = {"difference": delta, "interval": [delta - 1, delta + 1], "p": 0.5, "queries": 53}
        return {
            "first_stage": stage,
            "depth": k,
            "student": student,
            "fused": student + 2,
            "student_vs_100": d,
            "fused_vs_100": d,
        }

    record = {
        "command": "python experiments/first_stages.py depth a --record t",
        "setting": "a",
        "seeds": ["a", "a-seed1"],
        "split": "some queries",
        "rows": [row("splade", 20, 69.416, 3.5), row("splade", 100, 65.5, 0)],
    }
    (results / "quality" / "depth-t.json").write_text(json.dumps(record))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    page = results_pages.pages()["students.md"]
    depth = page.split("## Rerank depth", 1)[1].split("\n## ", 1)[0]
    assert "files/quality/depth-t.json" in depth and "`a` (2 seeds)" in depth
    assert "| SPLADE++ | 20 | 69.42 | +3.50 [+2.50, +4.50] | 71.42 | +3.50 [+2.50, +4.50] |" in depth
    assert "| SPLADE++ | 100 | 65.50 | +0.00 [-1.00, +1.00] |" in depth


def test_a_levers_change_is_read_from_the_training_commands() -> None:
    """The changes column compares the options as the command line parser takes them: the last of a repeated option,
    every ``--config`` in order, the run's name and fold aside."""
    base = {"commands": ["distill train --config a.yaml --model.lr 1e-4 --data.val_fold 0 --run_name x-f0"]}
    variant = {
        "commands": [
            "distill rerank --model m",
            "distill train --config a.yaml --config b.yaml --model.lr 1e-4 --model.lr=3e-5 --run_name y-f1 "
            f"--data.label '{'z(a) + ' * 10}z(b)'",
        ]
    }
    assert results_pages.changed_options(variant, base) == {
        "--config": "`--config a.yaml b.yaml`",
        "--data.label": "`--data.label`",
        "--model.lr": "`--model.lr 3e-5`",
    }
    assert results_pages.changed_options(base, variant)["--data.label"] == "without `--data.label`"
    assert results_pages.changed_options(base, base) == {}


def test_the_h200_page_lists_its_later_runs_and_the_headlines_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each dated record of the H200 folder is listed by its README's title; the headline's run (a newer one) is
    shown whole there, and its MFU in the README block follows its summary file."""
    results = tmp_path / "results"
    shutil.copytree(results_pages.RESULTS, results)
    record = results / "gpu-suite-h200" / "2099-01-01-abcdef0"
    record.mkdir()
    (record / "README.md").write_text("# A later run, for the test\n\ntext\n")
    path = results / results_pages.GPU / "summary.json"
    data = json.loads(path.read_text())
    next(f for f in data["figures"] if f["figure"] == "mfu")["value"] = 0.4321
    path.write_text(json.dumps(data))
    monkeypatch.setattr(results_pages, "RESULTS", results)
    page = results_pages.pages()["gpu-h200.md"]
    later = page.split("## Later runs", 1)[1]
    assert "[A later run, for the test](files/gpu-suite-h200/2099-01-01-abcdef0/README.md)" in later
    assert "| train | `mfu` | 43.2% |" in later
    assert "43.2%, " in results_pages.headline(results_pages.Links(""))


def test_a_recorded_bench_command_in_older_spelling_is_shown_as_it_runs_today() -> None:
    """The GPU pages showed `--backends torch-fp16+nographs,...`, which fails today: the same levers are spelt
    otherwise."""
    from distill.bench.methods import variant

    old = "distill bench --device cuda --backends torch-fp16,torch-fp16+nographs,torch-fp16+padded+overlap50,"
    old += "torch-fp16+cudnn"
    today = results_pages.now(old)
    backends = "torch-fp16,torch-fp16+cuda_graphs=false,torch-fp16+unpad=false+overlap=50,torch-fp16+cudnn_attention"
    assert today == f" (now `distill bench --device cuda --backends {backends}`)"
    for name in backends.split(","):
        variant(name, "cuda")  # each spelling is one the bench takes
    assert results_pages.now("distill bench --backends torch-fp16+cudnn_attention") == ""


def test_a_bench_record_counted_before_todays_floor_shows_no_floor_column() -> None:
    """A record without ``matmul.bf16_flops_per_s`` floored its int8 and bf16 backends at the fp32 rate."""
    cell = {"workload": "100 candidates", "p50_s": 0.1, "flop_floor_s": 0.25}
    result = {
        "workloads": [{"name": "100 candidates"}],
        "cells": [{**cell, "method": "student onnx-int8"}, {**cell, "method": "student torch-fp32", "p50_s": 0.5}],
        "matmul": {"flops_per_s": 1e11},
    }
    old = results_pages.bench_table(result)
    assert "FLOP floor" not in old and "250" not in old and "| 5.00× |" in old  # the other columns stay
    new = results_pages.bench_table({**result, "matmul": {"flops_per_s": 1e11, "bf16_flops_per_s": None}})
    assert "of FLOP floor (100 candidates)" in new and "| 250.0% |" in new and "| 50.0% |" in new
