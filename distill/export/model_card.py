"""The export folder's ``README.md``: a model card in the Hugging Face Hub's format, rendered from ``card.json``.

YAML metadata (``base_model``, ``pipeline_tag: text-ranking``, ``library_name``, ``tags``, ``datasets``,
``license``), then what the student learnt (teacher, label, loss, teacher data), its validation and fidelity
figures (the student card's), each precision's quality gate, usage with cis-distill's ``Reranker``,
sentence-transformers and transformers, and its limitations. Paths show as the training command gave them (never
an absolute path: see :func:`~distill.export.recorded_paths.shown_path`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distill.export.recorded_paths import shown_path
from distill.model.resolver import hub_id

PROJECT = "cis-distill"
TAGS = ("cross-encoder", "reranker", "text-ranking", "sentence-transformers", "knowledge-distillation", PROJECT)
HEADS = {
    "bert-segment-cosine": (
        "segment-cosine",
        "the segment-cosine head: {reading} the joint input `[CLS] query [SEP] passage [SEP]`, and the score is "
        "`scale · cos(mean of the query's last-layer tokens, mean of the passage's) + bias`",
    ),
    "mpnet-segment-cosine": (
        "segment-cosine",
        "the segment-cosine head over MPNet: {reading} the joint input `<s> query </s></s> passage </s>`, and the "
        "score is `scale · cos(mean of the query's last-layer tokens, mean of the passage's) + bias`",
    ),
}
"""``model_type`` of a head of the project's own -> (tag, what it computes, ``{reading}``: :func:`layers_reading`)."""


def layers_reading(segment_layers: int, layers: int | None) -> str:
    """How a segment-cosine student's layers read its pair: all across it, or its first ``segment_layers`` each
    segment apart (the bi-encoder it starts from) and the rest across it."""
    if not segment_layers:
        return "every layer reads"
    if layers is not None and segment_layers >= layers:
        return f"all {layers} layers encode the query and the passage apart (a bi-encoder) in one pass over"
    rest = f"the other {layers - segment_layers}" if layers is not None else "the later ones"
    return f"its first {segment_layers} layers encode the query and the passage apart, and {rest} read across"


CLS_HEAD = "the [CLS] head: a linear layer on the `[CLS]` token of `[CLS] query [SEP] passage [SEP]`"
VALIDATION = {
    "nDCG@10": "nDCG@10 of the student",
    "teacher_nDCG@10": "nDCG@10 of the teacher",
    "first_stage_nDCG@10": "nDCG@10 of the first stage",
    "interp_nDCG@10": "nDCG@10 of the student interpolated with the first stage",
    "interp_alpha": "α of that interpolation (α · z(student) + (1 − α) · z(first stage))",
    "fidelity_spearman": "fidelity: Spearman with the teacher, per query",
    "fidelity_kendall_tau": "fidelity: Kendall τ with the teacher, per query",
    "fidelity_nDCG@10_teacher": "fidelity: nDCG@10 judged by the teacher's top 10, per query",
    "spearman": "Spearman with the teacher's labels, all pairs pooled",
    "pearson": "Pearson with the teacher's labels, all pairs pooled",
}
"""The student card's validation figures (``extra.validation``), in the order shown, with what each is."""
EXAMPLE_QUERY = "what is a rhino"
PASSAGES = 'passages = ["Rhinos are large herbivores with one or two horns.", "The stock market fell today."]'


def render_model_card(card: dict[str, Any], model_id: str, license: str) -> str:
    """The model card of an export whose ``card.json`` is ``card``; its snippets load ``model_id`` (a Hub id or a
    path)."""
    student = card.get("student") or {}
    remote = card.get("remote_code") is not None
    tag, head = HEADS.get(card["model_type"], (None, CLS_HEAD))
    head = head.format(reading=layers_reading(card.get("segment_layers") or 0, card.get("num_hidden_layers")))
    sections = [
        _front_matter(student, card, license, [*TAGS, *([tag] if tag else []), *(["custom_code"] if remote else [])]),
        f"# {Path(model_id).name}\n\nA cross-encoder reranker distilled with {PROJECT} from a causal language "
        f"model's relevance judgement. It scores a (query, passage) pair with {head}; a higher score is more "
        "relevant.",
        _training(student, card.get("teacher_data") or {}),
        _validation(student),
        _fusion(student),
        _calibration(card.get("score_calibration")),
        _precisions(card.get("quality_gate"), card.get("formats") or {}),
        _usage(model_id, remote, student, card["max_length"]),
        _limitations(student, remote, card["max_length"]),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _front_matter(student: dict[str, Any], card: dict[str, Any], license: str, tags: list[str]) -> str:
    base = hub_id(student["backbone"]) if student.get("backbone") else None
    datasets = _dataset_names(card.get("teacher_data") or {})
    lines = ["---"]
    if base:
        lines.append(f"base_model: {base}")
    lines += ["pipeline_tag: text-ranking", "library_name: sentence-transformers", f"license: {license}", "tags:"]
    lines += [f"- {t}" for t in tags]
    if datasets:
        lines += ["datasets:", *(f"- {d}" for d in datasets)]
    return "\n".join([*lines, "---"])


def _dataset_names(teacher_data: dict[str, Any]) -> list[str]:
    """The candidate sets the teacher labelled: an input file's folder name (``trec-dl21``), an ir_datasets id."""
    names: list[str] = []
    for metadata in teacher_data.values():
        for source in (metadata or {}).get("input", []):
            name = source.removeprefix("irds:") if source.startswith("irds:") else _set_name(source)
            if name not in names:
                names.append(name)
    return names


def _set_name(path: str) -> str:
    """A candidates file's folder name (``data/trec-dl21/bm25_top100.json``: ``trec-dl21``), a folder's own."""
    given = Path(path)
    return given.name if not given.suffix else given.parent.name or given.stem


def _label(label: str | dict[str, str]) -> str:
    """The card's label: one expression, or each first stage's on its own."""
    if isinstance(label, str):
        return f"`{label}`"
    return "; ".join(f"{stage}'s lists: `{expression}`" for stage, expression in label.items())


def _training(student: dict[str, Any], teacher_data: dict[str, Any]) -> str:
    if not student:
        return "## Training\n\nThis student has no cis-distill card: what it was trained on is not recorded."
    rows = [
        ("teacher", "; ".join(sorted({_teacher(m) for m in teacher_data.values()})) or "not recorded"),
        ("label (teacher score learnt)", _label(student["label"])),
        ("loss", f"`{student['loss']}`"),
        ("target scaling", f"`{(student.get('target_scaling') or {}).get('kind', 'none')}`"),
        ("backbone", f"`{_backbone(student['backbone'])}`"),
        ("max length in training", f"{student['max_length']} tokens"),
    ]
    for path, metadata in teacher_data.items():
        if metadata is None:
            rows.append(("teacher data", f"`{shown_path(path)}` (not found at export time)"))
        else:
            inputs = ", ".join(f"`{shown_path(i)}`" for i in metadata["input"])
            rows.append(("teacher data", f"`{shown_path(path)}`: scores {', '.join(metadata['scores'])} of {inputs}"))
    if student.get("checkpoint"):
        rows.append(("checkpoint", f"`{student['checkpoint']}`, best by `{student.get('monitor')}`"))
    if share := student.get("initial_weight_share"):
        rows.append(("weights", f"{1 - share:g} × trained + {share:g} × the backbone's initial weights (WiSE-FT)"))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"## Training\n\n| | |\n|---|---|\n{table}"


def _teacher(metadata: dict[str, Any] | None) -> str:
    """The teacher of a teacher dataset, by a public name (``kind:location`` identities lose their paths)."""
    if metadata is None:
        return "not recorded (teacher data not found at export time)"
    fingerprint = metadata.get("fingerprint") or {}
    kind, _, rest = str(fingerprint.get("teacher", "unknown")).partition(":")
    if kind == "package":
        requirement, _, file = rest.partition(":")
        name = f"{file} (pip package {requirement})"
    elif kind in ("gguf", "directory"):  # the path, then its file's or files' stat digest
        name = Path(rest.rsplit(":", 1)[0]).name
    else:
        name = rest or kind
    prompt = fingerprint.get("prompt")
    return f"{name}, prompt `{prompt}`" if prompt else name


def _backbone(name: str) -> str:
    return hub_id(name) or (Path(name).name if Path(name).is_absolute() else name)


def _validation(student: dict[str, Any]) -> str | None:
    figures = (student.get("extra") or {}).get("validation") or {}
    if not figures:
        return None
    queries = len(student.get("val_queries") or [])
    keys = [k for k in VALIDATION if k in figures] + sorted(set(figures) - set(VALIDATION))
    rows = "\n".join(f"| {_figure(k)} | {_number(k, figures[k])} |" for k in keys)
    return (
        f"## Validation\n\nOn the {queries} held-out validation queries of its teacher data (their every candidate), "
        f"at the checkpoint chosen by `{student.get('monitor')}`. nDCG@10 is x100 (trec_eval); fidelity is how "
        f"closely the student's ranking of each query copies its teacher's.\n\n| figure | value |\n|---|---|\n{rows}"
    )


PER_FIRST_STAGE = ("nDCG@10", "first_stage_nDCG@10", "interp_nDCG@10", "interp_alpha")
"""The validation figures also measured on each first stage's own lists (``interp_alpha/splade``)."""


def _figure(key: str) -> str:
    """What a validation figure is: :data:`VALIDATION`'s words, on a first stage's lists for ``<figure>/<name>``."""
    base, _, name = key.partition("/")
    if name and base in PER_FIRST_STAGE:
        return f"{VALIDATION[base]}, on {name}'s lists"
    return VALIDATION.get(key, key)


def _fusion(student: dict[str, Any]) -> str | None:
    """Each first stage's α, with what it was chosen on (or the rule that gave it)."""
    alphas = student.get("interpolation")
    if alphas is None:
        return None
    if not isinstance(alphas, dict):  # a card written before α was kept per first stage
        alphas = {"first_stage": {"alpha": alphas}}
    rows = []
    for name, entry in alphas.items():
        if entry.get("taken_from"):
            how = f"no validation lists: the α of {entry['taken_from']}"
        elif entry.get("declared"):
            how = "declared in the training config"
        elif entry.get("chosen_on"):
            files = ", ".join(f"`{shown_path(f)}`" for f in entry["chosen_on"].split(", "))
            how = f"the best nDCG@10 on the lists of {entry.get('queries', '?')} judged validation queries: {files}"
        else:
            how = "on the validation queries (what it was chosen on is not recorded)"
        rows.append(f"| {name} | {entry['alpha']:.2f} | {how} |")
    return (
        "## Fusion with the first stage\n\nThe student's score fused with the first stage's, α · z(student) + "
        "(1 − α) · z(first stage) (z standardises over a query's candidates), with the α of the first stage whose "
        "candidates are reranked: `Reranker.load(folder, first_stage=NAME)`, `distill rerank --first_stage NAME`, or "
        "`distill serve` with a request's `first_stage_scores` and `first_stage`. α = 1 is the student alone.\n\n"
        "| first stage | α | chosen |\n|---|---|---|\n" + "\n".join(rows)
    )


def _number(key: str, value: Any) -> str:
    if not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.2f}" if "nDCG" in key else f"{value:.3f}"


def _calibration(calibration: dict[str, Any] | None) -> str:
    if not calibration:
        return ""
    text = (
        "## Scores\n\nThe raw score is the model's output. The normalised score that `distill serve` returns "
        f"(and `Reranker.probabilities`) is a probability of relevance, score calibration by Platt scaling: "
        f"`sigmoid({calibration['scale']:.6g} * raw + {calibration['bias']:.6g})`, fitted on "
        f"{calibration['fitted_on'] or 'the judged validation pairs'}. It ranks as the raw score does."
    )
    quality = calibration.get("quality")
    if quality:
        text += (
            f" On those {quality['pairs']} pairs ({quality['relevant']} relevant; an unjudged candidate counts as not "
            f"relevant): Brier score {quality['brier']:.4f}, expected calibration error {quality['ece']:.4f}, and "
            f"the probabilities' 5th to 95th percentiles {quality['p05']:.3f} to {quality['p95']:.3f}."
        )
    return text


def _precisions(gate: dict[str, Any] | None, formats: dict[str, str]) -> str:
    files = ", ".join(f"`{file}`" for file in formats.values())
    head = f"## Precisions\n\nThe folder holds the PyTorch weights and {files or 'no exported file'}."
    if gate is None:
        return f"{head} No quality gate was measured (no judged validation pairs)."
    reference = gate["reference"]
    rows = []
    for name, record in gate["backends"].items():
        if "not_checked" in record:
            rows.append(f"| {name} | - | - | - | - | not checked: {record['not_checked']} |")
        else:
            passed = "yes" if record["passed"] else "**no**"
            verdict = f" ({record['verdict'].replace('_', ' ')})" if record.get("verdict") else ""
            interval = record.get("interval")
            shown = f"[{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "-"
            rows.append(
                f"| {name} | {record['ndcg10']:.2f} | {record['delta']:+.2f} | {shown} | {_spearman(record)} "
                f"| {passed}{verdict} |"
            )
    if "spearman_floor" in gate:
        rule = (
            f"a backend fails when the {gate['confidence']:.0%} interval of its mean ΔnDCG@10 (a paired bootstrap "
            f"over the queries) lies beyond ±{gate['bound']:g} points, passes when it lies within, and otherwise "
            f"passes only if its mean per-query Spearman with {reference['backend']}'s scores is at least "
            f"{gate['spearman_floor']:g} (it orders the candidates as fp32 does; only near-ties moved)."
        )
    else:  # a card written before the gate judged by its interval
        rule = f"a backend passes within {gate['bound']:g} nDCG@10 points."
    return (
        f"{head} Each backend's ranking was measured against {reference['backend']} (nDCG@10 "
        f"{reference['ndcg10']:.2f}) on {gate['pairs']}; {rule} "
        "cis-distill's `Reranker.load(folder)` chooses the fastest backend for the CPU among those that passed.\n\n"
        "| backend | nDCG@10 | Δ | 95% interval of Δ | Spearman with fp32 | passed |\n|---|---|---|---|---|---|\n"
        + "\n".join(rows)
    )


def _usage(model_id: str, remote: bool, student: dict[str, Any], max_length: int) -> str:
    trust = ", trust_remote_code=True" if remote else ""
    rerankers_trust = ", model_kwargs=trust, tokenizer_kwargs=trust" if remote else ""
    trust_line = 'trust = {"trust_remote_code": True}\n' if remote else ""
    interpolate = bool(student.get("interpolate"))
    rerank = (
        f"bm25_scores = [14.2, 3.1]  # the first stage's score of each passage\n"
        f'reranker.rerank("{EXAMPLE_QUERY}", passages, top_k=10, first_stage_scores=bm25_scores)'
        if interpolate
        else f'reranker.rerank("{EXAMPLE_QUERY}", passages, top_k=10)'
    )
    note = (
        "\n\nIts card interpolates with the first stage (see Fusion with the first stage): `Reranker` needs each "
        "passage's first-stage score; the other loaders give the student's own scores."
        if interpolate
        else ""
    )
    folder = f'snapshot_download("{model_id}")' if _is_hub_id(model_id) else f'"{model_id}"'
    download = "from huggingface_hub import snapshot_download\n" if _is_hub_id(model_id) else ""
    remote_note = (
        "\n\nThe head is not part of `transformers`: outside cis-distill it loads with `trust_remote_code=True`, "
        "which runs this folder's `modeling_*.py` (it imports only torch and transformers)."
        if remote
        else ""
    )
    return f"""## Usage

With cis-distill (not on a package index: `pip install -e .` in its checkout, or `pip install` the wheel built
there), on the fastest backend this machine has:

```python
{download}from distill import Reranker

{PASSAGES}
reranker = Reranker.load({folder})
{rerank}  # [(index into passages, score), ...], best first
```

With sentence-transformers:

```python
from sentence_transformers import CrossEncoder

{PASSAGES}
model = CrossEncoder("{model_id}"{trust})
scores = model.predict([("{EXAMPLE_QUERY}", passage) for passage in passages])
```

With transformers:

```python
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

{PASSAGES}
tokenizer = AutoTokenizer.from_pretrained("{model_id}"{trust})
model = AutoModelForSequenceClassification.from_pretrained("{model_id}"{trust}).eval()
batch = tokenizer(["{EXAMPLE_QUERY}"] * len(passages), passages, padding=True, truncation="only_second",
                  max_length={max_length}, return_tensors="pt")
with torch.inference_mode():
    scores = model(**batch).logits[:, 0]
```

With rerankers:

```python
from rerankers import Reranker

{PASSAGES}
{trust_line}ranker = Reranker("{model_id}", model_type="cross-encoder"{rerankers_trust})
ranker.rank("{EXAMPLE_QUERY}", passages)
```{note}{remote_note}"""


def _is_hub_id(model_id: str) -> bool:
    return not model_id.startswith("path/to/") and model_id.count("/") == 1


def _limitations(student: dict[str, Any], remote: bool, max_length: int) -> str:
    items = [
        "It copies its teacher, a causal language model's judgement, errors included, learnt from a few thousand "
        "pairs of the teacher data above; how well it ranks outside their domain and language is not measured.",
        f"Scores are not probabilities: compare them within one query. Pairs over {max_length} tokens are cut "
        f"(the passage's end); it was trained on pairs of at most {student.get('max_length', max_length)} tokens.",
        "The validation figures come from a few dozen queries at most: differences of a point or two of nDCG@10 "
        "are within their noise. They chose its settings, so they overstate how it does on new queries.",
        "Check the terms of the training data (the candidate sets above) before any commercial use.",
    ]
    if remote:
        items.append(
            "The Hub's hosted inference does not run remote code, so the widget cannot score with this head; "
            "load it as above."
        )
    return "## Limitations\n\n" + "\n".join(f"- {item}" for item in items)


def _spearman(record: dict[str, Any]) -> str:
    """A gate record's Spearman, or ``-`` where it is undefined (``null``: no ordering compared)."""
    value = record.get("spearman")
    return "-" if value is None else f"{value:.4f}"
