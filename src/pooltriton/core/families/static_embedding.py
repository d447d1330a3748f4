"""sentence-transformers' StaticEmbedding (static-retrieval-mrl, model2vec's potion models): a table of token
vectors averaged over a text's tokens, no special tokens, no attention and no position limit. It has no
transformers config; its folder is described here as one (static_config), under this model type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pooltriton.core.families.family import Config, Family, ResolutionError

MODEL_TYPE = "static_embedding"
# The tokens one text may have: the model has no limit of its own (the library reads any length); --max-length
# sets another.
MAX_LENGTH = 8192
WEIGHTS = ("embedding.weight", "embeddings")  # sentence-transformers' name, model2vec's


def module(root: Path, modules: list[dict[str, Any]] | None) -> Path | None:
    """The folder of a StaticEmbedding that a sentence-transformers pipeline starts with (None: it does not)."""
    first = (modules or [{}])[0]
    if not str(first.get("type", "")).endswith(".StaticEmbedding"):
        return None
    return root / str(first.get("path") or "")


def config(folder: Path) -> Config:
    """A StaticEmbedding's table as a config: its rows and width, read from its safetensors header."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ResolutionError(f"{folder} has no model.safetensors: the StaticEmbedding's table is required in "
                              "safetensors")
    with weights.open("rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    name = next((name for name in WEIGHTS if name in header), None)
    if name is None or len(header[name].get("shape", ())) != 2:
        raise ResolutionError(f"{weights} holds no table of token vectors ({' or '.join(WEIGHTS)})")
    rows, width = header[name]["shape"]
    if "mapping" in header:  # model2vec's vocabulary-quantized table: a row of it per token
        rows = header["mapping"]["shape"][0]
    return {"model_type": MODEL_TYPE, "architectures": ["StaticEmbedding"], "vocab_size": int(rows),
            "hidden_size": int(width)}


FAMILY = Family((MODEL_TYPE,), one_use="embed")
