"""Bad input gets a clear error for that request only; the server keeps serving and loses nothing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(params=["http", "grpc"])
def raw(request, server):
    module = MODULES[request.param]
    url = server.http_url if request.param == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    yield module, client, url
    client.close()


def send(module, client, array: np.ndarray, datatype: str, parameters: dict | None = None) -> np.ndarray:
    tensor = module.InferInput("TEXT", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    result = client.infer("minilm", [tensor], outputs=[module.InferRequestedOutput("EMBEDDING")],
                          parameters=parameters)
    return result.as_numpy("EMBEDDING")


def texts(*items: bytes | str) -> np.ndarray:
    return np.array([i.encode() if isinstance(i, str) else i for i in items], dtype=object).reshape(-1, 1)


def assert_still_serving(module, client) -> None:
    vector = send(module, client, texts("still serving"), "BYTES")
    assert vector.shape == (1, 384) and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


@pytest.mark.parametrize(
    ("array", "datatype", "message"),
    [
        (texts("ok", ""), "BYTES", r"text 1 is empty"),
        (texts(b"caf\xe9 au lait"), "BYTES", r"text 0 is not valid UTF-8"),
        (np.zeros((0, 1), dtype=object), "BYTES", r"expected 1 string elements|empty batch|got 0"),
        (np.ones((1, 1), dtype=np.float32), "FP32", r"data-type is 'FP32', but model 'minilm' expects 'BYTES'"),
        (texts("a", "b").reshape(1, 2), "BYTES", r"unexpected shape"),
    ],
    ids=["empty-string", "non-utf8", "empty-batch", "wrong-dtype", "wrong-shape"],
)
def test_bad_input_is_a_clear_error_and_server_keeps_serving(raw, array, datatype, message) -> None:
    module, client, _url = raw
    with pytest.raises(InferenceServerException, match=message):
        send(module, client, array, datatype)
    assert_still_serving(module, client)


def test_bad_request_inside_a_dynamic_batch_fails_alone(raw) -> None:
    """Good and bad requests land in the same dynamic batch: only the bad ones fail."""
    module, client, url = raw
    payloads = [texts(f"good request number {i}") for i in range(12)]
    bad = {3: texts(""), 7: texts(b"\xff\xfe"), 9: texts("word " * 400)}
    payloads = [bad.get(i, p) for i, p in enumerate(payloads)]

    def call(array):
        # One client per thread: tritonclient's HTTP client is not thread-safe.
        own = module.InferenceServerClient(url)
        try:
            return send(module, own, array, "BYTES")
        except InferenceServerException as error:
            return error
        finally:
            own.close()

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, payloads))
    for index, result in enumerate(results):
        if index in bad:
            assert isinstance(result, InferenceServerException), index
        else:
            assert isinstance(result, np.ndarray) and result.shape == (1, 384), (index, result)
    assert_still_serving(module, client)


def test_client_library_rejects_empty_list(http_client) -> None:
    with pytest.raises(ValueError, match="texts is empty"):
        http_client.embed([])


def _request(module, client, model: str, inputs: dict[str, np.ndarray], parameters: dict | None = None):
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors, parameters=parameters)


@pytest.mark.parametrize(
    ("model", "inputs", "parameters", "message"),
    [
        ("minilm", {"TEXT": texts("word " * 200_000)}, None, r"limit of 256 tokens"),  # ~1 MB
        ("minilm", {"TEXT": texts(*(["x"] * 129))}, None, r"batch-size must be <= 128"),
        ("minilm", {"TEXT": texts("x")}, {"truncate": "SIDEWAYS"}, r"truncate"),
        ("minilm", {"TEXT": texts("x")}, {"use_activation": "maybe"}, r"use_activation must be true or false"),
        ("minilm", {"TEXT": texts("x")}, {"max_tokens": -5}, r"max_tokens must be a positive integer"),
        ("minilm", {"TEXT": texts("[1, 999999999]")}, {"input_format": "token_ids"},
         r"token ids must be integers"),
        ("minilm", {"TEXT": texts("not json")}, {"input_format": "token_ids"},
         r"TEXT item 0 is not a JSON list of integers"),
        ("no_such_model", {"TEXT": texts("x")}, None, r"unknown model|not found"),
        ("minilm_score", {"QUERY": np.array([b"a", b"b"], dtype=object),
                          "DOCUMENTS": np.array([b"x", b"y", b"z"], dtype=object)}, None, r"quer|document"),
        ("minilm_score", {"QUERY": np.array([b"a"], dtype=object)}, None, r"DOCUMENTS|input"),
        ("minilm_tokenizer", {"TEXT": texts("[1, -4]")}, {"mode": "detokenize"}, r"tokens must be ids"),
        # Triton's front end refuses a TEXT of no elements; the tokenizer stage would too (BLS callers).
        ("minilm", {"TEXT": np.empty((0, 1), dtype=object)}, None, r"got 0|empty batch"),
        ("minilm_tokenizer", {"TEXT": np.empty((0, 1), dtype=object)}, {"mode": "tokenize"}, r"got 0|empty batch"),
    ],
    ids=["1MB-text", "too-many-texts", "bad-truncate", "bad-use-activation", "bad-max-tokens", "bad-token-ids",
         "token-ids-not-json", "unknown-model", "mismatched-score-lists", "missing-documents", "bad-detokenize",
         "no-texts", "tokenize-no-texts"],
)
def test_bad_requests_are_named_and_break_nothing(raw, model, inputs, parameters, message) -> None:
    module, client, _url = raw
    with pytest.raises(InferenceServerException, match=message) as caught:
        _request(module, client, model, inputs, parameters)
    status = str(caught.value.status())
    assert status in ("400", "404") or "INVALID_ARGUMENT" in status or "NOT_FOUND" in status, status
    assert_still_serving(module, client)


def test_nul_and_unusual_text_is_served(raw) -> None:
    """NUL is valid UTF-8 inside a BYTES element: served like any text, not an error."""
    module, client, _url = raw
    vectors = send(module, client, texts("a\x00b", "\u202etext\u200b", "🙂" * 10), "BYTES")
    assert vectors.shape == (3, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
