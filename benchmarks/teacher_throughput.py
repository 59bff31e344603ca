"""Throughput of the teacher stage against a naive one-pair-at-a-time loop and a plain batched loop, on the real
DL19 texts: ``python -m benchmarks.teacher_throughput [--random_config llama3-8b] [--device cuda]``.

The workload is the CIS terms of every (query, passage) pair of the input, as
:class:`teachers.teacher.CausalLMTeacher` builds them (``logp_cond`` per pair, ``logp_uncond`` per distinct
passage). Three scorers run on it, on the same model in the same process: (a) naive, one sequence at a time with the
logits of every position (the first ``--naive_pairs`` pairs); (c) plain, batches of ``--plain_batch_size``
right-padded sequences sorted by length, full-vocabulary log-softmax in fp32 (the first ``--plain_pairs``); then
(b) the teacher's own scorer with its levers (``--bucket``, ``--packing``, ``--compile``, ``--cudnn_attention``;
compile changes the model in place, so it comes last). Each is timed after a warm-up batch; its pairs/s, tokens/s,
peak memory and fraction of the matmul ceiling (``2 * n_params * tokens / seconds`` over a large square matmul in the
run dtype) are reported, and (a)'s and (c)'s log-probabilities are checked against (b)'s (exit status 1 on a
mismatch). ``benchmarks/README.md`` defines each figure.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks import RESULTS, phases
from benchmarks.phases import (
    Ceiling,
    Column,
    Phase,
    TimedOptions,
    Window,
    at_least,
    display_path,
    header,
    met,
    set_threads,
    slug,
    table,
    write_result,
)
from distill.bench.measure import dtype_name, environment
from distill.bench.profile import profiled
from distill.core.config import options_of
from distill.core.devices import MATMUL_SIZE, attention_backends, resolve_device
from distill.core.project_files import CANDIDATES, DL19
from distill.data.loaders import load_candidates
from distill.model.resolver import ARCHITECTURES
from teachers.causal_lm import CausalLMScorer, ScorerOptions, ScoringSequence
from teachers.teacher import CausalLMTeacher, resolve_dtype

RANDOM_CONFIGS = {"llama3-8b": "meta-llama/Meta-Llama-3-8B", "tiny": "tiny-llama"}
"""``--random_config`` names -> architectures of :data:`distill.model.resolver.ARCHITECTURES` (random weights)."""

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
"""Per-sequence relative tolerance of (a) and (c) against (b): ``|x - b| / max(|b|, 1)``."""
# The targets, stated for the Llama-3-8B config on an H100.
TARGET_FLOP_FRACTION = 0.75
TARGET_SPEEDUP = 6.0
TARGET_OVER_PLAIN = 1.2
"""(b)'s pairs/s over (c)'s."""


@dataclass(kw_only=True)
class TeacherThroughput(TimedOptions, ScorerOptions):
    """Throughput of the teacher stage against a naive and a plain batched loop. The teacher's batch budget and
    levers are :class:`~teachers.causal_lm.ScorerOptions`', each the device's default where not given
    (compile is applied after the loops that run the model as loaded)."""

    teacher: str = "smollm2-135m"
    """Any name ``distill.model.resolver.resolve_model`` takes."""
    random_config: Literal["llama3-8b", "tiny"] | None = None
    """Instead of ``teacher``: a random-weight ``LlamaForCausalLM`` of these shapes, fed SmolLM2 token ids."""
    input: str = str(DL19 / CANDIDATES)
    """rank_llm or multi-hop JSON, or a BEIR folder (default: DL19's BM25 top-100)."""
    max_queries: int | None = None
    """Use only the first N queries of the input."""
    max_candidates: int | None = None
    """Use only each query's first N candidates."""
    device: str = "auto"
    """``auto`` (cuda where there is one), ``cpu`` or ``cuda[:N]``."""
    dtype: str = "auto"
    """``auto`` (bf16 on cuda, fp32 on cpu), ``float32``, ``bfloat16`` or ``float16``."""
    logit_chunk_rows: int = 1024
    """The teacher's LM-head chunk (target positions)."""
    max_passage_tokens: int = 256
    naive_pairs: int = 64
    """Pairs the naive loop is timed on (the first N)."""
    plain_pairs: int | None = None
    """Pairs the plain batched loop is timed on (the first N; default all; 0 skips it)."""
    plain_batch_size: int = 32
    """Sequences per batch of the plain batched loop."""
    seed: int = 0
    """Seed of the random weights."""
    progress: bool = True
    """Progress bars (on a terminal)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        ScorerOptions.__post_init__(self)
        at_least(self, 1, "naive_pairs", "max_queries", "max_candidates", "plain_batch_size")
        at_least(self, 0, "plain_pairs")


@dataclass
class TeacherSequences:
    """The sequences behind the CIS terms of every pair, as the teacher builds them."""

    queries: list[str]
    """Query text of each pair."""
    passage_ids: list[list[int]]
    """Passage token ids of each pair (``CausalLMTeacher.encode_passages``)."""
    distinct_ids: list[list[int]]
    """Each distinct passage's ids once, in first-seen order."""
    distinct_index: list[int]
    """Pair -> index into ``distinct_ids``."""
    cond: list[ScoringSequence]
    """``logp_cond`` sequence of each pair."""
    uncond: list[ScoringSequence]
    """``logp_uncond`` sequence of each distinct passage."""
    n_queries: int

    @property
    def n_pairs(self) -> int:
        return len(self.queries)


@dataclass(kw_only=True)
class ScoringPhase(Phase):
    """The figures of one scorer's timed run."""

    pairs: int
    sequences: int
    tokens: int
    """Tokens fed (prefix + target), padding excluded."""
    flop_ceiling_fraction: float = 0.0
    """``2 * n_params * tokens / seconds / matmul_flops_per_s``."""

    RATES: ClassVar[tuple[str, ...]] = ("pairs", "tokens")

    def finish(self, n_params: int, ceiling: float) -> None:
        """Fill in the FLOP figures from the model size (parameters) and the matmul rate (FLOP/s)."""
        self.flop_ceiling_fraction = self.flop_fraction(2 * n_params * self.tokens, ceiling)


# ----------------------------------------------------------------------------- model and data


def build_teacher(options: TeacherThroughput, device: torch.device, dtype: torch.dtype) -> tuple[CausalLMTeacher, str]:
    """The teacher under test, with the levers that leave the model as it is (:func:`with_model_levers` adds the
    others), and a short label of its model for file names."""
    kwargs = {
        "logit_chunk_rows": options.logit_chunk_rows,
        "max_passage_tokens": options.max_passage_tokens,
        "options": dataclasses.replace(options_of(ScorerOptions, options).for_device(device), compile=False),
    }
    if options.random_config is None:
        teacher = CausalLMTeacher.load(options.teacher, device=device, dtype=dtype_name(dtype), **kwargs)
        return teacher, slug(options.teacher)
    name = RANDOM_CONFIGS[options.random_config]
    teacher = CausalLMTeacher.random(name, device=device, dtype=dtype_name(dtype), seed=options.seed, **kwargs)
    return teacher, f"random-{options.random_config}"


def with_model_levers(teacher: CausalLMTeacher, options: ScorerOptions) -> None:
    """Give ``teacher`` every lever of ``options``, the one that changes its model in place (``compile``)
    included: after (a) and (c), which run the model as loaded."""
    if options == teacher.scorer.options:
        return
    old = teacher.scorer
    teacher.scorer = CausalLMScorer(old.model, old.logit_chunk_rows, old.pad_token_id, options)


def load_sequences(
    teacher: CausalLMTeacher, path: str, max_queries: int | None, max_candidates: int | None
) -> TeacherSequences:
    """Every pair of ``path`` (the first ``max_queries`` queries, each query's first ``max_candidates``
    candidates), tokenised as the teacher does."""
    candidates = load_candidates(path).candidates[:max_queries]
    passages = [c.passages[:max_candidates] for c in candidates]
    queries = [c.query.text for c, kept in zip(candidates, passages, strict=True) for _ in kept]
    passage_ids = teacher.encode_passages([p.text for kept in passages for p in kept])
    first: dict[tuple[int, ...], int] = {}
    distinct_index = [first.setdefault(tuple(ids), len(first)) for ids in passage_ids]
    distinct_ids = [list(ids) for ids in first]
    cond = teacher.pair_sequences("logp_cond", queries, passage_ids)
    uncond = teacher.passage_sequences(distinct_ids)
    return TeacherSequences(queries, passage_ids, distinct_ids, distinct_index, cond, uncond, len(candidates))


def progress(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="seq", disable=not enabled, dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------- (a) naive and (c) plain loops


@torch.no_grad()
def naive_logprob(model: torch.nn.Module, seq: ScoringSequence, device: torch.device) -> float:
    """Summed log p(target | prefix) in nats, the way it is usually written: one sequence, all logits."""
    input_ids = torch.tensor([seq.prefix + seq.target], device=device)
    logits = model(input_ids).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = input_ids[0, 1:]
    token_logprobs = logprobs.gather(1, targets[:, None]).squeeze(1)
    return token_logprobs[len(seq.prefix) - 1 :].sum().item()


@torch.no_grad()
def plain_batch_logprobs(
    model: torch.nn.Module, sequences: Sequence[ScoringSequence], pad_id: int, device: torch.device
) -> np.ndarray:
    """Summed log p(target | prefix) in nats of each of ``sequences`` in one right-padded batch, the plain way:
    the logits of every position, a full-vocabulary log-softmax in fp32, gather, sum."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    is_target = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = torch.tensor(seq.prefix + seq.target)
        attention_mask[row, : len(seq)] = 1
        is_target[row, len(seq.prefix) : len(seq)] = True
    input_ids, attention_mask, is_target = input_ids.to(device), attention_mask.to(device), is_target.to(device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(2, input_ids[:, 1:, None]).squeeze(2)
    return torch.where(is_target[:, 1:], token_logprobs, 0.0).sum(1).double().cpu().numpy()


def run_loop(
    name: str,
    score: Callable[[list[ScoringSequence]], Sequence[float]],
    sequences: list[ScoringSequence],
    batches: list[list[int]],
    n_pairs: int,
    device: torch.device,
    show: bool,
) -> tuple[ScoringPhase, np.ndarray]:
    """Score ``sequences`` in ``batches`` (lists of their indices) with ``score`` (a batch -> each sequence's summed
    log-probability, nats), timed after one untimed batch (the first).

    Returns the phase (of ``n_pairs`` pairs) and the ``[len(sequences)]`` log-probabilities.
    """
    values = np.empty(len(sequences))
    score([sequences[i] for i in batches[0]])  # warm-up
    with progress(len(sequences), name, show) as bar, Window(device) as window:
        for batch in batches:
            values[batch] = score([sequences[i] for i in batch])
            bar.update(len(batch))
    padded = sum(len(batch) * max(len(sequences[i]) for i in batch) for batch in batches)
    tokens = sum(len(s) for s in sequences)
    phase = ScoringPhase(
        name=name, pairs=n_pairs, sequences=len(sequences), tokens=tokens, padded_tokens=padded, **window.figures()
    )
    return phase, values


def run_naive(
    model: torch.nn.Module, work: TeacherSequences, n_pairs: int, device: torch.device, show: bool
) -> tuple[ScoringPhase, np.ndarray, np.ndarray]:
    """Score the first ``n_pairs`` pairs' conditional and unconditional sequences one at a time.

    Returns the phase and the ``[n_pairs]`` cond and uncond log-probabilities (nats).
    """
    sequences = [s for i in range(n_pairs) for s in (work.cond[i], work.uncond[work.distinct_index[i]])]
    one = [[k] for k in range(len(sequences))]
    phase, values = run_loop(
        "(a) naive", lambda batch: [naive_logprob(model, batch[0], device)], sequences, one, n_pairs, device, show
    )
    return phase, values[0::2], values[1::2]


def plain_sequences(work: TeacherSequences, n_pairs: int) -> tuple[list[ScoringSequence], list[int]]:
    """The first ``n_pairs`` pairs' conditional sequences, then their distinct passages' unconditional ones; and
    for each of those pairs, the index of its unconditional sequence in that list."""
    distinct = list(dict.fromkeys(work.distinct_index[:n_pairs]))
    where = {d: n_pairs + k for k, d in enumerate(distinct)}
    sequences = [*work.cond[:n_pairs], *(work.uncond[d] for d in distinct)]
    return sequences, [where[d] for d in work.distinct_index[:n_pairs]]


def run_plain(
    model: torch.nn.Module,
    work: TeacherSequences,
    n_pairs: int,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    cudnn_attention: bool,
    show: bool,
) -> tuple[ScoringPhase, np.ndarray, np.ndarray]:
    """Score the first ``n_pairs`` pairs with the plain batched loop (:func:`plain_batch_logprobs` over batches of
    ``batch_size`` sequences sorted by length, longest first).

    Returns the phase and the ``[n_pairs]`` cond and uncond log-probabilities (nats).
    """
    sequences, uncond_of = plain_sequences(work, n_pairs)
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    with attention_backends(device, cudnn_attention):
        phase, values = run_loop(
            "(c) plain",
            lambda batch: plain_batch_logprobs(model, batch, pad_id, device),
            sequences,
            batches,
            n_pairs,
            device,
            show,
        )
    return phase, values[:n_pairs], values[uncond_of]


# ----------------------------------------------------------------------------- (b) teacher stage


def padded_tokens(scorer: CausalLMScorer, sequences: Sequence[ScoringSequence]) -> int:
    """Tokens the teacher's batches feed, padding included."""
    return sum(plan.padded_tokens for plan in scorer.plan(sequences))


def batch_shapes(scorer: CausalLMScorer, work: TeacherSequences) -> list[tuple[int, int]]:
    """The distinct ``(rows, width)`` shapes of the teacher's batches over the workload."""
    return sorted({plan.shape for seqs in (work.cond, work.uncond) for plan in scorer.plan(seqs)})


def warm_up(teacher: CausalLMTeacher, work: TeacherSequences, device: torch.device) -> float:
    """Score the first (longest, fullest) ``logp_cond`` batch; with ``compile``, also the last one and the first
    and last ``logp_uncond`` batches, so that torch.compile's compiles (at most three) happen here.

    Returns the seconds it took.
    """
    scorer = teacher.scorer
    window = Window(device)
    window.start()
    first = scorer.plan(work.cond)[0].sequences
    teacher.pair_terms([work.queries[i] for i in first], [work.passage_ids[i] for i in first], ["logp_cond"])
    if scorer.options.compile:
        plans = [scorer.plan(work.cond)[-1], *(scorer.plan(work.uncond)[k] for k in (0, -1))]
        for plan, sequences in zip(plans, (work.cond, work.uncond, work.uncond), strict=True):
            scorer.logprobs([sequences[i] for i in plan.sequences])
    return window.stop()


def run_teacher(
    teacher: CausalLMTeacher, work: TeacherSequences, device: torch.device, show: bool
) -> tuple[ScoringPhase, np.ndarray, np.ndarray]:
    """Score every distinct passage's ``logp_uncond`` and every pair's ``logp_cond`` with the teacher.

    Returns the phase, the ``[n_pairs]`` cond and the ``[n_distinct]`` uncond log-probabilities (nats).
    """
    window = Window(device)
    window.start()
    with progress(len(work.distinct_ids), "(b) teacher log p(K)", show) as bar:
        uncond = teacher.passage_logprobs(work.distinct_ids, bar.update)
        t_uncond = window.lap()
    with progress(work.n_pairs, "(b) teacher log p(K|Q)", show) as bar:
        cond = teacher.pair_terms(work.queries, work.passage_ids, ["logp_cond"], bar.update)["logp_cond"]
        t_cond = window.lap()
    window.stop()
    sequences = [*work.cond, *work.uncond]
    phase = ScoringPhase(
        name="(b) teacher",
        pairs=work.n_pairs,
        sequences=len(sequences),
        tokens=sum(len(s) for s in sequences),
        padded_tokens=padded_tokens(teacher.scorer, work.cond) + padded_tokens(teacher.scorer, work.uncond),
        breakdown_seconds={"logp_uncond": t_uncond, "logp_cond": t_cond},
        **window.figures(),
    )
    return phase, cond, uncond


def agreement(
    cond: np.ndarray,
    uncond: np.ndarray,
    ref_cond: np.ndarray,
    ref_uncond: np.ndarray,
    work: TeacherSequences,
    tolerance: float,
) -> dict[str, Any]:
    """Differences (nats) of a loop's ``[n]`` ``cond`` and ``uncond`` from (b)'s (``ref_cond`` ``[n_pairs]``,
    ``ref_uncond`` ``[n_distinct]``) on the first ``n`` pairs: per term and on CIS itself, and whether the largest
    relative one is within ``tolerance``."""
    n = len(cond)
    ref_cond, ref_uncond = ref_cond[:n], ref_uncond[np.asarray(work.distinct_index[:n])]
    ref_terms = np.concatenate([ref_cond, ref_uncond])
    diff = np.abs(np.concatenate([cond, uncond]) - ref_terms)
    relative = float((diff / np.maximum(np.abs(ref_terms), 1.0)).max())
    return {
        "pairs": n,
        "max_abs_diff_terms": float(diff.max()),
        "max_rel_diff_terms": relative,
        "max_abs_diff_cis": float(np.abs((cond - uncond) - (ref_cond - ref_uncond)).max()),
        "tolerance": tolerance,
        "ok": relative <= tolerance,
    }


# ----------------------------------------------------------------------------- the run


def run(options: TeacherThroughput, invocation: dict[str, Any]) -> int:
    """Time (a), (c) and (b) on one model, write the result and print the report; 1 if a loop's scores disagree
    with (b)'s."""
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype, device)
    set_threads(options.threads)
    show = options.progress and sys.stderr.isatty()

    teacher, label = build_teacher(options, device, dtype)
    model = teacher.scorer.model
    n_params = sum(p.numel() for p in model.parameters())
    work = load_sequences(teacher, options.input, options.max_queries, options.max_candidates)
    n_naive = min(options.naive_pairs, work.n_pairs)
    n_plain = work.n_pairs if options.plain_pairs is None else min(options.plain_pairs, work.n_pairs)
    ceiling = Ceiling(device, dtype, options.matmul_size or MATMUL_SIZE[device.type], options.matmul_reps)

    ceiling.measure()
    naive, *naive_terms = run_naive(model, work, n_naive, device, show)
    plain = None
    if n_plain:
        batch, pad_id = options.plain_batch_size, teacher.scorer.pad_token_id
        plain, *plain_terms = run_plain(model, work, n_plain, batch, pad_id, device, options.cudnn_attention, show)
    with_model_levers(teacher, options_of(ScorerOptions, options).for_device(device))
    warmup_seconds = warm_up(teacher, work, device)
    with profiled(options.profile, device):
        taught, *terms = run_teacher(teacher, work, device, show)
    ceiling.measure()
    phases = [naive, taught] + ([plain] if plain else [])
    for phase in phases:
        phase.finish(n_params, ceiling.rate)

    agree = agreement(*naive_terms, *terms, work, TOLERANCE[dtype])
    plain_agree = agreement(*plain_terms, *terms, work, TOLERANCE[dtype]) if plain else None
    speedup = taught.per_s("pairs") / naive.per_s("pairs")
    over_plain = taught.per_s("pairs") / plain.per_s("pairs") if plain else None
    result = {
        "benchmark": "teacher",
        **invocation,
        "environment": environment(device, dtype),
        "model": model_info(options, teacher, n_params),
        "workload": {
            "input": display_path(options.input),
            "queries": work.n_queries,
            "pairs": work.n_pairs,
            "distinct_passages": len(work.distinct_ids),
            "tokens": taught.tokens,
            "mean_cond_tokens": float(np.mean([len(s) for s in work.cond])),
            "mean_uncond_tokens": float(np.mean([len(s) for s in work.uncond])),
            "max_batch_tokens": teacher.scorer.max_batch_tokens,
            "logit_chunk_rows": options.logit_chunk_rows,
            "naive_pairs": n_naive,
            "plain_pairs": n_plain,
            "plain_batch_size": options.plain_batch_size,
            "batch_shapes": [list(shape) for shape in batch_shapes(teacher.scorer, work)],
        },
        "scorer_options": dataclasses.asdict(teacher.scorer.options),
        "teacher_warmup_seconds": warmup_seconds,
        "matmul": ceiling.to_json(),
        "naive": naive.to_json(),
        "teacher": taught.to_json(),
        "plain": plain.to_json() if plain else None,
        "speedup_pairs_per_s": speedup,
        "speedup_tokens_per_s": taught.per_s("tokens") / naive.per_s("tokens"),
        "speedup_over_plain_pairs_per_s": over_plain,
        "agreement": agree,
        "plain_agreement": plain_agree,
        "targets": {
            "flop_ceiling_fraction": TARGET_FLOP_FRACTION,
            "speedup": TARGET_SPEEDUP,
            "over_plain": TARGET_OVER_PLAIN,
            "flop_ceiling_met": taught.flop_ceiling_fraction >= TARGET_FLOP_FRACTION,
            "speedup_met": speedup >= TARGET_SPEEDUP,
            "over_plain_met": None if over_plain is None else over_plain >= TARGET_OVER_PLAIN,
        },
    }
    print(report(result, phases))
    write_result(result, options.out or RESULTS / f"teacher-{device.type}-{label}.json")
    return 0 if agree["ok"] and (plain_agree is None or plain_agree["ok"]) else 1


def model_info(options: TeacherThroughput, teacher: CausalLMTeacher, n_params: int) -> dict[str, Any]:
    """What was benchmarked: the model, its size and, for random weights, where the token ids come from."""
    model = teacher.scorer.model
    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    config = RANDOM_CONFIGS.get(options.random_config)
    return {
        "name": options.teacher if config is None else f"random-{options.random_config}",
        "weights": teacher.identity if config is None else "random init",
        "config": config,
        "architecture": type(model).__name__,
        "n_params": n_params,
        "n_params_counts": "all parameters: input embeddings and LM head included (tied weights once)",
        "n_embedding_params": embedding,
        "tied_embeddings": tied,
        "start_token_id": teacher.start_token_id,
        "note": ""
        if config is None
        else (
            f"token ids: the {ARCHITECTURES[config].tokenizer} tokenizer's (all < {len(teacher.tokenizer)}), "
            f"valid ids of the {model.config.vocab_size}-token vocabulary"
        ),
    }


COLUMNS = (
    Column("scorer", -12, lambda p: p.name),
    Column("pairs", 6, lambda p: f"{p.pairs}"),
    Column("tokens", 9, lambda p: f"{p.tokens}"),
    Column("time s", 9, lambda p: f"{p.seconds:.3f}"),
    Column("pairs/s", 9, lambda p: f"{p.per_s('pairs'):.2f}"),
    Column("tokens/s", 10, lambda p: f"{p.per_s('tokens'):.0f}"),
    Column("peak MiB", 9, lambda p: f"{p.peak_memory_bytes / 2**20:.0f}"),
    Column("TFLOP/s", 8, lambda p: f"{p.achieved_flops_per_s / 1e12:.3f}"),
    Column("ceiling", 8, lambda p: f"{p.flop_ceiling_fraction:.1%}"),
)


def report(result: dict[str, Any], scored: list[ScoringPhase]) -> str:
    """The run's figures for a reader: model, workload, each scorer, the speed-ups, agreements and targets."""
    model, work, teacher = result["model"], result["workload"], result["teacher"]
    described = [
        f"{model['name']} ({model['weights']}), {result['environment']['dtype']}, "
        f"{model['n_params'] / 1e6:.1f}M params",
        "(n_params counts all parameters, embeddings and LM head included)",
        *([model["note"]] if model["note"] else []),
    ]
    lines = header(
        result,
        described,
        f"{work['input']}: {work['queries']} queries, {work['pairs']} pairs, {work['distinct_passages']} distinct "
        f"passages, {work['tokens']} tokens",
    )
    levers = ", ".join(f"{k} {v}" for k, v in result["scorer_options"].items())
    lines += [
        "",
        table(scored, COLUMNS),
        f"peak memory: {scored[0].memory_kind}",
        f"teacher padding: {teacher['padded_tokens'] / teacher['tokens'] - 1:.1%} extra tokens fed as padding",
        f"teacher levers: {levers}; {len(work['batch_shapes'])} distinct batch shapes; "
        f"warm-up {result['teacher_warmup_seconds']:.2f} s (not timed)",
        "",
        f"speed-up (b)/(a): {result['speedup_pairs_per_s']:.2f}x pairs/s, {result['speedup_tokens_per_s']:.2f}x "
        "tokens/s",
    ]
    if plain := result["plain"]:
        lines.append(
            f"speed-up (b)/(c): {result['speedup_over_plain_pairs_per_s']:.2f}x pairs/s "
            f"((c): {work['plain_pairs']} pairs, batches of {work['plain_batch_size']} sequences, "
            f"{plain['padded_tokens'] / plain['tokens'] - 1:.1%} extra tokens fed as padding)"
        )
    for label, agree in (("a", result["agreement"]), ("c", result["plain_agreement"])):
        if agree is not None:
            lines.append(
                f"agreement on {agree['pairs']} pairs: max |{label}-b| = {agree['max_abs_diff_terms']:.3g} nats per "
                f"term (relative {agree['max_rel_diff_terms']:.2g}, tolerance {agree['tolerance']:.0e}), "
                f"{agree['max_abs_diff_cis']:.3g} on CIS: {'ok' if agree['ok'] else 'MISMATCH'}"
            )
    targets = result["targets"]
    over_plain = targets["over_plain_met"]
    lines.append(
        f"issue targets (Llama-3-8B config on an H100): ceiling >= {targets['flop_ceiling_fraction']:.0%}: "
        f"{met(targets['flop_ceiling_met'])}; speed-up >= {targets['speedup']:.0f}x: {met(targets['speedup_met'])}"
        + ("" if over_plain is None else f"; (b)/(c) >= {targets['over_plain']}x: {met(over_plain)}")
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.teacher_throughput ARGS``; its exit status."""
    return phases.main(TeacherThroughput, run, "benchmarks.teacher_throughput", argv)


if __name__ == "__main__":
    sys.exit(main())
