"""cis-distill: distil a causal LM's causal-relevance judgement (CIS) into cross-encoder rerankers.

The package is light to import: heavy dependencies (torch, transformers, datasets)
are imported by the modules that need them.
"""

__version__ = "0.1.0"
