"""A cache of exported ONNX graphs, used where POOLTRITON_GRAPH_CACHE names a folder.

The same encoder (weights, transformers config, resolved pooler configuration) traced by the same code
gives the same graph, so a second export of it, for another runtime, name, precision or instance count,
copies the file instead of tracing again (~10 s for a tiny model on 2 cores, minutes for a large one).
Verification still runs on every copy: a wrong hit could not pass unseen. Entries are never evicted:
the folder is the operator's (the test suite uses one per session).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pooltriton.core.resolve import PoolerConfig
    from pooltriton.export.encoder import PoolingEncoder

CACHE_ENV = "POOLTRITON_GRAPH_CACHE"
PACKAGE = Path(__file__).resolve().parent.parent
LAYERS = ("core", "contract", "export")  # the code an export depends on


def code_digest(digest: hashlib._Hash) -> hashlib._Hash:
    """`digest` updated with the source of every layer an export runs."""
    for folder in LAYERS:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            digest.update(path.read_bytes())
    return digest


def cache_dir() -> Path | None:
    folder = os.environ.get(CACHE_ENV)
    return Path(folder) if folder else None


def graph_key(encoder: PoolingEncoder, config: PoolerConfig, path_name: str) -> str:
    """What the traced graph depends on: code, library versions, structure, configs and every weight."""
    import torch
    import transformers

    digest = code_digest(hashlib.sha256())
    described = [torch.__version__, transformers.__version__, path_name, list(encoder.input_names),
                 repr(encoder), _described(encoder.config), asdict(config)]  # the config has max_length
    digest.update(json.dumps(described, sort_keys=True, default=str).encode())
    for name, tensor in encoder.state_dict().items():
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def restore(key: str, path: Path) -> bool:
    """Copy the cached graph of `key` (and its external data) beside `path`; False on a miss."""
    folder = cache_dir()
    entry = folder / key if folder else None
    if entry is None or not entry.is_dir():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    for file in entry.iterdir():
        shutil.copyfile(file, path.parent / file.name)
    print(f"graph cache: {path.name} copied from {entry}", file=sys.stderr)
    return True


def store(key: str, path: Path) -> None:
    """Keep the graph at `path` (and its external data) as `key`'s: written aside, then renamed in whole,
    so exports running together never see half an entry."""
    folder = cache_dir()
    if folder is None or (folder / key).is_dir():
        return
    folder.mkdir(parents=True, exist_ok=True)
    incoming = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder))
    for file in path.parent.iterdir():
        if file.name.startswith(path.name):  # model.onnx and its external data (model.onnx.data)
            shutil.copyfile(file, incoming / file.name)
    try:
        incoming.rename(folder / key)
    except OSError:  # another export stored it first
        shutil.rmtree(incoming, ignore_errors=True)


def _described(model_config) -> str:
    """A transformers config as its JSON; a static embedding's bare namespace of shapes as its fields."""
    to_json = getattr(model_config, "to_json_string", None)
    return to_json() if to_json is not None else json.dumps(vars(model_config), sort_keys=True, default=str)
