"""Pooling as torch modules, traced into the exported encoder graph (one class per method).

The sequence poolers reduce [B, L, H] hidden states to [B, H]; the token poolers keep [B, L, H] and
the pooler backend cuts each text to its real tokens (and STEP picks tagged ones).
"""

from __future__ import annotations

import torch
from torch import nn

from pooltriton.core.semantics import PoolingType


class ClsPool(nn.Module):
    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return hidden[:, 0]


class MeanPool(nn.Module):
    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Summed in fp32 also when the encoder runs in bf16/fp16 (a 512-token sum loses digits).
        weights = mask.unsqueeze(-1).to(torch.float32)
        # Same clamp as sentence-transformers, so an all-padding row cannot divide by zero.
        return (hidden.float() * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


class LastPool(nn.Module):
    """Last *real* token, whichever side the padding is on: the highest position whose mask is 1."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
        last = (positions * mask.to(positions.dtype)).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class MaxPool(nn.Module):
    """sentence-transformers' max: padding positions can never win."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.unsqueeze(-1).to(torch.bool)
        return hidden.float().masked_fill(~keep, -1e9).max(dim=1).values


class MeanSqrtLenPool(nn.Module):
    """sentence-transformers' mean_sqrt_len_tokens: the sum over real tokens / sqrt(their count)."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).to(torch.float32)
        return (hidden.float() * weights).sum(1) / torch.sqrt(weights.sum(1).clamp(min=1e-9))


class WeightedMeanPool(nn.Module):
    """sentence-transformers' weightedmean: token i of the text weighs i (from 1, at the first real token)."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = (mask.cumsum(1) * mask).unsqueeze(-1).to(torch.float32)
        return (hidden.float() * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def _splade_weights(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' SpladePooling (activation relu): log1p(relu(MLM logits)), padding zeroed first."""
    return torch.log1p(torch.relu(logits.float() * mask.unsqueeze(-1).to(torch.float32)))


class SpladeMaxPool(nn.Module):
    """SPLADE v2 and later: every weight is >= 0, so a zeroed pad cannot win the max."""

    def forward(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _splade_weights(logits, mask).max(dim=1).values


class SpladeSumPool(nn.Module):
    """The first SPLADE: the sum over the real tokens."""

    def forward(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _splade_weights(logits, mask).sum(dim=1)


class AllPool(nn.Module):
    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return hidden


POOLERS: dict[PoolingType, type[nn.Module]] = {
    PoolingType.CLS: ClsPool,
    PoolingType.MEAN: MeanPool,
    PoolingType.LAST: LastPool,
    PoolingType.ALL: AllPool,
    PoolingType.STEP: AllPool,  # selection by token id happens in the pooler backend
    PoolingType.MAX: MaxPool,
    PoolingType.MEAN_SQRT_LEN: MeanSqrtLenPool,
    PoolingType.WEIGHTED_MEAN: WeightedMeanPool,
    PoolingType.SPLADE_MAX: SpladeMaxPool,  # over the masked-LM head's logits (export.encoder)
    PoolingType.SPLADE_SUM: SpladeSumPool,
}


def get_pooler(pooling_type: PoolingType) -> nn.Module:
    return POOLERS[pooling_type]()
