"""The HTTP gateway (OpenAI / Cohere / vLLM shapes) against the real Triton server."""

from __future__ import annotations

import base64
import json
import re

import httpx
import numpy as np
import pytest

from pooltriton.export.defaults import minilm_path

from conftest import REPOSITORY, running_gateway

API_KEY = "test-key"


@pytest.fixture(scope="module")
def gateway(server):
    with running_gateway(server.grpc_url, api_key=API_KEY, admin_key=server.admin_key) as url:
        yield url


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as client:
        yield client


def test_openai_sdk_float_and_base64(gateway, http_client) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{gateway}/v1", api_key=API_KEY)
    texts = ["A man is eating food.", "A man is eating a piece of bread."]
    expected = http_client.embed(texts)
    for encoding_format in ("float", "base64"):
        response = client.embeddings.create(model="minilm", input=texts, encoding_format=encoding_format)
        # With base64 asked for explicitly the SDK hands the string over as is.
        vectors = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype=np.float32)
                            if isinstance(d.embedding, str) else d.embedding for d in response.data], dtype=np.float32)
        assert np.abs(vectors - expected).max() <= 1e-6
        assert response.usage.prompt_tokens > 0
    single = client.embeddings.create(model="minilm", input="A man is eating food.")
    assert np.abs(np.array(single.data[0].embedding) - expected[0]).max() <= 1e-6


def test_base64_is_float32_bytes(http, http_client) -> None:
    body = http.post("/v1/embeddings", json={"model": "minilm", "input": ["hello"], "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype=np.float32)
    assert np.abs(vector - http_client.embed(["hello"])[0]).max() <= 1e-6


def test_big_input_is_split_and_reassembled(http, http_client) -> None:
    texts = [f"text number {i} about pooling" for i in range(300)]
    body = http.post("/v1/embeddings", json={"model": "minilm", "input": texts}).json()
    vectors = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert [d["index"] for d in body["data"]] == list(range(300))
    assert np.abs(vectors - http_client.embed(texts)).max() <= 1e-6


def test_cohere_embed_types(http, http_client) -> None:
    body = http.post("/v2/embed", json={"model": "minilm", "texts": ["hello world"],
                                        "embedding_types": ["float", "int8", "uint8", "ubinary", "binary"]}).json()
    reference = http_client.embed(["hello world"])[0]
    assert np.abs(np.array(body["embeddings"]["float"][0]) - reference).max() <= 1e-6
    assert body["embeddings"]["int8"][0] == np.clip(np.round(reference * 127), -128, 127).astype(int).tolist()
    assert body["embeddings"]["ubinary"][0] == np.packbits(reference > 0).tolist()
    assert len(body["embeddings"]["binary"][0]) == 384 // 8
    assert body["meta"]["billed_units"]["input_tokens"] == 4


def test_cohere_sdk_v1_and_v2_embed_and_rerank(gateway, http_client) -> None:
    """Cohere's own SDK against the gateway: Client (v1: /v1/embed, /v1/rerank) and ClientV2 (/v2/...)."""
    import cohere

    texts, query = ["A man is eating food.", "A monkey plays drums."], "Someone eats."
    expected, scores = http_client.embed(texts), http_client.score(query, texts)
    v1 = cohere.Client(base_url=gateway, api_key=API_KEY)
    floats = v1.embed(texts=texts, model="minilm", input_type="search_document")
    assert floats.response_type == "embeddings_floats" and np.abs(np.array(floats.embeddings) - expected).max() <= 1e-6
    typed = v1.embed(texts=texts, model="minilm", embedding_types=["float", "int8"])
    assert np.abs(np.array(typed.embeddings.float_) - expected).max() <= 1e-6
    assert typed.embeddings.int8 == np.clip(np.round(expected * 127), -128, 127).astype(int).tolist()
    v2 = cohere.ClientV2(base_url=gateway, api_key=API_KEY)
    both = v2.embed(texts=texts, model="minilm", input_type="search_query", embedding_types=["float"])
    assert np.abs(np.array(both.embeddings.float_) - expected).max() <= 1e-6
    # v2's inputs of one text part each: the same vectors.
    inputs = [cohere.EmbedInput(content=[cohere.TextEmbedContent(text=text)]) for text in texts]
    parts = v2.embed(inputs=inputs, model="minilm", input_type="search_query", embedding_types=["float"])
    assert np.abs(np.array(parts.embeddings.float_) - expected).max() <= 1e-6
    # max_tokens_per_doc: each document as its first 2 tokens (where transformers' offsets say they end).
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    cut = [t[: tokenizer(t, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][1][1]]
           for t in texts]
    short = {r.index: r.relevance_score for r in v2.rerank(model="minilm", query=query, documents=texts,
                                                            max_tokens_per_doc=2).results}
    assert np.abs(np.array([short[i] for i in range(len(texts))]) - http_client.score(query, cut)).max() <= 1e-6
    assert np.abs(np.array([short[i] for i in range(len(texts))]) - scores).max() > 1e-3
    for client, documents in ((v1, texts), (v1, [{"text": text} for text in texts]), (v2, texts)):
        ranked = client.rerank(model="minilm", query=query, documents=documents, top_n=2)
        assert [r.index for r in ranked.results] == list(np.argsort(-scores))
        assert np.abs(np.array([r.relevance_score for r in ranked.results]) - np.sort(scores)[::-1]).max() <= 1e-6


def test_text_embeddings_inference_embed(http, http_client) -> None:
    """TEI's /embed: [[float]] as the served model gives it; normalize false is the pooled vector before
    MiniLM's Normalize (not unit, same direction); too long a text is cut at the end as TEI cuts it."""
    texts = ["A man is eating food.", "A man is eating a piece of bread."]
    expected = http_client.embed(texts)
    unit = http.post("/embed", json={"model": "minilm", "inputs": texts})
    assert unit.status_code == 200, unit.text
    assert np.abs(np.array(unit.json(), dtype=np.float32) - expected).max() <= 1e-6
    raw = np.array(http.post("/embed", json={"model": "minilm", "inputs": texts[0], "normalize": False}).json()[0])
    assert abs(np.linalg.norm(raw) - 1) > 0.1 and np.abs(raw / np.linalg.norm(raw) - expected[0]).max() <= 1e-6
    long = "pooling " * 1000
    cut = http.post("/embed", json={"model": "minilm", "inputs": long})
    refused = http.post("/embed", json={"model": "minilm", "inputs": long, "truncate": False})
    assert np.abs(np.array(cut.json()[0]) - http_client.embed([long], truncate="END")[0]).max() <= 1e-6
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation", refused.text
    # any size up to the width, cut and normalised as TEI does (minilm declares no Matryoshka sizes)
    cut = np.array(http.post("/embed", json={"model": "minilm", "inputs": texts, "dimensions": 100}).json())
    assert np.abs(cut - expected[:, :100] / np.linalg.norm(expected[:, :100], axis=1, keepdims=True)).max() <= 1e-6


def test_text_embeddings_inference_clients_and_routes(gateway, http, http_client) -> None:
    """huggingface_hub's InferenceClient against the gateway as against TEI (it posts to /, served by the first
    model, minilm): feature extraction equals the client's vectors, sentence similarity its scores; /info
    describes minilm; /decode drops special tokens as TEI does; /embed_all is minilm_tokens' raw token vectors."""
    from huggingface_hub import InferenceClient

    hub = InferenceClient(model=gateway, api_key=API_KEY)  # no model in the URL: the first served, minilm
    text, others = "A man is eating food.", ["A man is eating a piece of bread.", "A monkey plays drums."]
    vector = hub.feature_extraction(text)
    assert vector.shape == (1, 384) and np.abs(vector - http_client.embed([text])).max() <= 1e-6
    similarity = hub.sentence_similarity(text, other_sentences=others)
    assert np.abs(np.array(similarity) - http_client.score(text, others)).max() <= 1e-6
    # the URL names the model: a token_embed one, whose POST / is /embed_all
    named = InferenceClient(model=f"{gateway}/?model=minilm_tokens", api_key=API_KEY).feature_extraction(text)
    expected_tokens = http_client.encode([text], model="minilm_tokens", use_activation=False)[0]
    assert named.shape == (1, 8, 384) and np.abs(named[0] - expected_tokens).max() <= 1e-6

    info = http.get("/info").json()
    assert info["model_id"] == "minilm" and info["model_type"] == {"embedding": {"pooling": "mean"}}, info
    assert info["model_dtype"] == "float32" and info["max_input_length"] == 256
    # TEI's router settings, read from the stages' configs as this Triton answers them
    written = (REPOSITORY / "minilm_encoder" / "config.pbtxt").read_text()
    budget = int(re.search(r'key: "ragged_token_budget"\s*value \{\s*string_value: "(\d+)"', written)[1])
    assert info["max_batch_tokens"] == budget > 0 and info["max_batch_requests"] > 0
    assert info["tokenization_workers"] >= 1 and info["max_concurrent_requests"] >= 1, info
    ids = http_client.tokenize([text])[0]
    decoded = http.post("/decode", json={"model": "minilm", "ids": [ids, ids[1:-1]]}).json()
    assert decoded == ["a man is eating food."] * 2, decoded
    tokens = http.post("/embed_all", json={"model": "minilm_tokens", "inputs": [text, others[0]]}).json()
    expected = http_client.encode([text, others[0]], model="minilm_tokens", use_activation=False)
    assert [len(rows) for rows in tokens] == [len(rows) for rows in expected] == [8, 11]
    assert max(np.abs(np.array(got) - want).max() for got, want in zip(tokens, expected)) <= 1e-6
    assert not np.allclose(np.linalg.norm(expected[0], axis=1), 1)  # raw, not the per-token normalised vectors


def test_sagemaker_invocations_take_vllms_and_teis_bodies(http, http_client) -> None:
    text = "A man is eating food."
    expected = http_client.embed([text])
    vllm = http.post("/invocations", json={"model": "minilm", "input": text})
    tei = http.post("/invocations", json={"model": "minilm", "inputs": text})
    assert vllm.status_code == tei.status_code == 200, (vllm.text, tei.text)
    assert np.abs(np.array(vllm.json()["data"][0]["embedding"]) - expected[0]).max() <= 1e-6
    assert np.abs(np.array(tei.json()) - expected).max() <= 1e-6


def test_text_embeddings_inference_tokenize_equals_transformers(http) -> None:
    """TEI's /tokenize body: each token's id, string and span as transformers' tokenizer of the same files
    gives them (spans in UTF-8 bytes, as TEI counts; special tokens without one)."""
    from transformers import AutoTokenizer

    texts = ["Café naïve 東京 über-cool", "A man is eating food."]
    reference = AutoTokenizer.from_pretrained(str(minilm_path()))
    answer = http.post("/tokenize", json={"model": "minilm", "inputs": texts})
    assert answer.status_code == 200, answer.text
    for text, tokens in zip(texts, answer.json(), strict=True):
        expected = reference(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        strings = reference.convert_ids_to_tokens(expected["input_ids"])
        assert [t["id"] for t in tokens] == expected["input_ids"]
        assert [t["special"] for t in tokens] == [bool(m) for m in expected["special_tokens_mask"]]
        for token, string, (start, stop), special in zip(tokens, strings, expected["offset_mapping"],
                                                         expected["special_tokens_mask"], strict=True):
            if special:
                assert (token["text"], token["start"], token["stop"]) == (string, None, None)
            else:
                assert token["text"] == text[start:stop]
                assert (token["start"], token["stop"]) == (len(text[:start].encode()), len(text[:stop].encode()))
    assert any(t["stop"] - t["start"] > len(t["text"]) for t in answer.json()[0] if not t["special"])  # multi-byte


def test_score_and_rerank_routes(http, http_client) -> None:
    query, documents = "A man is eating food.", ["A monkey plays drums.", "A man is eating a piece of bread."]
    expected = http_client.score(query, documents)
    for path in ("/score", "/v1/score"):
        body = http.post(path, json={"model": "minilm", "text_1": query, "text_2": documents}).json()
        assert np.abs(np.array([d["score"] for d in body["data"]]) - expected).max() <= 1e-6
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = http.post(path, json={"model": "minilm", "query": query, "documents": documents, "top_n": 1}).json()
        assert [r["index"] for r in body["results"]] == [1]
        assert body["results"][0]["document"]["text"] == documents[1]
        # Usage as the model counted it (query and documents, special tokens included), as vLLM reports it.
        lengths = [len(ids) for ids in http_client.tokenize([query, *documents])]
        assert body["usage"] == {"prompt_tokens": sum(lengths), "total_tokens": sum(lengths)}
    # text-embeddings-inference's rerank body (texts) on the same path, in its shape: best first
    tei = http.post("/rerank", json={"model": "minilm", "query": query, "texts": documents, "return_text": True})
    assert [r["index"] for r in tei.json()] == [1, 0] and tei.json()[0]["text"] == documents[1], tei.text
    assert np.abs(np.array([r["score"] for r in tei.json()]) - expected[[1, 0]]).max() <= 1e-6


def test_pooling_token_output_and_tokenize(http, http_client) -> None:
    body = http.post("/pooling", json={"model": "rampart", "input": ["Mail john@example.com"]}).json()
    expected = http_client.encode(["Mail john@example.com"], model="rampart")[0]
    assert np.abs(np.array(body["data"][0]["data"]) - expected).max() <= 1e-6
    # vLLM's base64 of a token task's answer: its values flattened row by row, in the dtype and order asked
    packed = http.post("/pooling", json={"model": "rampart", "input": ["Mail john@example.com"],
                                         "encoding_format": "base64", "embed_dtype": "float16",
                                         "endianness": "big"}).json()["data"][0]["data"]
    unpacked = np.frombuffer(base64.b64decode(packed), dtype=">f2").reshape(expected.shape)
    assert np.abs(unpacked - expected).max() <= 1e-3
    raw = http.post("/pooling", json={"model": "rampart", "input": ["Mail john@example.com"],
                                      "encoding_format": "bytes"})
    (item,) = json.loads(raw.headers["metadata"])["data"]  # vLLM's bytes: the shape travels in the metadata
    assert tuple(item["shape"]) == expected.shape
    assert np.abs(np.frombuffer(raw.content, dtype=np.float32).reshape(item["shape"]) - expected).max() <= 1e-6
    refused = http.post("/pooling", json={"model": "rampart", "input": "x", "dimensions": 4})
    assert refused.status_code == 400 and "dimensions is currently not supported" in refused.text
    tokens = http.post("/tokenize", json={"model": "minilm", "prompt": "hello world"}).json()
    assert tokens["count"] == 4 and tokens["max_model_len"] == 256
    text = http.post("/detokenize", json={"model": "minilm", "tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "[CLS] hello world [SEP]"  # vLLM keeps special tokens unless asked not to
    plain = http.post("/detokenize", json={"model": "minilm", "tokens": tokens["tokens"],
                                           "skip_special_tokens": True}).json()["prompt"]
    assert plain == "hello world"
    bare = http.post("/tokenize", json={"model": "minilm", "prompt": "hello world", "add_special_tokens": False})
    assert bare.json()["tokens"] == tokens["tokens"][1:-1]
    strings = http.post("/tokenize", json={"model": "minilm", "prompt": "hello world", "return_token_strs": True})
    assert strings.json()["token_strs"] == ["[CLS]", "hello", "world", "[SEP]"]
    assert strings.json()["tokens"] == tokens["tokens"]


def test_models_health_metrics(gateway, http) -> None:
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert models["minilm"]["task"] == "embed" and models["rampart"]["task"] == "token_classify"
    assert httpx.get(f"{gateway}/health").status_code == 200  # no API key needed
    from prometheus_client.parser import text_string_to_metric_families

    def listed() -> float:
        families = text_string_to_metric_families(http.get("/metrics").text)
        return sum(s.value for f in families for s in f.samples if s.name == "pooltriton_gateway_requests_total"
                   and s.labels == {"route": "/v1/models", "status": "200"})

    before = listed()
    for _ in range(3):
        http.get("/v1/models")
    assert listed() == before + 3


@pytest.mark.parametrize(("path", "payload", "status", "message"), [
    ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "does not exist"),
    ("/v1/embeddings", {"model": "minilm", "input": "word " * 400}, 400, "limit of 256 tokens"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 128}, 400,
     "does not support 128 dimensions: it has 384"),
    ("/v1/embeddings", {"model": "minilm", "input": 5}, 400, "input"),
    ("/v1/embeddings", {"model": "minilm"}, 400, "input"),
    ("/v1/embeddings", {"model": "minilm", "input": [""]}, 400, "is empty"),
    ("/score", {"model": "rampart", "text_1": "a", "text_2": "b"}, 400, "cannot score"),
    ("/classify", {"model": "minilm", "input": "x"}, 400, "not 'classify'"),
    ("/detokenize", {"model": "minilm", "tokens": [-1, 10**9]}, 400, "tokens must be ids"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 10**12}, 400,
     "does not support 1000000000000 dimensions"),
    ("/v1/embeddings", {"model": "../minilm", "input": "x"}, 400, "invalid model name"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "truncate_prompt_tokens": -7}, 400,
     "truncate_prompt_tokens"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "truncate_prompt_tokens": 300}, 400,
     "greater than the model's limit of 256"),
    ("/v1/embeddings", {"model": "rampart", "input": "x"}, 400, "serves task 'token_classify', not 'embed'"),
    ("/v2/embed", {"model": "rampart", "texts": ["x"]}, 400, "use /pooling"),
    ("/v1/embeddings", {"model": "minilm", "input": [10**9]}, 400, "token ids must be integers"),
    ("/rerank", {"model": "minilm", "query": "q", "documents": []}, 400, "documents is empty"),
    ("/score", {"model": "minilm", "text_1": ["a", "b"], "text_2": ["x", "y", "z"]}, 400, "quer"),
    ("/v2/embed", {"model": "minilm", "texts": ["x"], "embedding_types": ["float16"]}, 400, "embedding_types"),
])
def test_errors_have_the_openai_shape(http, path, payload, status, message) -> None:
    response = http.post(path, json=payload)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status and error["type"]


@pytest.mark.parametrize(("tokens", "side"), [(-1, None), (-1, "left"), (10, None), (10, "left"), (256, "right")])
def test_truncate_prompt_tokens(http, minilm_st, tokens, side) -> None:
    """vLLM's option: keep the first k tokens (vLLM loads a pooling model's tokenizer with truncation_side
    right), the last k with truncation_side left."""
    long = " ".join(f"w{i}" for i in range(400))
    payload = {"model": "minilm", "input": long, "truncate_prompt_tokens": tokens}
    if side:
        payload["truncation_side"] = side
    body = http.post("/v1/embeddings", json=payload).json()
    limit = 256 if tokens == -1 else min(tokens, 256)
    assert body["usage"]["prompt_tokens"] == limit  # the tokens the model read, not the untruncated length
    minilm_st.max_seq_length, minilm_st.tokenizer.truncation_side = limit, side or "right"
    try:
        expected = minilm_st.encode([long], normalize_embeddings=True)[0]
    finally:
        minilm_st.max_seq_length, minilm_st.tokenizer.truncation_side = 256, "right"
    assert np.abs(np.array(body["data"][0]["embedding"]) - expected).max() <= 1e-5


def test_text_embeddings_inferences_openai_route_truncates_and_normalises(http, minilm_st) -> None:
    """POST /embeddings is TEI's: an over-long text is truncated (its --auto-truncate), where /v1/embeddings
    (vLLM's) refuses it; an OpenAI model name not served is answered by the first embedding model."""
    long = " ".join(f"w{i}" for i in range(400))
    assert http.post("/v1/embeddings", json={"model": "minilm", "input": long}).status_code == 400
    body = http.post("/embeddings", json={"model": "text-embedding-ada-002", "input": [long, "short"]}).json()
    expected = minilm_st.encode([long, "short"], normalize_embeddings=True)
    got = np.array([item["embedding"] for item in body["data"]])
    assert np.abs(got - expected).max() <= 1e-5 and body["usage"]["prompt_tokens"] == 256 + 3


def test_bad_json_missing_key_and_too_large(gateway, http) -> None:
    response = http.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    assert httpx.post(f"{gateway}/v1/embeddings", json={"input": "x"}).status_code == 401
    wrong = httpx.post(f"{gateway}/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    big = http.post("/v1/embeddings", content=b"x" * (9 * 1024 * 1024), headers={"content-type": "application/json"})
    assert big.status_code == 413


def test_openapi_document(http) -> None:
    spec = http.get("/openapi.json").json()
    for path in ("/v1/embeddings", "/v2/embed", "/", "/invocations", "/info", "/embed", "/embed_all",
                 "/embed_sparse", "/predict", "/similarity", "/decode", "/classify", "/score",
                 "/v1/score",
                 "/rerank", "/v1/rerank",
                 "/v2/rerank", "/pooling", "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics"):
        assert path in spec["paths"], path


def test_token_id_input_equals_text_input(http, http_client) -> None:
    ids = http.post("/tokenize", json={"model": "minilm", "prompt": "A man is eating food."}).json()["tokens"]
    for payload in (ids, [ids, ids]):
        body = http.post("/v1/embeddings", json={"model": "minilm", "input": payload}).json()
        vectors = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert np.abs(vectors - http_client.embed(["A man is eating food."])[0]).max() <= 1e-5
        assert body["usage"]["prompt_tokens"] == len(ids) * (1 if payload is ids else 2)
    bad = http.post("/v1/embeddings", json={"model": "minilm", "input": [10**9]})
    assert bad.status_code == 400 and "token ids must be integers" in bad.json()["error"]["message"]
    # TEI's /embed takes a batch mixing texts and rows of ids, answered in order
    mixed = http.post("/embed", json={"model": "minilm", "inputs": ["hello world", ids, "hello world"]}).json()
    expected = http_client.embed(["hello world", "A man is eating food.", "hello world"])
    assert np.abs(np.array(mixed) - expected).max() <= 1e-5


@pytest.mark.parametrize("priority", [-5, 0, 7])
def test_priority_is_accepted(http, priority) -> None:
    body = http.post("/v1/embeddings", json={"model": "minilm", "input": "x", "priority": priority})
    assert body.status_code == 200, body.text


def test_no_server_errors_for_arbitrary_json(http) -> None:
    """Property-based: whatever JSON arrives, the gateway answers 2xx/4xx, never 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    numbers = st.integers(-10, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    scalars = st.none() | st.booleans() | numbers | st.text(max_size=30)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=8), inner, max_size=4), max_leaves=12)
    fields = st.fixed_dictionaries({}, optional={
        "model": st.sampled_from(["minilm", "rampart", "minilm_tokens", "nope"]) | st.text(max_size=5),
        "input": values, "text_1": values, "text_2": values, "query": values, "documents": values,
        "texts": values, "encoding_format": values, "dimensions": values, "top_n": values, "truncate": values,
        "embedding_types": values, "priority": values, "use_activation": values, "prompt": values, "tokens": values,
        "truncate_prompt_tokens": values, "inputs": values, "ids": values, "normalize": values,
        "parameters": values})
    paths = st.sampled_from(["/v1/embeddings", "/v2/embed", "/classify", "/score", "/rerank", "/pooling",
                             "/tokenize", "/detokenize", "/", "/embed", "/embed_sparse", "/embed_all", "/predict",
                             "/similarity", "/decode", "/invocations"])

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=paths, body=fields)
    def check(path, body):
        response = http.post(path, json=body)
        assert response.status_code < 500, (path, body, response.status_code, response.text[:300])
        if response.status_code >= 400:
            assert "error" in response.json()

    check()


def test_triton_unavailable_is_503(tmp_path) -> None:
    from conftest import free_port

    with running_gateway(f"localhost:{free_port()}") as url:
        assert httpx.get(f"{url}/health").status_code == 503
        response = httpx.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": "x"})
        assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable"


def test_committed_openapi_document_is_current(http) -> None:
    """docs/openapi.json is the gateway's published contract: regenerate it when routes change
    (python -m pooltriton.gateway --write-openapi docs/openapi.json)."""
    import json
    from pathlib import Path

    committed = json.loads((Path(__file__).resolve().parent.parent / "docs" / "openapi.json").read_text())
    assert committed == http.get("/openapi.json").json()


def test_concurrent_requests_travel_merged_each_with_its_own_answer_and_error(gateway, http_client) -> None:
    """The gateway merges concurrent small requests for one model into one Triton call (client.coalesce):
    each still gets exactly its own vectors, usage and error, for sequence and token tasks alike."""
    import asyncio

    texts = [f"sentence {i} about " + "pooling " * (i % 37) for i in range(40)]
    mails = [f"Mail person{i}@example.com about {'invoices ' * (i % 5)}" for i in range(12)]
    expected, tokens = http_client.embed(texts), http_client.encode(mails, model="rampart")
    usage = [len(ids) for ids in http_client.tokenize(texts)]

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway, headers={"Authorization": f"Bearer {API_KEY}"},
                                     timeout=60) as client:
            calls = [client.post("/v1/embeddings", json={"model": "minilm", "input": [t]}) for t in texts]
            calls.insert(17, client.post("/v1/embeddings", json={"model": "minilm", "input": ["word " * 400]}))
            calls += [client.post("/pooling", json={"model": "rampart", "input": [m]}) for m in mails]
            return await asyncio.gather(*calls)

    answers = asyncio.run(send())
    too_long = answers.pop(17)
    assert too_long.status_code == 400 and "limit of 256 tokens" in too_long.json()["error"]["message"]
    for answer, vector, count in zip(answers[: len(texts)], expected, usage):
        assert answer.status_code == 200, answer.text
        assert np.abs(np.array(answer.json()["data"][0]["embedding"]) - vector).max() <= 1e-5
        assert answer.json()["usage"]["prompt_tokens"] == count
    for answer, rows in zip(answers[len(texts):], tokens):
        assert answer.status_code == 200, answer.text
        assert np.abs(np.array(answer.json()["data"][0]["data"]) - rows).max() <= 1e-5
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(
        f"{gateway}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text)}
    carried = {s.name: s.value for s in families["pooltriton_gateway_requests_per_triton_call"].samples}
    # Each encode request was carried by some call (merging itself is pinned in test_coalesce.py).
    assert carried["pooltriton_gateway_requests_per_triton_call_sum"] >= len(texts) + len(mails)
