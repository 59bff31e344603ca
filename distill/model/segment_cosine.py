"""A cross-encoder head that starts as its backbone's own sentence similarity: the segment-cosine head.

The paper's student reads ``[CLS] Q [SEP] K [SEP]`` and scores it with a linear layer on ``[CLS]``; from a
sentence-embedding backbone such as all-MiniLM-L6-v2 that head starts at random, and a few thousand
distillation pairs on a CPU teach it little. This head reads the same joint input, every layer attending across
the query and the passage, and scores it as ``scale · cos(mean(Q tokens), mean(K tokens)) + bias``, the two
means taken over the last layer's tokens of each segment (``token_type_ids`` 0 and 1). With a backbone trained
for mean-pooled cosine similarity it ranks well before any training; distillation then moves it towards the
teacher.

With ``segment_layers`` N, the first N layers attend within each segment only (and to the leading [CLS], the
attention sink the backbone was trained with), and each segment's positions start at 1 as if it followed its own
[CLS] (token type 0 throughout): those layers encode the query and the passage each on its own, as the backbone was
trained to, and only the later layers attend across them. With N the number of layers the head is, but for the
[CLS] the passage shares with the query, the backbone's own bi-encoder similarity in one pass over the joint input.

The same head over MPNet (:class:`MPNetForSegmentCosine`, ``model_type`` :data:`MPNET_MODEL_TYPE`) reads MPNet's
pairs, ``<s> Q </s></s> K </s>``, which carry no token types: the passage's segment starts at the second ``</s>``,
its own start token, which its layers apart read as ``<s>``: they encode ``<s> K </s>`` as the backbone does alone.

Importing this module registers both architectures with ``AutoConfig`` and ``AutoModelForSequenceClassification``
(``model_type`` :data:`MODEL_TYPE` and :data:`MPNET_MODEL_TYPE`), so that every loader of the project (and
sentence-transformers' ``CrossEncoder``, once this module is imported) loads such a student like any other.

``distill export`` copies this very file into the export folder as Hugging Face remote code
(``modeling_segment_cosine.py``, see :mod:`distill.export.remote_code`), so that a Python without cis-distill
loads the student with ``trust_remote_code=True``: it must import nothing but torch and transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    BertPreTrainedModel,
    MPNetConfig,
    MPNetModel,
    MPNetPreTrainedModel,
)
from transformers.modeling_outputs import SequenceClassifierOutput

MODEL_TYPE = "bert-segment-cosine"
MPNET_MODEL_TYPE = "mpnet-segment-cosine"


class BertSegmentCosineConfig(BertConfig):
    """A BERT config with the head's initial ``cosine_scale`` (the scores' spread before training) and
    ``segment_layers``, the first layers that attend within each segment only (0: every layer attends across)."""

    model_type = MODEL_TYPE

    def __init__(self, cosine_scale: float = 20.0, segment_layers: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cosine_scale = cosine_scale
        self.segment_layers = segment_layers


def segment_positions(attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` position ids that start again for the second segment: ``[CLS] Q [SEP]`` keep 0, 1, ...; the
    passage's first token is 1, as after a [CLS] of its own (padding positions are never attended to)."""
    first_length = (attention_mask * (1 - token_type_ids)).sum(1, keepdim=True)  # [B, 1]
    places = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None]  # [1, T]
    return places - token_type_ids * (first_length - 1)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, T, T]`` additive attention mask: 0 where ``allowed`` ``[B, T, T]`` (query token, key token), the
    dtype's minimum elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)[
        :, None
    ]


def segment_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, H]`` mean of ``hidden`` ``[B, T, H]`` over the positions where ``mask`` ``[B, T]`` is 1."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class CosineScored(torch.nn.Module):
    """The head both architectures share: ``scale`` (initially ``config.cosine_scale``) and ``bias`` (initially 0),
    learnt, and the score ``scale · cos(mean query tokens, mean passage tokens) + bias``."""

    def _add_scale_and_bias(self) -> None:
        self.scale = torch.nn.Parameter(torch.tensor(float(self.config.cosine_scale)))
        self.bias = torch.nn.Parameter(torch.tensor(0.0))

    def _init_weights(self, module: torch.nn.Module) -> None:
        if module is self:
            with torch.no_grad():
                self.scale.fill_(float(self.config.cosine_scale))
                self.bias.zero_()
        else:
            super()._init_weights(module)

    def _scored(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, segments: torch.Tensor
    ) -> SequenceClassifierOutput:
        """``logits`` ``[B, 1]`` of the last hidden states ``[B, T, H]``, with ``segments`` ``[B, T]`` (0: the
        query's, 1: the passage's)."""
        query = segment_mean(hidden, attention_mask * (1 - segments))
        passage = segment_mean(hidden, attention_mask * segments)
        cosine = torch.nn.functional.cosine_similarity(query, passage, dim=-1)
        return SequenceClassifierOutput(logits=(self.scale * cosine + self.bias).unsqueeze(-1))


class BertForSegmentCosine(CosineScored, BertPreTrainedModel):
    """A BERT cross-encoder scored by the cosine of its two segments' mean last-layer tokens.

    ``forward`` takes ``input_ids``, ``attention_mask`` and ``token_type_ids``, each ``[B, T]``, and returns
    ``logits`` ``[B, 1]``: ``scale · cos + bias``, with ``scale`` (initially ``config.cosine_scale``) and ``bias``
    (initially 0) learnt.
    """

    config_class = BertSegmentCosineConfig

    def __init__(self, config: BertSegmentCosineConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self._add_scale_and_bias()
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        if self.config.segment_layers:
            hidden = self._segments_apart(input_ids, attention_mask, token_type_ids)
        else:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
        return self._scored(hidden, attention_mask, token_type_ids)

    def _segments_apart(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        """``[B, T, H]`` last hidden states, the first ``segment_layers`` layers attending within each segment and to
        the [CLS]."""
        hidden = self.bert.embeddings(
            input_ids=input_ids,
            token_type_ids=torch.zeros_like(token_type_ids),
            position_ids=segment_positions(attention_mask, token_type_ids),
        )
        keys = attention_mask.bool()[:, None, :]  # [B, 1, T]
        same_segment = token_type_ids[:, :, None] == token_type_ids[:, None, :]  # [B, T, T]
        same_segment[:, :, 0] = True  # every token sees the [CLS]
        apart = additive_mask(keys & same_segment, hidden.dtype)
        across = additive_mask(keys.expand_as(same_segment), hidden.dtype)
        for index, layer in enumerate(self.bert.encoder.layer):
            out = layer(hidden, apart if index < self.config.segment_layers else across)
            hidden = out[0] if isinstance(out, tuple) else out  # transformers 4 returns a tuple
        return hidden


class MPNetSegmentCosineConfig(MPNetConfig):
    """An MPNet config with the head's ``cosine_scale`` and ``segment_layers``, as :class:`BertSegmentCosineConfig`."""

    model_type = MPNET_MODEL_TYPE

    def __init__(self, cosine_scale: float = 20.0, segment_layers: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cosine_scale = cosine_scale
        self.segment_layers = segment_layers


def separator_segments(input_ids: torch.Tensor, attention_mask: torch.Tensor, separator: int) -> torch.Tensor:
    """``[B, T]`` int64 segment ids of MPNet's pairs ``<s> Q </s></s> K </s>``, whose tokenizer gives no token types:
    0 for ``<s> Q </s>``, 1 from the second ``</s>`` on (``</s> K </s>``, the passage led by a start token of its
    own, as ``<s> K </s>`` is alone), 0 on padding."""
    seen = torch.cumsum((input_ids == separator).long(), dim=1)  # [B, T] separators up to and including each
    return (seen >= 2).long() * attention_mask.long()


class MPNetForSegmentCosine(CosineScored, MPNetPreTrainedModel):
    """An MPNet cross-encoder scored by the cosine of its two segments' mean last-layer tokens.

    ``forward`` takes ``input_ids`` and ``attention_mask``, each ``[B, T]`` (the segments are read off the
    separators, :func:`separator_segments`), and returns ``logits`` ``[B, 1]``: ``scale · cos + bias``. With
    ``segment_layers`` N, the first N layers attend within each segment only, each segment's positions (and relative
    position buckets) starting again and the passage's leading ``</s>`` read as ``<s>``, so that with N the number of
    layers the query is encoded as ``<s> Q </s>`` alone and the passage as ``<s> K </s>``: the backbone's own
    bi-encoder similarity in one pass over the joint input.
    """

    config_class = MPNetSegmentCosineConfig

    def __init__(self, config: MPNetSegmentCosineConfig) -> None:
        super().__init__(config)
        self.mpnet = MPNetModel(config, add_pooling_layer=False)
        self._add_scale_and_bias()
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        segments = separator_segments(input_ids, attention_mask, self.config.eos_token_id)
        if self.config.segment_layers:
            hidden = self._segments_apart(input_ids, attention_mask, segments)
        else:
            hidden = self.mpnet(input_ids=input_ids, attention_mask=attention_mask)[0]
        return self._scored(hidden, attention_mask, segments)

    def _segments_apart(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, segments: torch.Tensor
    ) -> torch.Tensor:
        """``[B, T, H]`` last hidden states, the first ``segment_layers`` layers attending within each segment."""
        first_length = (attention_mask * (1 - segments)).sum(1, keepdim=True)  # [B, 1]
        places = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # [1, T]
        positions = places - segments * first_length  # [B, T]: each segment's places from 0
        starts = (segments == 1) & (positions == 0)  # the passage's leading </s> reads as <s>, as alone
        ids = torch.where(starts, torch.full_like(input_ids, self.config.bos_token_id), input_ids)
        hidden = self.mpnet.embeddings(input_ids=ids, position_ids=positions + self.config.pad_token_id + 1)
        encoder = self.mpnet.encoder
        keys = attention_mask.bool()[:, None, :]  # [B, 1, T]
        same_segment = segments[:, :, None] == segments[:, None, :]  # [B, T, T]
        apart = additive_mask(keys & same_segment, hidden.dtype)
        across = additive_mask(keys.expand_as(same_segment), hidden.dtype)
        relative = positions[:, None, :] - positions[:, :, None]  # [B, T, T]: key's place - query's, in a segment
        buckets = encoder.relative_position_bucket(relative, num_buckets=self.config.relative_attention_num_buckets)
        apart_bias = encoder.relative_attention_bias(buckets).permute(0, 3, 1, 2)  # [B, heads, T, T]
        across_bias = encoder.compute_position_bias(hidden)
        for index, layer in enumerate(encoder.layer):
            inside = index < self.config.segment_layers
            hidden = layer(hidden, apart if inside else across, apart_bias if inside else across_bias)[0]
        return hidden


AutoConfig.register(MODEL_TYPE, BertSegmentCosineConfig, exist_ok=True)
AutoModelForSequenceClassification.register(BertSegmentCosineConfig, BertForSegmentCosine, exist_ok=True)
AutoConfig.register(MPNET_MODEL_TYPE, MPNetSegmentCosineConfig, exist_ok=True)
AutoModelForSequenceClassification.register(MPNetSegmentCosineConfig, MPNetForSegmentCosine, exist_ok=True)
