"""The similarity teacher (an embedding model's cosine of query and passage) in the teacher stage, and its scores in
a label beside a causal LM's."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest

from distill.core.schema import ExistingOutputError, InputError
from distill.data.label_table import load_label_table
from distill.data.labels import per_query_z
from distill.data.teacher_data import TeacherDataset
from distill.model.embeddings import Encoder
from distill.stages.teach import TeachConfig, teach


def similarity_config(tiny_bert: Path, input_file: Path, output: Path, **overrides) -> TeachConfig:
    values = {
        "input": str(input_file),
        "output": str(output),
        "teacher": str(tiny_bert),
        "scores": ["similarity"],
        "chunk_size": 7,
        "max_batch_tokens": 512,
        "progress": False,
    }
    return TeachConfig(**{**values, **overrides})


def test_scores_each_pair_by_the_cosine_of_its_texts_encoded_apart(
    tiny_bert: Path, sample_file: Path, tmp_path: Path
) -> None:
    report = teach(similarity_config(tiny_bert, sample_file, tmp_path / "st"))
    assert not report.up_to_date and report.scores == ["similarity"]
    table = datasets.load_from_disk(str(report.output)).to_pandas()
    assert len(table) == 36 and "cis" not in table.columns and "logp_uncond" not in table.columns
    encoder = Encoder(str(tiny_bert))
    for row in table.head(9).itertuples():  # each text on its own, not in the stage's batches
        q, p = encoder.encode([row.query])[0], encoder.encode([row.passage])[0]
        assert row.similarity == pytest.approx(float(q @ p), abs=1e-5)
    assert table.similarity.between(-1, 1).all() and table.similarity.nunique() > 30
    meta = TeacherDataset.open(report.output).metadata
    assert meta.score == "similarity" and meta.fingerprint["kind"] == "similarity"
    assert (report.output / "runs" / "similarity.trec").is_file()
    again = teach(similarity_config(tiny_bert, sample_file, tmp_path / "st"))
    assert again.up_to_date
    # batches of another size score within rounding of these: another dataset (a resume under it mixed the two)
    with pytest.raises(ExistingOutputError, match=r"differs in \['max_batch_tokens'\]"):
        teach(similarity_config(tiny_bert, sample_file, tmp_path / "st", max_batch_tokens=256))


def test_one_process_or_other_chunks_give_the_same_scores(tiny_bert: Path, sample_file: Path, tmp_path: Path) -> None:
    a = teach(similarity_config(tiny_bert, sample_file, tmp_path / "a")).output
    b = teach(similarity_config(tiny_bert, sample_file, tmp_path / "b", chunk_size=36)).output
    sa = datasets.load_from_disk(str(a))["similarity"]
    sb = datasets.load_from_disk(str(b))["similarity"]
    np.testing.assert_allclose(sa, sb, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"scores": ["similarity", "cis"]}, "cannot be mixed with a causal LM's (cis)"),
        ({"reuse": ["somewhere"]}, "only a causal LM's scores are reused"),
        ({"scores": ["cosine"]}, "or similarity (an embedding model)"),
    ],
)
def test_refuses_what_an_embedding_teacher_cannot_do(
    tiny_bert: Path, sample_file: Path, tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        similarity_config(tiny_bert, sample_file, tmp_path / "st", **overrides)


def test_a_label_sums_a_causal_lm_and_a_similarity_teacher(teacher_dataset: Path, tiny_bert: Path) -> None:
    """The similarity teacher's dataset of the same candidates joins the causal LM's by pair, and a label is the
    sum of their per-query z-scores."""
    lm_input = Path(TeacherDataset.open(teacher_dataset).metadata.input[0])
    st = teach(similarity_config(tiny_bert, lm_input, teacher_dataset.parent / "similarity")).output
    table = load_label_table({"lm": [str(teacher_dataset)], "st": [str(st)]}, "z(lm.cis) + 0.5*z(st.similarity)")
    frame = table.table
    lm = datasets.load_from_disk(str(teacher_dataset)).to_pandas().set_index(["qid", "docid"])
    sim = datasets.load_from_disk(str(st)).to_pandas().set_index(["qid", "docid"])
    keys = list(zip(frame.qid, frame.docid, strict=True))
    cis = lm.loc[keys, "cis"].to_numpy()
    similarity = sim.loc[keys, "similarity"].to_numpy()
    expected = per_query_z(cis, frame.qid.to_numpy()) + 0.5 * per_query_z(similarity, frame.qid.to_numpy())
    np.testing.assert_allclose(frame["label"].to_numpy(), expected, atol=1e-9)


def test_the_similarity_of_lists_of_other_lengths_is_refused(tiny_bert: Path) -> None:
    from teachers.embedding import SimilarityTeacher

    teacher = SimilarityTeacher.load(str(tiny_bert))
    with pytest.raises(ValueError, match="3 queries for 1 passages: one query a passage"):
        teacher.similarity(["q one", "q two", "q three"], ["only passage"])  # broadcast: three scores came back
    with pytest.raises(ValueError, match="a list of queries and a list of passages, not a string"):
        teacher.similarity("a query", ["a passage"])


def test_a_causal_lm_is_no_similarity_teacher(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"LlamaForCausalLM is no embedding model, which --scores similarity needs"):
        teach(similarity_config(tiny_llama, sample_file, tmp_path / "st"))  # its hidden states' cosines, exit 0
    cfg = TeachConfig(input=[str(sample_file)], output=str(tmp_path / "default"), scores=["similarity"])
    with pytest.raises(InputError, match="a GGUF causal LM is no embedding model"):  # the default teacher, SmolLM2
        teach(cfg)
    assert not (tmp_path / "st").exists() and not (tmp_path / "default").exists()


def test_an_embedding_models_dataset_is_named_as_such_when_reused(
    tiny_bert: Path, tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    similarity = teach(similarity_config(tiny_bert, sample_file, tmp_path / "st")).output
    cfg = TeachConfig(
        input=[str(sample_file)], output=str(tmp_path / "lm"), teacher=str(tiny_llama), reuse=[str(similarity)]
    )
    with pytest.raises(InputError, match=f"reuse {similarity} is an embedding model's dataset: only a causal LM's"):
        teach(cfg)  # "dtype is None there, 'float32' here"
