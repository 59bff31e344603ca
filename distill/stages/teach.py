"""The teacher stage: score every (query, candidate) pair with a causal LM and save triplets.

Work is cut into deterministic chunks, the same whatever the number of processes: pair chunk ``j`` goes to process
``j mod world_size``, which keeps only those pairs (:class:`~distill.stages.teach_input.Share`); the distinct passages
are hashed into buckets (their number a function of the input alone), each bucket's cut into chunks in order of
first appearance, and bucket ``b`` goes to process ``b mod world_size``. Each chunk is scored as one unit, and a pair
chunk written atomically under its checksum (:mod:`distill.stages.teach_chunks`; a damaged one is scored again), so

- one process and N processes (``accelerate launch``) produce the same dataset;
- after a crash or ``kill -9``, the same command resumes and gives the same dataset as an
  uninterrupted run;
- log p(K) is computed once per distinct passage and kept in a disk cache across runs;
- with ``reuse``, pairs already scored in other datasets of the same teacher setting take their values from
  there (and their passages' log p(K) and queries' terms seed the caches), and only the other pairs are scored.

The output is a :class:`~distill.data.teacher_data.TeacherDataset` folder.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from distill.core.config import options_of
from distill.core.counts import counted
from distill.core.output_files import hold_output, remove_stale_siblings, replace_folder, staging_path
from distill.core.path_checks import input_path, output_folder
from distill.core.rank_agreement import check_ranks_agree
from distill.core.schema import ExistingOutputError, InputError, PeerProcessFailed
from distill.data.loaders import check_text_sources, skip_summary
from distill.data.loaders.irds import is_irds
from distill.data.teacher_data import TeacherDataset, TeacherMetadata
from distill.model.resolver import cache_home
from distill.stages.teach_chunks import chunk_batches, chunk_file, write_chunk
from distill.stages.teach_config import TeachConfig
from distill.stages.teach_fingerprint import (
    changed_keys,
    check_earlier_results,
    dataset_fingerprint,
    fingerprint_before_load,
    is_up_to_date,
    prepare_work_dir,
    record_up_to_date,
)
from distill.stages.teach_input import (
    PairRows,
    Share,
    candidate_stream,
    write_pair_rows,
)
from teachers.causal_lm import ScorerOptions
from teachers.embedding import SIMILARITY
from teachers.passage_cache import PassageLogProbCache, passage_key
from teachers.terms import (
    PAIR_TERMS,
    QUERY_TERMS,
    SCORES,
    required_terms,
)

log = logging.getLogger(__name__)
SHARED_WAIT_S = 30.0
"""How long a process looks for the main process's marker in a folder that must be shared (:func:`check_shared`)."""


REUSE_FREE = ("input", "first_stage", "scores")
"""Fingerprint keys a reused dataset may differ in: what was scored, not how."""
REUSE_KEY = ("qid", "docid", "query", "passage")


@dataclass
class _Reuse:
    """What the ``reuse`` datasets hold for this run's pairs."""

    rows: np.ndarray
    """``[n]`` each pair's row in :attr:`terms` (``n`` this process's pairs), or -1: the pair is scored."""
    terms: dict[str, np.ndarray]
    """Pair term -> its values of the reused rows."""
    passages: dict[str, float]
    """Passage text -> log p(K), from every reused row."""
    query_values: dict[str, dict[str, float]]
    """Query term -> {query text: value}, from every reused row."""

    @classmethod
    def load(cls, cfg: TeachConfig, fingerprint: dict[str, Any], pairs: PairRows) -> _Reuse:
        """Check each reused folder's fingerprint against ``fingerprint`` and match this run's pairs to its rows.

        Raises:
            InputError: a folder was made under another teacher setting (one line naming it and the key).
        """
        terms = required_terms(cfg.score_columns)
        pair_terms = [t for t in PAIR_TERMS if t in terms]
        query_terms = [t for t in QUERY_TERMS if t in terms]
        found: dict[tuple[str, ...], int] = {}
        values: dict[str, list[float]] = {t: [] for t in pair_terms}
        passages: dict[str, float] = {}
        query_values: dict[str, dict[str, float]] = {t: {} for t in query_terms}
        _check_reused(cfg.reuse, fingerprint)
        for folder in cfg.reuse:
            table = TeacherDataset.open(folder).table()
            names = set(table.column_names)
            for row in table.select([c for c in (*REUSE_KEY, "logp_uncond") if c in names]).to_pylist():
                passages.setdefault(row["passage"], row["logp_uncond"])
            for term in (t for t in query_terms if t in names):
                for query, value in zip(table.column("query").to_pylist(), table.column(term).to_pylist(), strict=True):
                    query_values[term].setdefault(query, value)
            if missing := [t for t in pair_terms if t not in names]:
                log.warning("teach: reuse %s lacks %s: only its log p(K) and query terms are reused", folder, missing)
                continue
            keys = zip(*(table.column(c).to_pylist() for c in REUSE_KEY), strict=True)
            columns = {t: table.column(t).to_pylist() for t in pair_terms}
            for i, key in enumerate(keys):
                if key not in found:
                    found[key] = len(found)
                    for t in pair_terms:
                        values[t].append(columns[t][i])
        rows = np.full(len(pairs), -1, dtype=np.int64)
        if found:
            start = 0
            for chunk in _chunks(len(pairs), 4096):
                batch = pairs.rows(chunk, REUSE_KEY)
                keys = zip(*(batch[c] for c in REUSE_KEY), strict=True)
                rows[start : start + len(chunk)] = [found.get(key, -1) for key in keys]
                start += len(chunk)
        terms_out = {t: np.asarray(v, dtype=np.float64) for t, v in values.items()}
        return cls(rows, terms_out, passages, query_values)

    def seed(self, keys: np.ndarray, pairs: PairRows, cache: PassageLogProbCache) -> None:
        """Add the reused log p(K) of this process's passages that ``cache`` lacks."""
        if not self.passages:
            return
        new: dict[str, float] = {}
        for chunk in _chunks(len(pairs), 4096):
            for i, passage in zip(chunk, pairs.rows(chunk, ["passage"])["passage"], strict=True):
                key = keys[i].decode()
                if passage in self.passages and key not in cache and key not in new:
                    new[key] = self.passages[passage]
        cache.add(list(new), list(new.values()))

    @staticmethod
    def summary(folders: list[str], pairs: int, reused: int) -> dict[str, Any] | None:
        """``teacher.json``'s record of the reuse (``reused`` of ``pairs``), or None without ``reuse``."""
        if not folders:
            return None
        return {"datasets": list(folders), "pairs_reused": reused, "pairs_new": pairs - reused}


def _chunks(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


@dataclass(frozen=True)
class TeachReport:
    """What the teacher stage wrote."""

    output: Path
    pairs: int
    queries: int
    scores: list[str]
    up_to_date: bool
    """The output was already complete for this configuration: nothing was scored."""
    skipped: dict[str, int]
    """Bad input records skipped (``on_bad_input: skip``), by reason."""
    reused: int = 0
    """Pairs whose values came from the ``reuse`` datasets; the others were scored."""

    def format(self) -> str:
        done = "up to date" if self.up_to_date else "wrote"
        of = f"{counted(self.pairs, 'pair')} of {counted(self.queries, 'query', 'queries')}"
        lines = [f"{done} {self.output}: {of}, scores {', '.join(self.scores)}"]
        if self.reused:
            lines.append(f"reused {self.reused} pairs, scored {self.pairs - self.reused} new")
        if self.skipped:
            lines.append(f"skipped {sum(self.skipped.values())} bad input record(s): {skip_summary(self.skipped)}")
        return "\n".join(lines)


def teach(cfg: TeachConfig, command: str | None = None) -> TeachReport:
    """Run the teacher stage (in every process of an ``accelerate launch``); ``command``, the command line, is
    recorded in the dataset's ``teacher.json``.

    Raises:
        ExistingOutputError: another job is writing ``output`` now (or an earlier result is in the way).
    """
    from accelerate.utils import broadcast_object_list

    state = process_state()
    options = options_of(ScorerOptions, cfg).for_device(state.device)
    output = Path(cfg.output)
    cache_root = Path(cfg.cache_dir) if cfg.cache_dir else cache_home() / "pk"
    # the nodes of a job, each launched by its own command line, split one job's work: they must agree on it
    where = {"output": output.absolute(), "cache_dir": cache_root.absolute()}
    check_ranks_agree({**dataclasses.asdict(cfg), **where}, "distill teach")
    check_paths(cfg, output, cache_root)  # before anything is loaded or scored, a bad path loses nothing
    lock = hold_output(output) if state.is_main_process else None
    [busy] = broadcast_object_list([state.is_main_process and lock is None])  # every process stops alike
    if busy:
        raise ExistingOutputError(
            f"{output}: another distill teach is writing it now: wait for it to end, or choose another --output"
        )
    try:
        return _teach_held(cfg, state, options, output, cache_root, command)
    finally:
        if lock is not None:
            lock.release()


def _teach_held(
    cfg: TeachConfig, state: Any, options: ScorerOptions, output: Path, cache_root: Path, command: str | None
) -> TeachReport:
    """The stage, once this job holds ``output``."""
    # Each process reads all of the inputs, so that a bad record stops every process alike, and keeps its share.
    share = Share(state.process_index, state.num_processes, cfg.chunk_size)
    rows_folder = _rows_folder(output, share.rank)
    candidates, skipped = candidate_stream(cfg, rows_folder.with_name(rows_folder.name + ".join"))
    write_pair_rows(candidates, skipped, rows_folder, cfg.max_queries, ", ".join(cfg.input), share)
    pairs = PairRows(rows_folder)
    try:
        if cfg.similarity:
            return _teach_similarity(cfg, state, share, options, output, pairs, command)
        return _teach(cfg, state, share, options, output, cache_root, pairs, command)
    finally:  # done, up to date or failed: the rows go (a rerun reads the inputs again)
        pairs.close()
        shutil.rmtree(rows_folder, ignore_errors=True)


def _rows_folder(output: Path, rank: int) -> Path:
    """Where process ``rank`` keeps its share of the pairs while ``output`` is made (beside it)."""
    return output.with_name(f".{output.name}.pairs-{rank}")


def process_state() -> Any:
    """Accelerate's state of this process. Without CUDA (or under ``accelerate launch --cpu``), the processes that a
    launcher started (torchrun's or ``accelerate launch --multi_gpu``'s environment) meet over gloo on their CPUs;
    Accelerate's default would leave each one alone, every one scoring everything as process 0."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.cuda.is_available())


def check_paths(cfg: TeachConfig, output: Path, cache_root: Path) -> None:
    """Every path of ``cfg``: the inputs are there; the output (replaced when done) is none of the paths the stage
    reads (inputs, qrels, a local teacher, reused datasets, the log p(K) cache), inside none of their folders and
    holds none of them; the cache (read and written) is no input nor inside one.

    Raises:
        InputError: ``teach: <option>: <path>: <what is wrong>``.
    """
    for path in cfg.input:
        if not is_irds(path):
            input_path(path, "teach", "input")
    for path in cfg.reuse:
        input_path(path, "teach", "reuse")
    for key in ("queries", "corpus", "run", "qrels"):
        if getattr(cfg, key) is not None:
            input_path(getattr(cfg, key), "teach", key, "file")
    check_text_sources(cfg.input, "teach", queries=cfg.queries, corpus=cfg.corpus, run=cfg.run)
    inputs = [(key, getattr(cfg, key)) for key in ("queries", "corpus", "run", "qrels")]
    inputs += [("input", path) for path in cfg.input if not is_irds(path)]
    inputs += [("reuse", path) for path in cfg.reuse]
    if Path(cfg.teacher).expanduser().exists():
        inputs.append(("teacher", Path(cfg.teacher).expanduser()))
    output_folder(output, "teach", "output", [*inputs, ("cache_dir", cache_root)], replaced=True)
    output_folder(cache_root, "teach", "cache_dir", inputs)


def _check_reused(folders: list[str], known: dict[str, Any]) -> None:
    """Each reused dataset was made under the teacher setting of ``known`` (a fingerprint, which before the teacher
    loads lacks the start token's keys): they may differ only in :data:`REUSE_FREE`.

    Raises:
        InputError: one line naming the first folder made otherwise and the key.
    """
    for folder in folders:
        theirs = TeacherDataset.open(folder).metadata.fingerprint
        if theirs.get("kind") == SIMILARITY:
            raise InputError(f"teach: reuse {folder} is an embedding model's dataset: only a causal LM's are reused")
        differs = [key for key in changed_keys(theirs, known) if key not in REUSE_FREE]
        if differs:
            key = differs[0]
            raise InputError(
                f"teach: reuse {folder} was made under another teacher fingerprint: {key} is "
                f"{theirs.get(key)!r} there, {known.get(key)!r} here"
            )


def _teach(
    cfg: TeachConfig,
    state: Any,
    share: Share,
    options: ScorerOptions,
    output: Path,
    cache_root: Path,
    pairs: PairRows,
    command: str | None,
) -> TeachReport:
    """The stage once its share of the inputs is in ``pairs``: load the teacher, then score what is not done yet."""
    from accelerate.utils import gather_object

    from teachers.teacher import CausalLMTeacher

    summary = pairs.summary
    work = output.with_name(output.name + ".partial")
    known = fingerprint_before_load(cfg, state.device, summary, options)
    check_earlier_results(output, work, known, cfg.overwrite)
    _check_reused(cfg.reuse, known)

    teacher = CausalLMTeacher.load(
        cfg.teacher,
        device=state.device,
        dtype=cfg.dtype,
        device_map=cfg.device_map,
        start_token=cfg.start_token,
        max_passage_tokens=cfg.max_passage_tokens,
        prompt=cfg.prompt,
        logit_chunk_rows=cfg.logit_chunk_rows,
        options=options,
    )
    _check_context(teacher, pairs.queries(), cfg)
    setting = teacher.describe()
    fingerprint = dataset_fingerprint(setting, summary, cfg, options)
    reuse = _Reuse.load(cfg, fingerprint, pairs)
    reused = sum(gather_object([int((reuse.rows >= 0).sum())]))
    report = TeachReport(output, summary.pairs, summary.queries, cfg.score_columns, True, summary.skipped, reused)
    if is_up_to_date(output, fingerprint, cfg.overwrite):
        if state.is_main_process:
            record_up_to_date(output, cfg.scores[0], cfg.qrels)
        state.wait_for_everyone()
        return report

    check_ranks_agree({"fingerprint": fingerprint}, "distill teach")  # the same inputs and teacher on every node
    if state.is_main_process:
        prepare_work_dir(work, fingerprint, cfg.overwrite)
    state.wait_for_everyone()
    check_shared(work, state, "output", output)

    keys = _passage_keys(teacher, pairs, cfg.chunk_size)
    cache_setting = {k: setting[k] for k in ("teacher", "dtype", "start_token_id")}
    cache = PassageLogProbCache(cache_root, cache_setting)
    check_shared(cache_root, state, "cache_dir", cache_root)
    reuse.seed(keys, pairs, cache)
    _write_passage_requests(keys, share, summary.pairs, work)
    state.wait_for_everyone()
    cache.reload()
    _score_passages(teacher, cache, output, work, share, summary.pairs, cfg, state)
    state.wait_for_everyone()
    cache.reload()
    query_values = _score_queries(teacher, pairs, cfg, state, reuse.query_values)
    _score_pairs(teacher, pairs, share, keys, cache, query_values, reuse, work, cfg, state)
    state.wait_for_everyone()
    reuse_summary = reuse.summary(cfg.reuse, summary.pairs, reused)
    _merge(state, work, output, summary.pairs, cfg, fingerprint, reuse_summary, command)
    return dataclasses.replace(report, up_to_date=False)


def _passage_keys(teacher: Any, pairs: PairRows, chunk_size: int) -> np.ndarray:
    """``[n]`` each pair's passage key (:func:`passage_key` of its ids, as bytes), tokenised a chunk at a time."""
    keys = np.empty(len(pairs), dtype="S32")
    for chunk in _chunks(len(pairs), max(chunk_size, 4096)):
        passages = pairs.rows(chunk, ["passage"])["passage"]
        keys[chunk.start : chunk.stop] = [passage_key(ids) for ids in teacher.encode_passages(passages)]
    return keys


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


PASSAGES_PER_BUCKET = 8
"""Pair chunks per bucket of passages (:func:`_buckets`), about: enough for every bucket to fill chunks of distinct
passages, few enough for the buckets to spread over the processes."""
MAX_BUCKETS = 4096


def _buckets(pairs: int, chunk_size: int) -> int:
    """How many buckets the distinct passages of ``pairs`` pairs are hashed into: a function of the input alone, so
    that one process and N processes cut the same chunks of passages."""
    return max(1, min(MAX_BUCKETS, pairs // (chunk_size * PASSAGES_PER_BUCKET)))


def _requests(work: Path, rank: int) -> Path:
    return work / "passages" / f"rank-{rank}"


def _write_passage_requests(keys: np.ndarray, share: Share, pairs: int, work: Path) -> None:
    """Write where this process's passages are, sorted by bucket (a passage's bucket: its key's high 64 bits modulo
    :func:`_buckets`), then place in input order: for each, its key, its pair's place in input order and its row in
    this process's row file; and where each bucket starts. Written afresh each run, through a rename."""
    rows = np.arange(len(keys))  # the row file holds this process's chunks one after another
    places = np.concatenate([np.arange(c.start, c.stop) for _, c, _ in share.chunks(pairs)] or [rows])
    high = np.frombuffer(bytes.fromhex(b"".join(k[:16] for k in keys).decode()), dtype=">u8").astype(np.uint64)
    buckets = _buckets(pairs, share.chunk_size)
    bucket = (high % np.uint64(buckets)).astype(np.int64)
    order = np.lexsort((places, bucket))
    folder = _requests(work, share.rank)
    tmp = staging_path(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, values in (("key", keys[order]), ("place", places[order]), ("row", rows[order])):
        np.save(tmp / f"{name}.npy", values)
    np.save(tmp / "starts.npy", np.searchsorted(bucket[order], np.arange(buckets + 1)))
    replace_folder(tmp, folder)


def _score_passages(
    teacher: Any,
    cache: PassageLogProbCache,
    output: Path,
    work: Path,
    share: Share,
    pairs: int,
    cfg: TeachConfig,
    state: Any,
) -> None:
    """log p(K) of the distinct passages of this process's buckets (bucket ``b`` is process ``b mod world``'s) not
    yet in the cache: each bucket's distinct passages (by key) in order of first appearance, cut into chunks of
    ``chunk_size``, each scored as one unit. The passages come from every process's requests
    (:func:`_write_passage_requests`) and their texts from its row file."""
    buckets = _buckets(pairs, share.chunk_size)
    requests = [
        {name: np.load(_requests(work, r) / f"{name}.npy", mmap_mode="r") for name in ("key", "place", "row", "starts")}
        for r in range(share.world)
    ]
    todo: list[tuple[list[str], list[tuple[int, int]]]] = []
    for b in range(share.rank, buckets, share.world):
        parts = [(r, req["starts"][b], req["starts"][b + 1]) for r, req in enumerate(requests)]
        keys = np.concatenate([requests[r]["key"][i:j] for r, i, j in parts])
        places = np.concatenate([requests[r]["place"][i:j] for r, i, j in parts])
        where = np.concatenate([np.stack([np.full(j - i, r), requests[r]["row"][i:j]], 1) for r, i, j in parts])
        order = np.argsort(places, kind="stable")
        keys, where = keys[order], where[order]
        _, first = np.unique(keys, return_index=True)
        distinct = np.sort(first)  # where each distinct passage of the bucket first appears
        for chunk in _chunks(len(distinct), cfg.chunk_size):
            chosen = [int(distinct[i]) for i in chunk if keys[distinct[i]].decode() not in cache]
            if chosen:
                todo.append(([keys[i].decode() for i in chosen], [tuple(map(int, where[i])) for i in chosen]))
    row_files: dict[int, PairRows] = {}
    try:
        with _progress(cfg, state, sum(len(k) for k, _ in todo), "log p(K)", "passage") as bar:
            for keys, places in todo:
                passages: list[str] = [""] * len(places)
                for r in {r for r, _ in places}:  # a process's rows come in input order, as its row file has them
                    if r not in row_files:
                        row_files[r] = PairRows(_rows_folder(output, r))
                    at = [i for i, (source, _) in enumerate(places) if source == r]
                    texts = row_files[r].rows([places[i][1] for i in at], ["passage"])["passage"]
                    for i, text in zip(at, texts, strict=True):
                        passages[i] = text
                values = teacher.passage_logprobs(teacher.encode_passages(passages), on_batch=bar.update)
                check_finite(values, "log p(K)", passages)
                cache.add(keys, values)
    finally:
        for rows in row_files.values():
            rows.close()


def check_finite(values: Any, what: str, texts: list[str]) -> None:
    """The teacher's ``values`` of ``what`` (one a text of ``texts``) are finite numbers, before any is cached or
    saved: broken weights, or an overflowing dtype (float16), give NaN or infinite log-probabilities.

    Raises:
        InputError: how many are not, and the text of the first.
    """
    bad = np.flatnonzero(~np.isfinite(np.asarray(values, dtype=np.float64)))
    if len(bad):
        raise InputError(
            f"teach: the teacher gave {len(bad)} non-finite {what} value(s) of {len(texts)} (the first for "
            f"{texts[int(bad[0])][:60]!r}): its weights or its dtype (float16 overflows) are broken; nothing of "
            "them was saved"
        )


def _check_context(teacher: Any, queries: list[str], cfg: TeachConfig) -> None:
    """Every query's sequences, with a passage of ``max_passage_tokens``, fit the teacher's context
    (:attr:`~teachers.causal_lm.CausalLMScorer.context_tokens`), before anything is scored.

    Raises:
        InputError: the longest query's, naming it.
    """
    context = teacher.scorer.context_tokens
    if not context or not queries:
        return
    lengths = [len(ids) for ids in teacher.encode_queries(queries)]
    longest = queries[int(np.argmax(lengths))]
    filler = [[teacher.start_token_id] * teacher.max_passage_tokens]
    terms = [t for t in PAIR_TERMS if t in required_terms(cfg.score_columns)]
    sizes = [len(seq) for term in terms for seq in teacher.pair_sequences(term, [longest], filler)]
    if sizes and max(sizes) > context:
        raise InputError(
            f"teach: the query {longest[:60]!r}... makes sequences of {max(sizes)} tokens with a passage of "
            f"{teacher.max_passage_tokens}, past the teacher's context of {context} tokens: shorten it or drop it"
        )


def _score_queries(
    teacher: Any, pairs: PairRows, cfg: TeachConfig, state: Any, seeded: dict[str, dict[str, float]]
) -> dict[str, dict[str, Any]]:
    """The query-only terms and ``n_query_tokens`` of every distinct query text: term -> {query: value}.

    A term's value ``seeded`` for a query (from a reused dataset) is kept; every process scores the other
    distinct queries in the same batches (one short sequence each), so all processes and all chunks see the
    same value for a query.
    """
    queries = pairs.queries()
    out: dict[str, dict[str, Any]] = {
        "n_query_tokens": dict(zip(queries, (len(ids) for ids in teacher.encode_queries(queries)), strict=True))
    }
    for term in (t for t in QUERY_TERMS if t in required_terms(cfg.score_columns)):
        known = seeded.get(term, {})
        todo = [q for q in queries if q not in known]
        out[term] = {q: known[q] for q in queries if q in known}
        if todo:
            with _progress(cfg, state, len(todo), "query terms", "query") as bar:
                values = teacher.query_terms(todo, [term], on_batch=bar.update)[term]
            check_finite(values, term, todo)
            out[term].update(zip(todo, values, strict=True))
    return out


def _score_pairs(
    teacher: Any,
    pairs: PairRows,
    share: Share,
    keys: np.ndarray,
    cache: PassageLogProbCache,
    query_values: dict[str, dict[str, Any]],
    reuse: _Reuse,
    work: Path,
    cfg: TeachConfig,
    state: Any,
) -> None:
    """Score this process's pair chunks that are not on disk yet; pairs found in a reused dataset take their pair
    terms from there."""
    terms = required_terms(cfg.score_columns)
    pair_terms = [t for t in PAIR_TERMS if t in terms]
    mine = [
        (j, rows)
        for j, chunk, rows in share.chunks(pairs.summary.pairs)
        if chunk_file(work / "chunks", j, len(chunk)) is None
    ]
    todo = sum(int((reuse.rows[r.start : r.stop] < 0).sum()) for _, r in mine)
    with _progress(cfg, state, todo, "pairs", "pair", len(pair_terms)) as bar:
        for j, chunk in mine:
            rows = pairs.rows(chunk)
            passage_ids = teacher.encode_passages(rows["passage"])
            found = reuse.rows[chunk.start : chunk.stop]
            new = np.flatnonzero(found < 0)
            scored = {term: np.empty(0) for term in pair_terms}
            if len(new):
                queries, ids = [rows["query"][i] for i in new], [passage_ids[i] for i in new]
                scored = teacher.pair_terms(queries, ids, pair_terms, on_batch=bar.update)
                for term in pair_terms:
                    check_finite(scored[term], term, [rows["passage"][i] for i in new])
            values: dict[str, Any] = {}
            for term in pair_terms:
                column = np.empty(len(chunk), dtype=np.float64)
                column[found >= 0] = reuse.terms[term][found[found >= 0]]
                column[new] = scored[term]
                values[term] = column
            values["logp_uncond"] = np.array([cache[keys[i].decode()] for i in chunk])
            for name, by_query in query_values.items():
                values[name] = np.array([by_query[query] for query in rows["query"]])
            values["n_passage_tokens"] = np.array([len(ids) for ids in passage_ids])
            columns: dict[str, Any] = {
                **_pair_columns(rows),
                "n_passage_tokens": pa.array(values["n_passage_tokens"], pa.int32()),
                "n_query_tokens": pa.array(values["n_query_tokens"], pa.int32()),
            }
            columns.update({score: SCORES[score](values) for score in cfg.score_columns})
            columns.update({term: values[term] for term in terms})
            write_chunk(pa.table(columns), work / "chunks", j)


def _pair_columns(rows: dict[str, Any]) -> dict[str, Any]:
    """The columns of a chunk that every teacher dataset has: the pair, its texts and its first-stage rank and score."""
    return {
        "qid": rows["qid"],
        "docid": rows["docid"],
        "query": rows["query"],
        "passage": rows["passage"],
        "first_stage_rank": pa.array(rows["first_stage_rank"], pa.int32()),
        "first_stage_score": rows["first_stage_score"],
    }


def _teach_similarity(
    cfg: TeachConfig,
    state: Any,
    share: Share,
    options: ScorerOptions,
    output: Path,
    pairs: PairRows,
    command: str | None,
) -> TeachReport:
    """The stage for an embedding teacher: score this process's share of pair chunks not on disk yet by
    :data:`~teachers.embedding.SIMILARITY`, then merge them as :func:`_teach` does."""
    from teachers.embedding import SimilarityTeacher

    summary = pairs.summary
    work = output.with_name(output.name + ".partial")
    teacher = SimilarityTeacher.load(cfg.teacher, device=str(state.device), max_batch_tokens=options.max_batch_tokens)
    fingerprint = dataset_fingerprint(teacher.describe(), summary, cfg, options)
    report = TeachReport(output, summary.pairs, summary.queries, cfg.score_columns, True, summary.skipped)
    if is_up_to_date(output, fingerprint, cfg.overwrite):
        if state.is_main_process:
            record_up_to_date(output, SIMILARITY, cfg.qrels)
        state.wait_for_everyone()
        return report
    check_ranks_agree({"fingerprint": fingerprint}, "distill teach")
    if state.is_main_process:
        prepare_work_dir(work, fingerprint, cfg.overwrite)
    state.wait_for_everyone()
    check_shared(work, state, "output", output)
    mine = [
        (j, rows)
        for j, chunk, rows in share.chunks(summary.pairs)
        if chunk_file(work / "chunks", j, len(chunk)) is None
    ]
    with _progress(cfg, state, sum(len(c) for _, c in mine), "pairs", "pair") as bar:
        for j, chunk in mine:
            rows = pairs.rows(chunk)
            similarity = teacher.similarity(rows["query"], rows["passage"], on_batch=bar.update)
            check_finite(similarity, SIMILARITY, rows["passage"])
            write_chunk(pa.table({**_pair_columns(rows), SIMILARITY: similarity}), work / "chunks", j)
    state.wait_for_everyone()
    _merge(state, work, output, summary.pairs, cfg, fingerprint, None, command)
    return dataclasses.replace(report, up_to_date=False)


def check_shared(folder: Path, state: Any, option: str, given: Path) -> None:
    """Every process sees ``folder`` as the main process writes it (nothing to do in one process): a path that is
    local to each node would split the job's partial results, or its log p(K) cache, node by node. A marker that
    the main process writes is looked for by every other one, for up to :data:`SHARED_WAIT_S` seconds (a network
    file system may show a new file late).

    Raises:
        InputError: ``teach: <option>: <path>: process <rank> does not see ...``, on every process.
    """
    from accelerate.utils import broadcast_object_list, gather_object

    if state.num_processes == 1:
        return
    [token] = broadcast_object_list([uuid.uuid4().hex if state.is_main_process else None])
    marker = folder / f".shared-{token}"
    if state.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        marker.touch()
    state.wait_for_everyone()
    deadline = time.monotonic() + SHARED_WAIT_S
    seen = _lists(folder, marker.name)
    while not seen and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = _lists(folder, marker.name)
    everyone = gather_object([seen])
    if state.is_main_process:
        marker.unlink()
    blind = [rank for rank, ok in enumerate(everyone) if not ok]
    if blind:
        raise InputError(
            f"teach: {option}: {given}: process {blind[0]} does not see what process 0 writes there: give every node "
            "the same folder on a shared file system"
        )


def _lists(folder: Path, name: str) -> bool:
    """Whether ``folder`` lists ``name`` (listing, not a lookup that a network file system may answer from cache)."""
    return folder.is_dir() and name in os.listdir(folder)


def _merge(
    state: Any,
    work: Path,
    output: Path,
    n_pairs: int,
    cfg: TeachConfig,
    fingerprint: dict[str, Any],
    reused: dict[str, Any] | None,
    command: str | None,
) -> None:
    """Join the chunks into the final dataset folder, by the main process (:func:`_write_dataset`); every other one
    learns whether it wrote the dataset, so that none reports a dataset that is not there.

    Raises:
        PeerProcessFailed: on a process other than the main one, when the main one's merge failed.
    """
    from accelerate.utils import broadcast_object_list

    error = None
    if state.is_main_process:
        try:
            metadata = TeacherMetadata(  # the text sources as given: each is read by an input (check_paths)
                cfg.scores[0],
                cfg.score_columns,
                cfg.input,
                fingerprint,
                reused,
                cfg.queries,
                cfg.corpus,
                command,
                cfg.run,
                cfg.qrels,
            )
            _write_dataset(work, output, metadata, [len(chunk) for chunk in _chunks(n_pairs, cfg.chunk_size)])
        except BaseException as e:  # told to the other processes, then raised here
            error = e
    [failed] = broadcast_object_list([error is not None])
    if error is not None:
        raise error
    if failed:
        raise PeerProcessFailed(f"{output}: process 0 failed to write the dataset: its error says why")


def _write_dataset(work: Path, output: Path, metadata: TeacherMetadata, sizes: list[int]) -> None:
    """Join the chunks of ``sizes`` pairs, a record batch at a time, into the final dataset folder, then swap it
    into place."""
    staging = work / "dataset"
    if staging.exists():
        shutil.rmtree(staging)
    TeacherDataset.write_batches(chunk_batches(work / "chunks", sizes), metadata, staging, work / "merged.arrow")
    remove_stale_siblings(output)
    replace_folder(staging, output)  # a dataset replaced (--overwrite) stays whole under its name until then
    shutil.rmtree(work)
