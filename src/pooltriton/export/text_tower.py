"""Export the text tower of an image-text dual encoder as the text pipeline every text model has:
<name> (TEXT -> EMBEDDING), its tokenizer and encoder stages and a bi-encoder scorer, the encoder being
transformers' own get_text_features and the normalisation (ACTIVATE).

CLIP pools its end-of-text token over the real tokens (the mask is an input); SigLIP was trained on texts
padded to its fixed length and pools the last position, pads included, so its tokenizer stage pads every
text to that length (one bucket) and its encoder takes no mask. Verified as every text encoder is
(export.verify) against transformers' model loaded on its own.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pooltriton.contract import ACTIVATE, ATTENTION_MASK, INPUT_IDS
from pooltriton.contract.config import ModelConfig
from pooltriton.core.resolve import PoolerConfig, read_json
from pooltriton.core.semantics import Activation, PoolingType, Task

# model type -> (its pooling, whether its encoder takes the mask)
TOWERS = {"clip": (PoolingType.LAST, True), "siglip": (PoolingType.LAST, False)}


class TextTower(nn.Module):
    """input_ids and attention_mask ([n, L]), ACTIVATE ([n, 1]) -> the projected text features [n, width]."""

    input_names = (INPUT_IDS, ATTENTION_MASK, ACTIVATE)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def features(self, **inputs: torch.Tensor) -> torch.Tensor:
        features = self.model.get_text_features(**inputs)
        return getattr(features, "pooler_output", features).float()

    def activated(self, vectors: torch.Tensor, activate: torch.Tensor) -> torch.Tensor:
        return torch.where(activate > 0, nn.functional.normalize(vectors, dim=-1), vectors)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        return self.activated(self.features(input_ids=input_ids, attention_mask=attention_mask), extra[0])


class PaddedTextTower(TextTower):
    """SigLIP's: every row padded to the fixed length, every position attended (no mask)."""

    input_names = (INPUT_IDS, ACTIVATE)

    def forward(self, input_ids: torch.Tensor, activate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.activated(self.features(input_ids=input_ids), activate)


def tower_config(model_dir: Path, hf: dict, normalize: bool = True) -> PoolerConfig | None:
    """The text tower's configuration, or None where it cannot be served: no fast tokenizer (tokenizer.json)."""
    if not (model_dir / "tokenizer.json").is_file():
        return None
    pooling, _mask = TOWERS[hf["model_type"]]
    text = hf.get("text_config") or {}
    length = int(text.get("max_position_embeddings") or (64 if hf["model_type"] == "siglip" else 77))
    tokenizer = read_json(model_dir / "tokenizer_config.json") or {}
    limit = tokenizer.get("model_max_length")
    if isinstance(limit, int) and 0 < limit < length:
        length = limit
    return PoolerConfig(task=Task.EMBED, pooling_type=pooling, activation=Activation.NORMALIZE,
                        use_activation=normalize, max_length=length, architecture=(hf.get("architectures") or [""])[0],
                        model_type=hf["model_type"], sources={"pooling_type": "model-family",
                                                              "max_length": "hf-config"})


def load_tower(model_dir: Path, model_type: str, allow_pickle: bool) -> TextTower:
    from pooltriton.export.vision import load_model

    tower = TextTower if TOWERS[model_type][1] else PaddedTextTower
    return tower(load_model(model_dir, allow_pickle, eager=True))


def reference(model_dir: Path, model_type: str, allow_pickle: bool):
    """transformers' own model (its default attention) on each text alone: CLIP's real tokens, SigLIP's
    padded row as its processor pads it."""
    from pooltriton.export.reference import Reference
    from pooltriton.export.vision import load_model

    padded = not TOWERS[model_type][1]

    def compute(module: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        features = module.get_text_features(**inputs)
        return getattr(features, "pooler_output", features)[0]

    class TowerReference(Reference):
        def run(self, feeds: dict[str, np.ndarray], dtype: torch.dtype) -> list[np.ndarray]:
            if not padded:
                return super().run(feeds, dtype)
            module = self._module(dtype)
            with torch.no_grad():
                return [compute(module, {INPUT_IDS: torch.from_numpy(row[None])}).to(torch.float64).numpy()
                        for row in feeds[INPUT_IDS]]

    return TowerReference(lambda: (load_model(model_dir, allow_pickle, eager=False), compute),
                          f"transformers ({model_type}'s get_text_features)")


def export_torchscript(tower: TextTower, path: Path, device: str) -> None:
    """Traced whole: its forward's argument names are the config's inputs (Triton's libtorch binds by them)."""
    from pooltriton.export.encoder import sample_inputs

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(tower.to(device), sample_inputs(tower, device=device), check_trace=False,
                                 strict=False)
    traced.save(str(path))


def padded_to_length(models: list[ModelConfig], tokenizer: str, length: int) -> None:
    """SigLIP: its tokenizer stage pads every text to the fixed length (one bucket)."""
    for model in models:
        if model.name == tokenizer:
            model.parameters["pad_to_buckets"] = json.dumps([length])
