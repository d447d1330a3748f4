"""Served MiniLM embeddings equal sentence-transformers' on the same weights, over HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest

from pooltriton.core.capabilities import detect

from corpus import texts_by_token_length, varied_texts

COSINE_MIN = 0.99999
MAX_ABS = 1e-5


@pytest.fixture(scope="module")
def texts(minilm_st) -> list[str]:
    tokens = minilm_st.tokenizer
    texts = texts_by_token_length(220, lambda w: len(tokens(w, add_special_tokens=False)["input_ids"]))
    lengths = [len(tokens(t)["input_ids"]) for t in texts]
    assert min(lengths) <= 4 and 240 <= max(lengths) <= 250, (min(lengths), max(lengths))
    return texts


def assert_close(served: np.ndarray, reference: np.ndarray) -> None:
    assert served.shape == reference.shape and served.dtype == np.float32
    cosine = np.sum(served * reference, axis=1) / (
        np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() >= COSINE_MIN, f"min cosine {cosine.min():.8f} at text {int(cosine.argmin())}"
    assert np.abs(served - reference).max() <= MAX_ABS, f"max |Δ| {np.abs(served - reference).max():.3g}"


def test_embeddings_equal_sentence_transformers(client, minilm_st, texts) -> None:
    reference = minilm_st.encode(texts, normalize_embeddings=True, batch_size=32, convert_to_numpy=True)
    served = client.embed(texts)
    assert_close(served, reference)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


def test_known_reference_values(client) -> None:
    """MiniLM's published behaviour (shared/MODELS.md): first values and a known cosine."""
    vectors = client.embed(["A man is eating food.", "A man is eating a piece of bread."])
    np.testing.assert_allclose(vectors[0, :5], [0.0332, 0.0044, -0.0063, 0.0484, -0.1387], atol=1e-4)
    assert abs(float(vectors[0] @ vectors[1]) - 0.755) < 1e-3


def test_one_request_many_texts_keeps_order(client) -> None:
    texts = varied_texts(300, seed=7, max_words=30)  # > max_batch: the client splits and reassembles
    together = client.embed(texts)
    alone = np.stack([client.embed(t)[0] for t in texts[:5] + texts[-5:]])
    np.testing.assert_allclose(together[list(range(5)) + list(range(295, 300))], alone, atol=1e-5)


def test_use_activation_false_returns_unnormalised_mean(client, minilm_st) -> None:
    raw = client.embed(["A man is eating food."], use_activation=False)
    reference = minilm_st.encode(["A man is eating food."], normalize_embeddings=False)
    # ST's pipeline includes its Normalize module, so compare directions and check the norm is raw.
    assert np.linalg.norm(raw) > 1.5
    assert_close(raw / np.linalg.norm(raw), reference / np.linalg.norm(reference))


@pytest.mark.skipif(not detect().bf16, reason="this CPU has no AVX512-BF16/AMX, so minilm_bf16 is not exported "
                    "here (test_capabilities covers that branch)")
def test_bf16_export_meets_the_reduced_precision_bound(grpc_client, minilm_st, texts) -> None:
    """minilm_bf16 (OpenVINO bf16) against fp32 sentence-transformers, on the benchmark corpus and
    this file's unicode-heavy texts: the bound is mean cosine >= 0.995, min >= 0.98."""
    from bench.bench import corpus

    for sample in (corpus(400), texts):
        reference = minilm_st.encode(sample, normalize_embeddings=True, batch_size=32, convert_to_numpy=True)
        served = grpc_client.embed(sample, model="minilm_bf16")
        cosine = np.sum(served * reference, axis=1)
        assert cosine.mean() >= 0.995 and cosine.min() >= 0.98, (cosine.mean(), cosine.min())
        assert cosine.mean() < 0.999999  # really bf16: fp32 agrees to ~1e-7


@pytest.mark.skipif(not detect().vnni, reason="this CPU has no VNNI/AMX, so minilm_int8 is not exported "
                    "here (test_capabilities covers that branch)")
def test_int8_export_meets_its_bound_served(grpc_client, minilm_st, texts) -> None:
    """minilm_int8 as served, against fp32 sentence-transformers, on the benchmark corpus and this
    file's unicode-heavy texts (neither is what its accuracy control or verification measured):
    the bound is mean cosine >= 0.999, min >= 0.995."""
    from bench.bench import corpus

    for sample in (corpus(400), texts):
        reference = minilm_st.encode(sample, normalize_embeddings=True, batch_size=32, convert_to_numpy=True)
        served = grpc_client.embed(sample, model="minilm_int8")
        cosine = np.sum(served * reference, axis=1)
        assert cosine.mean() >= 0.999 and cosine.min() >= 0.995, (cosine.mean(), cosine.min())
        assert cosine.mean() < 0.99999  # really quantized
