"""Python client for the served pooling models, over Triton's HTTP or gRPC protocol (tritonclient).

    client = PoolingClient("localhost:8001", protocol="grpc")
    vectors = client.embed(["A man is eating food."])            # np.ndarray [1, 384], L2-normalised
    async with AsyncPoolingClient("localhost:8001") as aclient:   # the same API, awaited
        vectors = await aclient.embed(["A man is eating food."])
    tokens = client.encode(["Call John"], task="token_classify", model="rampart")  # per-text arrays
    scores = client.score("query", ["doc a", "doc b"], model="minilm")            # bi-encoder cosine

Both are thin adapters of the one pooling service (`pooltriton.client.service`): the asyncio client
returns its values, the blocking one runs the asyncio client on a private event loop thread. Methods
ending in `_with_usage` return the service's answers with the tokens the model read.
Big inputs are split into requests of at most `max_batch` texts and reassembled in order.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from pooltriton.client.service import Pooled, PoolingService, RerankResult, TritonTransport
from pooltriton.contract import MAX_BATCH_SIZE, admin_headers
from pooltriton.contract.requests import RETRIES, ModelInfo, TokenPieces

T = TypeVar("T")


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


class AsyncPoolingClient:
    """asyncio client: the pooling service's answers without their usage. Every call retries on
    UNAVAILABLE with exponential backoff; `priority` is vLLM's (lower runs earlier, 0 default).
    `timeout_s`: each inference's deadline, retries included, also sent to Triton as the request's
    timeout, so a stage drops work that waited in its queue past it (service.TritonTransport). `admin_key`
    (the server's, `pooltriton serve` prints where it is): the repository index, so that names models
    answer to (--served-model-name) resolve here as at the gateway."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", model: str = "minilm",
                 max_batch: int = MAX_BATCH_SIZE, retries: int = RETRIES, timeout_s: float | None = None,
                 admin_key: str | None = None) -> None:
        self.service = PoolingService(TritonTransport(url, protocol, retries, timeout_s), model, max_batch,
                                      admin_headers=admin_headers(admin_key, protocol) if admin_key else None)

    @property
    def server(self) -> Any:
        """tritonclient's own aio client, for the KServe calls this one does not wrap (health, index)."""
        return self.service.transport.server

    async def close(self) -> None:
        await self.service.close()

    async def __aenter__(self) -> AsyncPoolingClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def info(self, model: str | None = None, task: str | None = None) -> ModelInfo:
        """Task, outputs and label names of a served ensemble, from its config (cached); of the one serving
        `task` among models that share a name (--served-model-name)."""
        return await self.service.info(model, task)

    async def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
                     pairs: Sequence[str] | None = None, priority: int = 0,
                     **options: Any) -> np.ndarray | list[np.ndarray]:
        """vLLM's `encode(task=...)`: sequence tasks return [n, C]; token tasks a list of [tokens_i, C]
        arrays, exactly each text's real tokens. `task`, when given, must be the model's task.
        Options: truncate ("NONE" | "END" | "START"), use_activation (bool), prompt_name (one of the
        model's sentence-transformers prompts; default: its default prompt)."""
        return (await self.service.encode(texts, model=model, task=task, pairs=pairs, priority=priority,
                                          **options)).values

    async def encode_with_usage(self, texts: str | Sequence[str], **options: Any) -> Pooled:
        return await self.service.encode(texts, **options)

    async def embed(self, texts: str | Sequence[str], *, model: str | None = None, **options: Any) -> np.ndarray:
        """One vector per text, [n, dim] float32. `truncate`: None/"NONE" rejects over-length texts
        with an error naming the limit; "END" or "START" cuts them to the model's limit. `dimensions`:
        cut to one of the model's Matryoshka sizes."""
        return await self.encode(texts, model=model, task="embed", **options)

    async def embed_images(self, images: Sequence[Any], *, model: str | None = None, **options: Any) -> np.ndarray:
        """One vector per image, [n, dim] float32: encoded bytes (PNG, JPEG, WebP, GIF, BMP, TIFF), file paths
        or PIL images. `model`: a model with an image tower (its `<name>_image` ensemble). `use_activation`:
        false answers the raw projected features (normalised by default)."""
        return (await self.service.embed_images(images, model=model, **options)).values

    async def classify(self, texts: str | Sequence[str], *, model: str | None = None,
                       pairs: Sequence[str] | None = None, **options: Any) -> Classification:
        """Class probabilities per text (or per (text, pair) for cross-encoders) with label names."""
        values = await self.encode(texts, model=model, pairs=pairs, task="classify", **options)
        return Classification(values, (await self.info(model, "classify")).labels)

    async def classify_tokens(self, texts: str | Sequence[str], *, model: str | None = None,
                              **options: Any) -> TokenClassification:
        values = await self.encode(texts, model=model, task="token_classify", **options)
        return TokenClassification(values, (await self.info(model, "token_classify")).labels)

    async def score(self, query: str | Sequence[str], documents: str | Sequence[str], *, model: str | None = None,
                    priority: int = 0, **options: Any) -> np.ndarray:
        """Scores from `<model>_score`: 1:1, 1:N (one query) or N:N (zipped lists)."""
        return (await self.score_with_usage(query, documents, model=model, priority=priority, **options)).values

    async def score_with_usage(self, query: str | Sequence[str], documents: str | Sequence[str],
                               **options: Any) -> Pooled[np.ndarray]:
        return await self.service.score(query, documents, **options)

    async def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None,
                     top_n: int | None = None, **options: Any) -> list[RerankResult]:
        """Documents sorted by score, best first (cross-encoder, bi-encoder or late interaction)."""
        return (await self.service.rerank(query, documents, model=model, top_n=top_n, **options)).values

    async def tokenize(self, texts: str | Sequence[str], *, model: str | None = None,
                       add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids per text, from the model's own tokenizer stage, untruncated (as `/tokenize`)."""
        return await self.service.tokenize(texts, model=model, add_special_tokens=add_special_tokens)

    async def detokenize(self, tokens: Sequence[int], *, model: str | None = None,
                         skip_special_tokens: bool = False) -> str:
        return await self.service.detokenize(tokens, model=model, skip_special_tokens=skip_special_tokens)

    async def pieces(self, texts: str | Sequence[str], *, model: str | None = None, add_special_tokens: bool = True,
                     prompt_name: str | None = None, with_prompt: bool = True) -> list[TokenPieces]:
        """Each text's tokens with their strings and character spans, from the model's tokenizer stage."""
        return await self.service.pieces(texts, model=model, add_special_tokens=add_special_tokens,
                                         prompt_name=prompt_name, with_prompt=with_prompt)

    async def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        """Call a plugin model (see pooltriton.core.plugins): one decoded JSON answer per input."""
        return await self.service.plugin(model, inputs, **parameters)


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


class PoolingClient:
    """Blocking client: the asyncio client's methods, run on a private event loop thread."""

    def __init__(self, url: str | None = None, protocol: str = "http", model: str = "minilm",
                 max_batch: int = MAX_BATCH_SIZE, retries: int = RETRIES, timeout_s: float | None = None,
                 admin_key: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pooltriton-client", daemon=True)
        self._thread.start()

        async def make() -> AsyncPoolingClient:  # tritonclient's aio clients belong to the loop they run on
            return AsyncPoolingClient(url, protocol, model, max_batch, retries, timeout_s, admin_key)

        try:
            self._async = self._run(make())
        except BaseException:
            _stop_loop(self._loop, self._thread)
            raise
        # A client never closed still ends its thread and loop when it is collected.
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("this PoolingClient is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            self._finalizer()

    def __enter__(self) -> PoolingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def service(self) -> PoolingService:
        return self._async.service

    def info(self, model: str | None = None, task: str | None = None) -> ModelInfo:
        return self._run(self._async.info(model, task))

    def encode(self, texts: str | Sequence[str], **options: Any) -> np.ndarray | list[np.ndarray]:
        return self._run(self._async.encode(texts, **options))

    def encode_with_usage(self, texts: str | Sequence[str], **options: Any) -> Pooled:
        return self._run(self._async.encode_with_usage(texts, **options))

    def embed(self, texts: str | Sequence[str], **options: Any) -> np.ndarray:
        return self._run(self._async.embed(texts, **options))

    def embed_images(self, images: Sequence[Any], **options: Any) -> np.ndarray:
        return self._run(self._async.embed_images(images, **options))

    def classify(self, texts: str | Sequence[str], **options: Any) -> Classification:
        return self._run(self._async.classify(texts, **options))

    def classify_tokens(self, texts: str | Sequence[str], **options: Any) -> TokenClassification:
        return self._run(self._async.classify_tokens(texts, **options))

    def score(self, query: str | Sequence[str], documents: str | Sequence[str], **options: Any) -> np.ndarray:
        return self._run(self._async.score(query, documents, **options))

    def score_with_usage(self, query: str | Sequence[str], documents: str | Sequence[str],
                         **options: Any) -> Pooled[np.ndarray]:
        return self._run(self._async.score_with_usage(query, documents, **options))

    def rerank(self, query: str, documents: Sequence[str], **options: Any) -> list[RerankResult]:
        return self._run(self._async.rerank(query, documents, **options))

    def tokenize(self, texts: str | Sequence[str], **options: Any) -> list[list[int]]:
        return self._run(self._async.tokenize(texts, **options))

    def detokenize(self, tokens: Sequence[int], **options: Any) -> str:
        return self._run(self._async.detokenize(tokens, **options))

    def pieces(self, texts: str | Sequence[str], **options: Any) -> list[TokenPieces]:
        return self._run(self._async.pieces(texts, **options))

    def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        return self._run(self._async.plugin(model, inputs, **parameters))
