"""`pooltriton serve MODEL_DIR`: a sentence-transformers folder exported and served in one step,
as `vllm serve ./my-model` does, its /v1/embeddings equal to sentence-transformers; a second start reuses
the export (its stamp) instead of exporting again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from tiny_models import build_st

from pooltriton.cli import served_name

from conftest import free_port

TEXTS = ["A man is eating food.", "hello", "one two three four five six seven"]


def _serve_once(model: Path, work: Path, log: Path) -> np.ndarray:
    """Start `pooltriton serve MODEL_DIR` in `work`, embed TEXTS through the gateway, stop it (SIGTERM)."""
    http, grpc, metrics, gateway = (free_port() for _ in range(4))
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "pooltriton.cli", "serve", str(model), "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--gateway-port", str(gateway),
             "--canary-interval-s", "0"],
            cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:  # the export, then Triton and the gateway starting: poll until it answers
            try:
                answer = httpx.post(f"http://127.0.0.1:{gateway}/v1/embeddings", timeout=30,
                                    json={"model": served_name(str(model)), "input": TEXTS})
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)
    assert server.returncode == 0, log.read_text()[-3000:]
    return np.array([item["embedding"] for item in answer.json()["data"]], dtype=np.float32)


@pytest.mark.server
def test_serve_exports_a_folder_then_serves_it_and_a_second_start_reuses_the_export(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = build_st(tmp_path / "models", "bert", "mean")
    reference = SentenceTransformer(str(model), device="cpu").encode(TEXTS, normalize_embeddings=True)
    work = tmp_path / "work"
    work.mkdir()
    first = _serve_once(model, work, tmp_path / "first.log")
    assert np.abs(first - reference).max() <= 1e-5
    name = served_name(str(model))
    assert name == "st_bert_mean_plain_norm"
    stamp = work / "model_repository" / name / "export_stamp.json"
    exported = stamp.stat().st_mtime_ns
    second = _serve_once(model, work, tmp_path / "second.log")
    assert f"{name}: up to date" in (tmp_path / "second.log").read_text()
    assert stamp.stat().st_mtime_ns == exported
    assert np.abs(second - reference).max() <= 1e-5
