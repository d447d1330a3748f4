"""A model folder as transformers and sentence-transformers read it, where its config.json says otherwise.

A config.json that names hub code transformers ports is read as the port (core.resolve.as_transformers_config:
nomic's auto_map left out, Alibaba's `new` GTE written as a GteConfig). Everything that loads the folder (the
encoder, the library's tokenizer, the verification's reference, sentence-transformers' modules) reads
config.json from disk, so the export works on a view of the folder: every file linked as it is, config.json
written as transformers reads it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pooltriton.core.resolve import as_transformers_config


@contextmanager
def transformers_view(model_dir: Path) -> Iterator[Path]:
    """The folder itself where transformers reads its config.json as written, else a linked view (removed after)."""
    config_file = model_dir / "config.json"
    written = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    read = as_transformers_config(written)
    if read is written:
        yield model_dir
        return
    with tempfile.TemporaryDirectory(prefix=f"pooltriton-{model_dir.name}-") as temporary:
        view = Path(temporary)
        for entry in model_dir.iterdir():
            if entry.name != "config.json":
                (view / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
        (view / "config.json").write_text(json.dumps(read, indent=2))
        yield view
