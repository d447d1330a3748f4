"""The one pooling service: every task against Triton, each answer with its usage (as
text-embeddings-inference keeps one `Infer` for its HTTP and gRPC routers).

The asyncio client, the blocking client and the gateway's routes are thin adapters of `PoolingService`;
requests are built by the sans-I/O layer (`contract.requests`) and sent through a `Transport`
(tritonclient's aio HTTP or gRPC client with the retry policy, or a fake in unit tests). Errors are
Triton's own (`InferenceServerException`, with its status code) or `RequestError` / `ModelNotFound` for
what the caller asked wrongly before anything was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from tritonclient.utils import InferenceServerException

from pooltriton.client.coalesce import Coalescer
from pooltriton.contract import (
    ATTENTION_MASK,
    DETOKENIZE,
    DETOKENIZED,
    DOCUMENTS,
    IMAGE,
    INPUT_IDS,
    MAX_BATCH_SIZE,
    PIECES,
    PLUGIN_INPUT,
    PLUGIN_OUTPUT,
    PROMPT_TOKENS,
    QUERY,
    SCORES,
    TEXT,
    TOKEN_PIECES,
    TOKENIZE,
    image_stages,
    invalid_model_name,
    stages,
    triton_priority,
)
from pooltriton.contract import requests as protocol
from pooltriton.contract.admission import Admission, Refusal
from pooltriton.contract.config import read_parameters
from pooltriton.contract.requests import RETRIES, ModelInfo, TritonRequest, model_info, retry_delay
from pooltriton.core.images import encoded

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}
T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


class RequestError(ValueError):
    """The caller asked for something no server answer could fix (HTTP 400); `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple:
        return _rebuilt, (type(self), self.args, self.__dict__)


class WrongTask(RequestError):
    """The model serves another task (one task per model, as in vLLM): `model` says which it serves, `task`
    which was asked."""

    def __init__(self, model: ModelInfo, task: str) -> None:
        super().__init__(f"model {model.name!r} serves task {model.task!r}, not {task!r} (one task per model)",
                         "model")
        self.model, self.task = model, task


def check_task(model: ModelInfo, task: str | None) -> None:
    """The one task check: a model answers only its own task (a classifier's probabilities are no
    embeddings)."""
    if task is not None and model.task and model.task != task:
        raise WrongTask(model, task)


# A name not found refreshes the model list at most this often (a refresh reads every model's config).
REFRESH_EVERY_S = 5.0


class ModelNotFound(LookupError):
    """No served model of that name or task (HTTP 404)."""


class Overloaded(Exception):
    """Refused before sending: the work already queued would keep this request past its deadline
    (contract.admission). Retryable: `retry_after_s` is when enough of that work should have cleared."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple:
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(kind: type[E], args: tuple, state: dict) -> E:
    """An error unpickled whole, fields and notes too, whatever its class's __init__ takes: the service's
    errors cross process boundaries (multiprocessing, Ray and Celery pickle them), where the default would
    call __init__ with `args`, the message alone."""
    error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


@dataclass(frozen=True)
class Pooled(Generic[T]):
    """An answer and the tokens the model read for it (after truncation, prompts included): usage."""

    values: T
    tokens: int


@dataclass(frozen=True)
class RerankResult:
    index: int
    score: float
    document: str


@dataclass(frozen=True)
class ServedModel(ModelInfo):
    scorer: str | None = None  # <name>_score where the model can score


class Transport(Protocol):
    """How requests reach Triton: `infer` and tritonclient's own metadata calls under `server`."""

    server: Any

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]: ...

    async def close(self) -> None: ...


class TritonTransport:
    """tritonclient's aio client (HTTP or gRPC); every call retried on UNAVAILABLE (`retry_delay`).

    `timeout_s`: each call's deadline, retries included (an inference, and each metadata read: a model's
    config, the repository index). An inference sends it to Triton too, as the request's own timeout:
    Triton 2.51 does not pass a client's cancellation on to a request already queued at a stage (it is
    computed for nobody), but each stage's queue drops a request that waited there longer than its
    timeout ("Request timeout expired", UNAVAILABLE: retried only while time is left), and the stages'
    admission by work stops counting it then. Past the deadline: DEADLINE_EXCEEDED."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", retries: int = RETRIES,
                 timeout_s: float | None = None) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.timeout_s = timeout_s
        if protocol == "http":
            import tritonclient.http.aio as module
        else:
            import tritonclient.grpc.aio as module
        self._module = module
        self.server = module.InferenceServerClient(url or DEFAULT_URLS[protocol])
        self.protocol, self.retries = protocol, retries

    async def retry(self, call: Any, deadline: float | None = None) -> Any:
        """`call()` retried by the policy; never waiting past `deadline` (time.monotonic()) to retry."""
        for attempt in itertools.count():
            try:
                return await call()
            except Exception as error:
                failure = self._connection_error(error) or error
                delay = retry_delay(attempt, failure, self.retries)
                if delay is not None and deadline is not None and time.monotonic() + delay >= deadline:
                    delay = None
                if delay is None:
                    if failure is error:
                        raise
                    raise failure from error
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _past_deadline(self) -> InferenceServerException:
        return InferenceServerException(f"no answer within the client's {self.timeout_s:g} s",
                                        status="StatusCode.DEADLINE_EXCEEDED")

    def _connection_error(self, error: Exception) -> ConnectionError | None:
        """aiohttp's refused or dropped connections (the HTTP client's) as the ConnectionError they are:
        the server is not there, which the retry policy treats as UNAVAILABLE. A timeout is not one: the
        server may still be computing, and a resend would double its work."""
        if self.protocol != "http" or isinstance(error, ConnectionError):
            return None
        import aiohttp

        if isinstance(error, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError)):
            return ConnectionError(f"{type(error).__name__}: {error}")
        return None

    async def _bounded(self, send: Callable[[dict[str, Any]], Awaitable[Any]], to_triton: bool = False) -> Any:
        """`send(options)` retried within `timeout_s`: the time left goes to gRPC as the call's deadline
        and, `to_triton`, to Triton as the request's own timeout; HTTP calls are awaited within it."""
        if self.timeout_s is None:
            return await self.retry(lambda: send({}))
        deadline = time.monotonic() + self.timeout_s

        async def call() -> Any:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._past_deadline()
            options: dict[str, Any] = {}
            if to_triton:  # in microseconds; each stage's queue applies it from the request's arrival
                options["timeout"] = max(int(left * 1e6), 1)
            if self.protocol == "grpc":  # past it: DEADLINE_EXCEEDED from tritonclient itself
                options["client_timeout"] = left
                return await send(options)
            try:  # tritonclient's HTTP client has no deadline of its own per call
                return await asyncio.wait_for(send(options), left)
            except asyncio.TimeoutError:
                raise self._past_deadline() from None

        return await self.retry(call, deadline)

    async def repository_index(self, headers: dict[str, str] | None) -> list[dict]:
        if self.protocol == "grpc":
            index = await self._bounded(lambda options: self.server.get_model_repository_index(
                headers=headers, as_json=True, **options))
            return index.get("models", [])
        return await self._bounded(lambda options: self.server.get_model_repository_index(headers=headers))

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        tensors = []
        for name, array in request.arrays().items():
            tensor = self._module.InferInput(name, list(array.shape), "BYTES")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        requested = [self._module.InferRequestedOutput(name) for name in request.outputs]
        result = await self._bounded(lambda options: self.server.infer(
            request.model, tensors, outputs=requested, parameters=request.parameters or None,
            priority=request.priority, **options), to_triton=True)
        return {name: result.as_numpy(name) for name in request.outputs}

    async def model_config(self, name: str) -> dict:
        if self.protocol == "grpc":
            return (await self._bounded(lambda options: self.server.get_model_config(
                name, as_json=True, **options)))["config"]
        return await self._bounded(lambda options: self.server.get_model_config(name))

    async def close(self) -> None:
        await self.server.close()


class PoolingService:
    """embed / classify / token tasks (`encode`), score, rerank, tokenize, detokenize and plugins over
    one transport; `model` is the default model name."""

    def __init__(self, transport: Transport, model: str | None = "minilm", max_batch: int = MAX_BATCH_SIZE,
                 admin_headers: dict[str, str] | None = None, deadline_s: float | None = None,
                 coalesce: int = 0, observe_call: Callable[[int], None] | None = None) -> None:
        self.transport, self.model, self.max_batch = transport, model, max_batch
        # coalesce > 0: concurrent small encode requests for one model travel merged, that many calls
        # in flight per model and options (client.coalesce); a server in front of many clients wants it.
        self.coalescer = Coalescer(lambda request: self.transport.infer(request), max_batch, coalesce,
                                   observe_call) if coalesce else None
        self.admin_headers = admin_headers  # the repository index is one of Triton's restricted APIs
        self._info: dict[str, ModelInfo] = {}
        self.models: dict[str, ServedModel] = {}
        # Every name a client may use -> the models it names: the model of that name first, then those that
        # answer to it (--served-model-name), by name; `served` picks among them by task.
        self.names: dict[str, list[ServedModel]] = {}
        self._refreshed_at = -REFRESH_EVERY_S
        # Admission by work (contract.admission): with a deadline, a request whose estimated wait behind
        # the work this service has in flight exceeds it is refused at once (Overloaded).
        self.deadline_s = deadline_s
        self._admission: dict[str, Admission] = {}

    @contextlib.asynccontextmanager
    async def _admitted(self, model: str, texts: Sequence[str]) -> AsyncIterator[list[int]]:
        """Admit a request of `texts` to `model` by the work queued ahead of it; the caller appends the
        tokens the answer says it cost, so the measured rate follows the server."""
        if self.deadline_s is None:
            yield []
            return
        admission = self._admission.setdefault(model, Admission(self.deadline_s))
        characters = sum(len(text) for text in texts)
        estimated = admission.estimate_tokens(characters, len(texts))
        admitted = admission.admit(estimated, time.monotonic())
        if isinstance(admitted, Refusal):
            raise Overloaded(f"overloaded: this request would be answered only in ~{admitted.wait_s:.1f} s, behind "
                             f"the work queued for {model!r}, past the {admitted.limit_s:g} s admitted of its "
                             f"{self.deadline_s:g} s deadline; retry in {admitted.retry_after_s} s",
                             admitted.retry_after_s)
        answered: list[int] = []
        try:
            yield answered
        finally:
            admission.done(admitted, sum(answered) or None, characters, time.monotonic())

    # ---- models ----------------------------------------------------------------------------------
    async def config(self, name: str) -> dict:
        """A model's (or a stage's) config as Triton reads it."""
        config = getattr(self.transport, "model_config", None)
        if config is not None:
            return await config(name)
        return (await self.transport.server.get_model_config(name, as_json=True))["config"]

    async def info(self, model: str | None = None, task: str | None = None, scoring: bool = False) -> ModelInfo:
        """Task, outputs and label names of a served ensemble, from its config (cached). A name models answer
        to (--served-model-name) is looked up in the repository's models (`served`: the one for `task`, or
        that can score), where the repository index can be read."""
        name = self._name(model)
        if name in self.names:
            return self.served(name, task, scoring)
        if name not in self._info:
            try:
                self._info[name] = model_info(name, await self.config(name))
            except InferenceServerException as error:  # no model of that name: perhaps a name one answers to
                if protocol.classify(error).status not in (400, 404) or name not in await self.refresh_names():
                    raise
                return self.served(name, task, scoring)
        info = self._info[name]
        if task is not None and info.task and info.task != task and name in await self.refresh_names():
            return self.served(name, task, scoring)  # another model that answers to this name may serve it
        return info

    async def refresh_names(self) -> dict[str, list[ServedModel]]:
        """`refresh` for a name not found, at most every REFRESH_EVERY_S (it reads every model's config),
        where the repository index can be read (an admin API: it may not); the names."""
        now = time.monotonic()
        if now - self._refreshed_at >= REFRESH_EVERY_S:
            self._refreshed_at = now
            try:
                await self.refresh()
            except InferenceServerException:
                pass
        return self.names

    async def refresh(self) -> dict[str, ServedModel]:
        """Every served pooling model (an ensemble whose config names its task), from the repository index."""
        listing = getattr(self.transport, "repository_index", None)
        if listing is not None:
            entries = await listing(self.admin_headers)
        else:  # a transport with only tritonclient's gRPC-shaped calls (the route tests' fake)
            index = await self.transport.server.get_model_repository_index(headers=self.admin_headers, as_json=True)
            entries = index.get("models", [])
        # A folder never loaded has no state (the gRPC index omits it): a volume's lost+found, an unloaded model.
        names = {m["name"] for m in entries if m.get("state") == "READY"}
        models = {}
        for name in sorted(names):
            config = await self.config(name)
            if config.get("platform") != "ensemble" or "task" not in read_parameters(config):
                continue
            score = stages(name).score
            models[name] = ServedModel(**vars(model_info(name, config)), scorer=score if score in names else None)
        self.models = models
        index: dict[str, list[ServedModel]] = {name: [model] for name, model in models.items()}
        for model in models.values():
            for alias in model.served_names:
                index.setdefault(alias, []).append(model)
        self.names = index
        return models

    def served(self, name: str | None, task: str | None = None, scoring: bool = False) -> ServedModel:
        """A model from the last `refresh`: by name, or a name it answers to (--served-model-name; where
        several models share one, the first serving `task`, or with `scoring` the first that can score;
        WrongTask unless one serves the task), or without a name the first serving `task` (with `scoring`, the
        first that can score, a cross-encoder before a bi-encoder)."""
        if name is None:
            candidates = [m for m in self.models.values() if (task is None or m.task == task)
                          and (not scoring or m.scorer)]
            if scoring:  # a reranker (a cross-encoder's classify) before a bi-encoder's cosine
                candidates.sort(key=lambda m: m.task != "classify")
            if not candidates:
                raise ModelNotFound(f"no served model for task {task!r}" if not scoring else "no served model scores")
            return candidates[0]
        if (problem := invalid_model_name(name)) is not None:
            raise RequestError(problem, "model")
        if name not in self.names:
            raise ModelNotFound(f"The model `{name}` does not exist. Served: {sorted(self.names)}")
        named = self.names[name]
        chosen = next((m for m in named if (task is None or m.task == task) and (not scoring or m.scorer)),
                      named[0])
        check_task(chosen, task)
        return chosen

    async def ready(self) -> bool:
        try:
            return bool(await self.transport.server.is_server_ready())
        except Exception:
            return False

    def _name(self, model: str | None) -> str:
        name = model or self.model
        if not name:
            raise RequestError("name a model", "model")
        return name

    # ---- tasks -----------------------------------------------------------------------------------
    async def encode(self, texts: str | Sequence[str], *, model: str | None = None, task: str | None = None,
                     pairs: Sequence[str] | None = None, priority: int = 0, dimensions: int | None = None,
                     **options: Any) -> Pooled[np.ndarray | list[np.ndarray]]:
        """vLLM's `encode(task=...)`: [n, C] for sequence tasks, per text [tokens_i, C] for token tasks;
        requests of at most `max_batch` texts sent concurrently and reassembled in order. `priority` is
        vLLM's (lower runs earlier, 0 default), mapped to Triton's levels; `dimensions`: embeddings cut to
        one of the model's Matryoshka sizes (vLLM's and OpenAI's option)."""
        info = await self.info(model, task)
        check_task(info, task)
        if info.modality == "image":
            raise RequestError(f"model {info.name!r} embeds images: send images (embed_images; the gateway's image "
                               "parts or modality \"image\")", "input")
        if dimensions is not None and info.task != "embed":
            raise RequestError(f"dimensions applies to embeddings, and model {info.name!r} is {info.task}",
                               "dimensions")
        try:
            protocol.check_dimensions(info, dimensions)  # before the model runs, where its width is known
        except ValueError as error:
            raise RequestError(str(error), "dimensions") from None
        try:
            requests = protocol.encode_requests(
                info.name, info.outputs, protocol.as_texts(texts), None if pairs is None else list(pairs), options,
                priority, self.max_batch)
        except ValueError as error:
            raise RequestError(str(error), "input") from None
        infer = self.coalescer.infer if self.coalescer is not None else self.transport.infer
        async with self._admitted(info.name, [*protocol.as_texts(texts), *(pairs or ())]) as answered:
            results = await asyncio.gather(*(infer(r) for r in requests))
            answered.append(protocol.prompt_tokens(results))
        values = protocol.reassemble(info.outputs, results, info.token_weights)
        if dimensions is not None:
            try:
                values = protocol.matryoshka(info, values, dimensions, options.get("use_activation"))
            except ValueError as error:
                raise RequestError(str(error), "dimensions") from None
        return Pooled(values, protocol.prompt_tokens(results))

    async def image_info(self, model: str | None = None) -> ModelInfo:
        """The image ensemble of `model`: itself, the one its config names, or `<model>_image` (an export's
        image tower, served beside its text model or alone)."""
        name = self._name(model)
        if (problem := invalid_model_name(name)) is not None:
            raise RequestError(problem, "model")
        info = await self._found(name)
        if info is not None and info.modality == "image":
            return info
        image = await self._found((info.image_model if info else None) or image_stages(name).ensemble)
        if image is None or image.modality != "image":
            if info is None:
                raise ModelNotFound(f"no model {name!r} with an image tower is served")
            raise RequestError(f"model {name!r} is not a multimodal model: it has no image tower and embeds text "
                               "only", "model")
        return image

    async def _found(self, name: str) -> ModelInfo | None:
        """The model of that name, None where Triton has none (any other failure is raised)."""
        try:
            return await self.info(name)
        except ModelNotFound:
            return None
        except InferenceServerException as error:
            if protocol.classify(error).status in (400, 404):
                return None
            raise

    async def embed_images(self, images: Sequence[bytes | str | Path | Any], *, model: str | None = None,
                           priority: int = 0, use_activation: bool | None = None) -> Pooled[np.ndarray]:
        """One vector per image ([n, dim] float32, normalised unless use_activation is false): encoded bytes,
        file paths or PIL images, decoded and preprocessed by the server's image stage."""
        info = await self.image_info(model)
        try:
            data = [encoded(image) for image in images]
        except (TypeError, OSError) as error:
            raise RequestError(str(error), "input") from None
        if not data:
            raise RequestError("images is empty: pass at least one image", "input")
        options = protocol.parameters({"use_activation": use_activation})
        requests = [TritonRequest(info.name, {IMAGE: data[start:start + self.max_batch]}, info.outputs[:1], options,
                                  True, triton_priority(priority)) for start in range(0, len(data), self.max_batch)]
        results = await asyncio.gather(*(self.transport.infer(request) for request in requests))
        return Pooled(np.concatenate([result[info.outputs[0]] for result in results]), 0)

    async def score_images(self, query: str, images: Sequence[Any], *, model: str | None = None,
                           priority: int = 0) -> Pooled[np.ndarray]:
        """A text against images: the cosine of the text tower's embedding and each image's (vLLM's scoring of
        multimodal embedders; CLIP's logits before their scale)."""
        image = await self.image_info(model)
        if image.text_model is None:
            raise RequestError(f"model {image.name!r} has no text tower to score images against", "model")
        # unit vectors whatever the towers answer by default (a sentence-transformers pipeline: raw)
        text = await self.encode([query], model=image.text_model, task="embed", priority=priority,
                                 use_activation=True)
        vectors = await self.embed_images(images, model=image.name, priority=priority, use_activation=True)
        return Pooled(vectors.values @ np.asarray(text.values)[0], text.tokens)

    async def score(self, query: str | Sequence[str], documents: str | Sequence[str], *, model: str | None = None,
                    priority: int = 0, **options: Any) -> Pooled[np.ndarray]:
        """`<model>_score`: 1:1, 1:N (one query) or N:N (zipped lists)."""
        name = (await self.info(model, scoring=True)).name  # a name it answers to: the model's own
        served = self.models.get(name)
        if served is not None and served.scorer is None:
            raise RequestError(f"model {name!r} ({served.task}) cannot score: scoring needs a 1-label classifier "
                               "(cross-encoder), an embed model or a token_embed model", "model")
        try:
            inputs = protocol.score_inputs(query, documents)
        except ValueError as error:
            raise RequestError(str(error), str(error).split()[0]) from None  # "query" or "documents"
        request = TritonRequest(stages(name).score, inputs, (SCORES, PROMPT_TOKENS), protocol.parameters(options),
                                False, triton_priority(priority))
        async with self._admitted(request.model, [*inputs[QUERY], *inputs[DOCUMENTS]]) as answered:
            result = await self.transport.infer(request)
            answered.append(protocol.prompt_tokens([result]))
        return Pooled(result[SCORES], protocol.prompt_tokens([result]))

    async def rerank(self, query: str, documents: Sequence[str], *, model: str | None = None,
                     top_n: int | None = None, **options: Any) -> Pooled[list[RerankResult]]:
        """Documents by score, best first (cross-encoder, bi-encoder or late interaction)."""
        if not documents:
            raise RequestError("documents is empty", "documents")
        if top_n is not None and top_n < 0:
            raise RequestError(f"top_n must be 0 (every document) or positive, not {top_n}", "top_n")
        scored = await self.score(query, list(documents), model=model, **options)
        order = np.argsort(-scored.values, kind="stable")[: top_n or len(documents)]
        return Pooled([RerankResult(int(i), float(scored.values[i]), documents[i]) for i in order], scored.tokens)

    async def tokenize(self, texts: str | Sequence[str], *, model: str | None = None,
                       add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids per text from the model's own tokenizer stage, untruncated (vLLM's /tokenize)."""
        try:
            batch = protocol.as_texts(texts)
        except ValueError as error:
            raise RequestError(str(error), "prompt") from None
        results = await self._tokenizer_calls(model, batch, (INPUT_IDS, ATTENTION_MASK),
                                              {"mode": TOKENIZE, "add_special_tokens": add_special_tokens})
        return [ids for result in results for ids in protocol.token_lists(result)]

    async def chat(self, messages: Sequence[Any], *, model: str | None = None, add_special_tokens: bool = False,
                   **template: Any) -> list[int]:
        """vLLM's chat form: the conversation as `chat_text` renders it, tokenized by the model's tokenizer stage,
        untruncated, with special tokens only if asked (the template writes them); the ids, to be sent as a
        pre-tokenised input."""
        text = await self.chat_text(messages, model=model, **template)
        return (await self.tokenize(text, model=model, add_special_tokens=add_special_tokens))[0]

    async def chat_text(self, messages: Sequence[Any], *, model: str | None = None, add_generation_prompt: bool = False,
                        continue_final_message: bool = False,
                        chat_template_kwargs: dict[str, Any] | None = None) -> str:
        """The conversation rendered by the model's own chat template (client.chat), as transformers renders it,
        off the event loop (a template is arbitrary work)."""
        from pooltriton.client.chat import ChatError, render_chat  # jinja2 only where chat bodies come

        info = await self.info(model)
        try:
            return await asyncio.to_thread(render_chat, info.chat_template, info.chat_tokens, list(messages),
                                           add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message,
                                           chat_template_kwargs=chat_template_kwargs)
        except ChatError as error:
            raise RequestError(str(error), error.param) from None

    async def pieces(self, texts: str | Sequence[str], *, model: str | None = None, add_special_tokens: bool = True,
                     prompt_name: str | None = None, with_prompt: bool = True) -> list[protocol.TokenPieces]:
        """Each text's tokens as the model's tokenizer stage splits it, untruncated, with the model's prompt
        (`prompt_name`'s, else its default; none if not `with_prompt`): ids, strings, spans
        (text-embeddings-inference's /tokenize, vLLM's token_strs)."""
        try:
            batch = protocol.as_texts(texts)
        except ValueError as error:
            raise RequestError(str(error), "inputs") from None
        parameters = {"mode": PIECES, "add_special_tokens": add_special_tokens,
                      **({"prompt_name": prompt_name} if prompt_name is not None else {}),
                      **({} if with_prompt else {"with_prompt": False})}
        results = await self._tokenizer_calls(model, batch, (TOKEN_PIECES,), parameters)
        return [protocol.TokenPieces.from_json(raw) for result in results for raw in result[TOKEN_PIECES].reshape(-1)]

    async def detokenize(self, tokens: Sequence[int], *, model: str | None = None,
                         skip_special_tokens: bool = False) -> str:
        return (await self.detokenize_rows([tokens], model=model, skip_special_tokens=skip_special_tokens))[0]

    async def detokenize_rows(self, rows: Sequence[Sequence[int]], *, model: str | None = None,
                              skip_special_tokens: bool = False) -> list[str]:
        """One text per row of ids, in requests of at most `max_batch` rows."""
        results = await self._tokenizer_calls(model, [json.dumps(list(row)) for row in rows], (DETOKENIZED,),
                                              {"mode": DETOKENIZE, "skip_special_tokens": skip_special_tokens})
        return [raw.decode("utf-8") for result in results for raw in result[DETOKENIZED].reshape(-1)]

    async def _tokenizer_calls(self, model: str | None, texts: Sequence[str], outputs: tuple[str, ...],
                               parameters: dict[str, Any]) -> list[dict[str, np.ndarray]]:
        """The model's tokenizer stage over `texts` in requests of at most `max_batch`, results in order."""
        tokenizer = stages((await self.info(model)).name).tokenizer  # a name it answers to: the model's own
        requests = [TritonRequest(tokenizer, {TEXT: list(texts[start : start + self.max_batch])}, outputs,
                                  parameters, True) for start in range(0, len(texts), self.max_batch)]
        return list(await asyncio.gather(*(self.transport.infer(r) for r in requests)))

    async def plugin(self, model: str, inputs: str | Sequence[str], **parameters: Any) -> list[Any]:
        """A plugin model (pooltriton.core.plugins): one decoded JSON answer per input."""
        try:
            batch = protocol.as_texts(inputs, "inputs")
        except ValueError as error:
            raise RequestError(str(error), "inputs") from None
        request = TritonRequest(model, {PLUGIN_INPUT: batch}, (PLUGIN_OUTPUT,), protocol.parameters(parameters),
                                False)
        return [json.loads(item) for item in (await self.transport.infer(request))[PLUGIN_OUTPUT]]

    async def close(self) -> None:
        if self.coalescer is not None:
            await self.coalescer.close()
        await self.transport.close()
