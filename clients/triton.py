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
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pooltriton.scoring import split_tokens

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}
MAX_BATCH = 128  # the exported models' max_batch_size
TOKEN_COUNTS = "TOKEN_COUNTS"


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


@dataclass(frozen=True)
class ModelInfo:
    name: str
    task: str
    outputs: tuple[str, ...]
    labels: tuple[str, ...]


RETRIES = 4  # attempts on UNAVAILABLE (server starting, overloaded), with exponential backoff
BACKOFF_S = 0.25


def _texts(texts: str | Sequence[str], what: str = "texts") -> list[str]:
    batch = [texts] if isinstance(texts, str) else list(texts)
    if not batch:
        raise ValueError(f"{what} is empty: pass at least one text")
    return batch


def _retryable(error: Exception) -> bool:
    status = str(getattr(error, "status", lambda: "")() or "")
    return "UNAVAILABLE" in status or "Unavailable" in status or status == "503"


def _config_info(model: str, config: dict) -> ModelInfo:
    parameters = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
    return ModelInfo(name=model, task=parameters.get("task", ""), outputs=tuple(o["name"] for o in config["output"]),
                     labels=tuple(json.loads(parameters.get("labels", "[]"))))


class _Requests:
    """What both clients send and how they read answers; transport lives in the subclasses."""

    def __init__(self, url: str | None, protocol: str, model: str, max_batch: int, asynchronous: bool) -> None:
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
        self.protocol, self.model, self.max_batch = protocol, model, max_batch
        self._info: dict[str, ModelInfo] = {}

    def _config_from(self, response: Any) -> dict:
        return response["config"] if self.protocol == "grpc" else response

    def _tensors(self, inputs: dict[str, list[str]], outputs: Sequence[str], batched: bool) -> tuple[list, list]:
        tensors = []
        for name, texts in inputs.items():
            data = np.array([t.encode("utf-8") if isinstance(t, str) else t for t in texts], dtype=object)
            shape = [len(texts), 1] if batched else [len(texts)]
            tensor = self._module.InferInput(name, shape, "BYTES")
            tensor.set_data_from_numpy(data.reshape(shape))
            tensors.append(tensor)
        return tensors, [self._module.InferRequestedOutput(name) for name in outputs]

    def _encode_chunks(self, info: ModelInfo, texts: str | Sequence[str], pairs: Sequence[str] | None,
                       task: str | None) -> list[dict[str, list[str]]]:
        if task is not None and info.task and task != info.task:
            raise ValueError(f"model {info.name!r} serves task {info.task!r}, not {task!r} (one task per model)")
        batch = _texts(texts)
        pair_list = None if pairs is None else list(pairs)
        if pair_list is not None and len(pair_list) != len(batch):
            raise ValueError(f"{len(pair_list)} pairs for {len(batch)} texts: they pair up one to one")
        chunks = []
        for start in range(0, len(batch), self.max_batch):
            chunk = {"TEXT": batch[start : start + self.max_batch]}
            if pair_list is not None:
                chunk["TEXT_PAIR"] = pair_list[start : start + self.max_batch]
            chunks.append(chunk)
        return chunks

    @staticmethod
    def _encode_result(info: ModelInfo, results: list[dict[str, np.ndarray]]) -> np.ndarray | list[np.ndarray]:
        if TOKEN_COUNTS in info.outputs:
            return [rows for r in results for rows in split_tokens(r[info.outputs[0]], r[TOKEN_COUNTS])]
        return np.concatenate([r[info.outputs[0]] for r in results], axis=0)

    @staticmethod
    def _score_inputs(query: str | Sequence[str], documents: str | Sequence[str]) -> dict[str, list[str]]:
        return {"QUERY": _texts(query, "query"), "DOCUMENTS": _texts(documents, "documents")}

    @staticmethod
    def _ranked(scores: np.ndarray, documents: Sequence[str], top_n: int | None) -> list[RerankResult]:
        order = np.argsort(-scores, kind="stable")[: top_n or len(documents)]
        return [RerankResult(int(i), float(scores[i]), documents[i]) for i in order]

    @staticmethod
    def _token_lists(result: dict[str, np.ndarray]) -> list[list[int]]:
        return [row[mask.astype(bool)].tolist() for row, mask in zip(result["input_ids"], result["attention_mask"])]

    @staticmethod
    def _options(options: dict[str, Any]) -> dict[str, Any]:
        return {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in options.items() if v is not None}


class PoolingClient(_Requests):
    """Blocking client. Every call retries on UNAVAILABLE with exponential backoff."""

    def __init__(self, url: str | None = None, protocol: str = "http", model: str = "minilm",
                 max_batch: int = MAX_BATCH) -> None:
        super().__init__(url, protocol, model, max_batch, asynchronous=False)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PoolingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _infer(self, model: str, inputs: dict[str, list[str]], outputs: Sequence[str], parameters: dict[str, Any],
               batched: bool) -> dict[str, np.ndarray]:
        tensors, requested = self._tensors(inputs, outputs, batched)
        for attempt in range(RETRIES):
            try:
                result = self._client.infer(model, tensors, outputs=requested, parameters=parameters or None)
                return {name: result.as_numpy(name) for name in outputs}
            except Exception as error:
                if attempt == RETRIES - 1 or not _retryable(error):
                    raise
                time.sleep(BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def info(self, model: str | None = None) -> ModelInfo:
        """Task, outputs and label names of a served ensemble, from its config (cached)."""
        model = model or self.model
        if model not in self._info:
            kwargs = {"as_json": True} if self.protocol == "grpc" else {}
            self._info[model] = _config_info(model, self._config_from(self._client.get_model_config(model, **kwargs)))
        return self._info[model]

    def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
               pairs: Sequence[str] | None = None, **options: Any) -> np.ndarray | list[np.ndarray]:
        """vLLM's `encode(task=...)`: sequence tasks return [n, C]; token tasks a list of [tokens_i, C]
        arrays, exactly each text's real tokens. `task`, when given, must be the model's task.
        Options: truncate ("NONE" | "END" | "START"), use_activation (bool)."""
        info = self.info(model)
        chunks = self._encode_chunks(info, texts, pairs, task)
        return self._encode_result(info, [self._infer(info.name, c, info.outputs, self._options(options), True)
                                          for c in chunks])

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
              **options: Any) -> np.ndarray:
        """Scores from `<model>_score`: 1:1, 1:N (one query) or N:N (zipped lists)."""
        name = f"{model or self.model}_score"
        return self._infer(name, self._score_inputs(query, documents), ("SCORES",), self._options(options),
                           False)["SCORES"]

    def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None, top_n: int | None = None,
               **options: Any) -> list[RerankResult]:
        """Documents sorted by score, best first (cross-encoder, bi-encoder or late interaction)."""
        return self._ranked(self.score(query, list(documents), model=model, **options), documents, top_n)

    def tokenize(self, texts: str | Sequence[str], *, model: str | None = None, **options: Any) -> list[list[int]]:
        """Token ids per text, from the model's own tokenizer stage (`<model>_tokenizer`)."""
        result = self._infer(f"{model or self.model}_tokenizer", {"TEXT": _texts(texts)},
                             ("input_ids", "attention_mask"), self._options(options), True)
        return self._token_lists(result)

    def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        """Call a plugin model (see pooltriton.plugins): one decoded JSON answer per input."""
        result = self._infer(model, {"INPUT": _texts(inputs, "inputs")}, ("OUTPUT",), self._options(parameters), False)
        return [json.loads(item) for item in result["OUTPUT"]]


class AsyncPoolingClient(_Requests):
    """asyncio client (tritonclient's aio HTTP/gRPC clients): the same methods, awaited; chunks of a big
    input are sent concurrently."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", model: str = "minilm",
                 max_batch: int = MAX_BATCH) -> None:
        super().__init__(url, protocol, model, max_batch, asynchronous=True)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncPoolingClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _infer(self, model: str, inputs: dict[str, list[str]], outputs: Sequence[str],
                     parameters: dict[str, Any], batched: bool) -> dict[str, np.ndarray]:
        tensors, requested = self._tensors(inputs, outputs, batched)
        for attempt in range(RETRIES):
            try:
                result = await self._client.infer(model, tensors, outputs=requested, parameters=parameters or None)
                return {name: result.as_numpy(name) for name in outputs}
            except Exception as error:
                if attempt == RETRIES - 1 or not _retryable(error):
                    raise
                await asyncio.sleep(BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    async def info(self, model: str | None = None) -> ModelInfo:
        model = model or self.model
        if model not in self._info:
            kwargs = {"as_json": True} if self.protocol == "grpc" else {}
            config = self._config_from(await self._client.get_model_config(model, **kwargs))
            self._info[model] = _config_info(model, config)
        return self._info[model]

    async def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
                     pairs: Sequence[str] | None = None, **options: Any) -> np.ndarray | list[np.ndarray]:
        info = await self.info(model)
        chunks = self._encode_chunks(info, texts, pairs, task)
        parameters = self._options(options)
        results = await asyncio.gather(*(self._infer(info.name, c, info.outputs, parameters, True) for c in chunks))
        return self._encode_result(info, list(results))

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
                    **options: Any) -> np.ndarray:
        name = f"{model or self.model}_score"
        result = await self._infer(name, self._score_inputs(query, documents), ("SCORES",), self._options(options),
                                   False)
        return result["SCORES"]

    async def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None,
                     top_n: int | None = None, **options: Any) -> list[RerankResult]:
        return self._ranked(await self.score(query, list(documents), model=model, **options), documents, top_n)

    async def tokenize(self, texts: str | Sequence[str], *, model: str | None = None,
                       **options: Any) -> list[list[int]]:
        result = await self._infer(f"{model or self.model}_tokenizer", {"TEXT": _texts(texts)},
                                   ("input_ids", "attention_mask"), self._options(options), True)
        return self._token_lists(result)
