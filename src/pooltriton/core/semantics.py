"""The pooling vocabulary shared by export/ and backends/: tasks, pooling types, activations.

Mirrors vLLM's pooling runner (see shared/POOLING.md). Nothing here imports torch, so the
Triton stubs that import it stay small.
"""

from __future__ import annotations

from enum import Enum


class Task(str, Enum):
    EMBED = "embed"
    CLASSIFY = "classify"
    TOKEN_EMBED = "token_embed"
    TOKEN_CLASSIFY = "token_classify"

    @property
    def per_token(self) -> bool:
        return self in (Task.TOKEN_EMBED, Task.TOKEN_CLASSIFY)

    @property
    def is_embedding(self) -> bool:
        return self in (Task.EMBED, Task.TOKEN_EMBED)


class PoolingType(str, Enum):
    CLS = "CLS"
    LAST = "LAST"
    MEAN = "MEAN"
    ALL = "ALL"
    STEP = "STEP"
    # sentence-transformers' other Pooling modes (their modules.json), beyond vLLM's set.
    MAX = "MAX"
    MEAN_SQRT_LEN = "MEAN_SQRT_LEN"
    WEIGHTED_MEAN = "WEIGHTED_MEAN"
    # SPLADE (sentence-transformers' SparseEncoder, vLLM's SPLADE pooler): log(1 + relu(MLM logits)) of the
    # real tokens, their max (SPLADE v2 and later) or sum (the first SPLADE): one weight per vocabulary entry.
    SPLADE_MAX = "SPLADE_MAX"
    SPLADE_SUM = "SPLADE_SUM"

    @property
    def per_token(self) -> bool:
        return self in (PoolingType.ALL, PoolingType.STEP)

    @property
    def sparse(self) -> bool:
        """Pools the masked-LM head's logits (a vocabulary-wide vector), not the hidden states."""
        return self in (PoolingType.SPLADE_MAX, PoolingType.SPLADE_SUM)


class Activation(str, Enum):
    """What the pooler stage applies to the encoder's pooled output."""

    NORMALIZE = "normalize"  # L2, for embeddings
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"
    IDENTITY = "identity"
    RELU = "relu"  # BGE-M3's lexical weights (vLLM's token_classify for BgeM3EmbeddingModel)


class Truncation(str, Enum):
    """Per-request truncation policy (Cohere's names). NONE rejects over-length input."""

    NONE = "NONE"
    END = "END"  # keep the start, drop the end (sentence-transformers' behaviour)
    START = "START"  # keep the end, drop the start

    @classmethod
    def parse(cls, value: object) -> Truncation:
        """Accepts the documented spellings: true/false, "END"/"START"/"NONE" (any case)."""
        if value is None or value is False:
            return cls.NONE
        if value is True:
            return cls.END
        text = str(value).strip().upper()
        aliases = {"TRUE": "END", "RIGHT": "END", "LEFT": "START", "FALSE": "NONE", "": "NONE"}
        text = aliases.get(text, text)
        try:
            return cls(text)
        except ValueError:
            raise ValueError(
                f"invalid truncate value {value!r}: use one of NONE, END, START (or true/false)"
            ) from None


def default_activation(task: Task, num_labels: int | None = None) -> Activation:
    """Task defaults: embeddings are normalised; classifiers use sigmoid for 1 label, else softmax."""
    if task.is_embedding:
        return Activation.NORMALIZE
    return Activation.SIGMOID if num_labels == 1 else Activation.SOFTMAX
