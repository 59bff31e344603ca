"""A cross-encoder head that starts as its backbone's own sentence similarity: the segment-cosine head.

The paper's student reads ``[CLS] Q [SEP] K [SEP]`` and scores it with a linear layer on ``[CLS]``; from a
sentence-embedding backbone such as all-MiniLM-L6-v2 that head starts at random, and a few thousand
distillation pairs on a CPU teach it little. This head reads the same joint input, every layer attending across
the query and the passage, and scores it as ``scale · cos(mean(Q tokens), mean(K tokens)) + bias``, the two
means taken over the last layer's tokens of each segment (``token_type_ids`` 0 and 1). With a backbone trained
for mean-pooled cosine similarity it ranks well before any training; distillation then moves it towards the
teacher.

Importing this module registers the architecture with ``AutoConfig`` and ``AutoModelForSequenceClassification``
(``model_type`` :data:`MODEL_TYPE`), so that every loader of the project (and sentence-transformers'
``CrossEncoder``, once this module is imported) loads such a student like any other.

``distill export`` copies this very file into the export folder as Hugging Face remote code
(``modeling_segment_cosine.py``, see :mod:`distill.export.remote_code`), so that a Python without cis-distill
loads the student with ``trust_remote_code=True``: it must import nothing but torch and transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertModel, BertPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

MODEL_TYPE = "bert-segment-cosine"


class BertSegmentCosineConfig(BertConfig):
    """A BERT config with the head's initial ``cosine_scale`` (the scores' spread before training)."""

    model_type = MODEL_TYPE

    def __init__(self, cosine_scale: float = 20.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cosine_scale = cosine_scale


def segment_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, H]`` mean of ``hidden`` ``[B, T, H]`` over the positions where ``mask`` ``[B, T]`` is 1."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class BertForSegmentCosine(BertPreTrainedModel):
    """A BERT cross-encoder scored by the cosine of its two segments' mean last-layer tokens.

    ``forward`` takes ``input_ids``, ``attention_mask`` and ``token_type_ids``, each ``[B, T]``, and returns
    ``logits`` ``[B, 1]``: ``scale · cos + bias``, with ``scale`` (initially ``config.cosine_scale``) and ``bias``
    (initially 0) learnt.
    """

    config_class = BertSegmentCosineConfig

    def __init__(self, config: BertSegmentCosineConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.scale = torch.nn.Parameter(torch.tensor(float(config.cosine_scale)))
        self.bias = torch.nn.Parameter(torch.tensor(0.0))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        if module is self:
            with torch.no_grad():
                self.scale.fill_(float(self.config.cosine_scale))
                self.bias.zero_()
        else:
            super()._init_weights(module)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
        query = segment_mean(hidden, attention_mask * (1 - token_type_ids))
        passage = segment_mean(hidden, attention_mask * token_type_ids)
        cosine = torch.nn.functional.cosine_similarity(query, passage, dim=-1)
        return SequenceClassifierOutput(logits=(self.scale * cosine + self.bias).unsqueeze(-1))


AutoConfig.register(MODEL_TYPE, BertSegmentCosineConfig, exist_ok=True)
AutoModelForSequenceClassification.register(BertSegmentCosineConfig, BertForSegmentCosine, exist_ok=True)
