"""What the export must know of one model family beyond its transformers config: one `Family` per module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]


class ResolutionError(ValueError):
    """The model cannot serve what was asked; raised at export, never a silent fallback."""


@dataclass(frozen=True)
class Family:
    """A model family, found by `model_type` (core.families.family_of)."""

    model_types: tuple[str, ...]
    # Exported, served and compared with transformers / sentence-transformers by the test matrix
    # (docs/models.md); a family known only for its facts is refused at export, by name.
    supported: bool = True
    decoder: bool = False  # causal mask and LAST pooling by default
    cls_default: bool = False  # an encoder that pools the first token by default (vLLM's overrides)
    self_pooling_head: bool = False  # its classification head takes the first token itself: run whole
    position_offset: bool = False  # position ids start after the padding index (RoBERTa's)
    plain_mask: bool = False  # its attention builds its own masks from the 0/1 mask
    text_encoder: bool = False  # an encoder-decoder whose embeddings come from the encoder alone
    fp16_overflow: bool = False  # activations overflow fp16 (GPU auto precision runs fp32)
    bidirectional_flag: bool = False  # transformers builds its masks from `use_bidirectional_attention`
    one_use: str | None = None  # the one task the matrix proves it for (export.refusals.check_supported)
    # Hub code that transformers ports as this family, and the model types a config naming it may say.
    ported_code: str | None = None
    ported_types: tuple[str, ...] = ()
    read_config: Callable[[Config], Config] | None = None  # a ported config as transformers reads it
    unread_keys: Callable[[Config], list[str]] | None = None  # keys that change the math, unread by the port
    own_positions: bool = False  # position_embedding_type is its own (not BERT's absolute/relative)
    vision: bool = False  # takes images: its image tower is exported by export.vision (if supported)


def unread_against(hf: Config, table: dict[str, tuple[str | None, Any]],
                   as_read: Callable[[str, Any], Any] = lambda key, value: value) -> list[str]:
    """`key=value (computed with ...)` for each key of `table` whose value differs from what the port
    computes with: another key of the config (and its default there) or a constant."""
    unread = []
    for key, (read_as, default) in table.items():
        if key not in hf:
            continue
        used = computed_with(hf, read_as, default) if read_as else default
        if as_read(key, hf[key]) != used:
            unread.append(f"{key}={hf[key]!r} (computed with {f'{read_as}=' if read_as else ''}{used!r})")
    return unread


def computed_with(hf: Config, key: str, default: Any) -> Any:
    if key == "rope_theta":  # transformers 5 reads it from rope_parameters, or the legacy top-level key
        return (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", default))
    return hf.get(key, default)
