"""Throughput of the teacher stage against a naive one-pair-at-a-time loop and a plain batched loop, on the real
DL19 texts.

The workload is the CIS terms of every (query, passage) pair of the input, built exactly as
:class:`teachers.teacher.CausalLMTeacher` builds them:

- ``logp_cond``: ``[start] + tok("Q: {query} A:")`` then the passage ids, one sequence per pair;
- ``logp_uncond``: ``[start]`` then the passage ids, one sequence per distinct passage.

Three scorers run on it, in the same process, on the same model:

(a) naive: one sequence at a time, ``model(input_ids).logits``, a log-softmax over the full vocabulary,
    gather, sum; two forwards (conditional and unconditional) per pair. Timed on the first
    ``--naive-pairs`` pairs only.
(b) teacher: ``CausalLMTeacher.passage_logprobs`` on the distinct passages and
    ``CausalLMTeacher.pair_terms(..., ["logp_cond"])`` on all pairs (token-budget batches, LM head
    at target positions only, chunked logsumexp), with the scorer's levers as given: ``--bucket``,
    ``--packing``, ``--compile`` and ``--cudnn-attention`` (see ``teachers.causal_lm.ScorerOptions``).
    ``--compile`` changes the model in place, so it is applied after (a) and (c) have run: those stay the
    uncompiled model.
(c) plain: the plain batched PyTorch loop, the issue's reference: ``--plain-batch-size`` sequences a batch,
    right-padded, ``model(input_ids, attention_mask).logits`` at every position, a log-softmax over the full
    vocabulary in fp32, gather the target tokens, sum, ``.cpu()``. Its sequences are sorted by length, longest
    first, as a careful loop would (less padding: the stage's ratio over it is not flattered), and it uses the
    stage's choice of attention kernels (``--cudnn-attention``). Timed after one untimed batch, on the first
    ``--plain-pairs`` pairs (default all; 0 skips it): their conditional and their distinct unconditional
    sequences, the same work per pair as (b).

Reported per scorer: pairs/s, tokens/s (all tokens fed, prefix and target, padding excluded),
peak memory, and the fraction of the matmul FLOP ceiling, ``2 * n_params * tokens / seconds``
over the rate of a large square matmul in the run dtype measured in the same run. ``n_params``
counts every parameter, input embeddings and LM head included (tied weights once). (a)'s and (b)'s
log-probabilities are checked against each other on the pairs both scored: (a) is unpadded, so
with ``--packing`` this is the check of packed against unpadded scores, within the same tolerance; (c) is checked
against (b) the same way. The issue's targets: (b) at >= 75% of the ceiling and >= 1.2x (c)'s pairs/s
(``speedup_over_plain_pairs_per_s``), on the Llama-3-8B shapes on an H100.

Run ``python benchmarks/teacher.py --help``; results go to ``benchmarks/results/`` as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from _common import (
    RESULTS,
    ROOT,
    display_path,
    invocation,
    slug,
    writable_file,
    yes,
)
from tqdm.auto import tqdm

from distill.bench.measure import (
    MemoryProbe,
    dtype_name,
    environment,
    matmul_flops_per_s,
    synchronize,
)
from distill.bench.profile import profiled
from distill.core.devices import MATMUL_SIZE, TEACHER_BATCH_TOKENS, attention_backends, resolve_device
from distill.core.loaders import load_candidates
from distill.core.models import ARCHITECTURES
from teachers.causal_lm import CausalLMScorer, ScorerOptions, ScoringSequence
from teachers.teacher import DTYPES, CausalLMTeacher, resolve_dtype

DEFAULT_INPUT = ROOT / "data" / "trec-dl19" / "bm25_top100.json"

RANDOM_CONFIGS = {"llama3-8b": "meta-llama/Meta-Llama-3-8B", "tiny": "tiny-llama"}
"""``--random-config`` names -> architectures of :data:`distill.core.models.ARCHITECTURES` (random weights)."""

# Per-sequence relative tolerance of (a) against (b): |a - b| / max(|b|, 1).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
# The targets, stated for the Llama-3-8B config on an H100.
TARGET_FLOP_FRACTION = 0.75
TARGET_SPEEDUP = 6.0
TARGET_OVER_PLAIN = 1.2
"""(b)'s pairs/s over (c)'s."""


@dataclass
class Workload:
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


@dataclass
class Phase:
    """The figures of one scorer's timed run."""

    name: str
    pairs: int
    sequences: int
    tokens: int
    """Tokens fed (prefix + target), padding excluded."""
    padded_tokens: int
    """Tokens fed including padding (equals ``tokens`` for one sequence at a time)."""
    seconds: float
    """Wall time, device synchronised at both ends."""
    peak_memory_bytes: int
    memory_kind: str
    """What ``peak_memory_bytes`` is (GPU allocator peak or process peak RSS)."""
    flop_ceiling_fraction: float = 0.0
    """``2 * n_params * tokens / seconds / matmul_flops_per_s``."""
    achieved_flops_per_s: float = 0.0
    """``2 * n_params * tokens / seconds``."""
    breakdown_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def finish(self, n_params: int, matmul_flops_per_s: float) -> None:
        """Fill in the FLOP figures from the model size (parameters) and the matmul rate (FLOP/s)."""
        self.achieved_flops_per_s = 2 * n_params * self.tokens / self.seconds
        self.flop_ceiling_fraction = self.achieved_flops_per_s / matmul_flops_per_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "pairs_per_s": self.pairs_per_s, "tokens_per_s": self.tokens_per_s}


# ----------------------------------------------------------------------------- arguments


def flag(text: str) -> bool:
    """A bool option's value: true/false, yes/no, on/off or 1/0."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    model = p.add_mutually_exclusive_group()
    model.add_argument("--teacher", default="smollm2-135m", help="any name distill.core.models.resolve_model takes")
    model.add_argument(
        "--random-config",
        choices=sorted(RANDOM_CONFIGS),
        help="a random-weight LlamaForCausalLM of these shapes, fed SmolLM2 token ids, instead of --teacher",
    )
    p.add_argument(
        "--input", default=str(DEFAULT_INPUT), help="rank_llm or multi-hop JSON, or a BEIR folder (default: DL19 BM25)"
    )
    p.add_argument("--max-queries", type=int, help="use only the first N queries of the input")
    p.add_argument("--device", default="auto", help="auto (cuda where there is one), cpu or cuda[:N]")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="auto: bf16 on cuda, fp32 on cpu")
    p.add_argument("--max-batch-tokens", type=int, help="teacher batch budget (default 8192 on cpu, 16384 on cuda)")
    p.add_argument("--logit-chunk-rows", type=int, default=1024, help="teacher LM-head chunk (target positions)")
    p.add_argument("--max-passage-tokens", type=int, default=256)
    p.add_argument("--naive-pairs", type=int, default=64, help="pairs the naive loop is timed on (the first N)")
    p.add_argument(
        "--plain-pairs", type=int, help="pairs the plain batched loop is timed on (the first N; default all; 0 skips)"
    )
    p.add_argument("--plain-batch-size", type=int, default=32, help="sequences per batch of the plain batched loop")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--matmul-size", type=int, help="side of the square matmul (default 8192 on cuda, 2048 on cpu)")
    p.add_argument("--matmul-reps", type=int, default=10, help="timed matmul repetitions (after 3 warm-up ones)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    levers = p.add_argument_group("the teacher's levers (teachers.causal_lm.ScorerOptions; a bare flag means true)")
    levers.add_argument(
        "--bucket", type=int, help="pad batch widths up to a multiple of N tokens (default the device's: 64 on cuda)"
    )
    for name, default, text in (
        ("packing", None, "pack sequences in rows behind a block-diagonal causal mask (default: on cuda)"),
        ("compile", None, "torch.compile each decoder layer, compiled during the warm-up (default: on cuda)"),
        ("cudnn-attention", ScorerOptions.cudnn_attention, "on cuda, let attention use cuDNN's SDPA kernels"),
    ):
        levers.add_argument(f"--{name}", type=flag, nargs="?", const=True, default=default, help=text)
    p.add_argument(
        "--profile",
        type=writable_file,
        help="also record (b) with torch.profiler into this file (distill.bench.profile; the profiler slows it, so "
        "use the run's figures only as a profile)",
    )
    p.add_argument(
        "--out", type=writable_file, help="JSON result (default benchmarks/results/teacher-<device>-<model>.json)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    for name in ("naive_pairs", "max_queries", "max_batch_tokens", "matmul_size", "matmul_reps", "threads", "bucket"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.plain_batch_size < 1 or (args.plain_pairs is not None and args.plain_pairs < 0):
        p.error("--plain-batch-size must be at least 1 and --plain-pairs at least 0")
    return args


# ----------------------------------------------------------------------------- model and data


def build_teacher(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> tuple[CausalLMTeacher, str]:
    """The teacher under test, with the levers that leave the model as it is (:func:`with_model_levers` adds the
    others), and a short label of its model for file names."""
    options = {
        "max_batch_tokens": args.max_batch_tokens,
        "logit_chunk_rows": args.logit_chunk_rows,
        "max_passage_tokens": args.max_passage_tokens,
        "options": dataclasses.replace(scorer_options(args, device), compile=False),
    }
    if args.random_config is None:
        teacher = CausalLMTeacher.load(args.teacher, device=device, dtype=dtype_name(dtype), **options)
        return teacher, slug(args.teacher)
    name = RANDOM_CONFIGS[args.random_config]
    teacher = CausalLMTeacher.random(name, device=device, dtype=dtype_name(dtype), seed=args.seed, **options)
    return teacher, f"random-{args.random_config}"


def scorer_options(args: argparse.Namespace, device: torch.device) -> ScorerOptions:
    """The levers given, else the device's defaults (as ``distill teach`` takes them)."""
    levers = ("bucket", "packing", "compile", "cudnn_attention")
    return ScorerOptions.for_device(device, **{name: getattr(args, name) for name in levers})


def with_model_levers(teacher: CausalLMTeacher, options: ScorerOptions) -> None:
    """Give ``teacher`` every lever of ``options``, the one that changes its model in place (``compile``)
    included: after (a) and (c), which run the model as loaded."""
    if options == teacher.scorer.options:
        return
    old = teacher.scorer
    teacher.scorer = CausalLMScorer(old.model, old.max_batch_tokens, old.logit_chunk_rows, old.pad_token_id, options)


def load_workload(teacher: CausalLMTeacher, path: str, max_queries: int | None) -> Workload:
    """Every pair of ``path`` (the first ``max_queries`` queries), tokenised as the teacher does."""
    data = load_candidates(path)
    candidates = data.candidates[:max_queries] if max_queries is not None else data.candidates
    queries = [c.query.text for c in candidates for _ in c.passages]
    passage_ids = teacher.encode_passages([p.text for c in candidates for p in c.passages])
    first: dict[tuple[int, ...], int] = {}
    distinct_index = [first.setdefault(tuple(ids), len(first)) for ids in passage_ids]
    distinct_ids = [list(ids) for ids in first]
    cond = teacher.pair_sequences("logp_cond", queries, passage_ids)
    uncond = teacher.passage_sequences(distinct_ids)
    return Workload(queries, passage_ids, distinct_ids, distinct_index, cond, uncond, len(candidates))


# ----------------------------------------------------------------------------- measurement


def progress(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="seq", disable=not enabled, dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------- (a) naive loop


@torch.no_grad()
def naive_logprob(model: torch.nn.Module, seq: ScoringSequence, device: torch.device) -> float:
    """Summed log p(target | prefix) in nats, the way it is usually written: one sequence, all logits."""
    input_ids = torch.tensor([seq.prefix + seq.target], device=device)
    logits = model(input_ids).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = input_ids[0, 1:]
    token_logprobs = logprobs.gather(1, targets[:, None]).squeeze(1)
    return token_logprobs[len(seq.prefix) - 1 :].sum().item()


def run_naive(
    model: torch.nn.Module, work: Workload, n_pairs: int, device: torch.device, show: bool
) -> tuple[Phase, np.ndarray, np.ndarray]:
    """Score the first ``n_pairs`` pairs' conditional and unconditional sequences one at a time.

    Returns the phase and the ``[n_pairs]`` cond and uncond log-probabilities (nats).
    """
    sequences = [s for i in range(n_pairs) for s in (work.cond[i], work.uncond[work.distinct_index[i]])]
    probe = MemoryProbe(device)
    naive_logprob(model, sequences[0], device)  # warm-up
    probe.reset()
    values = np.empty(len(sequences))
    with progress(len(sequences), "(a) naive", show) as bar:
        synchronize(device)
        start = time.perf_counter()
        for k, seq in enumerate(sequences):
            values[k] = naive_logprob(model, seq, device)
            bar.update()
        synchronize(device)
        seconds = time.perf_counter() - start
    tokens = sum(len(s) for s in sequences)
    phase = Phase("(a) naive", n_pairs, len(sequences), tokens, tokens, seconds, probe.peak(), probe.kind)
    return phase, values[0::2], values[1::2]


# ----------------------------------------------------------------------------- (c) plain batched loop


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


def plain_sequences(work: Workload, n_pairs: int) -> tuple[list[ScoringSequence], list[int]]:
    """The first ``n_pairs`` pairs' conditional sequences, then their distinct passages' unconditional ones; and
    for each of those pairs, the index of its unconditional sequence in that list."""
    distinct = list(dict.fromkeys(work.distinct_index[:n_pairs]))
    where = {d: n_pairs + k for k, d in enumerate(distinct)}
    sequences = [*work.cond[:n_pairs], *(work.uncond[d] for d in distinct)]
    return sequences, [where[d] for d in work.distinct_index[:n_pairs]]


def run_plain(
    model: torch.nn.Module,
    work: Workload,
    n_pairs: int,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    cudnn_attention: bool,
    show: bool,
) -> tuple[Phase, np.ndarray, np.ndarray]:
    """Score the first ``n_pairs`` pairs with the plain batched loop (:func:`plain_batch_logprobs` over batches of
    ``batch_size`` sequences sorted by length, longest first), after one untimed batch.

    Returns the phase and the ``[n_pairs]`` cond and uncond log-probabilities (nats).
    """
    sequences, uncond_of = plain_sequences(work, n_pairs)
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    values = np.empty(len(sequences))
    probe = MemoryProbe(device)
    with attention_backends(device, cudnn_attention):
        plain_batch_logprobs(model, [sequences[i] for i in batches[0]], pad_id, device)  # warm-up
        probe.reset()
        with progress(len(sequences), "(c) plain", show) as bar:
            synchronize(device)
            start = time.perf_counter()
            for batch in batches:
                values[batch] = plain_batch_logprobs(model, [sequences[i] for i in batch], pad_id, device)
                bar.update(len(batch))
            synchronize(device)
            seconds = time.perf_counter() - start
    tokens = sum(len(s) for s in sequences)
    padded = sum(len(batch) * len(sequences[batch[0]]) for batch in batches)
    phase = Phase("(c) plain", n_pairs, len(sequences), tokens, padded, seconds, probe.peak(), probe.kind)
    return phase, values[:n_pairs], values[uncond_of]


# ----------------------------------------------------------------------------- (b) teacher stage


def padded_tokens(scorer: CausalLMScorer, sequences: Sequence[ScoringSequence]) -> int:
    """Tokens the teacher's batches feed, padding included."""
    return sum(plan.padded_tokens for plan in scorer.plan(sequences))


def batch_shapes(scorer: CausalLMScorer, work: Workload) -> list[tuple[int, int]]:
    """The distinct ``(rows, width)`` shapes of the teacher's batches over the workload."""
    return sorted({plan.shape for seqs in (work.cond, work.uncond) for plan in scorer.plan(seqs)})


def warm_up(teacher: CausalLMTeacher, work: Workload, device: torch.device) -> float:
    """Score the first (longest, fullest) ``logp_cond`` batch; with ``compile``, also the last one and the first
    and last ``logp_uncond`` batches, so that torch.compile's compiles (at most three) happen here.

    Returns the seconds it took.
    """
    scorer = teacher.scorer
    synchronize(device)
    start = time.perf_counter()
    first = scorer.plan(work.cond)[0].sequences
    teacher.pair_terms([work.queries[i] for i in first], [work.passage_ids[i] for i in first], ["logp_cond"])
    if scorer.options.compile:
        plans = [scorer.plan(work.cond)[-1], *(scorer.plan(work.uncond)[k] for k in (0, -1))]
        for plan, sequences in zip(plans, (work.cond, work.uncond, work.uncond), strict=True):
            scorer.logprobs([sequences[i] for i in plan.sequences])
    synchronize(device)
    return time.perf_counter() - start


def run_teacher(
    teacher: CausalLMTeacher, work: Workload, device: torch.device, show: bool
) -> tuple[Phase, np.ndarray, np.ndarray]:
    """Score every pair's ``logp_cond`` and every distinct passage's ``logp_uncond`` with the teacher.

    Returns the phase, the ``[n_pairs]`` cond and the ``[n_distinct]`` uncond log-probabilities (nats).
    """
    probe = MemoryProbe(device)
    probe.reset()

    def timed(desc: str, total: int, call: Callable[[Callable[[int], None]], np.ndarray]) -> tuple[np.ndarray, float]:
        with progress(total, desc, show) as bar:
            synchronize(device)
            start = time.perf_counter()
            values = call(bar.update)
            synchronize(device)
            return values, time.perf_counter() - start

    uncond, t_uncond = timed(
        "(b) teacher log p(K)", len(work.distinct_ids), lambda cb: teacher.passage_logprobs(work.distinct_ids, cb)
    )
    cond, t_cond = timed(
        "(b) teacher log p(K|Q)",
        work.n_pairs,
        lambda cb: teacher.pair_terms(work.queries, work.passage_ids, ["logp_cond"], cb)["logp_cond"],
    )
    sequences = [*work.cond, *work.uncond]
    padded = padded_tokens(teacher.scorer, work.cond) + padded_tokens(teacher.scorer, work.uncond)
    phase = Phase(
        "(b) teacher",
        work.n_pairs,
        len(sequences),
        sum(len(s) for s in sequences),
        padded,
        t_uncond + t_cond,
        probe.peak(),
        probe.kind,
        breakdown_seconds={"logp_uncond": t_uncond, "logp_cond": t_cond},
    )
    return phase, cond, uncond


def agreement(
    naive_cond: np.ndarray, naive_uncond: np.ndarray, cond: np.ndarray, uncond: np.ndarray, work: Workload
) -> dict[str, float]:
    """Differences (nats) of (a) from (b) on the pairs both scored: per term and on CIS itself."""
    n = len(naive_cond)
    ref_cond = cond[:n]
    ref_uncond = uncond[np.asarray(work.distinct_index[:n])]
    naive_terms = np.concatenate([naive_cond, naive_uncond])
    ref_terms = np.concatenate([ref_cond, ref_uncond])
    diff = np.abs(naive_terms - ref_terms)
    cis_diff = np.abs((naive_cond - naive_uncond) - (ref_cond - ref_uncond))
    return {
        "pairs": n,
        "max_abs_diff_terms": float(diff.max()),
        "max_rel_diff_terms": float((diff / np.maximum(np.abs(ref_terms), 1.0)).max()),
        "max_abs_diff_cis": float(cis_diff.max()),
    }


# ----------------------------------------------------------------------------- reporting


def print_report(result: dict[str, Any], phases: list[Phase]) -> None:
    env, model, work, mm = result["environment"], result["model"], result["workload"], result["matmul"]
    print(f"command   : {result['command']}")
    print(f"device    : {env['device']} ({env['device_name']}), torch {env['torch']}, {env['torch_threads']} threads")
    print(f"model     : {model['name']} ({model['weights']}), {env['dtype']}, {model['n_params'] / 1e6:.1f}M params")
    print("            (n_params counts all parameters, embeddings and LM head included)")
    if model["note"]:
        print(f"            {model['note']}")
    print(
        f"workload  : {work['input']}: {work['queries']} queries, {work['pairs']} pairs, "
        f"{work['distinct_passages']} distinct passages, {work['tokens']} tokens"
    )
    print(
        f"matmul    : {mm['size']}^3 {env['dtype']}: {mm['flops_per_s'] / 1e12:.3f} TFLOP/s "
        f"(the larger of {mm['before_flops_per_s'] / 1e12:.3f} before and {mm['after_flops_per_s'] / 1e12:.3f} after)"
    )
    header = f"{'scorer':<12} {'pairs':>6} {'tokens':>9} {'time s':>9} {'pairs/s':>9} {'tokens/s':>10} "
    print("\n" + header + f"{'peak MiB':>9} {'TFLOP/s':>8} {'ceiling':>8}")
    for ph in phases:
        print(
            f"{ph.name:<12} {ph.pairs:>6} {ph.tokens:>9} {ph.seconds:>9.3f} {ph.pairs_per_s:>9.2f} "
            f"{ph.tokens_per_s:>10.0f} {ph.peak_memory_bytes / 2**20:>9.0f} "
            f"{ph.achieved_flops_per_s / 1e12:>8.3f} {ph.flop_ceiling_fraction:>8.1%}"
        )
    print(f"peak memory: {phases[0].memory_kind}")
    teacher = result["teacher"]
    print(f"teacher padding: {teacher['padded_tokens'] / teacher['tokens'] - 1:.1%} extra tokens fed as padding")
    levers = ", ".join(f"{k} {v}" for k, v in result["scorer_options"].items())
    print(
        f"teacher levers: {levers}; {len(work['batch_shapes'])} distinct batch shapes; "
        f"warm-up {result['teacher_warmup_seconds']:.2f} s (not timed)"
    )
    pairs_x, tokens_x = result["speedup_pairs_per_s"], result["speedup_tokens_per_s"]
    print(f"\nspeed-up (b)/(a): {pairs_x:.2f}x pairs/s, {tokens_x:.2f}x tokens/s")
    if result["plain"] is not None:
        plain = result["plain"]
        print(
            f"speed-up (b)/(c): {result['speedup_over_plain_pairs_per_s']:.2f}x pairs/s "
            f"((c): {work['plain_pairs']} pairs, batches of {work['plain_batch_size']} sequences, "
            f"{plain['padded_tokens'] / plain['tokens'] - 1:.1%} extra tokens fed as padding)"
        )
    for label, agree in (("a", result["agreement"]), ("c", result["plain_agreement"])):
        if agree is None:
            continue
        print(
            f"agreement on {agree['pairs']} pairs: max |{label}-b| = {agree['max_abs_diff_terms']:.3g} nats per term "
            f"(relative {agree['max_rel_diff_terms']:.2g}, tolerance {agree['tolerance']:.0e}), "
            f"{agree['max_abs_diff_cis']:.3g} on CIS: {'ok' if agree['ok'] else 'MISMATCH'}"
        )
    targets = result["targets"]
    over_plain = (
        ""
        if targets["over_plain_met"] is None
        else (f"; (b)/(c) >= {targets['over_plain']}x: {yes(targets['over_plain_met'])}")
    )
    print(
        f"issue targets (Llama-3-8B config on an H100): ceiling >= {targets['flop_ceiling_fraction']:.0%}: "
        f"{yes(targets['flop_ceiling_met'])}; speed-up >= {targets['speedup']:.0f}x: {yes(targets['speedup_met'])}"
        + over_plain
    )


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.max_batch_tokens is None:
        args.max_batch_tokens = TEACHER_BATCH_TOKENS[device.type]
    size = args.matmul_size or MATMUL_SIZE[device.type]
    show = not args.no_progress and sys.stderr.isatty()

    teacher, label = build_teacher(args, device, dtype)
    model = teacher.scorer.model
    n_params = sum(p.numel() for p in model.parameters())
    work = load_workload(teacher, args.input, args.max_queries)
    n_naive = min(args.naive_pairs, work.n_pairs)

    before = matmul_flops_per_s(device, dtype, size, args.matmul_reps)
    naive, naive_cond, naive_uncond = run_naive(model, work, n_naive, device, show)
    n_plain = work.n_pairs if args.plain_pairs is None else min(args.plain_pairs, work.n_pairs)
    plain = None
    if n_plain:
        pad_id = teacher.scorer.pad_token_id
        plain, plain_cond, plain_uncond = run_plain(
            model, work, n_plain, args.plain_batch_size, pad_id, device, args.cudnn_attention, show
        )
    options = scorer_options(args, device)
    with_model_levers(teacher, options)
    warmup_seconds = warm_up(teacher, work, device)
    with profiled(args.profile, device):
        taught, cond, uncond = run_teacher(teacher, work, device, show)
    after = matmul_flops_per_s(device, dtype, size, args.matmul_reps)
    rate = max(before, after)  # the higher ceiling: the conservative fraction
    phases = [naive, taught] + ([plain] if plain else [])
    for phase in phases:
        phase.finish(n_params, rate)

    def checked(agree: dict[str, Any]) -> dict[str, Any]:
        return {**agree, "tolerance": TOLERANCE[dtype], "ok": agree["max_rel_diff_terms"] <= TOLERANCE[dtype]}

    agree = checked(agreement(naive_cond, naive_uncond, cond, uncond, work))
    plain_agree = checked(agreement(plain_cond, plain_uncond, cond, uncond, work)) if plain else None
    speedup = taught.pairs_per_s / naive.pairs_per_s
    over_plain = taught.pairs_per_s / plain.pairs_per_s if plain else None
    result = {
        "benchmark": "teacher",
        **invocation("benchmarks/teacher.py", argv),
        "environment": environment(device, dtype),
        "model": model_info(args, teacher, n_params),
        "workload": {
            "input": display_path(args.input),
            "queries": work.n_queries,
            "pairs": work.n_pairs,
            "distinct_passages": len(work.distinct_ids),
            "tokens": taught.tokens,
            "mean_cond_tokens": float(np.mean([len(s) for s in work.cond])),
            "mean_uncond_tokens": float(np.mean([len(s) for s in work.uncond])),
            "max_batch_tokens": args.max_batch_tokens,
            "logit_chunk_rows": args.logit_chunk_rows,
            "naive_pairs": n_naive,
            "plain_pairs": n_plain,
            "plain_batch_size": args.plain_batch_size,
            "batch_shapes": [list(shape) for shape in batch_shapes(teacher.scorer, work)],
        },
        "scorer_options": dataclasses.asdict(teacher.scorer.options),
        "teacher_warmup_seconds": warmup_seconds,
        "matmul": {
            "size": size,
            "reps": args.matmul_reps,
            "flops_per_s": rate,
            "before_flops_per_s": before,
            "after_flops_per_s": after,
        },
        "naive": naive.to_json(),
        "teacher": taught.to_json(),
        "plain": plain.to_json() if plain else None,
        "speedup_pairs_per_s": speedup,
        "speedup_tokens_per_s": taught.tokens_per_s / naive.tokens_per_s,
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
    print_report(result, phases)
    out = args.out or RESULTS / f"teacher-{device.type}-{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {display_path(out)}")
    return 0 if agree["ok"] and (plain_agree is None or plain_agree["ok"]) else 1


def model_info(args: argparse.Namespace, teacher: CausalLMTeacher, n_params: int) -> dict[str, Any]:
    """What was benchmarked: the model, its size and, for random weights, where the token ids come from."""
    model = teacher.scorer.model
    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    random = args.random_config is not None
    return {
        "name": f"random-{args.random_config}" if random else args.teacher,
        "weights": "random init" if random else teacher.identity,
        "config": RANDOM_CONFIGS[args.random_config] if random else None,
        "architecture": type(model).__name__,
        "n_params": n_params,
        "n_params_counts": "all parameters: input embeddings and LM head included (tied weights once)",
        "n_embedding_params": embedding,
        "tied_embeddings": tied,
        "start_token_id": teacher.start_token_id,
        "note": (
            f"token ids: the {ARCHITECTURES[RANDOM_CONFIGS[args.random_config]].tokenizer} tokenizer's "
            f"(all < {len(teacher.tokenizer)}), valid ids of the {model.config.vocab_size}-token vocabulary"
            if random
            else ""
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
