"""Client library: asyncio client equals the blocking one, tokenize, retry policy, CLI commands."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from pooltriton.client import AsyncPoolingClient
from pooltriton.client.service import TritonTransport
from pooltriton.contract.requests import BACKOFF_S, MAX_BACKOFF_S, TritonRequest, classify, retry_delay

from conftest import running_gateway


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


def test_client_tokenize_accepts_what_the_gateway_tokenize_accepts(server, http_client, minilm_st) -> None:
    """One service behind both: untruncated (a text over the model's 256-token limit) and lists over the
    tokenizer's batch of 128, in order."""
    long = "word " * 600
    texts = [long] + [f"text {i}" for i in range(200)]
    got = http_client.tokenize(texts)
    assert len(got) == 201 and len(got[0]) == 602
    assert got[0] == minilm_st.tokenizer(long)["input_ids"]
    assert got[150] == minilm_st.tokenizer("text 149")["input_ids"]
    with running_gateway(server.grpc_url, admin_key=server.admin_key) as url:
        body = httpx.post(f"{url}/tokenize", json={"model": "minilm", "prompt": long}).json()
    assert body["tokens"] == got[0] and body["count"] == 602


def test_client_score_reports_usage(http_client, minilm_st) -> None:
    query, documents = "a query", ["first document", "the second document here"]
    scored = http_client.score_with_usage(query, documents)
    tokens = sum(len(minilm_st.tokenizer(t)["input_ids"]) for t in [query, *documents])
    assert scored.tokens == tokens
    assert np.abs(scored.values - http_client.score(query, documents)).max() <= 1e-6


def test_only_unavailable_is_retried() -> None:
    assert classify(InferenceServerException("down", status="StatusCode.UNAVAILABLE")).retryable
    assert classify(InferenceServerException("down", status="503")).retryable  # the HTTP client's form
    assert not classify(InferenceServerException("bad", status="StatusCode.INVALID_ARGUMENT")).retryable
    assert classify(InferenceServerException("bad", status="400")).status == 400
    assert not classify(ValueError("x")).retryable
    # a restricted API over gRPC comes back UNAVAILABLE: no retry opens it
    restricted = InferenceServerException("This protocol is restricted, expecting header 'x'",
                                          status="StatusCode.UNAVAILABLE")
    assert classify(restricted).status == 403 and not classify(restricted).retryable


def test_a_refusal_by_admission_is_retried_no_sooner_than_it_says_and_not_at_all_when_far() -> None:
    def refused(seconds: int) -> InferenceServerException:
        return InferenceServerException(f"in ensemble 'minilm', overloaded: ...; retry after {seconds} s",
                                        status="StatusCode.UNAVAILABLE")

    assert retry_delay(0, InferenceServerException("full", status="StatusCode.UNAVAILABLE")) == BACKOFF_S
    assert retry_delay(0, refused(2)) == 2
    assert retry_delay(4, refused(1)) == BACKOFF_S * 2**4  # the backoff when longer
    assert retry_delay(0, refused(int(MAX_BACKOFF_S) + 1)) is None  # the caller gets the refusal at once
    assert classify(refused(7)).retry_after_s == 7
    assert classify(InferenceServerException("retry after 7 s of text echoed, then more", status="400")
                    ).retry_after_s is None


class _TimingOut:
    """tritonclient's infer as a server whose queue timed the request out: records each call's keywords."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    async def infer(self, *_args, **keywords):
        self.calls.append(keywords)
        raise InferenceServerException("Request timeout expired", status="StatusCode.UNAVAILABLE")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_deadline_goes_to_triton_and_bounds_the_retries(protocol: str) -> None:
    async def run(timeout_s: float | None, retries: int) -> tuple[list[dict], InferenceServerException]:
        transport = TritonTransport("localhost:1", protocol, retries=retries, timeout_s=timeout_s)
        await transport.server.close()
        transport.server = _TimingOut()
        request = TritonRequest("m", {"TEXT": ["a"]}, ("EMBEDDING",), {}, batched=True)
        with pytest.raises(InferenceServerException) as raised:
            await transport.infer(request)
        return transport.server.calls, raised.value

    calls, error = asyncio.run(run(BACKOFF_S * 2.5, retries=8))
    # Triton gets the time left as the request's own timeout (microseconds), gRPC also as the call's deadline.
    assert 0 < calls[0]["timeout"] <= BACKOFF_S * 2.5 * 1e6
    assert ("client_timeout" in calls[0]) == (protocol == "grpc")
    # Retried while the backoff fits before the deadline (0.25 s, then 0.5 s would pass 0.625 s), then
    # the last error at once; without a deadline, every attempt and no timeout sent.
    assert len(calls) == 2 and "timeout expired" in str(error)
    assert calls[1]["timeout"] < calls[0]["timeout"]  # one deadline for all attempts
    calls, _ = asyncio.run(run(None, retries=3))
    assert len(calls) == 3 and all(call.get("timeout") is None and "client_timeout" not in call for call in calls)


class _Hanging:
    """A server that never answers a metadata read; tritonclient's gRPC client gives up at its
    client_timeout, its HTTP client never does."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    async def get_model_config(self, *_args, **keywords):
        self.calls.append(keywords)
        if "client_timeout" in keywords:
            await asyncio.sleep(keywords["client_timeout"])
            raise InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED")
        await asyncio.Event().wait()

    get_model_repository_index = get_model_config


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_deadline_bounds_its_metadata_reads(protocol: str) -> None:
    """A model's config and the repository index are read within timeout_s too: a server that accepts
    the connection and never answers gets DEADLINE_EXCEEDED, not a client waiting for ever."""
    async def run() -> list[dict]:
        transport = TritonTransport("localhost:1", protocol, timeout_s=0.05)
        await transport.server.close()
        transport.server = _Hanging()
        for read in (lambda: transport.model_config("m"), lambda: transport.repository_index(None)):
            with pytest.raises(InferenceServerException) as raised:
                await asyncio.wait_for(read(), 10)  # (a regression fails here instead of hanging)
            assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        return transport.server.calls

    calls = asyncio.run(run())
    assert len(calls) == 2 and all(("client_timeout" in call) == (protocol == "grpc") for call in calls)


@pytest.mark.parametrize(("command", "message"), [
    (["classify", "--model", "rampart", "x"], "serves task 'token_classify', not 'classify'"),
    (["embed", "word " * 300], "limit of 256 tokens"),
])
def test_cli_errors_are_clear(server, command, message) -> None:
    result = subprocess.run([sys.executable, "-m", "pooltriton.client", "--url", server.http_url, *command],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_cli_commands(server, http_client, minilm_st) -> None:
    """Each command prints what it names: the model's token ids, cosine scores and their ranking, and
    the raw per-token output the library client returns."""

    def cli(*command: str) -> dict:
        return json.loads(subprocess.run([sys.executable, "-m", "pooltriton.client", "--url", server.http_url,
                                          *command], check=True, capture_output=True, text=True).stdout)

    out = cli("tokenize", "hello world")
    assert out == {"model": "minilm", "data": [{"index": 0, "tokens": minilm_st.tokenizer("hello world")["input_ids"]}]}
    query, documents = "A man eats.", ["A monkey.", "Someone eats."]
    vectors = minilm_st.encode([query, *documents], normalize_embeddings=True)
    cosines = vectors[1:] @ vectors[0]
    out = cli("score", query, *documents)
    assert np.abs(np.array([row["score"] for row in out["data"]]) - cosines).max() <= 1e-5
    out = cli("--timeout-s", "60", "embed", query)  # a deadline that holds changes nothing in the answer
    assert np.abs(np.array(out["data"][0]["embedding"]) - vectors[0]).max() <= 1e-5
    out = cli("rerank", query, *documents)
    order = [int(i) for i in np.argsort(-cosines)]
    assert [r["index"] for r in out["results"]] == order
    assert [r["document"] for r in out["results"]] == [documents[i] for i in order]
    assert np.abs(np.array([r["relevance_score"] for r in out["results"]]) - cosines[order]).max() <= 1e-5
    out = cli("encode", "--model", "rampart", "Mail john@example.com")
    expected = http_client.encode(["Mail john@example.com"], model="rampart")[0]
    got = np.array(out["data"][0]["data"])
    assert out["model"] == "rampart" and got.shape == expected.shape and np.abs(got - expected).max() <= 1e-6
