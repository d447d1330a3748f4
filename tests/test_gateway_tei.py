"""text-embeddings-inference's routes against a fake Triton client (no server): its bodies, answers, shapes
and codes."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gateway_fake import FakeClient, served_config, word_tokens

from pooltriton.contract import (
    PROMPT_TOKENS,
    SCORES,
    TEXT,
    TEXT_PAIR,
)
from pooltriton.gateway import create_app


def test_text_embeddings_inference_routes_answer_in_its_shapes_and_codes() -> None:
    """TEI's /embed ([[float]], normalised unless asked not to, truncating at the end by default),
    /embed_sparse ([[{index, value}]] of the non-zero weights) and /predict, its error shape and codes: a model of the
    wrong kind 424, an empty input 400, what it cannot serve 422, overload 429 with Retry-After."""
    fake = FakeClient()
    fake.server.configs["spl"] = served_config("spl", "embed", ["EMBEDDING", PROMPT_TOKENS], use_activation=False,
                                         sparse=True)
    with TestClient(create_app("unused:0", client=fake)) as http:
        dense = http.post("/embed", json={"inputs": ["abc", "de"]})  # no model: the first dense one
        assert dense.status_code == 200 and dense.json() == [[3, 4, 5, 6], [2, 3, 4, 5]]
        assert fake.requests[-1].model == "emb"
        assert fake.requests[-1].parameters == {"use_activation": True, "truncate": "END"}
        http.post("/embed", json={"model": "emb", "inputs": "abc", "normalize": False, "truncate": True,
                                  "truncation_direction": "left", "prompt_name": "query"})
        assert fake.requests[-1].parameters == {"use_activation": False, "truncate": "START", "prompt_name": "query"}
        http.post("/embed", json={"inputs": "abc", "truncate": False})
        assert fake.requests[-1].parameters == {"use_activation": True}
        assert http.post("/embed", json={"inputs": "[]"}).json() == [[2, 3, 4, 5]]  # a text, not an id list
        http.post("/embed", json={"inputs": "abc", "truncate": None})  # TEI's Option: the default
        assert fake.requests[-1].parameters == {"use_activation": True, "truncate": "END"}

        sparse = http.post("/embed_sparse", json={"inputs": "abc"})  # no model: the first SPLADE one
        assert sparse.status_code == 200, sparse.text
        assert sparse.json() == [[{"index": 1, "value": 4.0}, {"index": 3, "value": 6.0}]]
        assert fake.requests[-1].model == "spl" and fake.requests[-1].parameters["use_activation"] is False
        whole = http.post("/embed", json={"model": "spl", "inputs": "abc", "normalize": False})
        assert whole.json() == [[0, 4, 0, 6]]

        sent = len(fake.requests)
        errors = [(http.post("/embed", json={"model": "spl", "inputs": "abc"}), 424, "Backend",
                   "`normalize` is not available for SPLADE models"),
                  (http.post("/embed_sparse", json={"model": "emb", "inputs": "abc"}), 424, "Backend",
                   "is not an embedding model with SPLADE pooling"),
                  (http.post("/embed", json={"model": "cls", "inputs": "abc"}), 424, "Backend",
                   "is not an embedding model (it serves classify)"),
                  (http.post("/embed", json={"inputs": []}), 400, "Empty", "`inputs` cannot be empty"),
                  (http.post("/embed", json={"model": "emb", "inputs": "ab", "dimensions": 5}), 422, "Validation",
                   "`dimensions` should be smaller than the maximum embedding dimension"),
                  (http.post("/embed", json={"model": "nope", "inputs": "ab"}), 404, "Validation", "does not exist"),
                  (http.post("/embed", json={"inputs": "ab", "truncation_direction": "up"}), 422, "Validation",
                   "truncation_direction"),
                  (http.post("/embed", json={"inputs": ["ab", ""]}), 400, "Empty", "`inputs` cannot be empty"),
                  (http.post("/embed", json={"inputs": [[7, 8], []]}), 400, "Empty", "`inputs` cannot be empty"),
                  (http.post("/predict", json={"inputs": ["a", "b", "c"]}), 422, "Validation",
                   "a list of texts is one input"),
                  (http.post("/predict", json={"inputs": []}), 422, "Validation", "invalid length 0"),
                  (http.post("/predict", json={"inputs": [["a"], ["", "b"], ["", ""]]}), 400, "Empty", "cannot be")]
        for response, status, kind, message in errors:
            assert response.status_code == status, response.text
            assert response.json()["error_type"] == kind and message in response.json()["error"], response.text
        assert len(fake.requests) == sent  # each refused before the model ran
        # any size up to the width, as TEI cuts (vLLM's routes take declared Matryoshka sizes only)
        cut = np.array(http.post("/embed", json={"model": "emb", "inputs": "ab", "dimensions": 3}).json())
        assert np.allclose(cut, [np.array([2, 3, 4]) / np.linalg.norm([2, 3, 4])])
        raw = http.post("/embed", json={"model": "emb", "inputs": "ab", "dimensions": 3, "normalize": False}).json()
        assert raw == [[2, 3, 4]] and fake.requests[-1].parameters["use_activation"] is False
        busy = http.post("/embed", json={"inputs": "busy"})
        assert busy.status_code == 429 and busy.json()["error_type"] == "Overloaded"
        assert busy.headers["retry-after"] == "1"

        # /predict: one text, a pair ([a, b] is one pair in TEI), a batch mixing both; labels highest first
        # TEI's activation whatever the model's (it asks for logits): softmax over the fake's logits [3, 4]
        one = http.post("/predict", json={"inputs": "abc"})  # no model: the first classifier
        top = float(np.exp(4) / (np.exp(3) + np.exp(4)))
        assert one.json() == [{"score": pytest.approx(top), "label": "yes"},
                              {"score": pytest.approx(1 - top), "label": "no"}]
        assert http.post("/predict", json={"inputs": ["abc"]}).json() == one.json()  # one text, not a batch
        assert fake.requests[-1].model == "cls" and fake.requests[-1].parameters["use_activation"] is False
        pair = http.post("/predict", json={"model": "cls", "inputs": ["abc", "de"], "raw_scores": True})
        assert pair.json()[0] == {"score": 4, "label": "yes"} and fake.requests[-1].inputs[TEXT_PAIR] == ["de"]
        assert fake.requests[-1].parameters["use_activation"] is False
        batch = http.post("/predict", json={"model": "cls", "raw_scores": True,
                                            "inputs": [["abcd"], ["a", "b"], ["xy"]]}).json()
        assert [answer[0]["score"] for answer in batch] == [5, 2, 3]
        assert sorted(map(len, (r.inputs[TEXT] for r in fake.requests[-2:]))) == [1, 2]  # the pairs, the rest
        wrong = http.post("/predict", json={"model": "emb", "inputs": "abc"})
        assert wrong.status_code == 424 and "is not a classifier model" in wrong.json()["error"]


def test_text_embeddings_inference_post_root_info_similarity_decode_and_embed_all() -> None:
    """TEI's POST / (huggingface_hub's InferenceClient posts there) takes the route of the model's kind, or
    /similarity's for a sentence-similarity body; /info describes a model as TEI does; /similarity is the
    bi-encoder's score; /decode a text per row; /embed_all needs a token_embed model; errors in TEI's shape."""
    fake = FakeClient()
    fake.server.configs["spl"] = served_config("spl", "embed", ["EMBEDDING", PROMPT_TOKENS], use_activation=False,
                                         sparse=True)
    for name, pooling, precision in (("emb", "MEAN", "bf16"), ("spl", "SPLADE_MAX", "fp32")):  # strings as written
        fake.server.configs[name]["parameters"].update({"pooling": {"string_value": pooling},
                                                        "precision": {"string_value": precision}})
    fake.server.configs["rr"] = served_config("rr", "classify", ["PROBABILITIES", PROMPT_TOKENS], labels=["LABEL_0"])
    fake.server.configs["rr_score"] = {"name": "rr_score", "backend": "scorer", "output": [{"name": SCORES}]}
    with TestClient(create_app("unused:0", client=fake)) as http:
        assert http.post("/", json={"model": "emb", "inputs": "abc"}).json() == [[3, 4, 5, 6]]  # /embed
        assert fake.requests[-1].model == "emb" and fake.requests[-1].parameters["use_activation"] is True
        # no model: the first served by name (cls), a classifier: /predict
        assert http.post("/", json={"inputs": "abc", "raw_scores": True}).json()[0] == {"score": 4, "label": "yes"}
        assert fake.requests[-1].model == "cls"
        assert http.post("/", json={"model": "spl", "inputs": "abc"}).json() == [[{"index": 1, "value": 4.0},
                                                                                  {"index": 3, "value": 6.0}]]
        ranked = http.post("/", json={"model": "rr", "query": "q", "texts": ["long text", "ab"]}).json()
        assert [r["index"] for r in ranked] == [1, 0] and fake.requests[-1].model == "rr_score"
        # A batch that mixes texts and rows of ids (TEI's Input): each kind one encode, the answers in order
        sent = len(fake.requests)
        mixed = http.post("/embed", json={"model": "emb", "inputs": ["abc", [7, 8], "de"]})
        assert mixed.json() == [[3, 4, 5, 6], [6, 7, 8, 9], [2, 3, 4, 5]], mixed.text
        assert sorted(len(r.inputs[TEXT]) for r in fake.requests[sent:]) == [1, 2]
        assert mixed.headers["x-compute-characters"] == str(3 + 2 + 2)  # a row of ids counts its ids
        # TEI's x-compute-* headers on its inference answers (what HF's endpoints and usage meters read)
        metered = http.post("/embed", json={"model": "emb", "inputs": ["abc", "de f"]})
        assert metered.headers["x-compute-characters"] == "7"
        assert metered.headers["x-compute-tokens"] == str(sum(map(word_tokens, ["abc", "de f"])))  # usage's count
        # x-compute-time: the span of the Triton calls; x-total-time: the whole answer
        assert 0 <= int(metered.headers["x-compute-time"]) <= int(metered.headers["x-total-time"])
        reranked = http.post("/rerank", json={"model": "rr", "query": "q", "texts": ["ab", "cde"]})
        assert reranked.headers["x-compute-characters"] == str(2 * 1 + 5)
        assert "x-compute-tokens" not in http.post("/v1/embeddings", json={"model": "emb", "input": "x"}).headers
        # TEI's /rerank body names no model: the cross-encoder (not emb, first by name, whose cosine could score),
        # its logit through TEI's sigmoid whatever the model's own activation
        unnamed = http.post("/rerank", json={"query": "q", "texts": ["ab"]}).json()
        assert fake.requests[-1].model == "rr_score" and fake.requests[-1].parameters["use_activation"] is False
        assert unnamed == [{"index": 0, "score": pytest.approx(1 / (1 + np.exp(-1 / 3)))}]
        assert http.post("/rerank", json={"query": "q", "texts": ["ab"], "raw_scores": True}).json()[0]["score"] == \
            pytest.approx(1 / 3)
        assert http.post("/rerank", json={"query": "q", "documents": "ab"}).json()["results"][0]["index"] == 0
        assert fake.requests[-1].model == "rr_score"  # vLLM's body too; one text for documents, as vLLM wraps it
        similar = http.post("/", json={"inputs": {"source_sentence": "q", "sentences": ["a", "bcd"]},
                                       "parameters": {"truncate": False, "prompt_name": "query"}})
        assert np.allclose(similar.json(), [1 / 2, 1 / 4]), similar.text
        assert similar.headers["x-compute-characters"] == str(1 + 1 + 3)  # the source sentence once, as TEI
        assert fake.requests[-1].model == "emb_score" and fake.requests[-1].parameters == {"prompt_name": "query"}
        assert np.allclose(http.post("/similarity", json={"inputs": {"source_sentence": "q", "sentences": ["a"]}})
                           .json(), [1 / 2])
        assert http.get("/").json() == {"status": "ok"}

        assert http.get("/info").json()["model_id"] == "cls"
        info = http.get("/info", params={"model": "emb"}).json()
        assert info["model_id"] == "emb" and info["model_type"] == {"embedding": {"pooling": "mean"}}
        assert info["model_dtype"] == "bfloat16" and info["max_input_length"] == 16 and info["task"] == "embed"
        assert "max_batch_tokens" not in info  # no encoder stage to read in this fake (yet)
        # TEI's router settings from the stages' configs as Triton's gRPC JSON gives them (64-bit: strings)
        fake.server.configs["emb_tokenizer"].update({"instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                                                     "dynamic_batching": {"default_queue_policy": {
                                                         "max_queue_size": "128"}}})
        fake.server.configs["emb_encoder"] = {"name": "emb_encoder", "max_batch_size": 64, "output": [],
                                              "parameters": {"ragged_token_budget": {"string_value": "2048"}}}
        info = http.get("/info", params={"model": "emb"}).json()
        assert {key: info[key] for key in ("max_concurrent_requests", "max_batch_tokens", "max_batch_requests",
                                           "tokenization_workers")} == {"max_concurrent_requests": 128,
                                                                        "max_batch_tokens": 2048,
                                                                        "max_batch_requests": 64,
                                                                        "tokenization_workers": 2}
        assert http.get("/info", params={"model": "spl"}).json()["model_type"] == {"embedding": {"pooling": "splade"}}
        assert http.get("/info", params={"model": "cls"}).json()["model_type"] == {"classifier": {
            "id2label": {"0": "no", "1": "yes"}, "label2id": {"no": 0, "yes": 1}}}
        assert list(http.get("/info", params={"model": "rr"}).json()["model_type"]) == ["reranker"]

        assert http.post("/decode", json={"model": "emb", "ids": [7, 8]}).json() == ["t7 t8"]
        assert fake.requests[-1].parameters["skip_special_tokens"] is True  # TEI's default
        rows = http.post("/decode", json={"model": "emb", "ids": [[7], [8, 9]], "skip_special_tokens": False})
        assert rows.json() == ["t7", "t8 t9"] and fake.requests[-1].inputs[TEXT] == ["[7]", "[8, 9]"]  # one call
        assert http.post("/?model=emb", json={"inputs": "abc"}).json() == [[3, 4, 5, 6]]  # the URL names it
        # TEI's OpenAI route: truncated and normalised whatever the body says, any `dimensions` up to the width,
        # an OpenAI model name it does not serve answered by the first embedding model
        assert http.post("/embeddings", json={"model": "emb", "input": "abc"}).json()["data"][0]["embedding"] == \
            [3, 4, 5, 6]
        assert fake.requests[-1].parameters == {"truncate": "END", "use_activation": True}
        tei_openai = http.post("/embeddings", json={"model": "text-embedding-ada-002", "input": ["abc"],
                                                    "dimensions": 3, "encoding_format": "base64"})
        assert tei_openai.status_code == 200 and fake.requests[-1].model == "emb", tei_openai.text
        decoded = np.frombuffer(base64.b64decode(tei_openai.json()["data"][0]["embedding"]), dtype=np.float32)
        assert np.allclose(decoded, np.array([3, 4, 5]) / np.linalg.norm([3, 4, 5]))
        assert http.post("/embeddings", json={"model": "cls", "input": "abc"}).status_code == 424
        hub_id = http.post("/embeddings", json={"model": "BAAI/bge-large-en-v1.5", "input": "abc"})  # TEI's name
        assert hub_id.status_code == 200 and fake.requests[-1].model == "emb", hub_id.text
        assert http.post("/embeddings", json={"model": "spl", "input": "abc"}).status_code == 424  # TEI's SPLADE
        assert http.post("/embeddings", json={"input": "abc", "dimensions": 5}).status_code == 400
        mixed = http.post("/embeddings", json={"input": [[7, 8], "abc", "de"]})  # TEI's Input here too, in order
        assert [item["embedding"] for item in mixed.json()["data"]] == [[6, 7, 8, 9], [3, 4, 5, 6], [2, 3, 4, 5]], \
            mixed.text
        assert mixed.headers["x-compute-characters"] == str(2 + 3 + 2)  # a row of ids counts its ids
        empty = http.post("/embeddings", json={"input": ["abc", ""]}).json()["error"]
        assert empty["code"] == 400 and empty["param"] == "input", empty  # OpenAI's shape names its own field

        sent = len(fake.requests)
        errors = [(http.post("/", content=b"{not json"), 422, "Validation", "not JSON"),
                  (http.post("/", json={"inputs": 5}), 422, "Validation", "inputs"),
                  (http.post("/", json={"model": 5, "inputs": "a"}), 422, "Validation", "model"),
                  (http.post("/", json={"model": "nope", "inputs": "a"}), 404, "Validation", "does not exist"),
                  (http.post("/", json={"inputs": {"source_sentence": "q", "sentences": []}}), 400, "Empty",
                   "`inputs.sentences` cannot be empty"),
                  (http.post("/similarity", json={"model": "cls", "inputs": {"source_sentence": "q",
                                                                             "sentences": ["a"]}}),
                   424, "Backend", "is not an embedding model"),
                  (http.post("/decode", json={"model": "emb", "ids": []}), 400, "Empty", "`input_ids` cannot be empty"),
                  (http.post("/decode", json={"model": "emb", "ids": [[7], []]}), 400, "Empty",
                   "`input_ids` cannot be empty"),
                  (http.post("/", content=b"[" * 100_000), 422, "Validation", "not JSON"),
                  (http.post("/decode", json={"ids": [[]], "model": 3}), 422, "Validation", "model"),
                  (http.post("/embed_all", json={"model": "emb", "inputs": "a"}), 424, "Backend",
                   "is not a token embedding model"),
                  (http.post("/embed_all", json={"inputs": "a"}), 424, "Backend", "no served token embedding")]
        for response, status, kind, message in errors:
            assert response.status_code == status, response.text
            assert response.json()["error_type"] == kind and message in response.json()["error"], response.text
        assert len(fake.requests) == sent  # each refused before the model ran
        fake.server.ready = False
        unhealthy = http.get("/")
        assert unhealthy.status_code == 503 and unhealthy.json() == {"error": "unhealthy", "error_type": "Unhealthy"}


def test_tokenize_takes_text_embeddings_inferences_body_and_answers_in_its_shape(http, fake) -> None:
    """TEI's /tokenize body (`inputs`) on vLLM's path: per input its tokens as {id, text, special, start, stop},
    spans in UTF-8 bytes of the text read (prompt included), a special token with its string and no span."""
    one = http.post("/tokenize", json={"model": "emb", "inputs": "héllo wörld"})
    assert one.status_code == 200, one.text
    assert one.json() == [[{"id": 0, "text": "[CLS]", "special": True, "start": None, "stop": None},
                           {"id": 1, "text": "héllo", "special": False, "start": 0, "stop": 6},
                           {"id": 2, "text": "wörld", "special": False, "start": 7, "stop": 13},
                           {"id": 3, "text": "[SEP]", "special": True, "start": None, "stop": None}]]
    assert fake.requests[-1].parameters == {"mode": "pieces", "add_special_tokens": True}
    both = http.post("/tokenize", json={"model": "emb", "inputs": ["a", "b c"], "add_special_tokens": False,
                                        "prompt_name": "query"}).json()
    assert [[token["text"] for token in tokens] for tokens in both] == [["query:", "a"], ["query:", "b", "c"]]
    assert both[1][2]["start"] == len("query: b ") and fake.requests[-1].parameters["prompt_name"] == "query"
    for body in ({"model": "emb", "inputs": []}, {"model": "emb", "inputs": ["a", ""]}):  # TEI's error for its body
        refused = http.post("/tokenize", json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json() == {"error": "`inputs` cannot be empty", "error_type": "Empty"}
    for body in ({"model": "emb", "inputs": "a", "prompt": "a"}, {"model": "emb"}):  # which API: not known
        refused = http.post("/tokenize", json=body)
        assert refused.status_code == 400 and "send one of prompt" in refused.json()["error"]["message"], refused.text
    tei_rerank = http.post("/rerank", json={"model": "cls", "query": "q", "texts": ["a"]})  # not a scorer
    assert tei_rerank.status_code == 424 and tei_rerank.json()["error_type"] == "Backend", tei_rerank.text
    assert "is not a re-ranker model" in tei_rerank.json()["error"]  # TEI's words
    empty = http.post("/rerank", json={"model": "emb", "query": "q", "texts": []})
    assert empty.status_code == 400 and empty.json() == {"error": "`texts` cannot be empty", "error_type": "Empty"}
