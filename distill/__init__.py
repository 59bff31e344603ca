"""cis-distill: distil a causal LM's causal-relevance judgement (CIS) into cross-encoder rerankers.

The package is light to import: heavy dependencies (torch, transformers, datasets)
are imported by the modules that need them, and ``distill.Reranker`` on first use.
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Reranker":
        from distill.serving.reranker import Reranker

        return Reranker
    raise AttributeError(f"module 'distill' has no attribute {name!r}")
