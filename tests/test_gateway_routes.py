"""The gateway's routes against a fake Triton client (no server): what each route sends through the one
request layer, and how answers, usage and errors come back. The live-server tests are test_gateway.py."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from fastapi.testclient import TestClient
from tritonclient.utils import InferenceServerException

from pooltriton.contract import (
    ATTENTION_MASK,
    DETOKENIZED,
    DOCUMENTS,
    INPUT_IDS,
    MAX_BATCH_SIZE,
    PROMPT_TOKENS,
    QUERY,
    SCORES,
    TEXT,
    TEXT_PAIR,
    TOKEN_PIECES,
    stages,
)
from pooltriton.contract.requests import TokenPieces, TritonRequest, text_array
from pooltriton.gateway import create_app
from pooltriton.gateway.serving import base64_vector

WIDTH = 4


def _config(name: str, task: str, outputs: list[str], **parameters) -> dict:
    values = {"task": task, "max_length": "16", **{k: json.dumps(v) for k, v in parameters.items()}}
    # Triton's JSON config writes dims as strings; the first output is WIDTH wide.
    return {"name": name, "platform": "ensemble", "output": [{"name": o, "dims": [str(WIDTH)]} for o in outputs],
            "parameters": {k: {"string_value": v} for k, v in values.items()}}


class FakeServer:
    """tritonclient's metadata calls, as a served repository would answer them."""

    def __init__(self) -> None:
        self.configs = {
            "emb": _config("emb", "embed", ["EMBEDDING", PROMPT_TOKENS], matryoshka_dimensions=[2],
                           use_activation=True, prompts=["query", "document"]),
            "cls": _config("cls", "classify", ["PROBABILITIES", PROMPT_TOKENS], labels=["no", "yes"]),
            "emb_score": {"name": "emb_score", "backend": "scorer", "output": [{"name": SCORES}]},
            "emb_tokenizer": {"name": "emb_tokenizer", "backend": "tokenizer", "output": []},
        }

    async def get_model_repository_index(self, headers: dict | None = None, as_json: bool = True) -> dict:
        return {"models": [{"name": name, "state": "READY"} for name in self.configs]}

    async def get_model_config(self, name: str, as_json: bool = True) -> dict:
        if name not in self.configs:  # as Triton answers over gRPC
            raise InferenceServerException(f"Request for unknown model: '{name}' is not found",
                                           status="StatusCode.NOT_FOUND")
        return {"config": self.configs[name]}

    ready = True

    async def is_server_ready(self) -> bool:
        return self.ready


def _words(text: str) -> int:
    return len(text.split()) + 2  # like [CLS] ... [SEP]


def _pieces(text: str, parameters: dict) -> TokenPieces:
    """A word per token, spans in characters; [CLS] and [SEP] around them unless asked not to."""
    prompted = parameters.get("prompt_name") == "query" and parameters.get("with_prompt", True)
    text = ("query: " if prompted else "") + text
    words = [(match.start(), match.end()) for match in re.finditer(r"\S+", text)]
    special = bool(parameters["add_special_tokens"])
    spans = [None] * special + words + [None] * special
    tokens = ["[CLS]"] * special + [text[a:b] for a, b in words] + ["[SEP]"] * special
    return TokenPieces(text, list(range(len(tokens))), tokens, [span is None for span in spans], spans)


class FakeClient:
    """Answers like the served models (an embedding is a function of its text), records every request."""

    def __init__(self) -> None:
        self.server = FakeServer()
        self.requests: list[TritonRequest] = []

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        self.requests.append(request)
        texts = request.inputs.get(TEXT, [])
        if any(t == "bad" for t in texts):
            raise InferenceServerException("text 0 is bad", status="StatusCode.INVALID_ARGUMENT")
        if any(t == "busy" for t in texts):
            raise InferenceServerException("queue full", status="StatusCode.UNAVAILABLE")
        if request.model in ("emb", "cls", "raw", "spl", "rr"):
            width = 2 if request.model == "cls" else WIDTH
            values = np.array([[len(t) + i for i in range(width)] for t in texts], dtype=np.float32)
            if request.model == "spl":  # SPLADE: most of the vocabulary at zero
                values[:, ::2] = 0
            return {request.outputs[0]: values, PROMPT_TOKENS: np.array([[_words(t)] for t in texts])}
        if request.model in ("emb_score", "rr_score"):
            query, documents = request.inputs[QUERY], request.inputs[DOCUMENTS]
            scores = np.array([1.0 / (1 + len(d)) for d in documents], dtype=np.float32)
            return {SCORES: scores, PROMPT_TOKENS: np.array([sum(map(_words, query + documents))])}
        if request.model == "emb_tokenizer" and request.parameters.get("mode") == "pieces":
            return {TOKEN_PIECES: text_array([_pieces(text, request.parameters).to_json() for text in texts],
                                             batched=True)}
        if request.model == "emb_tokenizer" and request.parameters.get("mode") == "detokenize":
            rows = [json.loads(text) for text in texts]
            return {DETOKENIZED: text_array([" ".join(f"t{i}" for i in ids) for ids in rows], batched=True)}
        if request.model == "emb_tokenizer":
            ids = np.array([[101, 7, 8, 102, 0]]) if request.parameters.get("add_special_tokens") else \
                np.array([[7, 8, 0, 0, 0]])
            return {INPUT_IDS: ids, ATTENTION_MASK: (ids != 0).astype(np.int64)}
        raise InferenceServerException(f"unknown model {request.model}", status="StatusCode.NOT_FOUND")


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


@pytest.fixture
def http(fake: FakeClient):
    with TestClient(create_app("unused:0", client=fake)) as client:
        yield client


def test_embeddings_are_chunked_reassembled_in_order_with_served_usage(http, fake) -> None:
    texts = [f"text number {i}" for i in range(300)]
    body = http.post("/v1/embeddings", json={"model": "emb", "input": texts}).json()
    assert [len(r.inputs[TEXT]) for r in fake.requests] == [MAX_BATCH_SIZE, MAX_BATCH_SIZE, 300 - 2 * MAX_BATCH_SIZE]
    assert [d["embedding"][0] for d in body["data"]] == [float(len(t)) for t in texts]
    assert body["usage"] == {"prompt_tokens": sum(map(_words, texts)), "total_tokens": sum(map(_words, texts))}
    assert all(r.batched and r.model == "emb" for r in fake.requests)


@pytest.mark.parametrize(("priority", "level"), [(-5, 1), (0, 0), (7, 3)])
def test_priority_and_truncation_reach_triton(http, fake, priority: int, level: int) -> None:
    http.post("/v1/embeddings", json={"model": "emb", "input": "x", "priority": priority, "truncate_prompt_tokens": 5})
    request = fake.requests[-1]
    assert request.priority == level and request.parameters == {"truncate": "END", "max_tokens": 5}


def test_errors_are_classified_by_status_code(http) -> None:
    bad = http.post("/v1/embeddings", json={"model": "emb", "input": ["ok", "bad"]})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "text 0 is bad"
    busy = http.post("/v1/embeddings", json={"model": "emb", "input": "busy"})  # UNAVAILABLE from a ready server
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["type"] == "rate_limit_error"
    assert http.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404


def test_matryoshka_cohere_and_classify(http) -> None:
    cut = http.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 2}).json()
    assert np.isclose(np.linalg.norm(cut["data"][0]["embedding"]), 1.0)
    cohere = http.post("/v2/embed", json={"model": "emb", "texts": ["a b", "c"]}).json()
    assert cohere["meta"]["billed_units"]["input_tokens"] == _words("a b") + _words("c")
    classified = http.post("/classify", json={"model": "cls", "input": ["abc"]}).json()
    assert classified["data"][0]["label"] == "yes" and classified["usage"]["prompt_tokens"] == _words("abc")


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
    fake.server.configs["raw"] = _config("raw", "embed", ["EMBEDDING", PROMPT_TOKENS], use_activation=False)
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


def test_text_embeddings_inference_routes_answer_in_its_shapes_and_codes() -> None:
    """TEI's /embed ([[float]], normalised unless asked not to, truncating at the end by default),
    /embed_sparse ([[{index, value}]] of the non-zero weights) and /predict, its error shape and codes: a model of the
    wrong kind 424, an empty input 400, what it cannot serve 422, overload 429 with Retry-After."""
    fake = FakeClient()
    fake.server.configs["spl"] = _config("spl", "embed", ["EMBEDDING", PROMPT_TOKENS], use_activation=False,
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
    fake.server.configs["spl"] = _config("spl", "embed", ["EMBEDDING", PROMPT_TOKENS], use_activation=False,
                                         sparse=True)
    for name, pooling, precision in (("emb", "MEAN", "bf16"), ("spl", "SPLADE_MAX", "fp32")):  # strings as written
        fake.server.configs[name]["parameters"].update({"pooling": {"string_value": pooling},
                                                        "precision": {"string_value": precision}})
    fake.server.configs["rr"] = _config("rr", "classify", ["PROBABILITIES", PROMPT_TOKENS], labels=["LABEL_0"])
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
        assert metered.headers["x-compute-tokens"] == str(sum(map(_words, ["abc", "de f"])))  # usage's count
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


def test_invocations_routes_vllms_bodies_then_text_embeddings_inferences(http, fake) -> None:
    """SageMaker's /invocations: the first of vLLM's bodies that validates among those the model serves
    (embeddings, classify, rerank, score, pooling), else TEI's route for the model's kind; errors in OpenAI's shape."""
    def post(body: dict, **params: str):
        response = http.post("/invocations", json=body, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    assert post({"model": "emb", "input": "abc"})["data"][0]["embedding"] == [3, 4, 5, 6]
    assert post({"input": "abc"}, model="emb")["data"][0]["object"] == "embedding"
    assert post({"model": "cls", "input": "abc"})["data"][0]["label"] == "yes"
    assert post({"input": "abc"})["data"][0]["label"] == "yes"  # no model: the first served, cls
    assert [r["index"] for r in post({"model": "emb", "query": "q", "documents": ["long", "a"]})["results"]] == [1, 0]
    assert len(post({"model": "emb", "text_1": "q", "text_2": ["a", "b"]})["data"]) == 2
    assert post({"model": "emb", "inputs": "abc"}) == [[3, 4, 5, 6]]  # TEI's /embed
    assert post({"model": "cls", "inputs": ["abc", "de"]})[0]["label"] == "yes"  # TEI's pair on /predict
    refused = http.post("/invocations", json={"model": "emb"})
    assert refused.status_code == 400 and "takes one of EmbeddingRequest, RerankRequest, ScoreRequest, " \
        "PoolingRequest (vLLM's), or text-embeddings-inference's (`inputs`)" in refused.json()["error"]["message"]
    typo = http.post("/invocations", json={"model": "emb", "input": 5})  # vLLM's body, wrong: not TEI's error
    assert typo.status_code == 400 and "no handler for this body" in typo.json()["error"]["message"]
    assert http.post("/invocations", json={"model": "emb", "inputs": 5}).status_code == 400  # TEI's, wrong
    assert http.post("/invocations", json={"model": "nope", "input": "a"}).status_code == 404


def test_rerank_and_score_carry_documents_and_usage(http, fake) -> None:
    documents = ["a long document", "short", "mid doc"]
    body = http.post("/rerank", json={"model": "emb", "query": "q", "documents": documents}).json()
    assert [r["document"]["text"] for r in body["results"]] == ["short", "mid doc", "a long document"]
    assert body["usage"]["prompt_tokens"] == sum(map(_words, ["q", *documents]))
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


def test_models_list_reads_only_what_triton_says(http) -> None:
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert set(models) == {"emb", "cls"} and models["emb"]["max_model_len"] == 16 and models["emb"]["scoring"]


def test_served_model_names_reach_their_model_and_a_shared_one_is_told_apart_by_task(fake) -> None:
    """--served-model-name: a model answers to its other names too (an OpenAI model name, for one); models
    exported under one shared name (BGE-M3's dense, lexical and ColBERT exports, as vLLM serves one model)
    are told apart by the task the request asks for, the model's own name first where none is asked."""
    fake.server.configs["emb"]["parameters"]["served_names"] = {"string_value": json.dumps(
        ["text-embedding-3-small", "shared"])}
    fake.server.configs["cls"]["parameters"]["served_names"] = {"string_value": json.dumps(["shared", "emb"])}
    with TestClient(create_app("unused:0", client=fake)) as http:
        aliased = http.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"})
        assert aliased.status_code == 200 and fake.requests[-1].model == "emb"
        assert aliased.json()["model"] == "text-embedding-3-small"  # the name asked for, as vLLM answers
        assert http.post("/v1/embeddings", json={"model": "shared", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb"
        assert http.post("/classify", json={"model": "shared", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "cls"
        pooled = http.post("/pooling", json={"model": "shared", "input": "x", "task": "classify"})
        assert pooled.status_code == 200 and fake.requests[-1].model == "cls"
        # "emb" is the embedding model's own name: a classify request for it reaches the classifier that
        # answers to it as well; with no task asked, the model of that name.
        assert http.post("/classify", json={"model": "emb", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "cls"
        assert http.post("/pooling", json={"model": "emb", "input": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb"
        wrong = http.post("/pooling", json={"model": "text-embedding-3-small", "input": "x", "task": "classify"})
        assert wrong.status_code == 400, wrong.text
        assert http.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert set(models) == {"emb", "cls", "text-embedding-3-small", "shared"}
        assert models["text-embedding-3-small"]["root"] == "emb" and models["shared"]["root"] == "cls"  # by name
        assert http.get("/info", params={"model": "text-embedding-3-small"}).json()["served_model_name"] == \
            "text-embedding-3-small"
        # Every route picks by what it needs: TEI's /embed an embedding model, /rerank and /score one that
        # can score, /invocations the task its body names, the tokenizer routes the name's model.
        assert http.post("/embed", json={"model": "shared", "inputs": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb"
        reranked = http.post("/rerank", json={"model": "shared", "query": "q", "documents": ["d"]})
        assert reranked.status_code == 200 and fake.requests[-1].model == "emb_score"
        scored = http.post("/score", json={"model": "shared", "text_1": "q", "text_2": "d"})
        assert scored.status_code == 200 and fake.requests[-1].model == "emb_score"
        assert reranked.json()["model"] == scored.json()["model"] == "shared"
        unnamed = http.post("/pooling", json={"input": "x"}).json()["model"]
        assert unnamed == fake.requests[-1].model  # none asked: the model's own name
        by_url = http.post("/invocations", params={"model": "text-embedding-3-small"}, json={"input": "x"})
        assert by_url.status_code == 200 and by_url.json()["model"] == "text-embedding-3-small", by_url.text
        invoked = http.post("/invocations", json={"model": "shared", "input": "x", "task": "embed"})
        assert invoked.status_code == 200 and fake.requests[-1].model == "emb"
        assert "embedding" in invoked.json()["data"][0]  # vLLM's order all the same: /v1/embeddings' answer
        assert http.post("/tokenize", json={"model": "text-embedding-3-small", "prompt": "x"}).status_code == 200
        assert fake.requests[-1].model == "emb_tokenizer"

    # The Python client's service, over the same fake: the same names, the labels of the model that answered.
    import asyncio

    from pooltriton.client.service import PoolingService

    async def client_side() -> None:
        service = PoolingService(fake, model=None)
        assert (await service.info("shared", "classify")).name == "cls"
        assert (await service.info("shared", "classify")).labels == ("no", "yes")
        assert (await service.info("text-embedding-3-small")).name == "emb"
        scored = await service.score("q", ["d"], model="shared")
        assert fake.requests[-1].model == "emb_score" and scored.values.shape == (1,)
        await service.tokenize("x", model="text-embedding-3-small")
        assert fake.requests[-1].model == "emb_tokenizer"

    asyncio.run(client_side())


@pytest.mark.parametrize("name", ["../emb", "emb/../../x", "a b"])
def test_model_names_are_validated(http, name: str) -> None:
    response = http.post("/v1/embeddings", json={"model": name, "input": "x"})
    assert response.status_code == 400 and "invalid model name" in response.json()["error"]["message"]


def test_cors_answers_a_browsers_preflight_before_the_api_key_and_can_be_narrowed(fake) -> None:
    """Any origin by default, as vLLM and text-embeddings-inference; the preflight (which carries no key) is
    answered, the request itself still needs the key; a narrowed list leaves other origins without the header."""
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    with TestClient(create_app("unused:0", api_key="s3cret", client=fake)) as client:
        answer = client.options("/v1/embeddings", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
        refused = client.post("/v1/embeddings", json={"model": "emb", "input": "x"},
                              headers={"origin": "https://app.example"})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"
    with TestClient(create_app("unused:0", client=fake, allowed_origins=["https://app.example"])) as client:
        assert client.options("/v1/embeddings", headers=preflight).status_code == 200
        other = client.post("/v1/embeddings", json={"model": "emb", "input": "x"}, headers={"origin": "https://x.io"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
        plain = client.post("/v1/embeddings", json={"model": "emb", "input": "x"})  # no browser: untouched
        assert plain.status_code == 200 and "vary" not in plain.headers
    with TestClient(create_app("unused:0", client=fake, allowed_origins=[])) as client:
        plain = client.post("/v1/embeddings", json={"model": "emb", "input": "x"}, headers={"origin": "https://x.io"})
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_api_key(fake) -> None:
    with TestClient(create_app("unused:0", api_key="s3cret", client=fake)) as client:
        assert client.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 401
        wrong = client.post("/v1/embeddings", json={"model": "emb", "input": "x"},
                            headers={"authorization": "Bearer s3cres"})
        assert wrong.status_code == 401
        right = client.post("/v1/embeddings", json={"model": "emb", "input": "x"},
                            headers={"authorization": "Bearer s3cret"})
        assert right.status_code == 200 and client.get("/health").status_code == 200
        assert client.get("/ping").status_code == 200 and client.get("/version").status_code == 401
        # text-embeddings-inference's GET / is a health check; its POST / an inference, behind the key
        assert client.get("/").status_code == 200 and client.post("/", json={"inputs": "x"}).status_code == 401


def test_unavailable_from_a_server_that_is_not_ready_is_503(http, fake) -> None:
    fake.server.ready = False
    response = http.post("/v1/embeddings", json={"model": "emb", "input": "busy"})
    assert response.status_code == 503 and "retry-after" not in response.headers


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """The exposition parsed by prometheus_client's own parser (it raises on an invalid one)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_by_route_template_with_bounded_series(http) -> None:
    """10,000 distinct unknown paths (a scanner) add no series; a path with a quote and a newline still
    leaves a valid exposition; known routes are counted by their template, status by status."""
    import asyncio

    async def scan(count: int) -> set[int]:  # straight through ASGI: 10,000 requests in seconds
        statuses = set()
        for i in range(count):
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                     "scheme": "http", "path": f"/scan/{i}", "raw_path": f"/scan/{i}".encode(),
                     "query_string": b"", "headers": [], "client": ("127.0.0.1", 1), "server": ("test", 80)}
            sent, asked = [], []

            async def receive(asked=asked) -> dict:
                if not asked:  # the body; after it, like a server whose client stays connected: wait
                    asked.append(True)
                    return {"type": "http.request", "body": b"", "more_body": False}
                await asyncio.Event().wait()
                return {"type": "http.disconnect"}

            async def send(message: dict, sent=sent) -> None:
                sent.append(message)

            await http.app(scope, receive, send)
            statuses.add(sent[0]["status"])
        return statuses

    assert asyncio.run(scan(10_000)) == {404}
    assert http.get("/x%22y%0Az").status_code == 404  # the path holds a quote and a newline
    assert http.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 200
    assert http.post("/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404
    samples = _samples(http.get("/metrics").text)
    requests = "pooltriton_gateway_requests_total"
    assert samples[(requests, (("route", "unmatched"), ("status", "404")))] == 10_001
    assert samples[(requests, (("route", "/v1/embeddings"), ("status", "200")))] == 1
    assert samples[(requests, (("route", "/v1/embeddings"), ("status", "404")))] == 1
    duration = "pooltriton_gateway_request_duration_seconds_count"
    assert samples[(duration, (("route", "unmatched"),))] == 10_001
    assert len(samples) < 100


def test_bodies_over_the_limit_get_413_over_real_http(fake) -> None:
    """Through uvicorn (real HTTP, fake Triton): a 20 MB body gets its 413 (it used to be a reset
    connection), so does a chunked body that states no length, both are counted, and the next request
    is served."""
    import httpx

    from conftest import running_gateway

    with running_gateway("unused:0", client=fake) as base, httpx.Client(base_url=base, timeout=60) as http:
        json_type = {"content-type": "application/json"}
        huge = http.post("/v1/embeddings", content=b"x" * (20 << 20), headers=json_type)
        assert huge.status_code == 413 and "request body over" in huge.json()["error"]["message"]
        chunked = http.post("/v1/embeddings", content=(b"x" * (1 << 20) for _ in range(12)), headers=json_type)
        assert chunked.status_code == 413 and "content-length" not in chunked.request.headers
        assert http.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 200
        samples = _samples(http.get("/metrics").text)
    assert samples[("pooltriton_gateway_requests_total", (("route", "/v1/embeddings"), ("status", "413")))] == 2


def test_cancel_on_disconnect_cancels_only_for_a_client_gone() -> None:
    """The middleware alone, over an app that waits until released: a client that disconnects before the
    answer cancels the handler (counted, nothing raised, no cancellation left on the request's task); a
    cancellation from outside (the server stopping) goes through uncounted, also when the client left at
    the same moment; an answered request is left alone."""
    import asyncio

    from pooltriton.gateway.disconnect import CancelOnDisconnect

    async def case(disconnect: bool, outside: bool) -> tuple[list[float], str, int]:
        release, started, client_gone = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def app(scope, receive, send) -> None:
            await receive()  # the body
            started.set()
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        cancelled: list[float] = []
        middleware = CancelOnDisconnect(app, on_cancel=lambda scope, seconds: cancelled.append(seconds))
        bodies = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict:
            if bodies:
                return bodies.pop()
            await client_gone.wait()
            return {"type": "http.disconnect"}

        async def send(_message: dict) -> None:
            pass

        async def request() -> int:
            await middleware({"type": "http"}, receive, send)
            return asyncio.current_task().cancelling()

        task = asyncio.ensure_future(request())
        await started.wait()
        if disconnect:
            client_gone.set()
        if outside:
            task.cancel()
        if not disconnect and not outside:
            release.set()
        try:
            left = await task
            return cancelled, "returned", left
        except asyncio.CancelledError:
            return cancelled, "raised", -1

    cancelled, how, left = asyncio.run(case(disconnect=True, outside=False))
    assert len(cancelled) == 1 and how == "returned" and left == 0
    cancelled, how, _ = asyncio.run(case(disconnect=False, outside=True))
    assert cancelled == [] and how == "raised"
    cancelled, how, _ = asyncio.run(case(disconnect=True, outside=True))
    assert cancelled == [] and how == "raised"
    cancelled, how, left = asyncio.run(case(disconnect=False, outside=False))
    assert cancelled == [] and how == "returned" and left == 0


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
    fake.server.configs["emb"] = _config("emb", "embed", ["EMBEDDING", PROMPT_TOKENS], matryoshka_dimensions=[2],
                                         use_activation=False)  # a sentence-transformers model without Normalize
    with TestClient(create_app("unused:0", client=fake)) as client:
        cut = client.post("/v1/embeddings", json={"model": "emb", "input": "ab", "dimensions": 2}).json()
    assert cut["data"][0]["embedding"] == [2.0, 3.0]
    # Exported before the config said: raw vectors (these) stay raw when cut.
    fake.server.configs["emb"] = _config("emb", "embed", ["EMBEDDING", PROMPT_TOKENS], matryoshka_dimensions=[2])
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


def test_ping_and_version(http, fake) -> None:
    assert http.get("/ping").json() == {"status": "ok"} and http.post("/ping").status_code == 200
    fake.server.ready = False
    assert http.get("/ping").status_code == 503
    assert http.get("/version").json()["version"] == "0.1.0"


def test_cohere_binary_types_pack_non_negative_components_as_ones() -> None:
    from pooltriton.gateway.protocol import APIError
    from pooltriton.gateway.serving import cohere_encode

    vectors = np.array([[0.0, -0.5, 0.25, -0.0, 1.0, -1.0, 0.0, 0.1]], dtype=np.float32)
    assert cohere_encode(vectors, "ubinary") == [[0b10111011]]
    assert cohere_encode(vectors, "binary") == [[0b10111011 - 128]]
    with pytest.raises(APIError, match="not divisible by 8"):
        cohere_encode(vectors[:, :6], "binary")


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
