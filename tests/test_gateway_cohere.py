"""Cohere's embed routes (v1, v2) against a fake Triton client (no server)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gateway_fake import WIDTH, FakeClient, served_config, word_tokens

from pooltriton.contract import (
    PROMPT_TOKENS,
    TEXT,
)
from pooltriton.gateway import create_app


def test_matryoshka_cohere_and_classify(http) -> None:
    cut = http.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 2}).json()
    assert np.isclose(np.linalg.norm(cut["data"][0]["embedding"]), 1.0)
    cohere = http.post("/v2/embed", json={"model": "emb", "texts": ["a b", "c"]}).json()
    assert cohere["meta"]["billed_units"]["input_tokens"] == word_tokens("a b") + word_tokens("c")
    classified = http.post("/classify", json={"model": "cls", "input": ["abc"]}).json()
    assert classified["data"][0]["label"] == "yes" and classified["usage"]["prompt_tokens"] == word_tokens("abc")


def test_cohere_v1_embed_answers_plain_floats_unless_types_are_asked(http, fake) -> None:
    floats = http.post("/v1/embed", json={"model": "emb", "texts": ["abc"], "input_type": "search_query"}).json()
    assert floats["response_type"] == "embeddings_floats" and floats["embeddings"] == [[3, 4, 5, 6]]
    assert floats["meta"]["api_version"] == {"version": "1"} and fake.requests[-1].parameters["prompt_name"] == "query"
    body = {"model": "emb", "texts": ["abc"], "embedding_types": ["float", "base64"]}
    typed = http.post("/v1/embed", json=body).json()
    assert typed["response_type"] == "embeddings_by_type" and set(typed["embeddings"]) == {"float", "base64"}


def test_a_size_the_model_cannot_give_is_refused_before_it_runs(http, fake) -> None:
    """The ensemble's output dims say the width: an undeclared Matryoshka size, or a binary type over a
    width not divisible by 8, costs no inference; Cohere's errors name Cohere's field."""
    sent = len(fake.requests)
    wrong = http.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 3}).json()["error"]
    assert wrong["message"] == "model 'emb' does not support 3 dimensions: it has 4 and declares only [2]"
    assert wrong["param"] == "dimensions"
    cohere = http.post("/v2/embed", json={"model": "emb", "texts": ["a"], "output_dimension": 3,
                                          "embedding_types": ["ubinary"]})  # the size is the error to report
    assert cohere.status_code == 400 and cohere.json()["error"]["param"] == "output_dimension"
    packed = http.post("/v2/embed", json={"model": "emb", "texts": ["a"], "output_dimension": 2,
                                          "embedding_types": ["float", "ubinary"]})
    assert packed.status_code == 400 and "the dimension 2 is not divisible by 8" in packed.json()["error"]["message"]
    assert len(fake.requests) == sent
    full = http.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": WIDTH})
    assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == WIDTH


def test_cohere_int8_is_refused_for_a_model_whose_embeddings_are_not_unit_vectors() -> None:
    """int8/uint8 scale by 127 (unit vectors); a raw model's components (here 1-7) would all clip to 127.
    Refused before it runs; float still serves (and the sign bits of binary would: the fake is 4 wide)."""
    fake = FakeClient()
    fake.server.configs["raw"] = served_config("raw", "embed", ["EMBEDDING", PROMPT_TOKENS], use_activation=False)
    with TestClient(create_app("unused:0", client=fake)) as http:
        for kind in ("int8", "uint8"):
            refused = http.post("/v2/embed", json={"model": "raw", "texts": ["abc"],
                                                   "embedding_types": ["float", kind]})
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == "embedding_types"
            assert f"embedding type {kind} scales unit-length vectors" in refused.json()["error"]["message"]
        assert not fake.requests
        served = http.post("/v2/embed", json={"model": "raw", "texts": ["abc"], "embedding_types": ["float"]})
        assert served.status_code == 200 and served.json()["embeddings"]["float"] == [[3, 4, 5, 6]]
        # a normalised model's int8 still serves
        normalised = http.post("/v2/embed", json={"model": "emb", "texts": ["a"], "embedding_types": ["int8"]})
        assert normalised.status_code == 200


def test_cohere_input_type_max_tokens_and_priority_reach_triton(http, fake) -> None:
    http.post("/v2/embed", json={"model": "emb", "texts": ["x"], "input_type": "search_query", "truncate": "START",
                                 "max_tokens": 5, "priority": -3})
    request = fake.requests[-1]
    assert request.parameters == {"truncate": "START", "max_tokens": 5, "prompt_name": "query"}
    assert request.priority == 1
    http.post("/v2/embed", json={"model": "emb", "texts": ["x"], "input_type": "document"})
    assert fake.requests[-1].parameters["prompt_name"] == "document"
    # A type the model has no prompt for is not used (Cohere's SDKs send one on every call).
    http.post("/v2/embed", json={"model": "emb", "texts": ["x"], "input_type": "clustering"})
    assert "prompt_name" not in fake.requests[-1].parameters
    http.post("/v2/embed", json={"model": "emb", "texts": ["x"], "truncate": "NONE", "max_tokens": 5})
    assert fake.requests[-1].parameters == {"max_tokens": 5}  # over 5 tokens refused by the tokenizer stage


def test_cohere_v2_inputs_of_text_embed_as_texts_and_images_are_refused(http, fake) -> None:
    """Cohere v2's `inputs` (its SDK's EmbedInput of a TextEmbedContent) embed as the same `texts` would; an
    image, or an input of several parts, is a 400 before anything is sent."""
    texts = http.post("/v2/embed", json={"model": "emb", "texts": ["ab", "abcd"]}).json()
    body = {"model": "emb", "inputs": [{"content": [{"type": "text", "text": t}]} for t in ("ab", "abcd")]}
    inputs = http.post("/v2/embed", json=body)
    assert inputs.status_code == 200, inputs.text
    assert inputs.json()["embeddings"] == texts["embeddings"] and inputs.json()["texts"] == ["ab", "abcd"]
    assert fake.requests[-1].inputs[TEXT] == ["ab", "abcd"]
    sent = len(fake.requests)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for refused in ({"model": "emb", "inputs": [{"content": [image]}]},
                    {"model": "emb", "inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                           "text": "b"}]}]},
                    {"model": "emb", "images": ["data:image/png;base64,AAAA"]},
                    {"model": "emb", "texts": ["a"], "inputs": body["inputs"]}, {"model": "emb"}):
        answer = http.post("/v2/embed", json=refused)
        assert answer.status_code == 400, (refused, answer.text)
    assert len(fake.requests) == sent


def test_cohere_binary_types_pack_non_negative_components_as_ones() -> None:
    from pooltriton.gateway.cohere.serving import encode as cohere_encode
    from pooltriton.gateway.errors import APIError

    vectors = np.array([[0.0, -0.5, 0.25, -0.0, 1.0, -1.0, 0.0, 0.1]], dtype=np.float32)
    assert cohere_encode(vectors, "ubinary") == [[0b10111011]]
    assert cohere_encode(vectors, "binary") == [[0b10111011 - 128]]
    with pytest.raises(APIError, match="not divisible by 8"):
        cohere_encode(vectors[:, :6], "binary")
