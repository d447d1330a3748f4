"""Client library: asyncio client equals the blocking one, tokenize, retry policy, CLI commands."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from pooltriton.client import AsyncPoolingClient
from pooltriton.contract.requests import classify


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_async_client_equals_blocking_client(server, http_client, protocol: str) -> None:
    texts = [f"text {i} about pooling models" for i in range(300)]  # several chunks, sent concurrently
    url = server.http_url if protocol == "http" else server.grpc_url

    async def run():
        async with AsyncPoolingClient(url, protocol=protocol) as client:
            vectors = await client.embed(texts)
            scores = await client.score("text 1 about pooling models", texts[:3])
            tags = await client.classify_tokens(["Mail john@example.com"], model="rampart")
            ranked = await client.rerank("text 1 about pooling models", texts[:3], top_n=1)
            return vectors, scores, tags, ranked

    vectors, scores, tags, ranked = asyncio.run(run())
    assert np.abs(vectors - http_client.embed(texts)).max() <= 1e-6
    assert np.abs(scores - http_client.score("text 1 about pooling models", texts[:3])).max() <= 1e-6
    assert "B-EMAIL" in tags.tags()[0] and ranked[0].index == 1


def test_tokenize_uses_the_model_tokenizer(client, minilm_st) -> None:
    texts = ["A man is eating food.", "hello"]
    assert client.tokenize(texts) == [minilm_st.tokenizer(t)["input_ids"] for t in texts]


def test_only_unavailable_is_retried() -> None:
    assert classify(InferenceServerException("down", status="StatusCode.UNAVAILABLE")).retryable
    assert classify(InferenceServerException("down", status="503")).retryable  # the HTTP client's form
    assert not classify(InferenceServerException("bad", status="StatusCode.INVALID_ARGUMENT")).retryable
    assert classify(InferenceServerException("bad", status="400")).status == 400
    assert not classify(ValueError("x")).retryable


@pytest.mark.parametrize(("command", "message"), [
    (["classify", "--model", "rampart", "x"], "serves task 'token_classify', not 'classify'"),
    (["embed", "word " * 300], "limit of 256 tokens"),
])
def test_cli_errors_are_clear(server, command, message) -> None:
    result = subprocess.run([sys.executable, "-m", "pooltriton.client", "--url", server.http_url, *command],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [
    ["tokenize", "hello world"], ["rerank", "A man eats.", "Someone eats.", "A monkey."],
    ["score", "A man eats.", "Someone eats."], ["encode", "--model", "rampart", "Mail john@example.com"],
])
def test_cli_commands(server, command) -> None:
    out = subprocess.run([sys.executable, "-m", "pooltriton.client", "--url", server.http_url, *command],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out)["model"] == "minilm" or "rampart" in command
