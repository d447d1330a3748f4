"""OpenAI's and vLLM's routes against a fake Triton client (no server): what each sends through the one
request layer, and how answers, usage and errors come back. The live-server tests are test_gateway.py."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gateway_fake import served_config, word_tokens

from pooltriton.contract import (
    MAX_BATCH_SIZE,
    PROMPT_TOKENS,
    TEXT,
    stages,
)
from pooltriton.gateway import create_app
from pooltriton.gateway.serving import base64_vector


def test_embeddings_are_chunked_reassembled_in_order_with_served_usage(http, fake) -> None:
    texts = [f"text number {i}" for i in range(300)]
    body = http.post("/v1/embeddings", json={"model": "emb", "input": texts}).json()
    assert [len(r.inputs[TEXT]) for r in fake.requests] == [MAX_BATCH_SIZE, MAX_BATCH_SIZE, 300 - 2 * MAX_BATCH_SIZE]
    assert [d["embedding"][0] for d in body["data"]] == [float(len(t)) for t in texts]
    tokens = sum(map(word_tokens, texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert all(r.batched and r.model == "emb" for r in fake.requests)


# Triton's levels: 1 asked high, 2 a short request at the default (ahead of long batches), 0 the model's
# default level (3) for a long one, 4 asked low.
@pytest.mark.parametrize(("priority", "text", "level"), [(-5, "x", 1), (0, "x", 2), (0, "x " * 1500, 0),
                                                         (7, "x", 4), (7, "x " * 1500, 4)])
def test_priority_and_truncation_reach_triton(http, fake, priority: int, text: str, level: int) -> None:
    http.post("/v1/embeddings", json={"model": "emb", "input": text, "priority": priority, "truncate_prompt_tokens": 5})
    request = fake.requests[-1]
    assert request.priority == level and request.parameters == {"truncate": "END", "max_tokens": 5}


def test_rerank_and_score_carry_documents_and_usage(http, fake) -> None:
    documents = ["a long document", "short", "mid doc"]
    body = http.post("/rerank", json={"model": "emb", "query": "q", "documents": documents}).json()
    assert [r["document"]["text"] for r in body["results"]] == ["short", "mid doc", "a long document"]
    assert body["usage"]["prompt_tokens"] == sum(map(word_tokens, ["q", *documents]))
    assert fake.requests[-1].model == stages("emb").score and not fake.requests[-1].batched
    objects = http.post("/v1/rerank", json={"model": "emb", "query": "q", "documents": [{"text": "short"}, "mid doc"]})
    assert [r["document"]["text"] for r in objects.json()["results"]] == ["short", "mid doc"]  # Cohere v1's objects
    bare = http.post("/v2/rerank", json={"model": "emb", "query": "q", "documents": documents, "top_n": 1,
                                         "return_documents": False}).json()
    assert len(bare["results"]) == 1 and "document" not in bare["results"][0]
    # text-embeddings-inference's body on the same path (texts), answered in its shape
    tei = http.post("/rerank", json={"model": "emb", "query": "q", "texts": documents, "return_text": True,
                                     "truncate": False}).json()
    assert [(r["index"], r["text"]) for r in tei] == [(1, "short"), (2, "mid doc"), (0, "a long document")]
    assert np.allclose([r["score"] for r in tei], [1 / 6, 1 / 8, 1 / 16]) and set(tei[0]) == {"index", "score", "text"}
    assert fake.requests[-1].parameters == {"use_activation": True}
    raw = http.post("/rerank", json={"model": "emb", "query": "q", "texts": documents, "raw_scores": True}).json()
    assert "text" not in raw[0] and fake.requests[-1].parameters == {"use_activation": False, "truncate": "END"}
    both = http.post("/rerank", json={"model": "emb", "query": "q", "texts": documents, "documents": documents})
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
    scored = http.post("/score", json={"model": "emb", "text_1": "q", "text_2": documents}).json()
    assert len(scored["data"]) == 3 and scored["usage"]["prompt_tokens"] > 0
    assert http.post("/score", json={"model": "cls", "text_1": "q", "text_2": "d"}).status_code == 400


def test_score_and_rerank_pass_vllms_per_side_token_limits_to_the_scorer(http, fake) -> None:
    """max_tokens_per_query / max_tokens_per_doc reach the scorer stage (which cuts each side to its first
    tokens); truncation_side is truncate_prompt_tokens' side, not theirs (vLLM); 0 is no cut (nothing sent), a
    negative limit is refused before anything is sent."""
    body = {"model": "emb", "query": "q", "documents": ["a b c"], "max_tokens_per_doc": 2}
    assert http.post("/v2/rerank", json=body).status_code == 200
    assert fake.requests[-1].parameters == {"max_tokens_per_doc": 2}
    left = http.post("/score", json={"model": "emb", "queries": "q", "documents": ["d"], "max_tokens_per_query": 3,
                                     "max_tokens_per_doc": 0, "truncation_side": "left"})
    assert left.status_code == 200 and fake.requests[-1].parameters == {"max_tokens_per_query": 3}
    assert http.post("/rerank", json={**body, "max_tokens_per_doc": 0}).status_code == 200
    assert fake.requests[-1].parameters == {}
    tei = http.post("/rerank", json={"model": "emb", "query": "q", "texts": ["a b c"], "max_tokens_per_doc": 2})
    assert tei.status_code == 200 and fake.requests[-1].parameters == {"truncate": "END", "use_activation": True,
                                                                        "max_tokens_per_doc": 2}
    sent = len(fake.requests)
    refused = http.post("/rerank", json={**body, "max_tokens_per_doc": -1})
    assert refused.status_code == 400 and "max_tokens_per_doc" in refused.text and len(fake.requests) == sent


def test_tokenize_returns_token_strings_without_the_prompt_when_asked_as_vllm(http, fake) -> None:
    plain = http.post("/tokenize", json={"model": "emb", "prompt": "héllo wörld"}).json()
    assert plain["token_strs"] is None and fake.requests[-1].parameters["mode"] == "tokenize"
    strings = http.post("/tokenize", json={"model": "emb", "prompt": "héllo wörld", "return_token_strs": True}).json()
    assert strings["token_strs"] == ["[CLS]", "héllo", "wörld", "[SEP]"] and strings["count"] == 4
    assert fake.requests[-1].parameters == {"mode": "pieces", "add_special_tokens": True, "with_prompt": False}


def test_tokenize_and_detokenize_go_to_the_tokenizer_stage(http, fake) -> None:
    tokens = http.post("/tokenize", json={"model": "emb", "prompt": "hello world"}).json()
    assert tokens == {"tokens": [101, 7, 8, 102], "count": 4, "max_model_len": 16, "token_strs": None}
    request = fake.requests[-1]
    assert request.model == stages("emb").tokenizer and request.parameters["mode"] == "tokenize"
    plain = http.post("/tokenize", json={"model": "emb", "prompt": "hello world", "add_special_tokens": False})
    assert plain.json()["tokens"] == [7, 8]
    text = http.post("/detokenize", json={"model": "emb", "tokens": [7, 8]}).json()
    assert text == {"prompt": "t7 t8"} and fake.requests[-1].parameters == {"mode": "detokenize",
                                                                            "skip_special_tokens": False}


def test_embedding_routes_serve_only_embedding_models(http, fake) -> None:
    """A classifier's probabilities are not embeddings: 400 naming the route that serves it (vLLM's answer)."""
    for path, body in (("/v1/embeddings", {"model": "cls", "input": "x"}),
                       ("/v2/embed", {"model": "cls", "texts": ["x"]})):
        response = http.post(path, json=body)
        message = response.json()["error"]["message"]
        assert response.status_code == 400 and "serves task 'classify', not 'embed'" in message
        assert "use /classify" in message
    assert not fake.requests


def test_invalid_bodies_are_400_in_the_openai_shape_and_documented_so(http) -> None:
    response = http.post("/v1/embeddings", json={"model": "emb", "input": 5})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    spec = http.get("/openapi.json").json()
    responses = spec["paths"]["/v1/embeddings"]["post"]["responses"]
    assert "422" not in responses and responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorResponse")


def test_rerank_top_n_zero_means_every_document(http) -> None:
    body = http.post("/rerank", json={"model": "emb", "query": "q", "documents": ["a", "bb", "c"], "top_n": 0}).json()
    assert len(body["results"]) == 3


def test_a_cut_vector_is_renormalised_only_where_the_answer_was_activated(http, fake) -> None:
    raw = http.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 2,
                                            "use_activation": False}).json()["data"][0]["embedding"]
    assert raw == [2.0, 3.0]  # the fake's first two values, as served
    fake.server.configs["emb"] = served_config("emb", "embed", ["EMBEDDING", PROMPT_TOKENS], matryoshka_dimensions=[2],
                                         use_activation=False)  # a sentence-transformers model without Normalize
    with TestClient(create_app("unused:0", client=fake)) as client:
        cut = client.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 2}).json()
    assert cut["data"][0]["embedding"] == [2.0, 3.0]
    # Exported before the config said: raw vectors (these) stay raw when cut.
    fake.server.configs["emb"] = served_config("emb", "embed", ["EMBEDDING", PROMPT_TOKENS], matryoshka_dimensions=[2])
    with TestClient(create_app("unused:0", client=fake)) as client:
        cut = client.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 2}).json()
    assert cut["data"][0]["embedding"] == [2.0, 3.0]


def test_classify_and_pooling_take_token_ids_and_pooling_checks_its_task(http, fake) -> None:
    http.post("/classify", json={"model": "cls", "input": [[7, 8], [9]]})
    assert fake.requests[-1].parameters == {"input_format": "token_ids"} and fake.requests[-1].inputs[TEXT] == [
        "[7, 8]", "[9]"]
    pooled = http.post("/pooling", json={"model": "emb", "input": [5, 6], "task": "embed"})
    assert pooled.status_code == 200 and fake.requests[-1].parameters == {"input_format": "token_ids"}
    wrong = http.post("/pooling", json={"model": "emb", "input": "x", "task": "token_classify"})
    error = wrong.json()["error"]
    assert wrong.status_code == 400 and "serves task 'embed', not 'token_classify'" in error["message"]
    # /pooling serves every task: the hint is the task to name, not a route (it was "use /pooling" there).
    assert error["message"].endswith('send "task": "embed" or leave it out') and error["param"] == "task"
    body = http.post("/v1/embeddings", json={"model": "emb", "input": "x"}).json()
    assert body["id"].startswith("embd-") and body["created"] > 0


def test_score_takes_each_of_vllms_pairs_of_fields_and_only_one(http) -> None:
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2")):
        body = http.post("/score", json={"model": "emb", first: "q", second: ["a", "bb"]})
        assert body.status_code == 200 and len(body.json()["data"]) == 2, (first, body.text)
    for payload in ({"model": "emb", "queries": "q"}, {"model": "emb", "text_1": "q", "text_2": "d", "queries": "q",
                                                        "documents": "d"},
                    {"model": "emb", "text_1": "q", "text_2": "d", "queries": "q"}):  # a stray half of a pair
        refused = http.post("/score", json=payload)
        assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("send exactly one pair")


@pytest.mark.parametrize(("dtype", "endianness", "numpy_type"), [
    ("float32", "native", "=f4"), ("float32", "big", ">f4"), ("float16", "little", "<f2"), ("float16", "big", ">f2")])
def test_base64_embed_dtype_and_endianness(http, dtype, endianness, numpy_type) -> None:
    body = http.post("/v1/embeddings", json={"model": "emb", "input": "abc", "encoding_format": "base64",
                                             "embed_dtype": dtype, "endianness": endianness}).json()
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype=numpy_type)
    assert decoded.tolist() == [3.0, 4.0, 5.0, 6.0]


def test_vllms_bytes_answers_carry_packed_values_and_their_metadata(http) -> None:
    """vLLM's encoding_format bytes: the body is every answer's values back to back, the `metadata` header
    says where each one starts and ends, its dtype, byte order and shape (as vLLM's decode_pooling_output
    reads them); bytes_only leaves the header out."""
    answer = http.post("/v1/embeddings", json={"model": "emb",
                                               "input": ["abc", "de"], "encoding_format": "bytes",
                                               "embed_dtype": "float16", "endianness": "big"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/octet-stream"
    metadata = json.loads(answer.headers["metadata"])
    assert metadata["model"] == "emb" and metadata["usage"]["prompt_tokens"] > 0
    vectors = [np.frombuffer(answer.content[item["start"]:item["end"]], dtype=">f2").reshape(item["shape"])
               for item in sorted(metadata["data"], key=lambda item: item["index"])]
    assert [v.tolist() for v in vectors] == [[3, 4, 5, 6], [2, 3, 4, 5]]
    assert {(item["embed_dtype"], item["endianness"]) for item in metadata["data"]} == {("float16", "big")}
    bare = http.post("/pooling", json={"model": "emb", "input": "abc", "encoding_format": "bytes_only"})
    assert "metadata" not in bare.headers and np.frombuffer(bare.content, dtype=np.float32).tolist() == [3, 4, 5, 6]


def test_base64_bfloat16_is_the_rounded_upper_half_of_float32() -> None:
    import torch

    values = np.array([1.0, -2.5, 3.14159265, 1e-3, 65504.0, 0.1, np.inf, -np.inf], dtype=np.float32)
    got = np.frombuffer(base64.b64decode(base64_vector(values, "bfloat16", "little")), dtype="<u2")
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert got.tolist() == expected.tolist()
    # NaNs whose rounding would carry into the exponent or the sign stay NaN.
    nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001], dtype=np.uint32).view(np.float32)
    decoded = np.frombuffer(base64.b64decode(base64_vector(nans, "bfloat16")), dtype=np.uint16).astype(np.uint32)
    assert np.isnan((decoded << 16).view(np.float32)).all()


def test_older_vllm_activation_names_are_honoured_and_special_tokens_cannot_be_dropped(http, fake) -> None:
    http.post("/v1/embeddings", json={"model": "emb", "input": "x", "normalize": False})
    assert fake.requests[-1].parameters == {"use_activation": False}
    http.post("/classify", json={"model": "cls", "input": "x", "softmax": False, "use_activation": True})
    assert fake.requests[-1].parameters == {"use_activation": True}  # the current name wins
    http.post("/classify", json={"model": "cls", "input": "x", "normalize": False})
    assert fake.requests[-1].parameters == {}  # an embedding's name means nothing to a classifier
    refused = http.post("/v1/embeddings", json={"model": "emb", "input": "x", "add_special_tokens": False})
    assert refused.status_code == 400 and "add_special_tokens" in refused.json()["error"]["message"]


def test_matryoshka_of_an_old_repository_renormalises_unit_vectors_only() -> None:
    from pooltriton.contract.requests import ModelInfo, matryoshka

    info = ModelInfo("m", "embed", ("EMBEDDING",), (), dimensions=(2,))  # no use_activation in its config
    assert matryoshka(info, np.array([[0.6, 0.0, 0.8, 0.0]]), 2).tolist() == [[1.0, 0.0]]
    assert matryoshka(info, np.array([[2.0, 3.0, 4.0, 5.0]]), 2).tolist() == [[2.0, 3.0]]
    with pytest.raises(ValueError, match=r"only \[2\]"):
        matryoshka(info, np.ones((1, 4)), 3)


def test_the_service_refuses_a_negative_top_n(fake) -> None:
    import asyncio

    from pooltriton.client.service import PoolingService, RequestError

    with pytest.raises(RequestError, match="top_n"):
        asyncio.run(PoolingService(fake, model=None).rerank("q", ["a", "b"], model="emb", top_n=-1))
    assert not fake.requests
