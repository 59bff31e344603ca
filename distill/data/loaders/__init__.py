"""Loaders: each reads one input format into the internal schema (:mod:`distill.core.schema`).

:func:`load_candidates` picks the loader from the input itself:

- a directory with ``corpus.jsonl`` and ``queries.jsonl``: BEIR (:mod:`.beir`);
- a JSON list (or JSON-lines file) of ``{query, hits}``: rank_llm (:mod:`.rank_llm`);
- a JSON list (or JSON-lines file) of multi-hop QA questions (HotpotQA, 2Wiki, MuSiQue; distractor
  setting) (:mod:`.multihop`);
- any other file: a TREC run, which needs ``queries`` and ``corpus`` (:mod:`.trec`);
- a string ``irds:<dataset id>``: an ir_datasets dataset's top ``depth`` scoreddocs (:mod:`.irds`).
"""

from __future__ import annotations

from pathlib import Path

from distill.core.schema import InputError, RerankingData
from distill.data.loaders._common import BadInput, OnBadInput, iter_jsonl, read_json
from distill.data.loaders.beir import is_beir_dir, load_beir
from distill.data.loaders.irds import DEFAULT_DEPTH, is_irds, load_irds
from distill.data.loaders.multihop import is_multihop, load_multihop
from distill.data.loaders.qrels import load_qrels
from distill.data.loaders.rank_llm import is_rank_llm, load_rank_llm
from distill.data.loaders.trec import load_trec_run

__all__ = ["load_candidates", "load_qrels"]


def load_candidates(
    path: str | Path,
    *,
    queries: str | Path | None = None,
    corpus: str | Path | None = None,
    run: str | Path | None = None,
    qrels: str | Path | None = None,
    on_bad_input: OnBadInput = "error",
    repair_mojibake: bool = True,
    depth: int = DEFAULT_DEPTH,
) -> RerankingData:
    """Read candidate lists (and qrels, where there are any) from ``path``.

    Args:
        path: a rank_llm or multi-hop JSON file, a TREC run file, a BEIR folder, or ``irds:<ir_datasets id>``.
        queries: for a TREC run, the queries (TSV ``qid<TAB>text`` or JSONL).
        corpus: for a TREC run, the passages (TSV ``docid<TAB>text`` or JSONL).
        run: for a BEIR folder, a TREC run over its corpus; without one, the judged pairs are the candidates.
        qrels: a TREC qrels file; overrides qrels the source carries itself.
        on_bad_input: ``"error"`` raises :class:`InputError` at the first bad record;
            ``"skip"`` drops it and counts the reason in ``RerankingData.skipped``.
        repair_mojibake: undo UTF-8-read-as-Latin-1 damage (MS MARCO) in all texts.
        depth: for an ``irds:`` input, the candidates per query (its top scoreddocs).
    """
    if is_irds(path):
        bad = BadInput(on_bad_input)
        candidates, source_qrels = load_irds(str(path), depth, bad, repair_mojibake)
        if not candidates:
            raise InputError(f"{path}: no candidates left to score")
        return RerankingData(str(path), candidates, load_qrels(Path(qrels)) if qrels else source_qrels, bad.skipped)
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    bad = BadInput(on_bad_input)
    source_qrels = {}
    if path.is_dir():
        if not is_beir_dir(path):
            raise InputError(f"{path}: a directory input must be a BEIR folder with corpus.jsonl and queries.jsonl")
        candidates, source_qrels = load_beir(path, Path(run) if run else None, bad, repair_mojibake)
    elif path.suffix in (".json", ".jsonl"):
        data = read_json(path) if path.suffix == ".json" else [record for _, record in iter_jsonl(path)]
        if is_rank_llm(data):
            candidates = load_rank_llm(path, data, bad, repair_mojibake)
        elif is_multihop(data):
            candidates, source_qrels = load_multihop(path, data, bad, repair_mojibake)
        else:
            raise InputError(
                f"{path}: unknown JSON layout: expected a list of rank_llm {{query, hits}} entries "
                "or of multi-hop QA questions (HotpotQA/2Wiki 'context', MuSiQue 'paragraphs')"
            )
    else:
        if queries is None or corpus is None:
            raise InputError(f"{path}: a TREC run file needs --queries and --corpus")
        candidates = load_trec_run(path, Path(queries), Path(corpus), bad, repair_mojibake)
    if not candidates:
        raise InputError(f"{path}: no candidates left to score")
    return RerankingData(
        source=str(path),
        candidates=candidates,
        qrels=load_qrels(Path(qrels)) if qrels else source_qrels,
        skipped=bad.skipped,
    )
