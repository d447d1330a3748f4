"""The package as a user gets it: `python -m build` makes a wheel, a fresh venv installs it (not
editable), and `pooltriton export`, `pooltriton serve` and the client work from there, with every output
under the working directory and nothing read from this source tree."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build

from pooltriton.client import PoolingClient

from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def _run(command: list[str], cwd: Path, timeout: int = 300) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


@pytest.mark.server
def test_the_built_wheel_exports_and_serves_from_a_fresh_venv(tmp_path: Path) -> None:
    source, dist = tmp_path / "source", tmp_path / "dist"  # a copy: building leaves nothing in the tree
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)], tmp_path)
    wheel = next(dist.glob("pooltriton-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)], tmp_path)
    # Third-party dependencies come from this environment's site-packages as a plain path entry: its
    # .pth files (the editable pooltriton) are not processed there, so pooltriton is the wheel's.
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
                .strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    where = _run([str(python), "-c", "import pooltriton; print(pooltriton.__file__)"], work).strip()
    assert where.startswith(str(site)), where

    model = build(tmp_path / "models", "bert", "embed", sentence_transformers_pooling="mean_tokens")
    _run([str(bin_dir / "pooltriton"), "export", str(model), "--name", "tiny", "--runtime", "openvino"], work)
    assert (work / "model_repository" / "tiny_encoder" / "verification.json").is_file()
    ports = [free_port() for _ in range(3)]
    server = subprocess.Popen(
        [str(bin_dir / "pooltriton"), "serve", "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
         "--metrics-port", str(ports[2]), "--gateway-port", "0"],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    try:
        with PoolingClient(f"localhost:{ports[0]}", protocol="http", model="tiny") as client:
            deadline = time.monotonic() + 180
            while True:
                try:
                    vectors = client.embed(["one two three", "query"])
                    break
                except Exception:
                    assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()[-3000:]
                    time.sleep(1)
        assert vectors.shape == (2, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert (work / "build" / "backends" / "tokenizer" / "model.py").is_file()  # assembled from the wheel
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=60)[0]
    assert server.returncode == 0, output[-3000:]
