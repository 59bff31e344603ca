"""The teacher stage: score every (query, candidate) pair with a causal LM and save triplets.

Work is cut into deterministic chunks (passages for log p(K), then pairs), chunk ``i`` going
to process ``i mod world_size``. Each chunk is scored as one unit and written atomically, so

- one process and N processes (``accelerate launch``) produce the same dataset;
- after a crash or ``kill -9``, the same command resumes and gives the same dataset as an
  uninterrupted run;
- log p(K) is computed once per distinct passage and kept in a disk cache across runs.

The output folder loads with ``datasets.load_from_disk`` and holds ``runs/<score>.trec``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from distill.core.loaders import OnBadInput, load_candidates
from distill.core.models import cache_home
from distill.core.runs import write_trec_run
from distill.core.schema import InputError, RerankingData
from teachers.passage_cache import PassageLogProbCache, passage_key
from teachers.scores import DEFAULT_PROMPT, PAIR_TERMS, QUERY_TERMS, SCORES, required_terms

log = logging.getLogger(__name__)


@dataclass
class TeachConfig:
    """Options of ``distill teach`` (YAML keys and ``--flags`` alike)."""

    input: list[str]
    """Candidates: rank_llm or multi-hop QA JSON files, TREC run files or BEIR folders; several are joined,
    each (qid, docid) pair scored once."""
    output: str
    """The dataset folder to write."""
    teacher: str = "smollm2-135m"
    """A hub id, a local model folder, a .gguf file or an embedded alias (see ``distill.core.models``)."""
    scores: list[str] = field(default_factory=lambda: ["cis"])
    """Scores to compute; the first is the dataset's primary label. ``cis`` is always included."""
    queries: str | None = None
    corpus: str | None = None
    run: str | None = None
    qrels: str | None = None
    max_queries: int | None = None
    """Score only the first N queries of the input."""
    start_token: int | str | None = None
    """Token every prefix starts with (id or string); default the tokenizer's BOS, else EOS."""
    max_passage_tokens: int = 256
    prompt: str = DEFAULT_PROMPT
    dtype: str = "auto"
    """``auto`` (bf16 on GPU, fp32 on CPU), ``float32``, ``bfloat16`` or ``float16``."""
    device_map: str | None = None
    """``auto`` shards one model over all visible GPUs (model parallel, one process)."""
    max_batch_tokens: int = 8192
    logit_chunk_rows: int = 1024
    chunk_size: int = 256
    """Pairs (or passages) per unit of work, the granularity of sharding and resuming."""
    cache_dir: str | None = None
    """Where log p(K) is cached; default ``$CIS_DISTILL_CACHE/pk`` (``~/.cache/cis-distill/pk``)."""
    on_bad_input: OnBadInput = "error"
    repair_mojibake: bool = True
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            self.input = [self.input]
        if isinstance(self.scores, str):
            self.scores = [s.strip() for s in self.scores.split(",") if s.strip()]
        required_terms(self.scores)  # validates the names
        if self.chunk_size < 1 or self.max_batch_tokens < 1 or self.max_passage_tokens < 1:
            raise ValueError("chunk_size, max_batch_tokens and max_passage_tokens must be positive")

    @property
    def score_columns(self) -> list[str]:
        return list(dict.fromkeys(["cis", *self.scores]))


@dataclass
class Pairs:
    """The flat list of (query, candidate) pairs, in input order."""

    qid: list[str]
    docid: list[str]
    query: list[str]
    passage: list[str]
    rank: list[int]
    first_stage_score: list[float]

    @classmethod
    def from_data(cls, data: RerankingData) -> Pairs:
        pairs = cls([], [], [], [], [], [])
        for cands in data.candidates:
            for rank, (passage, score) in enumerate(zip(cands.passages, cands.scores, strict=True), start=1):
                pairs.qid.append(cands.query.qid)
                pairs.docid.append(passage.docid)
                pairs.query.append(cands.query.text)
                pairs.passage.append(passage.text)
                pairs.rank.append(rank)
                pairs.first_stage_score.append(score)
        return pairs

    def __len__(self) -> int:
        return len(self.qid)

    def digest(self) -> str:
        h = hashlib.sha256()
        for row in zip(self.qid, self.docid, self.query, self.passage, strict=True):
            h.update(json.dumps(row).encode())
        return h.hexdigest()[:16]


def _chunks(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def _atomic_write_parquet(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    pq.write_table(table, tmp)
    tmp.replace(path)


def run_teach(cfg: TeachConfig) -> Path:
    """Run the teacher stage (in every process of an ``accelerate launch``); returns the output folder."""
    from accelerate import PartialState

    from teachers.teacher import CausalLMTeacher

    state = PartialState()
    output = Path(cfg.output)
    data = RerankingData.union(
        [
            load_candidates(
                path,
                queries=cfg.queries,
                corpus=cfg.corpus,
                run=cfg.run,
                qrels=cfg.qrels,
                on_bad_input=cfg.on_bad_input,
                repair_mojibake=cfg.repair_mojibake,
            )
            for path in cfg.input
        ]
    )
    if cfg.max_queries is not None:
        data.candidates = data.candidates[: cfg.max_queries]
    pairs = Pairs.from_data(data)

    teacher = CausalLMTeacher.load(
        cfg.teacher,
        device=state.device,
        dtype=cfg.dtype,
        device_map=cfg.device_map,
        start_token=cfg.start_token,
        max_passage_tokens=cfg.max_passage_tokens,
        prompt=cfg.prompt,
        max_batch_tokens=cfg.max_batch_tokens,
        logit_chunk_rows=cfg.logit_chunk_rows,
    )
    setting = teacher.describe()
    fingerprint = {
        **setting,
        "input": pairs.digest(),
        "scores": cfg.score_columns,
        "chunk_size": cfg.chunk_size,
        "max_batch_tokens": cfg.max_batch_tokens,
    }
    if _is_complete(output, fingerprint, cfg.overwrite):
        if state.is_main_process:
            log.warning("%s is complete and up to date; nothing to do", output)
        return output

    work = output.with_name(output.name + ".partial")
    if state.is_main_process:
        _prepare_work_dir(work, fingerprint, cfg.overwrite)
    state.wait_for_everyone()

    passage_ids = teacher.encode_passages(pairs.passage)
    keys = [passage_key(ids) for ids in passage_ids]
    cache_setting = {k: setting[k] for k in ("teacher", "dtype", "start_token_id")}
    cache = PassageLogProbCache(Path(cfg.cache_dir) if cfg.cache_dir else cache_home() / "pk", cache_setting)
    _score_passages(teacher, keys, passage_ids, cache, cfg, state)
    state.wait_for_everyone()
    cache.reload()
    query_values = _score_queries(teacher, pairs, cfg, state)
    _score_pairs(teacher, pairs, passage_ids, keys, cache, query_values, work, cfg, state)
    state.wait_for_everyone()
    if state.is_main_process:
        _merge(work, output, pairs, cfg, fingerprint)
        if data.skipped:
            log.warning("skipped bad input records: %s", dict(data.skipped))
    state.wait_for_everyone()
    return output


def _is_complete(output: Path, fingerprint: dict[str, Any], overwrite: bool) -> bool:
    if not output.exists():
        return False
    meta = output / "dataset_info.json"
    if meta.is_file() and read_metadata(output).get("fingerprint") == fingerprint:
        return True
    if not overwrite:
        raise InputError(
            f"{output} exists and was not made by this configuration: pass --overwrite or another --output"
        )
    return False


def _prepare_work_dir(work: Path, fingerprint: dict[str, Any], overwrite: bool) -> None:
    """Create (or check, to resume) the folder of partial results."""
    stamp = work / "fingerprint.json"
    if work.exists():
        previous = json.loads(stamp.read_text()) if stamp.is_file() else None
        if previous == fingerprint:
            log.warning("resuming from %s", work)
            return
        if not overwrite:
            differs = sorted(k for k in fingerprint if (previous or {}).get(k) != fingerprint[k])
            raise InputError(
                f"{work} holds partial results of another configuration (differs in {differs}): "
                "pass --overwrite to discard them, or choose another --output"
            )
        shutil.rmtree(work)
    (work / "chunks").mkdir(parents=True)
    stamp.write_text(json.dumps(fingerprint, indent=2, sort_keys=True))


def _progress(cfg: TeachConfig, state: Any, total: int, desc: str, unit: str, per_item: int = 1) -> tqdm:
    """A bar counting items (passages or pairs) of ``per_item`` scored sequences each."""
    return tqdm(
        total=total * per_item,
        unit_scale=1 / per_item if per_item > 1 else False,
        desc=f"{desc} [rank {state.process_index}/{state.num_processes}]",
        unit=unit,
        disable=not cfg.progress or not state.is_local_main_process,
        dynamic_ncols=True,
    )


def _score_passages(
    teacher: Any,
    keys: list[str],
    passage_ids: list[list[int]],
    cache: PassageLogProbCache,
    cfg: TeachConfig,
    state: Any,
) -> None:
    """log p(K) for this process's share of the distinct passages not yet in the cache."""
    first = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    distinct = list(first.items())
    mine = [
        c
        for j, c in enumerate(_chunks(len(distinct), cfg.chunk_size))
        if j % state.num_processes == state.process_index
    ]
    todo = [[distinct[i] for i in chunk if distinct[i][0] not in cache] for chunk in mine]
    with _progress(cfg, state, sum(map(len, todo)), "log p(K)", "passage") as bar:
        for chunk in todo:
            if chunk:
                values = teacher.passage_logprobs([passage_ids[i] for _, i in chunk], on_batch=bar.update)
                cache.add([key for key, _ in chunk], values)


def _score_queries(teacher: Any, pairs: Pairs, cfg: TeachConfig, state: Any) -> dict[str, dict[str, Any]]:
    """The query-only terms and ``n_query_tokens`` of every distinct query text: term -> {query: value}.

    Every process scores all distinct queries in the same batches (one short sequence each), so all
    processes and all chunks see the same value for a query.
    """
    queries = list(dict.fromkeys(pairs.query))
    values: dict[str, Any] = {"n_query_tokens": [len(ids) for ids in teacher.encode_queries(queries)]}
    wanted = [t for t in QUERY_TERMS if t in required_terms(cfg.score_columns)]
    if wanted:
        with _progress(cfg, state, len(queries), "query terms", "query") as bar:
            values.update(teacher.query_terms(queries, wanted, on_batch=bar.update))
    return {name: dict(zip(queries, column, strict=True)) for name, column in values.items()}


def _score_pairs(
    teacher: Any,
    pairs: Pairs,
    passage_ids: list[list[int]],
    keys: list[str],
    cache: PassageLogProbCache,
    query_values: dict[str, dict[str, Any]],
    work: Path,
    cfg: TeachConfig,
    state: Any,
) -> None:
    """Score this process's share of pair chunks that are not on disk yet."""
    terms = required_terms(cfg.score_columns)
    pair_terms = [t for t in PAIR_TERMS if t in terms]
    chunks = _chunks(len(pairs), cfg.chunk_size)
    mine = [
        (j, chunk)
        for j, chunk in enumerate(chunks)
        if j % state.num_processes == state.process_index and not (work / "chunks" / f"{j:06d}.parquet").exists()
    ]
    with _progress(cfg, state, sum(len(c) for _, c in mine), "pairs", "pair", len(pair_terms)) as bar:
        for j, chunk in mine:
            values = teacher.pair_terms(
                [pairs.query[i] for i in chunk],
                [passage_ids[i] for i in chunk],
                pair_terms,
                on_batch=bar.update,
            )
            values["logp_uncond"] = np.array([cache[keys[i]] for i in chunk])
            for name, by_query in query_values.items():
                values[name] = np.array([by_query[pairs.query[i]] for i in chunk])
            values["n_passage_tokens"] = np.array([len(passage_ids[i]) for i in chunk])
            columns: dict[str, Any] = {
                "qid": [pairs.qid[i] for i in chunk],
                "docid": [pairs.docid[i] for i in chunk],
                "query": [pairs.query[i] for i in chunk],
                "passage": [pairs.passage[i] for i in chunk],
                "first_stage_rank": pa.array([pairs.rank[i] for i in chunk], pa.int32()),
                "first_stage_score": [pairs.first_stage_score[i] for i in chunk],
                "n_passage_tokens": pa.array(values["n_passage_tokens"], pa.int32()),
                "n_query_tokens": pa.array(values["n_query_tokens"], pa.int32()),
            }
            columns.update({score: SCORES[score](values) for score in cfg.score_columns})
            columns.update({term: values[term] for term in terms})
            _atomic_write_parquet(pa.table(columns), work / "chunks" / f"{j:06d}.parquet")


def _merge(work: Path, output: Path, pairs: Pairs, cfg: TeachConfig, fingerprint: dict[str, Any]) -> None:
    """Join the chunks into the final dataset and run files, then swap it into place."""
    import datasets

    n_chunks = len(_chunks(len(pairs), cfg.chunk_size))
    table = pa.concat_tables([pq.read_table(work / "chunks" / f"{j:06d}.parquet") for j in range(n_chunks)])
    if table.num_rows != len(pairs):
        raise RuntimeError(f"merged {table.num_rows} rows for {len(pairs)} pairs")
    metadata = {"score": cfg.scores[0], "scores": cfg.score_columns, "input": cfg.input, "fingerprint": fingerprint}
    dataset = datasets.Dataset(table, info=datasets.DatasetInfo(description=json.dumps(metadata)))
    staging = work / "dataset"
    if staging.exists():
        shutil.rmtree(staging)
    dataset.save_to_disk(str(staging))
    qids, docids = table.column("qid").to_pylist(), table.column("docid").to_pylist()
    runs = {"first_stage": table.column("first_stage_score").to_pylist()}
    runs.update({score: table.column(score).to_pylist() for score in cfg.score_columns})
    for name, values in runs.items():
        run: dict[str, dict[str, float]] = {}
        for qid, docid, value in zip(qids, docids, values, strict=True):
            run.setdefault(qid, {})[docid] = value
        write_trec_run(staging / "runs" / f"{name}.trec", run, tag=name)
    if output.exists():
        shutil.rmtree(output)
    staging.rename(output)
    shutil.rmtree(work)
    log.warning("wrote %d triplets to %s", len(pairs), output)


def read_metadata(output: str | Path) -> dict[str, Any]:
    """The teacher stage's metadata of a saved dataset: primary ``score``, ``scores``, ``input`` and
    ``fingerprint`` (teacher identity, dtype, start token, prompt, ...)."""
    info = json.loads((Path(output) / "dataset_info.json").read_text())
    return json.loads(info.get("description") or "{}")
