"""The model families, one module each, found by `model_type` (family_of). Adding a family: a module with
its `Family` and a line in FAMILIES (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable

from pooltriton.core.families import (
    bart,
    bert,
    clip,
    deberta,
    decoders,
    gte,
    modernbert,
    nomic_bert,
    roberta,
    static_embedding,
    t5,
)
from pooltriton.core.families.family import Config, Family, ResolutionError

__all__ = ["FAMILIES", "Config", "Family", "ResolutionError", "family_of", "model_types", "ported"]

FAMILIES: tuple[Family, ...] = (
    bert.FAMILY, roberta.FAMILY, deberta.FAMILY, deberta.FIRST, modernbert.FAMILY, nomic_bert.FAMILY, gte.FAMILY,
    bart.FAMILY, t5.FAMILY, decoders.GPT2, decoders.QWEN, decoders.LLAMA, decoders.MISTRAL, decoders.GEMMA,
    decoders.GEMMA3, decoders.GEMMA3_MULTIMODAL, decoders.UNPROVEN, static_embedding.FAMILY, clip.CLIP, clip.SIGLIP,
    clip.MULTIMODAL_UNSUPPORTED,
)
_BY_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_UNKNOWN = Family((), supported=False)


def family_of(model_type: str | None) -> Family:
    """The family of a model type; an unknown type's is unsupported and has no facts."""
    return _BY_TYPE.get(model_type or "", _UNKNOWN)


def model_types(which: Callable[[Family], object]) -> frozenset[str]:
    """The model types of the families `which` holds for."""
    return frozenset(model_type for family in FAMILIES if which(family) for model_type in family.model_types)


def ported(prefix_of: Callable[[str], bool]) -> Family | None:
    """The family whose hub code an auto_map entry names (prefix_of: whether a code prefix matches)."""
    return next((family for family in FAMILIES if family.ported_code and prefix_of(family.ported_code)), None)
