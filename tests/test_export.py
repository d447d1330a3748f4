"""The export records its measured error, and verification fails loudly on a wrong artefact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pooltriton.defaults import minilm_path
from pooltriton.export.encoder import load_encoder
from pooltriton.export.verify import MEAN_COSINE, MIN_COSINE, TOLERANCE, VerificationError, verify
from pooltriton.resolve import resolve
from pooltriton.tokenization import TextTokenizer

from conftest import REPOSITORY


def test_repository_layout_and_verification_report() -> None:
    for stage in ("minilm", "minilm_tokenizer", "minilm_encoder", "minilm_pooler"):
        assert (REPOSITORY / stage / "config.pbtxt").is_file(), stage
    assert (REPOSITORY / "minilm_encoder" / "1" / "model.onnx").is_file()
    report = json.loads((REPOSITORY / "minilm_encoder" / "verification.json").read_text())
    assert report["passed"] and report["max_abs_error_activated"] <= TOLERANCE
    assert {case["batch"] for case in report["cases"]} >= {1, 4, 16}
    assert max(case["max_tokens"] for case in report["cases"]) == 256
    config = json.loads((REPOSITORY / "minilm" / "pooler_config.json").read_text())
    assert config["pooling_type"] == "MEAN" and config["max_length"] == 256
    encoder_config = (REPOSITORY / "minilm_encoder" / "config.pbtxt").read_text()
    assert 'backend: "openvino"' in encoder_config and "allow_ragged_batch: true" in encoder_config
    assert '"HINT_BF16" value: { string_value: "NO" }' in encoder_config


def test_reduced_precision_export_records_cosine_within_its_bound() -> None:
    report = json.loads((REPOSITORY / "minilm_bf16_encoder" / "verification.json").read_text())
    assert report["precision"] == "bf16" and report["passed"]
    assert report["mean_cosine"] >= MEAN_COSINE and report["min_cosine"] >= MIN_COSINE
    # bf16 really ran: an fp32 graph would agree to ~1e-7, not ~1e-5.
    assert report["mean_cosine"] < 0.999999 and report["max_abs_error_activated"] > 1e-5
    config = (REPOSITORY / "minilm_bf16_encoder" / "config.pbtxt").read_text()
    assert '"HINT_BF16" value: { string_value: "YES" }' in config


def test_export_refuses_a_precision_the_runtime_cannot_serve(tmp_path) -> None:
    from pooltriton.cli import main

    assert main(["export", str(minilm_path()), "--name", "x", "--out", str(tmp_path), "--precision", "bf16"]) == 2
    assert main(["export", str(minilm_path()), "--name", "x", "--out", str(tmp_path), "--runtime", "openvino",
                 "--device", "cuda"]) == 2
    assert not (tmp_path / "x_encoder").exists()


def test_verification_fails_on_a_wrong_export() -> None:
    config = resolve(minilm_path())
    encoder = load_encoder(minilm_path(), config)
    tokenizer = TextTokenizer(str(minilm_path() / "tokenizer.json"), config.max_length)
    import torch

    def slightly_wrong(feeds):
        with torch.no_grad():
            out = encoder(*(torch.from_numpy(feeds[n]) for n in encoder.input_names)).numpy()
        return out + np.float32(1e-3)

    with pytest.raises(VerificationError, match="differs from PyTorch"):
        verify(encoder, slightly_wrong, tokenizer, config, runtime="test")

    def noisy(feeds):  # a reduced-precision export that lost too much (cosine ~0.95)
        out = slightly_wrong(feeds)
        return out + np.random.default_rng(0).normal(0, 0.3 * np.abs(out).mean(), out.shape).astype(np.float32)

    with pytest.raises(VerificationError, match="cosine mean"):
        verify(encoder, noisy, tokenizer, config, runtime="test", precision="bf16")
