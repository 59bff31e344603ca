"""The teacher stage end to end on a tiny random Llama: output, caching, resuming, sharding, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from distill.cli import main
from distill.core.schema import ExistingOutputError, InputError
from distill.data.teacher_data import TeacherDataset
from distill.eval.trec_runs import read_trec_run
from distill.stages.teach import TeachConfig, teach
from tests.conftest import DL19_QRELS

REPO = Path(__file__).resolve().parents[3]


def config(tiny_llama: Path, sample_file: Path, tmp_path: Path, **overrides) -> TeachConfig:
    values = {
        "input": str(sample_file),
        "output": str(tmp_path / "out"),
        "teacher": str(tiny_llama),
        "scores": ["cis", "cond", "noprompt", "upr"],
        "cache_dir": str(tmp_path / "cache"),
        "chunk_size": 5,
        "max_batch_tokens": 256,
        "progress": False,
    }
    return TeachConfig(**{**values, **overrides})


def rows(path: Path) -> list[dict]:
    return datasets.load_from_disk(str(path)).to_list()


def run_teach(cfg: TeachConfig) -> Path:
    return teach(cfg).output


def metadata(out: Path):
    return TeacherDataset.open(out).metadata


def test_writes_triplets_metadata_and_runs(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    out = run_teach(config(tiny_llama, sample_file, tmp_path))
    ds = datasets.load_from_disk(str(out))
    assert ds.num_rows == 36
    for column in (
        "qid",
        "docid",
        "query",
        "passage",
        "cis",
        "logp_cond",
        "logp_uncond",
        "n_passage_tokens",
        "cond",
        "noprompt",
        "upr",
        "logp_cond_noprompt",
        "logp_upr",
    ):
        assert column in ds.column_names
    assert len({(r["qid"], r["docid"]) for r in ds}) == 36
    table = ds.to_pandas()
    np.testing.assert_allclose(table.cis, table.logp_cond - table.logp_uncond)
    np.testing.assert_allclose(table.noprompt, table.logp_cond_noprompt - table.logp_uncond)
    np.testing.assert_array_equal(table.upr, table.logp_upr)
    assert (table.n_passage_tokens > 0).all() and (table.logp_uncond < 0).all()
    meta = metadata(out)
    assert meta.score == "cis" and meta.fingerprint["prompt"] == "Q: {query} A:"
    assert meta.fingerprint["teacher"].startswith("directory:")
    run = read_trec_run(out / "runs" / "cis.trec")
    top = max(run["264014"], key=run["264014"].get)
    assert top == table[table.qid == "264014"].sort_values("cis").docid.iloc[-1]
    assert sorted(p.name for p in (out / "runs").iterdir()) == [
        "cis.trec",
        "cond.trec",
        "first_stage.trec",
        "noprompt.trec",
        "upr.trec",
    ]
    assert not (tmp_path / "out.partial").exists()


def test_passage_logprob_computed_once_and_cached_across_runs(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path
) -> None:
    # The same passage under two queries: one log p(K), shared.
    shared = dict(dl19_sample[1]["hits"][0], qid=dl19_sample[0]["hits"][0]["qid"])
    sample = [{"query": dl19_sample[0]["query"], "hits": [*dl19_sample[0]["hits"], shared]}, dl19_sample[1]]
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(sample))
    out = run_teach(config(tiny_llama, path, tmp_path))
    table = datasets.load_from_disk(str(out)).to_pandas()
    same = table[table.docid == shared["docid"]]
    assert len(same) == 2 and same.logp_uncond.nunique() == 1
    cache_files = sorted((tmp_path / "cache").rglob("seg-*.jsonl"))
    entries = sum(len(f.read_text().splitlines()) for f in cache_files)
    assert entries == table.passage.nunique() == len(table) - 1
    # A second run on other outputs computes no new log p(K).
    run_teach(config(tiny_llama, path, tmp_path, output=str(tmp_path / "again"), scores=["cis"]))
    assert sorted((tmp_path / "cache").rglob("seg-*.jsonl")) == cache_files


def test_a_rerun_naming_another_primary_score_records_it_without_scoring_again(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    """--scores cis,upr, then --scores upr: "up to date", and teacher.json kept cis as the primary label, which
    eval --teacher then compared with."""
    out = run_teach(config(tiny_llama, sample_file, tmp_path, scores=["cis", "upr"]))
    rows = {f.name: f.read_bytes() for f in out.glob("*.arrow")}
    report = teach(config(tiny_llama, sample_file, tmp_path, scores=["upr"]))
    assert report.up_to_date and report.scores == ["cis", "upr"]
    assert metadata(out).score == "upr" and metadata(out).scores == ["cis", "upr"]
    assert {f.name: f.read_bytes() for f in out.glob("*.arrow")} == rows
    # qrels given to a rerun were dropped: the export's quality gate, which reads them there, found none
    qrels = tmp_path / "qrels.txt"
    shutil.copyfile(DL19_QRELS, qrels)
    assert teach(config(tiny_llama, sample_file, tmp_path, scores=["upr"], qrels=str(qrels))).up_to_date
    assert metadata(out).qrels == str(qrels) and metadata(out).score == "upr"
    assert teach(config(tiny_llama, sample_file, tmp_path, scores=["upr"])).up_to_date
    assert metadata(out).qrels == str(qrels)  # a rerun without qrels keeps those recorded
    assert {f.name: f.read_bytes() for f in out.glob("*.arrow")} == rows


def test_new_weights_in_a_teacher_folder_are_another_teacher(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    """A folder was known by its path: new weights there reused the old weights' log p(K) (CIS silently wrong) and
    found the old output "up to date"."""
    from transformers import AutoModelForCausalLM

    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_llama, teacher)
    first = run_teach(config(teacher, sample_file, tmp_path, output=str(tmp_path / "first")))
    model = AutoModelForCausalLM.from_pretrained(teacher)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight))
    model.save_pretrained(teacher)
    with pytest.raises(ExistingOutputError, match="not made by this configuration"):
        run_teach(config(teacher, sample_file, tmp_path, output=str(tmp_path / "first")))
    again = run_teach(config(teacher, sample_file, tmp_path, output=str(tmp_path / "again")))  # the shared cache
    fresh = run_teach(
        config(teacher, sample_file, tmp_path, output=str(tmp_path / "fresh"), cache_dir=str(tmp_path / "c2"))
    )
    columns = ["logp_uncond", "cis"]
    fresh_table = datasets.load_from_disk(str(fresh)).to_pandas()[columns]
    assert datasets.load_from_disk(str(again)).to_pandas()[columns].equals(fresh_table)
    assert not datasets.load_from_disk(str(first)).to_pandas()[columns].equals(fresh_table)


def test_rerun_of_a_complete_output_is_a_no_op(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    cfg = config(tiny_llama, sample_file, tmp_path)
    out = run_teach(cfg)
    stamp = (out / "dataset_info.json").stat().st_mtime_ns
    run_teach(cfg)
    assert (out / "dataset_info.json").stat().st_mtime_ns == stamp
    with pytest.raises(InputError, match="--overwrite"):
        run_teach(config(tiny_llama, sample_file, tmp_path, prompt="Question: {query} Answer:"))
    run_teach(config(tiny_llama, sample_file, tmp_path, prompt="Question: {query} Answer:", overwrite=True))
    assert metadata(out).fingerprint["prompt"] == "Question: {query} Answer:"


def test_overwrite_replaces_a_teacher_dataset_never_a_folder_of_something_else(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's work")
    with pytest.raises(ExistingOutputError, match=re.escape(f"{mine} exists and is not a teacher dataset")):
        run_teach(config(tiny_llama, sample_file, tmp_path, output=str(mine), overwrite=True))
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()  # nothing to lose: taken with --overwrite
    done = run_teach(config(tiny_llama, sample_file, tmp_path, output=str(empty), overwrite=True))
    assert (done / "teacher.json").is_file()


def test_a_second_job_on_the_same_output_stops_before_it_reads_anything(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    """Two jobs with one --output wrote the same rows folder (keyed by rank) and one crashed in pyarrow."""
    from distill.core.output_files import hold_output

    cfg = config(tiny_llama, sample_file, tmp_path)
    other = hold_output(Path(cfg.output))  # another process's hold, as a running distill teach has it
    try:
        with pytest.raises(ExistingOutputError, match=re.escape(f"{cfg.output}: another distill teach is writing it")):
            run_teach(cfg)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", sample_file.name]  # no rows, cache, output
    finally:
        other.release()
    assert (run_teach(cfg) / "teacher.json").is_file()


def saved(root: Path, pattern: str) -> list[Path]:
    """The files under ``root`` matching ``pattern``, as a running teacher leaves them: a temporary directory it
    renames away while the walk is inside it counts as nothing saved yet."""
    try:
        return list(root.rglob(pattern))
    except FileNotFoundError:
        return []


def _cli(tiny_llama: Path, sample_file: Path, out: Path, cache: Path) -> list[str]:
    return [
        "-m",
        "distill",
        "teach",
        "--input",
        str(sample_file),
        "--output",
        str(out),
        "--teacher",
        str(tiny_llama),
        "--scores",
        "cis,upr",
        "--chunk-size",
        "2",  # 18 chunks of pairs; the distinct passages in 2 buckets (each process scores one)
        "--max-batch-tokens",
        "128",
        "--cache-dir",
        str(cache),
        "--progress",
        "false",
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def one_process_rows(tiny_llama: Path, sample: Path, root: Path) -> list[dict]:
    """The rows of an uninterrupted run of :func:`_cli`'s command on ``sample`` into ``root``, in this process and on
    one thread, as the subprocesses run it: what an interrupted or a multi-process run must equal."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(_cli(tiny_llama, sample, root / "out", root / "cache")[2:]) == 0
    finally:
        torch.set_num_threads(threads)
    return rows(root / "out")


@pytest.fixture(scope="module")
def one_process(tiny_llama: Path, dl19_sample: list[dict], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """:func:`one_process_rows` of the DL19 sample (``sample_file``'s contents)."""
    root = tmp_path_factory.mktemp("one-process")
    (root / "sample.json").write_text(json.dumps(dl19_sample))
    return one_process_rows(tiny_llama, root / "sample.json", root)


@pytest.mark.slow
@pytest.mark.parametrize(("kill_after", "lines"), [("seg-*.jsonl", False), ("chunks/*.parquet", True)])
def test_resume_after_kill_9_gives_the_same_dataset(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, kill_after: str, lines: bool, one_process: list[dict]
) -> None:
    """Killed after its first p(K) segment, or its first chunk of pairs (then from a streamed JSON-lines input)."""
    if lines:
        sample_file = as_json_lines(sample_file, tmp_path / "sample.jsonl")
    out, cache = tmp_path / "out", tmp_path / "c2"
    watch = cache if kill_after.startswith("seg") else tmp_path / "out.partial"
    proc = subprocess.Popen([sys.executable, *_cli(tiny_llama, sample_file, out, cache)], env=_env(), cwd=REPO)
    deadline = time.monotonic() + 120
    while not saved(watch, kill_after) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "the run finished before it could be killed"
    assert saved(watch, kill_after), "killed before any work was saved"
    subprocess.run([sys.executable, *_cli(tiny_llama, sample_file, out, cache)], check=True, env=_env(), cwd=REPO)
    assert rows(out) == one_process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "status", "line"),
    [
        (signal.SIGINT, 130, "distill teach: interrupted"),
        # a scheduler's time limit: it ended the run without a word; the signal still ends it (143 in a shell)
        (signal.SIGTERM, -signal.SIGTERM, "distill teach: stopped by SIGTERM"),
    ],
)
def test_a_stop_is_one_line_and_a_rerun_goes_on_to_the_same_dataset(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, one_process: list[dict], signum: int, status: int, line: str
) -> None:
    """SIGINT (Ctrl-C) or SIGTERM after the first chunk of pairs is saved: one line, no traceback; the saved chunks
    stay, and the same command again ends with the uninterrupted run's rows."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, *_cli(tiny_llama, sample_file, out, cache)],
        env=_env(),
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C reaches it
    )
    deadline = time.monotonic() + 120
    while (
        not saved(tmp_path / "out.partial", "chunks/*.parquet") and proc.poll() is None and time.monotonic() < deadline
    ):
        time.sleep(0.002)
    proc.send_signal(signum)
    err = proc.communicate()[1]
    assert not out.exists(), "the run finished before it could be stopped"
    assert proc.returncode == status and err.splitlines()[-1] == line, err
    assert "Traceback" not in err and saved(tmp_path / "out.partial", "chunks/*.parquet")
    subprocess.run([sys.executable, *_cli(tiny_llama, sample_file, out, cache)], check=True, env=_env(), cwd=REPO)
    assert rows(out) == one_process


@pytest.mark.slow
def test_two_processes_give_the_same_dataset_as_one(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, one_process: list[dict]
) -> None:
    """``accelerate launch --multi_gpu`` (torchrun underneath) on a machine without CUDA: two processes over gloo,
    each scoring half the passages."""
    two = tmp_path / "two"
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    done = subprocess.run(
        [
            launcher,
            "launch",
            *["--multi_gpu", "--num_processes", "2", "--num_machines", "1"],
            *["--mixed_precision", "no", "--dynamo_backend", "no"],
            *_cli(tiny_llama, sample_file, two, tmp_path / "c2"),
            *["--progress", "true"],
        ],
        env=_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "log p(K) [rank 0/2]" in done.stderr  # rank 0 of 2: its share, not every passage
    assert rows(two) == one_process
    assert len(rows(two)) == 36


def test_bad_input_is_named_and_nothing_is_scored(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(dl19_sample)[:-40])
    code = main(["teach", "--input", str(broken), "--output", str(tmp_path / "o"), "--teacher", "x/y"])
    assert code == 2 and f"{broken}:1:" in capsys.readouterr().err
    missing = [{"query": "q", "hits": [{"qid": 1, "docid": "d1"}]}]
    broken.write_text(json.dumps(missing))
    assert main(["teach", "--input", str(broken), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "entry [0] hit [0]" in err and "'content'" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_an_output_that_cannot_be_written_is_one_line_before_the_teacher_loads(
    sample_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from teachers.teacher import CausalLMTeacher

    def never(*args, **kwargs):
        raise AssertionError("the teacher was loaded before the output was checked")

    monkeypatch.setattr(CausalLMTeacher, "load", never)
    regular = tmp_path / "a-file"
    regular.write_text("not a folder")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = [
        (
            "--output",
            regular / "x" / "out",
            f"output: {regular / 'x' / 'out'}: {regular} is a file, not a folder",
        ),
        ("--output", regular, f"output: {regular}: is a file, not a folder"),
        (
            "--output",
            tmp_path / "dangling" / "out",
            f"output: {tmp_path / 'dangling' / 'out'}: {tmp_path / 'dangling'} is a broken link, not a folder",
        ),
        ("--cache_dir", regular / "cache", f"cache_dir: {regular / 'cache'}: {regular} is a file, not a folder"),
    ]
    if Path("/proc/self").is_dir():  # a folder that takes no new file, even for root (mkdir there: FileNotFoundError)
        cases.append(("--output", Path("/proc/self/out"), "output: /proc/self/out: cannot write in /proc/self"))
    for flag, path, message in cases:
        args = ["teach", "--input", str(sample_file), "--output", str(tmp_path / "o")]
        args += ["--cache_dir", str(tmp_path / "pk")]  # beside the output: an output inside the cache is refused
        args[args.index(flag) + 1] = str(path)
        assert main(args) == 2, path
        err = capsys.readouterr().err
        assert err.startswith(f"distill teach: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "nowhere").exists() and regular.read_text() == "not a folder"


def test_bad_records_can_be_skipped_and_counted(tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path) -> None:
    sample = json.loads(json.dumps(dl19_sample))
    sample[0]["hits"][1]["content"] = "  "
    sample[1]["hits"].append(dict(sample[1]["hits"][0]))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(sample))
    with pytest.raises(InputError, match="empty passage"):
        run_teach(config(tiny_llama, path, tmp_path))
    report = teach(config(tiny_llama, path, tmp_path, on_bad_input="skip"))
    assert datasets.load_from_disk(str(report.output)).num_rows == 35
    assert report.skipped == {"empty passage text": 1, "duplicate (qid, docid)": 1}
    assert "skipped 2 bad input record(s): 1 x empty passage text; 1 x duplicate (qid, docid)" in report.format()


def test_unknown_teacher_lists_what_was_tried(sample_file: Path, tmp_path: Path, capsys) -> None:
    code = main(["teach", "--input", str(sample_file), "--output", str(tmp_path / "o"), "--teacher", "no/such-model"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot find model 'no/such-model'" in err and "local directory" in err and "hub id" in err


def test_an_encoder_as_a_causal_teacher_is_one_line(tiny_bert: Path, sample_file: Path, tmp_path: Path, capsys) -> None:
    """An embedding model as the CIS teacher was a traceback (no BOS or EOS token), or, with --start_token, scores
    from a random LM head with exit 0."""
    args = ["teach", "--input", str(sample_file), "--output", str(tmp_path / "o"), "--teacher", str(tiny_bert)]
    for extra in ([], ["--start_token", "[CLS]"]):
        assert main([*args, *extra]) == 2
        assert capsys.readouterr().err == (
            f"distill teach: error: teacher {tiny_bert}: BertForSequenceClassification is no causal LM, which "
            "log p(K | Q) needs; an embedding model teaches with --scores similarity\n"
        )
    assert not (tmp_path / "o").exists()


def test_partial_results_of_another_configuration_are_kept(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    partial = tmp_path / "out.partial"
    (partial / "chunks").mkdir(parents=True)
    (partial / "fingerprint.json").write_text(json.dumps({"prompt": "other"}))
    (partial / "chunks" / "000000.parquet").write_bytes(b"kept")
    with pytest.raises(InputError, match="partial results of another configuration"):
        run_teach(config(tiny_llama, sample_file, tmp_path))
    assert (partial / "chunks" / "000000.parquet").read_bytes() == b"kept"


def test_config_file_and_flag_overrides(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "teach.yaml"
    cfg.write_text(
        f"input: {sample_file}\noutput: {tmp_path / 'o'}\nteacher: {tiny_llama}\nscores: [upr]\n"
        f"cache_dir: {tmp_path / 'c'}\nmax_queries: 1\nprogress: false\n"
    )
    assert main(["teach", "--config", str(cfg), "--max-queries", "2", "--output", str(tmp_path / "flag")]) == 0
    ds = datasets.load_from_disk(str(tmp_path / "flag"))
    assert ds.num_rows == 24 and "upr" in ds.column_names and metadata(tmp_path / "flag").score == "upr"
    # the command that made it, recorded with it
    expected = f"distill teach --config {cfg} --max-queries 2 --output {tmp_path / 'flag'}"
    assert metadata(tmp_path / "flag").command == expected
    cfg.write_text("input: x\nbogus: 1\n")
    assert main(["teach", "--nonsense"]) == 2
    assert main(["teach", "--config", str(cfg)]) == 2


def as_json_lines(path: Path, out: Path) -> Path:
    """The rank_llm list at ``path`` as JSON lines, one ``{query, hits}`` entry a line."""
    out.write_text("".join(json.dumps(entry) + "\n" for entry in json.loads(path.read_text())))
    return out


def test_a_json_lines_input_is_streamed_to_the_same_dataset(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank_llm JSON list and JSON-lines file are each read an entry at a time (never loaded whole), into the same
    dataset: the same rows, the same fingerprint (so either one's output is up to date for the other)."""
    from distill.data import loaders

    def whole(*args, **kwargs):
        raise AssertionError("a rank_llm input was loaded whole")

    monkeypatch.setattr(loaders, "load_candidates", whole)
    listed = run_teach(config(tiny_llama, sample_file, tmp_path, output=str(tmp_path / "listed")))
    lines = as_json_lines(sample_file, tmp_path / "sample.jsonl")
    streamed = run_teach(config(tiny_llama, lines, tmp_path, output=str(tmp_path / "streamed")))
    assert rows(streamed) == rows(listed)
    assert metadata(streamed).fingerprint == metadata(listed).fingerprint
    assert not list(tmp_path.glob(".*pairs*"))  # the row files are removed once the dataset is written
    # at most the first N queries, read no further than needed
    first = run_teach(config(tiny_llama, lines, tmp_path, output=str(tmp_path / "first"), max_queries=2))
    assert rows(first) == rows(listed)[:24]


def test_a_trec_run_input_keeps_its_queries_and_corpus_in_teacher_json(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    """The same candidates as a TREC run with its queries and corpus: the same rows, and teacher.json names the
    queries and corpus (which the export's quality gate needs to read the run again); a rank_llm input names none."""
    from distill.data.loaders import load_candidates

    lists = load_candidates(sample_file).candidates
    run, queries, corpus = tmp_path / "bm25.trec", tmp_path / "queries.tsv", tmp_path / "corpus.tsv"
    run.write_text("".join(f"{c.query.qid} Q0 {p.docid} {r} {s} bm25\n" for c in lists
                           for r, (p, s) in enumerate(zip(c.passages, c.scores, strict=True), 1)))  # fmt: skip
    queries.write_text("".join(f"{c.query.qid}\t{c.query.text}\n" for c in lists))
    corpus.write_text("".join(f"{p.docid}\t{p.text}\n" for c in lists for p in c.passages))
    listed = run_teach(config(tiny_llama, sample_file, tmp_path, output=str(tmp_path / "listed")))
    trec = run_teach(
        config(tiny_llama, run, tmp_path, output=str(tmp_path / "trec"), queries=str(queries), corpus=str(corpus))
    )
    assert rows(trec) == rows(listed)
    assert (metadata(trec).queries, metadata(trec).corpus) == (str(queries), str(corpus))
    assert (metadata(listed).queries, metadata(listed).corpus) == (None, None)
    assert "queries" not in json.loads((listed / "teacher.json").read_text())


def test_a_query_that_comes_back_in_a_stream_is_named(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    entries = json.loads(sample_file.read_text())
    lines = tmp_path / "again.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in [*entries, entries[0]]))
    with pytest.raises(InputError, match=rf"{lines}:4: qid \S+ already had its candidates at {lines}:1"):
        run_teach(config(tiny_llama, lines, tmp_path))
    skipped = teach(config(tiny_llama, lines, tmp_path, output=str(tmp_path / "skip"), on_bad_input="skip"))
    assert skipped.pairs == 36 and sum(skipped.skipped.values()) == 1


def test_several_inputs_are_joined_and_each_pair_scored_once(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path
) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(dl19_sample[:2]))
    # The second file repeats 4 pairs of query 0 and adds query 2.
    second.write_text(
        json.dumps([{"query": dl19_sample[0]["query"], "hits": dl19_sample[0]["hits"][-4:]}, dl19_sample[2]])
    )
    out = tmp_path / "joined"
    args = ["teach", "--input", f"{first},{second}", "--output", str(out), "--teacher", str(tiny_llama)]
    assert main([*args, "--cache-dir", str(tmp_path / "c"), "--progress", "false"]) == 0
    table = datasets.load_from_disk(str(out)).to_pandas()
    assert len(table) == 36 and not table.duplicated(["qid", "docid"]).any()
    assert list(table.qid.unique()) == [str(e["hits"][0]["qid"]) for e in dl19_sample]
    assert metadata(out).input == [str(first), str(second)]


def test_cis_q_ranks_as_upr_within_a_query_and_is_comparable_across_queries(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    scores = ["cis", "upr", "cis_q", "cis_mean", "cis_q_mean"]
    table = datasets.load_from_disk(str(run_teach(config(tiny_llama, sample_file, tmp_path, scores=scores))))
    table = table.to_pandas()
    np.testing.assert_allclose(table.cis_q, table.logp_upr - table.logp_upr_empty)
    np.testing.assert_allclose(table.cis_mean, table.cis / table.n_passage_tokens)
    np.testing.assert_allclose(table.cis_q_mean, table.cis_q / table.n_query_tokens)
    by_query = table.groupby("qid")
    for _, group in by_query:
        # The subtracted term is one value per query, so the order within a query is upr's, ties and all.
        assert group.logp_upr_empty.nunique() == 1
        assert list(group.sort_values(["upr", "docid"]).docid) == list(group.sort_values(["cis_q", "docid"]).docid)
    # Raw query likelihood scales with the query's length; the PMI does not (a random LM learns nothing from K).
    lengths = by_query.n_query_tokens.first()
    upr, cis_q = by_query.upr.mean(), by_query.cis_q.mean()
    assert lengths.nunique() == len(lengths) and list(upr.sort_values().index) == list(
        lengths.sort_values().index[::-1]
    )
    assert cis_q.abs().max() < 0.05 * (upr.max() - upr.min())


def test_migrate_moves_legacy_metadata_to_teacher_json_and_keeps_every_row(
    teacher_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(teacher_dataset, legacy)
    metadata = json.loads((legacy / "teacher.json").read_text())
    (legacy / "teacher.json").unlink()
    info = json.loads((legacy / "dataset_info.json").read_text())
    (legacy / "dataset_info.json").write_text(json.dumps({**info, "description": json.dumps(metadata)}))
    with pytest.raises(InputError, match="run `distill migrate` on it"):
        TeacherDataset.open(legacy)
    arrow = {f.name: f.read_bytes() for f in legacy.glob("*.arrow")}
    before = (legacy / "dataset_info.json").read_bytes()
    assert main(["migrate", "--paths", str(legacy), str(tmp_path)]) == 2  # a folder that is no teacher dataset
    assert "not a teacher dataset" in capsys.readouterr().err
    assert (legacy / "dataset_info.json").read_bytes() == before and not (legacy / "teacher.json").exists()
    broken = shutil.copytree(legacy, tmp_path / "broken")  # a legacy description without its scores
    partial = {k: v for k, v in metadata.items() if k not in ("scores", "input")}
    (broken / "dataset_info.json").write_text(json.dumps({**info, "description": json.dumps(partial)}))
    assert main(["migrate", str(legacy), str(broken)]) == 2
    message = (
        f"distill migrate: error: {broken / 'dataset_info.json'}: description: missing key(s) ['input', 'scores']\n"
    )
    assert capsys.readouterr().err == message  # one line, not a KeyError; and the first folder is not written
    assert (legacy / "dataset_info.json").read_bytes() == before and not (legacy / "teacher.json").exists()
    # a field of another type: checked as teacher.json is read, before anything is written (its scores were
    # written as given, in a teacher.json no command could read, and the description cleared)
    (broken / "dataset_info.json").write_text(
        json.dumps({**info, "description": json.dumps({**metadata, "scores": "cis"})})
    )
    assert main(["migrate", str(legacy), str(broken)]) == 2
    message = f"{broken / 'dataset_info.json'}: description: scores: expected a list of strings, got 'cis'\n"
    assert capsys.readouterr().err == f"distill migrate: error: {message}"
    assert (legacy / "dataset_info.json").read_bytes() == before and not (broken / "teacher.json").exists()
    # a folder that cannot be written in (a read-only or immutable file system, which root's access check passes):
    # refused before the first folder is written (a PermissionError traceback, the first folder migrated, before)
    sealed = shutil.copytree(legacy, tmp_path / "sealed")
    mkstemp = tempfile.mkstemp

    def refusing(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == sealed:
            raise PermissionError(1, "Operation not permitted")
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refusing)
    assert main(["migrate", str(legacy), str(sealed)]) == 2
    assert (
        capsys.readouterr().err
        == f"distill migrate: error: paths: {sealed}: cannot write in {sealed}: Operation not permitted\n"
    )
    assert (legacy / "dataset_info.json").read_bytes() == before and not (legacy / "teacher.json").exists()
    monkeypatch.undo()
    assert main(["migrate", str(legacy), f"{legacy}/", str(legacy / ".." / "legacy")]) == 0  # one folder, once
    assert capsys.readouterr().out.splitlines() == [f"migrated {legacy}"]
    (legacy / "teacher.json").unlink()
    (legacy / "dataset_info.json").write_bytes(before)
    assert main(["migrate", "--paths", str(legacy), str(teacher_dataset)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"migrated {legacy}", f"already current: {teacher_dataset}"]
    assert {f.name: f.read_bytes() for f in legacy.glob("*.arrow")} == arrow  # every score bit-identical
    assert TeacherDataset.open(legacy).metadata == TeacherDataset.open(teacher_dataset).metadata
    assert rows(legacy) == rows(teacher_dataset)
    assert main(["migrate", "--paths", str(tmp_path)]) == 2
    assert "not a teacher dataset" in capsys.readouterr().err
    # a current teacher.json that no command could read is named, not "already current"
    (broken / "dataset_info.json").write_text(json.dumps(info))
    (broken / "teacher.json").write_text(json.dumps({**metadata, "input": None}))
    assert main(["migrate", str(broken)]) == 2
    assert f"{broken / 'teacher.json'}: input: expected a list of strings, got None" in capsys.readouterr().err


def test_reuse_gives_the_same_dataset_as_a_fresh_run_and_scores_only_the_new_pairs(
    tiny_llama: Path, dl19_sample: list[dict], sample_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from teachers.teacher import CausalLMTeacher

    scores = ["cis", "upr", "cis_q"]
    fresh = run_teach(config(tiny_llama, sample_file, tmp_path / "fresh", scores=scores))
    # An earlier dataset of the same teacher: 8 of the first 2 queries' 12 candidates, more scores than needed.
    part = tmp_path / "part.json"
    part.write_text(json.dumps([{"query": e["query"], "hits": e["hits"][:8]} for e in dl19_sample[:2]]))
    earlier = run_teach(config(tiny_llama, part, tmp_path / "earlier", scores=[*scores, "cis_mean"]))

    scored = {"passages": 0, "pairs": 0, "queries": 0}
    originals = {n: getattr(CausalLMTeacher, n) for n in ("passage_logprobs", "pair_terms", "query_terms")}

    def counting(name: str, kind: str):
        def wrapper(self, items, *args, **kwargs):
            scored[kind] += len(items)
            return originals[name](self, items, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(CausalLMTeacher, "passage_logprobs", counting("passage_logprobs", "passages"))
    monkeypatch.setattr(CausalLMTeacher, "pair_terms", counting("pair_terms", "pairs"))
    monkeypatch.setattr(CausalLMTeacher, "query_terms", counting("query_terms", "queries"))
    report = teach(config(tiny_llama, sample_file, tmp_path / "reuse", scores=scores, reuse=[str(earlier)]))
    assert report.reused == 16 and "reused 16 pairs, scored 20 new" in report.format()
    assert scored == {"passages": 20, "pairs": 20, "queries": 1}  # p(K) and query terms come from there too
    assert metadata(report.output).reused == {"datasets": [str(earlier)], "pairs_reused": 16, "pairs_new": 20}
    assert metadata(report.output).fingerprint == metadata(fresh).fingerprint

    got, want = rows(report.output), rows(fresh)
    assert [{k: r[k] for k in ("qid", "docid", "query", "passage")} for r in got] == [
        {k: r[k] for k in ("qid", "docid", "query", "passage")} for r in want
    ]
    assert list(got[0]) == list(want[0])
    for column in got[0]:
        if isinstance(want[0][column], float):
            np.testing.assert_allclose([r[column] for r in got], [r[column] for r in want], rtol=1e-5, atol=1e-5)
        else:
            assert [r[column] for r in got] == [r[column] for r in want], column
    # The reused pairs carry the earlier dataset's values exactly.
    before = {(r["qid"], r["docid"]): r for r in rows(earlier)}
    for r in got:
        if (r["qid"], r["docid"]) in before:
            assert all(r[c] == before[r["qid"], r["docid"]][c] for c in ("cis", "upr", "cis_q", "logp_uncond"))


def test_reuse_of_another_teacher_fingerprint_is_refused_in_one_line_before_the_teacher_loads(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from teachers.teacher import CausalLMTeacher

    earlier = run_teach(config(tiny_llama, sample_file, tmp_path / "earlier", scores=["cis"], max_passage_tokens=64))
    monkeypatch.setattr(CausalLMTeacher, "load", lambda *a, **k: pytest.fail("the teacher loaded before the check"))
    args = ["teach", "--input", str(sample_file), "--output", str(tmp_path / "out"), "--teacher", str(tiny_llama)]
    args += ["--cache-dir", str(tmp_path / "cache"), "--chunk-size", "5", "--max-batch-tokens", "256"]
    capsys.readouterr()
    assert main([*args, "--reuse", str(earlier), "--progress", "false"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        f"distill teach: error: reuse {earlier} was made under another teacher fingerprint: "
        "max_passage_tokens is 64 there, 256 here"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ({"max_queries": 0}, "teach: max_queries must be positive, got 0"),
        ({"chunk_size": -1}, "teach: chunk_size must be positive, got -1"),
        # uninitialised memory written as scores (and into the log p(K) cache), exit 0
        ({"logit_chunk_rows": -3}, "teach: logit_chunk_rows must be positive, got -3"),
        ({"logit_chunk_rows": 0}, "teach: logit_chunk_rows must be positive, got 0"),  # a traceback mid-scoring
        # everything scored, then an IndexError's traceback at the merge
        ({"scores": []}, "teach: scores: none given; one or more of cis, "),
        ({"scores": " , "}, "teach: scores: none given"),
        ({"prompt": "no field here"}, "teach: prompt 'no field here': must contain '{query}'"),
        # a KeyError's traceback once log p(K) was scored
        ({"prompt": "Q: {query} A: {passage}"}, "has fields ['passage'] besides '{query}' (the passage follows"),
        ({"prompt": "Q: {query} {A:"}, "teach: prompt 'Q: {query} {A:': not a format string ("),
    ],
)
def test_option_values_are_refused_before_anything_loads(option: dict, expected: str) -> None:
    with pytest.raises(InputError, match=re.escape(expected)):
        TeachConfig(input=["in.json"], output="out", **option)


def test_non_finite_teacher_values_are_one_line_and_never_cached(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weights that give NaN (broken, or overflowing in float16) were written as labels and into the log p(K) cache,
    which every later run of that teacher reads."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    weights = load_file(broken / "model.safetensors")
    name = next(k for k in weights if k.endswith("norm.weight") and "layers" not in k)  # the final norm
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    path = tmp_path / "in.json"
    path.write_text(json.dumps(dl19_sample[:1]))
    args = ["--input", str(path), "--output", str(tmp_path / "o"), "--teacher", str(broken), "--progress", "false"]
    assert main(["teach", *args, "--cache_dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    line = err.splitlines()[-1]
    assert line.startswith("distill teach: error: the teacher gave ") and "non-finite log p(K) value(s)" in line, err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
    assert not list((tmp_path / "cache").glob("**/*.npy")) and not list((tmp_path / "cache").glob("**/*.parquet"))


def test_a_query_past_the_teachers_context_is_one_line_before_anything_is_scored(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = [{**dl19_sample[0], "query": "rhinoceros " * 1100}]  # the tiny Llama's context is 1,024 positions
    path = tmp_path / "long.json"
    path.write_text(json.dumps(long))
    args = ["--input", str(path), "--output", str(tmp_path / "o"), "--teacher", str(tiny_llama)]
    assert main(["teach", *args, "--cache_dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    line = err.splitlines()[-1]  # after the weights' loading bar, which transformers draws outside the CLI's setting
    assert line.startswith("distill teach: error: the query 'rhinoceros rhinoceros") and "Traceback" not in err
    assert "past the teacher's context of 1024 tokens" in line
    assert not (tmp_path / "o.partial").exists() and not list((tmp_path / "cache").glob("**/*.npy"))


def test_the_scorer_refuses_a_sequence_past_the_models_context(tiny_llama: Path) -> None:
    from teachers import CausalLMTeacher

    teacher = CausalLMTeacher.load(str(tiny_llama))
    with pytest.raises(ValueError, match=r"sequence 0: .* tokens, past the teacher's context of 1024 tokens"):
        teacher.pair_terms(["rhinoceros " * 1100], teacher.encode_passages(["a passage"]), ["logp_cond"])


def test_new_first_stage_scores_are_no_dataset_up_to_date_nor_a_partial_to_resume(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path
) -> None:
    """The input's first-stage scores are in the dataset (its first-stage run, the labels' z(first_stage)): an input
    rewritten with other scores, in the same order, was "up to date" with the old ones, and a resume mixed both."""
    path = tmp_path / "input.json"
    path.write_text(json.dumps(dl19_sample))
    cfg = config(tiny_llama, path, tmp_path, scores=["cis"])
    teach(cfg)
    rescored = [{**e, "hits": [{**h, "score": h["score"] + 100} for h in e["hits"]]} for e in dl19_sample]
    path.write_text(json.dumps(rescored))
    with pytest.raises(ExistingOutputError, match=r"\(the input's first-stage scores changed\): pass --overwrite"):
        teach(cfg)
    report = teach(config(tiny_llama, path, tmp_path, scores=["cis"], overwrite=True))
    table = datasets.load_from_disk(str(report.output)).to_pandas()
    expected = [h["score"] for e in rescored for h in e["hits"]]
    np.testing.assert_allclose(table.first_stage_score, expected)
    work = tmp_path / "out.partial"  # partial results of the first scores, as an interrupted run leaves them
    work.mkdir()
    stamp = json.loads(json.dumps(TeacherDataset.open(report.output).metadata.fingerprint))
    (work / "fingerprint.json").write_text(json.dumps({**stamp, "first_stage": "0" * 16}))
    shutil.rmtree(report.output)
    with pytest.raises(InputError, match=r"partial results of another configuration \(differs in \['first_stage'\]\)"):
        teach(cfg)


def test_another_logit_chunk_is_another_dataset_and_one_made_before_the_key_stays_up_to_date(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    """The LM head's chunk of rows moves the log-probabilities within rounding: a resume under another one mixed two
    runs' bytes, and a dataset made under it was "up to date". A dataset written before the fingerprint had the key
    matches (it was made under the default)."""
    cfg = config(tiny_llama, sample_file, tmp_path, scores=["cis"])
    out = run_teach(cfg)
    assert metadata(out).fingerprint["logit_chunk_rows"] == cfg.logit_chunk_rows
    with pytest.raises(ExistingOutputError, match=r"differs in \['logit_chunk_rows'\]"):
        teach(config(tiny_llama, sample_file, tmp_path, scores=["cis"], logit_chunk_rows=1))
    info = json.loads((out / "teacher.json").read_text())
    del info["fingerprint"]["logit_chunk_rows"]
    (out / "teacher.json").write_text(json.dumps(info))
    assert teach(cfg).up_to_date


def test_teacher_json_records_what_reads_the_candidates_again(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path
) -> None:
    """A BEIR folder's run (the export's quality gate read the folder's judged pairs instead, other candidates) and
    the qrels are recorded; queries given with an input that reads none (rank_llm) are refused, where they were
    ignored without a word."""
    from distill.export.quality_gate import _load

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    corpus = [{"_id": d, "title": "", "text": f"passage {d} about rain"} for d in ("d1", "d2", "d3")]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "what causes rain"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d3 1 9.0 r\nq1 Q0 d2 2 8.0 r\n")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 1\n")
    cfg = config(tiny_llama, beir, tmp_path, scores=["cis"], run=str(run), qrels=str(qrels))
    metadata = TeacherDataset.open(teach(cfg).output).metadata
    assert (metadata.run, metadata.qrels, metadata.queries) == (str(run), str(qrels), None)
    again = _load(metadata.input[0], None, metadata.queries, metadata.corpus, metadata.run)
    assert [p.docid for p in again.candidates[0].passages] == ["d3", "d2"]  # the run's, not the judged d1
    path = tmp_path / "ranked.json"
    path.write_text(json.dumps(dl19_sample[:1]))
    cfg = config(tiny_llama, path, tmp_path, scores=["cis"], output=str(tmp_path / "o2"), queries=str(qrels))
    with pytest.raises(InputError, match=rf"^teach: queries: {qrels}: it gives a TREC run's texts, and no input is"):
        teach(cfg)  # rank_llm reads no queries file
    cfg = config(tiny_llama, path, tmp_path, scores=["cis"], output=str(tmp_path / "o2"), run=str(run))
    with pytest.raises(InputError, match=rf"^teach: run: {run}: it gives a BEIR folder's candidates, and no input"):
        teach(cfg)
    assert not (tmp_path / "o2").exists()


def test_first_stage_ranks_follow_the_scores_as_the_first_stage_run_does(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path
) -> None:
    """A list not in score order (here ascending) got its ranks by position, while its first-stage run ranked by
    score: train_depth then kept the first stage's worst candidates."""
    from distill.stages.teach_input import first_stage_ranks

    assert first_stage_ranks([1.0, 3.0, 3.0, 2.0]) == [4, 1, 2, 3]  # ties in the list's order
    entry = {**dl19_sample[0], "hits": dl19_sample[0]["hits"][:6][::-1]}
    path = tmp_path / "ascending.json"
    path.write_text(json.dumps([entry]))
    report = teach(config(tiny_llama, path, tmp_path, scores=["cis"]))
    table = datasets.load_from_disk(str(report.output)).to_pandas()
    assert table.first_stage_rank.tolist() == [6, 5, 4, 3, 2, 1]
    run = read_trec_run(report.output / "runs" / "first_stage.trec")[str(entry["hits"][0]["qid"])]
    by_rank = table.sort_values("first_stage_rank").docid.tolist()
    assert by_rank == sorted(run, key=run.get, reverse=True)


def test_an_input_whose_every_record_is_skipped_says_what_was_skipped(
    tiny_llama: Path, dl19_sample: list[dict], tmp_path: Path
) -> None:
    entry = {**dl19_sample[0], "hits": [{**h, "content": "  "} for h in dl19_sample[0]["hits"][:3]]}
    path = tmp_path / "empty-passages.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(
        InputError, match=r"no candidates left to score \(3 bad record\(s\) skipped: 3 x empty passage text\)"
    ):
        teach(config(tiny_llama, path, tmp_path, on_bad_input="skip"))  # no count came with it
