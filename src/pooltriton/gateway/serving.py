"""Between the gateway's routes and the pooling service: which model a body names, what the service's
errors mean in HTTP, and the encodings of the answers (vLLM keeps this layer as its `serving_*`)."""

from __future__ import annotations

import base64
import itertools
import json
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import numpy as np
from starlette.responses import Response
from tritonclient.utils import InferenceServerException

from pooltriton.client.service import (
    ModelNotFound,
    Overloaded,
    PoolingService,
    RequestError,
    ServedModel,
    WrongTask,
)
from pooltriton.contract import RETRY_AFTER_S, stages
from pooltriton.contract.config import read_parameters
from pooltriton.contract.requests import TokenPieces, classify
from pooltriton.core.activation import normalize as unit
from pooltriton.core.activation import sigmoid, softmax
from pooltriton.gateway.guard import CALLS_SPAN
from pooltriton.gateway.protocol import APIError

T = TypeVar("T")


POOLING_ROUTE = "/pooling"


class Serving:
    """The service as the routes use it: every call's errors as APIError with their HTTP status."""

    def __init__(self, service: PoolingService) -> None:
        self.service = service

    async def model(self, name: str | None, task: str | None = None, route: str | None = None,
                    scoring: bool = False) -> ServedModel:
        """The served model a body names, which must serve `task` where one is given (vLLM answers 400,
        "the model does not support" the route's API), or the first for `task`; among models that share a
        name (--served-model-name) the one serving `task` (with `scoring`: the first that can score). The
        model list is read on first use, and again (at most every few seconds) for a name not in it: a model
        loaded since. `route`: the asking route, where its body names the task (/pooling)."""
        if not self.service.models:
            try:
                await self.service.refresh()
            except InferenceServerException as error:
                raise APIError(503, f"Triton is unavailable: {error.message()}") from None
        elif name is not None and name not in self.service.names:
            await self.service.refresh_names()
        try:
            return self.service.served(name, task, scoring)
        except WrongTask as error:
            raise wrong_task(error, route) from None
        except RequestError as error:
            raise APIError(400, str(error), error.param) from None
        except ModelNotFound as error:
            raise APIError(404, str(error), "model", "model_not_found" if name else None) from None

    async def __call__(self, call: Awaitable[T], fields: dict[str, str] | None = None) -> T:
        """A service call. Triton's error keeps its code: UNAVAILABLE from a server that is ready means
        its queue is full, the request waited past the queue timeout, or the tokenizer's admission by work
        refused it: 429 with Retry-After (as that refusal says, else RETRY_AFTER_S), the client's to retry;
        from a server that is not, 503."""
        span, started = CALLS_SPAN.get(), time.monotonic()
        try:
            return await call
        except WrongTask as error:
            raise wrong_task(error) from None
        except RequestError as error:  # named as the route's body names the field (`fields`: service -> body)
            raise APIError(400, str(error), (fields or {}).get(error.param, error.param)) from None
        except ModelNotFound as error:
            raise APIError(404, str(error), "model") from None
        except Overloaded as error:  # refused by admission before anything was sent
            raise APIError(429, str(error), retry_after=error.retry_after_s) from None
        except InferenceServerException as error:
            failure = classify(error)
            if failure.retryable and await self.service.ready():
                raise APIError(429, f"overloaded, retry later: {failure.message}",
                               retry_after=failure.retry_after_s or RETRY_AFTER_S) from None
            raise APIError(failure.status, failure.message) from None
        finally:
            if span is not None:  # the guard's, for TEI's x-compute-time
                span[0], span[1] = min(span[0], started), max(span[1], time.monotonic())


def as_texts(value: Any, field: str = "input") -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise APIError(400, f"{field}: token-id input is not supported by this server yet; send text", field)


def encode_inputs(value: Any) -> tuple[list[str], dict[str, Any]]:
    """A body's `input` as the service's texts and the parameters they need: text, or OpenAI's and vLLM's
    pre-tokenised ids (each row travels as its JSON list, read by the tokenizer stage)."""
    token_rows = as_token_ids(value)
    if token_rows is not None:
        return [json.dumps(row) for row in token_rows], {"input_format": "token_ids"}
    return as_texts(value), {}


def as_token_ids(value: Any) -> list[list[int]] | None:
    """OpenAI's pre-tokenised input: a list of ids, or a list of such lists; None for text."""
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return value
    return None


# Cohere's input types and the prompt names sentence-transformers models use for them.
COHERE_PROMPTS = {"search_query": ("query",), "search_document": ("document", "passage", "doc")}


def cohere_prompt(model: ServedModel, input_type: str | None) -> str | None:
    """The model's prompt an input_type names (itself, or search_query -> query, search_document ->
    document/passage), None where the model has none for it: Cohere's SDKs send input_type on every call,
    and a model without prompts embeds every kind of text the same way."""
    if input_type is None:
        return None
    return next((name for name in (input_type, *COHERE_PROMPTS.get(input_type, ())) if name in model.prompts), None)


def usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def base64_vector(vector: np.ndarray, dtype: str = "float32", endianness: str = "native") -> str:
    """OpenAI's base64 (float32, this machine's byte order), or vLLM's embed_dtype and endianness."""
    return base64.b64encode(packed(vector, dtype, endianness)).decode()


def packed(vector: np.ndarray, dtype: str = "float32", endianness: str = "native") -> bytes:
    """An answer's values as bytes of `dtype` in `endianness` order, row by row (vLLM's tensor2binary)."""
    values = np.asarray(vector).astype(np.float32)
    if dtype == "float16":
        values = values.astype(np.float16)
    elif dtype == "bfloat16":  # the upper half of float32, rounded to nearest even as torch casts
        bits = values.view(np.uint32).astype(np.uint64)  # no carry wraps around
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        values = np.where(np.isnan(values), np.uint16(0x7FC0), rounded)  # a carry must not make NaN inf
    if endianness != "native" and endianness != sys.byteorder:
        values = values.byteswap()
    return values.tobytes()


def encoded_answers(answers: Sequence[np.ndarray], encoding: str, dtype: str, endianness: str) -> list[Any]:
    """/v1/embeddings' and /pooling's answers in their `encoding_format`: float lists or base64 strings."""
    if encoding == "base64":
        return [base64_vector(answer, dtype, endianness) for answer in answers]
    return [np.asarray(answer).tolist() for answer in answers]


def bytes_answer(answers: Sequence[np.ndarray], encoding: str, dtype: str, endianness: str,
                 header: dict[str, Any]) -> Response:
    """vLLM's `bytes` / `bytes_only` answer: every answer's packed values back to back as the body; with
    `bytes`, a `metadata` header holds `header` (id, created, model, usage) and per answer its index, dtype,
    byte order, start and end in the body and shape (vLLM's decode_pooling_output reads them)."""
    items, body, offset = [], [], 0
    for index, answer in enumerate(answers):
        data = packed(answer, dtype, endianness)
        items.append({"index": index, "embed_dtype": dtype, "endianness": endianness, "start": offset,
                      "end": offset + len(data), "shape": list(np.shape(answer))})
        body.append(data)
        offset += len(data)
    headers = None if encoding == "bytes_only" else {"metadata": json.dumps({**header, "data": items})}
    return Response(b"".join(body), media_type="application/octet-stream", headers=headers)


PACKED_TYPES = ("binary", "ubinary")


def check_packing(kinds: Sequence[str], width: int | None) -> None:
    """Binary types pack 8 components per byte: a width not divisible by 8 is refused (before the model
    runs where the width is known)."""
    packed = [kind for kind in kinds if kind in PACKED_TYPES]
    if packed and width and width % 8:
        raise APIError(400, f"embedding type {packed[0]} packs 8 components per byte: the dimension {width} is "
                       "not divisible by 8", "embedding_types")


SCALED_TYPES = ("int8", "uint8")


def check_scaling(kinds: Sequence[str], model: ServedModel) -> None:
    """int8/uint8 scale each component by 127, which keeps it in range only in a unit vector: a model
    whose embeddings are raw (a sentence-transformers pipeline without Normalize, SPLADE's weights) would
    come back clipped, so the type is refused before the model runs. Exports older than the flag pass."""
    scaled = [kind for kind in kinds if kind in SCALED_TYPES]
    if scaled and model.use_activation is False:
        raise APIError(400, f"embedding type {scaled[0]} scales unit-length vectors by 127: model "
                       f"{model.name!r} returns unnormalised embeddings, which it would clip; ask for float, "
                       "base64, binary or ubinary", "embedding_types")


def cohere_encode(vectors: np.ndarray, kind: str) -> list:
    """Cohere's embedding types. int8/uint8 scale unit-vector components by 127; binary types pack
    the sign bits 8 per byte, 1 for a component >= 0 (binary: signed, ubinary: unsigned), as vLLM packs
    them, and need a dimension divisible by 8."""
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64_vector(v) for v in vectors]
    if kind in ("int8", "uint8"):
        scaled = np.clip(np.round(vectors * 127), -128, 127).astype(np.int64)
        return (scaled + (128 if kind == "uint8" else 0)).tolist()
    check_packing([kind], vectors.shape[1])
    packed = np.packbits(vectors >= 0, axis=1).astype(np.int64)
    return (packed - 128 if kind == "binary" else packed).tolist()


def sparse_values(vectors: np.ndarray) -> list[list[dict[str, Any]]]:
    """text-embeddings-inference's sparse form: each vector's non-zero entries as {index, value}, by index."""
    return [[{"index": int(i), "value": float(row[i])} for i in np.flatnonzero(row)] for row in vectors]


# text-embeddings-inference's error types by status (its ErrorType); the rest of its 4xx are Validation.
TEI_ERROR_TYPES = {400: "Empty", 424: "Backend", 429: "Overloaded", 503: "Unhealthy"}


def tei_error(error: APIError) -> Response:
    """An APIError in text-embeddings-inference's shape ({"error", "error_type"}) and codes: a request it
    cannot serve is 422 Validation (this gateway's 400), a model of the wrong kind (or none of the route's
    kind served) and a failed inference 424 Backend."""
    status = 422 if error.status == 400 and error.kind != "Empty" else error.status
    if status >= 500 and status != 503:  # a failed inference: TEI's Backend error is 424 Failed Dependency
        status = 424
    kind = TEI_ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend")
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    return JSON({"error": error.message, "error_type": kind}, status_code=status, headers=headers)


TEI_KINDS = {"embed": "embedding model", "classify": "classifier model", "token_embed": "token embedding model"}


async def tei_model(serving: Serving, name: str | None, task: str, sparse: bool = False,
                    fallback: bool = False) -> ServedModel:
    """The model a text-embeddings-inference route serves: the one named (a model of another kind is TEI's
    424), else the first of the route's kind (TEI serves one model), or with `fallback` of the task."""
    model = await serving.model(name)  # reads the model list on first use
    if name is None:
        served = [m for m in serving.service.models.values() if m.task == task]
        kind = [m for m in served if m.sparse == sparse] or (served if fallback else [])
        if not kind:
            raise APIError(424, f"no served {'SPLADE ' if sparse else ''}{TEI_KINDS[task]}", "model")
        return kind[0]
    # Of the models that answer to the name (--served-model-name), the first of the route's kind.
    fits = [m for m in serving.service.names.get(name, [model]) if m.task == task and (m.sparse or not sparse)]
    if fits:
        return fits[0]
    if model.task != task:
        article = "an" if TEI_KINDS[task][0] in "aeiou" else "a"
        raise APIError(424, f"Model {name!r} is not {article} {TEI_KINDS[task]} "
                       f"(it serves {model.task})")
    if sparse and not model.sparse:
        raise APIError(424, f"Model {name!r} is not an embedding model with SPLADE pooling")
    return model


def tei_cut(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """text-embeddings-inference's `dimensions`: the first that many components, of any size up to the width
    (where vLLM's routes take the model's declared Matryoshka sizes only), normalised after the cut."""
    check_tei_dimensions(dimensions, vectors.shape[1])
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    cut = np.ascontiguousarray(vectors[:, :dimensions])
    return unit(cut) if normalize else cut


def check_tei_dimensions(dimensions: int | None, width: int | None) -> None:
    if dimensions is not None and width is not None and dimensions > width:
        raise APIError(400, "`dimensions` should be smaller than the maximum embedding dimension.", "dimensions")


# text-embeddings-inference's names for a pooling (its Pool) and for a precision (its dtype).
TEI_POOLING = {"CLS": "cls", "MEAN": "mean", "LAST": "last_token", "SPLADE_MAX": "splade", "SPLADE_SUM": "splade"}
TEI_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


async def tei_router(service: PoolingService, model: ServedModel) -> dict[str, int]:
    """text-embeddings-inference's router settings in /info, from the model's stages as Triton reads them:
    max_concurrent_requests the requests its tokenizer stage queues before it refuses (429), tokenization_workers
    that stage's instances, max_batch_tokens the tokens one encoder call takes (the ragged budget, or with
    buckets rows x max length), max_batch_requests its rows. Left out where a stage cannot be read (a plugin's
    model has no tokenizer of its own)."""
    names = stages(model.name)
    try:
        tokenizer, encoder = await service.config(names.tokenizer), await service.config(names.encoder)
    except InferenceServerException:
        return {}
    queue = tokenizer.get("dynamic_batching", {}).get("default_queue_policy", {})
    rows = int(encoder.get("max_batch_size", 0))
    budget = read_parameters(encoder).get("ragged_token_budget")
    workers = sum(int(group.get("count", 1)) for group in tokenizer.get("instance_group", []))
    settings = {"tokenization_workers": workers}
    if int(queue.get("max_queue_size", 0)) > 0:  # 0: Triton's unbounded queue
        settings["max_concurrent_requests"] = int(queue["max_queue_size"])
    if rows > 0:  # 0: an encoder that does not batch
        settings["max_batch_requests"] = rows
    if budget is not None or (rows > 0 and model.max_length):
        settings["max_batch_tokens"] = int(budget) if budget is not None else rows * (model.max_length or 0)
    return settings


def tei_info(model: ServedModel, version: str, max_batch: int, router: dict[str, int] | None = None) -> dict[str, Any]:
    """text-embeddings-inference's /info for one served model: what this gateway knows of it (the model's
    config, `router`: tei_router's settings). A cross-encoder is TEI's reranker; fields TEI does not have:
    `task`, and `pooling` of other than TEI's poolings in its own words."""
    labels = list(model.labels)
    if model.task in ("classify", "token_classify"):
        kind = "reranker" if model.scorer is not None and model.task == "classify" else "classifier"
        model_type: dict[str, Any] = {kind: {"id2label": {str(i): label for i, label in enumerate(labels)},
                                             "label2id": {label: i for i, label in enumerate(labels)}}}
    else:
        pooling = TEI_POOLING.get(model.pooling or "", (model.pooling or "unknown").lower())
        model_type = {"embedding": {"pooling": pooling}}
    dtype = TEI_DTYPES.get(model.precision or "", model.precision)
    return {"model_id": model.name, "model_sha": None, "model_dtype": dtype,
            "served_model_name": (model.served_names or (model.name,))[0], "model_type": model_type, "task": model.task,
            "max_input_length": model.max_length, "max_batch_requests": None, "max_client_batch_size": max_batch,
            "auto_truncate": True, **(router or {}), "version": version, "sha": None, "docker_label": None}


def tei_tokens(pieces: TokenPieces) -> list[dict[str, Any]]:
    """text-embeddings-inference's tokens of one text: a special token its vocabulary string and no span, any
    other the text it covers and its span in UTF-8 bytes of the text read, as TEI's tokenizer counts them."""
    at = [0, *itertools.accumulate(len(character.encode("utf-8", "surrogatepass")) for character in pieces.text)]
    return [{"id": id_, "text": token, "special": True, "start": None, "stop": None} if span is None else
            {"id": id_, "text": pieces.text[span[0]:span[1]], "special": special, "start": at[span[0]],
             "stop": at[span[1]]}
            for id_, token, special, span in zip(pieces.ids, pieces.tokens, pieces.special, pieces.spans, strict=True)]


def tei_activation(logits: np.ndarray) -> np.ndarray:
    """text-embeddings-inference's activation of a classifier's logits, whatever the model's own (its
    problem_type, sentence-transformers' activation_fn): softmax over more than one label, else sigmoid."""
    return softmax(logits) if logits.shape[-1] > 1 else sigmoid(logits)


def tei_predictions(probabilities: np.ndarray, labels: Sequence[str]) -> list[list[dict[str, Any]]]:
    """text-embeddings-inference's /predict answer per input: every label's score, highest first."""
    names = list(labels) or [f"LABEL_{i}" for i in range(probabilities.shape[1])]
    return [[{"score": float(row[i]), "label": names[i]} for i in np.argsort(-row, kind="stable")]
            for row in probabilities]


try:  # JSON of numpy arrays straight from their buffers (requirements-serve.txt installs it)
    import orjson

    def dump_json(body: Any) -> bytes:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
except ImportError:  # pragma: no cover - the same answer, slower
    import json

    def dump_json(body: Any) -> bytes:
        return json.dumps(body, default=lambda value: value.tolist()).encode()


class JSON(Response):
    """A JSON answer serialised once, numpy arrays included: a route returning it skips FastAPI's
    `jsonable_encoder` walk over every float (~19 % of the gateway's time, profiled)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dump_json(content)


def wrong_task(error: WrongTask, route: str | None = None) -> APIError:
    """vLLM's 400 for a model that does not serve the route's API, with the route that does serve it, or
    on /pooling (which serves every task, named in its body) the task to name."""
    served = error.model
    if route == POOLING_ROUTE:
        return APIError(400, f'{error}: send "task": "{served.task}" or leave it out', "task")
    hint = POOLING_ROUTE if served.per_token else "/classify" if served.task == "classify" else None
    where = f"; use {hint}" if hint else ""
    return APIError(400, f"{error}: it does not serve this API{where}", "model")
