"""Python client for the served pooling models, over Triton's HTTP or gRPC protocol (tritonclient).

    client = PoolingClient("localhost:8001", protocol="grpc")
    vectors = client.embed(["A man is eating food."])            # np.ndarray [1, 384], L2-normalised
    async with AsyncPoolingClient("localhost:8001") as aclient:   # the same API, awaited
        vectors = await aclient.embed(["A man is eating food."])
    tokens = client.encode(["Call John"], task="token_classify", model="rampart")  # per-text arrays
    scores = client.score("query", ["doc a", "doc b"], model="minilm")            # bi-encoder cosine

Big inputs are split into requests of at most `max_batch` texts and reassembled in order.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pooltriton.contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    MAX_BATCH_SIZE,
    PLUGIN_INPUT,
    PLUGIN_OUTPUT,
    SCORES,
    TEXT,
    stages,
    triton_priority,
)
from pooltriton.contract import requests as protocol
from pooltriton.contract.requests import (
    RETRIES,
    ModelInfo,
    TritonRequest,
    as_texts,
    model_info,
    retry_delay,
    score_inputs,
)

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}


@dataclass(frozen=True)
class Classification:
    """Class probabilities (or logits with use_activation=False) with the model's label names."""

    probabilities: np.ndarray  # [n, C]
    labels: tuple[str, ...]

    def top(self) -> list[tuple[str, float]]:
        best = self.probabilities.argmax(axis=1)
        return [(self.labels[i], float(self.probabilities[row, i])) for row, i in enumerate(best)]


@dataclass(frozen=True)
class TokenClassification:
    """One [tokens_i, C] array per text (real tokens only) with the model's label names."""

    probabilities: list[np.ndarray]
    labels: tuple[str, ...]

    def tags(self) -> list[list[str]]:
        return [[self.labels[i] for i in p.argmax(axis=1)] for p in self.probabilities]


@dataclass(frozen=True)
class RerankResult:
    index: int
    score: float
    document: str


class _Requests:
    """What both clients send and how they read answers; transport lives in the subclasses."""

    def __init__(self, url: str | None, protocol: str, model: str, max_batch: int, asynchronous: bool,
                 retries: int) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        if protocol == "http":
            import tritonclient.http as module
            if asynchronous:
                import tritonclient.http.aio as module
        else:
            import tritonclient.grpc as module
            if asynchronous:
                import tritonclient.grpc.aio as module
        self._module = module
        self._client = module.InferenceServerClient(url or DEFAULT_URLS[protocol])
        self.protocol, self.model, self.max_batch, self.retries = protocol, model, max_batch, retries
        self._info: dict[str, ModelInfo] = {}

    @property
    def server(self) -> Any:
        """tritonclient's own client, for the KServe calls this one does not wrap (health, index)."""
        return self._client

    def _config_from(self, response: Any) -> dict:
        return response["config"] if self.protocol == "grpc" else response

    def _send(self, request: TritonRequest) -> tuple[list, list]:
        """tritonclient's input and output objects for a request (same for both transports)."""
        tensors = []
        for name, array in request.arrays().items():
            tensor = self._module.InferInput(name, list(array.shape), "BYTES")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return tensors, [self._module.InferRequestedOutput(name) for name in request.outputs]

    def _encode_requests(self, info: ModelInfo, texts: str | Sequence[str], pairs: Sequence[str] | None,
                         task: str | None, options: dict[str, Any], priority: int) -> list[TritonRequest]:
        if task is not None and info.task and task != info.task:
            raise ValueError(f"model {info.name!r} serves task {info.task!r}, not {task!r} (one task per model)")
        return protocol.encode_requests(info.name, info.outputs, as_texts(texts), None if pairs is None else
                                        list(pairs), options, triton_priority(priority), self.max_batch)

    def _score_request(self, model: str | None, query: str | Sequence[str], documents: str | Sequence[str],
                       options: dict[str, Any], priority: int) -> TritonRequest:
        return TritonRequest(stages(model or self.model).score, score_inputs(query, documents), (SCORES,),
                       protocol.parameters(options), False, triton_priority(priority))

    def _tokenize_request(self, model: str | None, texts: str | Sequence[str],
                          options: dict[str, Any]) -> TritonRequest:
        return TritonRequest(stages(model or self.model).tokenizer, {TEXT: as_texts(texts)},
                             (INPUT_IDS, ATTENTION_MASK), protocol.parameters(options), True)

    @staticmethod
    def _plugin_request(model: str, inputs: str | Sequence[str], options: dict[str, Any]) -> TritonRequest:
        return TritonRequest(model, {PLUGIN_INPUT: as_texts(inputs, "inputs")}, (PLUGIN_OUTPUT,),
                       protocol.parameters(options), False)

    @staticmethod
    def _ranked(scores: np.ndarray, documents: Sequence[str], top_n: int | None) -> list[RerankResult]:
        order = np.argsort(-scores, kind="stable")[: top_n or len(documents)]
        return [RerankResult(int(i), float(scores[i]), documents[i]) for i in order]



class PoolingClient(_Requests):
    """Blocking client. Every call retries on UNAVAILABLE with exponential backoff. `priority` is
    vLLM's (lower runs earlier, 0 default), mapped to Triton's priority levels."""

    def __init__(self, url: str | None = None, protocol: str = "http", model: str = "minilm",
                 max_batch: int = MAX_BATCH_SIZE, retries: int = RETRIES) -> None:
        super().__init__(url, protocol, model, max_batch, asynchronous=False, retries=retries)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PoolingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _retry(self, call: Callable[[], Any]) -> Any:
        """Every call to the server, retried on UNAVAILABLE (contract.requests.retry_delay)."""
        for attempt in itertools.count():
            try:
                return call()
            except Exception as error:
                if (delay := retry_delay(attempt, error, self.retries)) is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        tensors, requested = self._send(request)
        result = self._retry(lambda: self._client.infer(request.model, tensors, outputs=requested,
                                                        parameters=request.parameters or None,
                                                        priority=request.priority))
        return {name: result.as_numpy(name) for name in request.outputs}

    def info(self, model: str | None = None) -> ModelInfo:
        """Task, outputs and label names of a served ensemble, from its config (cached)."""
        model = model or self.model
        if model not in self._info:
            kwargs = {"as_json": True} if self.protocol == "grpc" else {}
            config = self._retry(lambda: self._client.get_model_config(model, **kwargs))
            self._info[model] = model_info(model, self._config_from(config))
        return self._info[model]

    def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
               pairs: Sequence[str] | None = None, priority: int = 0,
               **options: Any) -> np.ndarray | list[np.ndarray]:
        """vLLM's `encode(task=...)`: sequence tasks return [n, C]; token tasks a list of [tokens_i, C]
        arrays, exactly each text's real tokens. `task`, when given, must be the model's task.
        Options: truncate ("NONE" | "END" | "START"), use_activation (bool), prompt_name (one of the
        model's sentence-transformers prompts; default: its default prompt)."""
        info = self.info(model)
        requests = self._encode_requests(info, texts, pairs, task, options, priority)
        return protocol.reassemble(info.outputs, [self.infer(r) for r in requests])

    def embed(self, texts: str | Sequence[str], *, model: str | None = None, **options: Any) -> np.ndarray:
        """One vector per text, [n, dim] float32. `truncate`: None/"NONE" rejects over-length texts
        with an error naming the limit; "END" or "START" cuts them to the model's limit."""
        return self.encode(texts, model=model, **options)

    def classify(self, texts: str | Sequence[str], *, model: str | None = None,
                 pairs: Sequence[str] | None = None, **options: Any) -> Classification:
        """Class probabilities per text (or per (text, pair) for cross-encoders) with label names."""
        return Classification(self.encode(texts, model=model, pairs=pairs, task="classify", **options),
                              self.info(model).labels)

    def classify_tokens(self, texts: str | Sequence[str], *, model: str | None = None,
                        **options: Any) -> TokenClassification:
        values = self.encode(texts, model=model, task="token_classify", **options)
        return TokenClassification(values, self.info(model).labels)

    def score(self, query: str | Sequence[str], documents: str | Sequence[str], *, model: str | None = None,
              priority: int = 0, **options: Any) -> np.ndarray:
        """Scores from `<model>_score`: 1:1, 1:N (one query) or N:N (zipped lists)."""
        return self.infer(self._score_request(model, query, documents, options, priority))[SCORES]

    def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None, top_n: int | None = None,
               **options: Any) -> list[RerankResult]:
        """Documents sorted by score, best first (cross-encoder, bi-encoder or late interaction)."""
        return self._ranked(self.score(query, list(documents), model=model, **options), documents, top_n)

    def tokenize(self, texts: str | Sequence[str], *, model: str | None = None, **options: Any) -> list[list[int]]:
        """Token ids per text, from the model's own tokenizer stage (`<model>_tokenizer`)."""
        return protocol.token_lists(self.infer(self._tokenize_request(model, texts, options)))

    def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        """Call a plugin model (see pooltriton.core.plugins): one decoded JSON answer per input."""
        result = self.infer(self._plugin_request(model, inputs, parameters))
        return [json.loads(item) for item in result[PLUGIN_OUTPUT]]


class AsyncPoolingClient(_Requests):
    """asyncio client (tritonclient's aio HTTP/gRPC clients): the same methods, awaited; the requests of
    a big input are sent concurrently."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", model: str = "minilm",
                 max_batch: int = MAX_BATCH_SIZE, retries: int = RETRIES) -> None:
        super().__init__(url, protocol, model, max_batch, asynchronous=True, retries=retries)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncPoolingClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _retry(self, call: Callable[[], Awaitable[Any]]) -> Any:
        for attempt in itertools.count():
            try:
                return await call()
            except Exception as error:
                if (delay := retry_delay(attempt, error, self.retries)) is None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        tensors, requested = self._send(request)
        result = await self._retry(lambda: self._client.infer(request.model, tensors, outputs=requested,
                                                              parameters=request.parameters or None,
                                                              priority=request.priority))
        return {name: result.as_numpy(name) for name in request.outputs}

    async def info(self, model: str | None = None) -> ModelInfo:
        model = model or self.model
        if model not in self._info:
            kwargs = {"as_json": True} if self.protocol == "grpc" else {}
            config = self._config_from(await self._retry(lambda: self._client.get_model_config(model, **kwargs)))
            self._info[model] = model_info(model, config)
        return self._info[model]

    async def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
                     pairs: Sequence[str] | None = None, priority: int = 0,
                     **options: Any) -> np.ndarray | list[np.ndarray]:
        info = await self.info(model)
        requests = self._encode_requests(info, texts, pairs, task, options, priority)
        return protocol.reassemble(info.outputs, await asyncio.gather(*(self.infer(r) for r in requests)))

    async def embed(self, texts: str | Sequence[str], *, model: str | None = None, **options: Any) -> np.ndarray:
        return await self.encode(texts, model=model, **options)

    async def classify(self, texts: str | Sequence[str], *, model: str | None = None,
                       pairs: Sequence[str] | None = None, **options: Any) -> Classification:
        values = await self.encode(texts, model=model, pairs=pairs, task="classify", **options)
        return Classification(values, (await self.info(model)).labels)

    async def classify_tokens(self, texts: str | Sequence[str], *, model: str | None = None,
                              **options: Any) -> TokenClassification:
        values = await self.encode(texts, model=model, task="token_classify", **options)
        return TokenClassification(values, (await self.info(model)).labels)

    async def score(self, query: str | Sequence[str], documents: str | Sequence[str], *, model: str | None = None,
                    priority: int = 0, **options: Any) -> np.ndarray:
        return (await self.infer(self._score_request(model, query, documents, options, priority)))[SCORES]

    async def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None,
                     top_n: int | None = None, **options: Any) -> list[RerankResult]:
        return self._ranked(await self.score(query, list(documents), model=model, **options), documents, top_n)

    async def tokenize(self, texts: str | Sequence[str], *, model: str | None = None,
                       **options: Any) -> list[list[int]]:
        return protocol.token_lists(await self.infer(self._tokenize_request(model, texts, options)))

    async def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        result = await self.infer(self._plugin_request(model, inputs, parameters))
        return [json.loads(item) for item in result[PLUGIN_OUTPUT]]
