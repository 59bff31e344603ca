"""Shared fixtures: tiny random-weight models saved as real Hugging Face folders, and real data."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# Tests never reach a model hub: fail fast instead of retrying the network (read by huggingface_hub on import).
os.environ["HF_HUB_OFFLINE"] = "1"
# pytest-xdist's workers share the machine's cores: each worker's OpenMP pools (torch's, in it and in every process a
# test starts) get its share of them, unless OMP_NUM_THREADS is set. Two workers that each ran a pool over every core
# would spin against each other, and small ops slow down several times (read by torch on import).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))

REPO = Path(__file__).resolve().parents[1]
DISTILL = str(Path(sys.executable).parent / "distill")
"""The ``distill`` program of this environment, for tests that run it as a user does."""
DL19 = REPO / "data" / "trec-dl19" / "bm25_top100.json"
DL19_QRELS = REPO / "data" / "trec-dl19" / "qrels.txt"


def _train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.fixture(scope="session")
def dl19_sample() -> list[dict]:
    """The first 3 DL19 queries with their first 12 BM25 candidates each (rank_llm format)."""
    data = json.loads(DL19.read_text())
    return [{"query": e["query"], "hits": e["hits"][:12]} for e in data[:3]]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, dl19_sample: list[dict]) -> Path:
    """A 2-layer random Llama with a byte-level BPE tokenizer, saved as a local model folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    texts = [e["query"] for e in dl19_sample] + [h["content"] for e in dl19_sample for h in e["hits"]]
    tokenizer = _train_tokenizer(texts)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def sample_file(tmp_path: Path, dl19_sample: list[dict]) -> Path:
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(dl19_sample))
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random BERT (BERT-large's shape family) with the real uncased WordPiece tokenizer."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


TINY_ENCODER = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
"""The shapes of the tests' tiny random encoders (BERT's, MPNet's, RoBERTa's configs take these keys)."""


def make_tiny_bert(path: Path) -> Path:
    """:func:`tiny_bert`'s model, saved into ``path``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from distill.model.resolver import load_pretrained, resolve_model

    tokenizer = load_pretrained(resolve_model("all-minilm-l6-v2"), AutoTokenizer)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, num_labels=1, **TINY_ENCODER)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_mpnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random MPNet with an MPNet tokenizer (``<s> Q </s></s> K </s>``, no token types) over the uncased
    WordPiece vocabulary, MPNet's four special tokens first and ``<mask>`` last, as all-mpnet-base-v2's."""
    import torch
    from transformers import AutoTokenizer, MPNetConfig, MPNetModel, MPNetTokenizer

    from distill.model.resolver import load_pretrained, resolve_model

    path = tmp_path_factory.mktemp("tiny-mpnet")
    wordpiece = load_pretrained(resolve_model("all-minilm-l6-v2"), AutoTokenizer)
    words = sorted(wordpiece.get_vocab(), key=wordpiece.get_vocab().get)
    vocab = {token: index for index, token in enumerate(["<s>", "<pad>", "</s>", "<unk>", *words, "<mask>"])}
    tokenizer = MPNetTokenizer(vocab=vocab, model_max_length=512)
    config = MPNetConfig(vocab_size=len(tokenizer), max_position_embeddings=514, **TINY_ENCODER)
    torch.manual_seed(0)
    MPNetModel(config, add_pooling_layer=False).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def teacher_dataset(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path, dl19_sample: list[dict]) -> Path:
    """Teacher triplets (cis and upr) of the DL19 sample, scored by the tiny Llama."""
    from distill.stages.teach import TeachConfig, teach

    root = tmp_path_factory.mktemp("teacher")
    (root / "in.json").write_text(json.dumps(dl19_sample))
    config = TeachConfig(
        input=[str(root / "in.json")],
        output=str(root / "triplets"),
        teacher=str(tiny_llama),
        scores=["cis", "upr"],
        cache_dir=str(root / "cache"),
        progress=False,
    )
    return teach(config).output


@pytest.fixture(scope="session")
def parity():
    """Two real DL19 queries, 24 BM25 candidates each (and the long pair), also the int8 evaluation set."""
    from distill.data.loaders import load_candidates
    from distill.export.parity_set import ParitySet

    data = load_candidates(DL19, qrels=DL19_QRELS)
    return ParitySet.from_data(data, queries=2, depth=24, ranking_queries=2, ranking_depth=24)


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The run's own temporary folder, shared by its pytest-xdist workers (above each worker's own)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def built_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """``folder``, built by ``build(folder)`` by the first worker of the run to ask, under a file lock; the others
    wait for it and read it (no test writes into it). A marker written after the build says it is complete."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.with_name(folder.name + ".lock"))):
        done = folder.with_name(folder.name + ".done")
        if not done.is_file():
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def student(run_folder: Path, parity) -> Path:
    """The tiny BERT fitted to the graded relevance of the parity pairs, saved as a student (once a run).

    A random model's ranking is noise that int8 quantisation reshuffles; one that separates the grades
    is what the int8 nDCG@10 bound is about.
    """
    return built_once(run_folder / "student", lambda out: fitted_student(out, parity))


def fitted_student(out: Path, parity) -> Path:
    """:func:`student`'s model, saved into ``out``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distill.core.student_card import StudentCard
    from distill.serving.encoding import encode_pairs, pad_batch
    from students.model import save_student

    tiny_bert = make_tiny_bert(out.parent / f"{out.name}-random")
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert)
    pairs = [p for p in parity.pairs if p.docid is not None]
    grades = torch.tensor([float(parity.qrels.get(p.qid, {}).get(p.docid, 0)) for p in pairs])
    features = encode_pairs(tokenizer, [p.query for p in pairs], [p.passage for p in pairs], 512).features
    batch = {k: torch.from_numpy(v) for k, v in pad_batch(tokenizer, features).items()}
    torch.manual_seed(0)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.eval()  # fitted without dropout: the attention's, on a CPU, is most of a step's time
    for _ in range(50):
        loss = torch.nn.functional.mse_loss(model(**batch).logits[:, 0], grades)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    card = StudentCard(
        backbone=str(tiny_bert),
        label="qrels grade",
        loss="mse",
        teacher_data=[],
        target_scaling={"kind": "none", "mean": 0.0, "std": 1.0},
        max_length=512,
        val_queries=sorted({p.qid for p in pairs}),
    )
    return save_student(model, tokenizer, out, card)


@pytest.fixture(scope="session")
def exported(run_folder: Path, student: Path, parity) -> Path:
    """The fitted student exported to every format (ONNX fp32/fp16/static int8, TorchScript), once a run."""
    from distill.export.exporter import export_student

    def build(out: Path) -> None:
        export_student(student, out, fp16=True, int8="static", parity=parity)

    return built_once(run_folder / "exported" / "student", build)


@pytest.fixture(scope="session")
def spread_bert(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random BERT with its classifier scaled up: its scores spread over about 0.05 rather than 5e-5, so
    that a score in another pair's place fails a test's tolerance for rounding (1e-5)."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_bert)
    with torch.no_grad():
        model.classifier.weight.mul_(1000.0)
    path = tmp_path_factory.mktemp("spread-bert")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def call() -> tuple[str, list[str]]:
    """A DL19 query and its 100 BM25 candidates: one reranking call."""
    from distill.data.loaders import load_candidates

    candidates = load_candidates(DL19).candidates[0]
    return candidates.query.text, [p.text for p in candidates.passages]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow first (a stable sort: otherwise in collection order), so that pytest-xdist's workers
    end together instead of one idling while the other runs a long test handed out last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
