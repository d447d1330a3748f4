"""A model folder as transformers and sentence-transformers read it, where its config.json says otherwise.

A config.json that names hub code transformers ports is read as the port (core.resolve.as_transformers_config:
nomic's auto_map left out, Alibaba's `new` GTE written as a GteConfig). Everything that loads the folder (the
encoder, the library's tokenizer, the verification's reference, sentence-transformers' modules) reads
config.json from disk, so the export works on a view of the folder: every file linked as it is, config.json
written as transformers reads it. A sentence-transformers StaticEmbedding has no transformers config: its view
has core.resolve.static_config's description as config.json, and its module's tokenizer.json at the top where
the module sits in a folder of its own (0_StaticEmbedding, as sentence-transformers 3 saved it).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pooltriton.core.resolve import model_config, static_module


@contextmanager
def transformers_view(model_dir: Path) -> Iterator[Path]:
    """The folder itself where transformers reads its config.json as written, else a linked view (removed after)."""
    config_file = model_dir / "config.json"
    written = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
    read = model_config(model_dir)
    if read is None or read == written:
        yield model_dir
        return
    modules_file = model_dir / "modules.json"
    static = static_module(model_dir, json.loads(modules_file.read_text()) if modules_file.is_file() else None)
    with tempfile.TemporaryDirectory(prefix=f"pooltriton-{model_dir.name}-") as temporary:
        view = Path(temporary)
        for entry in model_dir.iterdir():
            if entry.name != "config.json":
                (view / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
        (view / "config.json").write_text(json.dumps(read, indent=2))
        if static is not None and not (view / "tokenizer.json").exists():
            (view / "tokenizer.json").symlink_to((static / "tokenizer.json").resolve())
        yield view
