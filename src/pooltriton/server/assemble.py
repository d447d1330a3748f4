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


# A tritonserver of the image's own (the NGC image's /opt/tritonserver/bin/tritonserver) instead of
# the wheel's: `pooltriton serve` then supervises the native server the same way.
SERVER_ENV = "POOLTRITON_TRITONSERVER"


def server_binary() -> Path:
    import os

    own = os.environ.get(SERVER_ENV)
    return Path(own) if own else triton_home() / "bin" / "tritonserver"


def backend_names() -> list[str]:
    return sorted(p.parent.name for p in SOURCE.glob("*/model.py"))


def _copy(source: Path, target: Path) -> None:
    """Copy unless identical: re-running reuses what is already there."""
    if target.exists() and filecmp.cmp(source, target, shallow=False):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def native_backends() -> set[str]:
    """The encoder runtimes' backends, which the NGC image has as native C++ backends."""
    from pooltriton.core.runtimes import RUNTIMES

    return {runtime.backend for runtime in RUNTIMES.values()}


def assemble(out: Path, native: bool = False) -> Path:
    """native=True: for an image with Triton's own python and encoder backends (the NGC image): only
    our Python-based backends (tokenizer, pooler, scorer, plugin), next to the native ones in `out`."""
    if native:
        for name in sorted(set(backend_names()) - native_backends()):
            _copy(SOURCE / name / "model.py", out / name / "model.py")
        return out.resolve()
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
