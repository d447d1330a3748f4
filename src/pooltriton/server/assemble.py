"""Assemble the directory Triton loads backends from (`--backend-directory`).

    <out>/python/        libtriton_python.so, triton_python_backend_utils.py, the stub (real copies:
                         Triton refuses symlinks that leave the backend directory)
    <out>/<name>/model.py  one Python-based backend per folder of backends/ (tokenizer, pooler,
                         onnxruntime shim, ...); configs name them with `backend: "<name>"`.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
from pathlib import Path

# The Python-based backends ship as package data of pooltriton.backends (a wheel has them too).
SOURCE = Path(__file__).resolve().parent.parent / "backends"


def triton_home() -> Path:
    """The Triton 2.51 server shipped inside the nvidia-pytriton wheel."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed: it provides the tritonserver binary")
    return Path(spec.submodule_search_locations[0]) / "tritonserver"


def backend_names() -> list[str]:
    return sorted(p.parent.name for p in SOURCE.glob("*/model.py"))


def _copy(source: Path, target: Path) -> None:
    """Copy unless identical: re-running reuses what is already there."""
    if target.exists() and filecmp.cmp(source, target, shallow=False):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def assemble(out: Path) -> Path:
    home = triton_home()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = home / "backends" / "python"
    _copy(python / "libtriton_python.so", out / "python" / "libtriton_python.so")
    _copy(python / "triton_python_backend_utils.py", out / "python" / "triton_python_backend_utils.py")
    _copy(home / "python_backend_stubs" / version / "triton_python_backend_stub",
          out / "python" / "triton_python_backend_stub")
    for name in backend_names():
        _copy(SOURCE / name / "model.py", out / name / "model.py")
    return out.resolve()
