"""HTTP gateway with OpenAI-, Cohere- and vLLM-shaped routes in front of Triton (gRPC).

    python -m pooltriton.gateway --triton localhost:8001 --port 8080

The routers: each route is a thin adapter of the one pooling service (`pooltriton.client.service`,
the one the clients use), split as vLLM splits its entrypoints: request bodies in `protocol`, errors
and encodings in `serving`, the routes here. It knows only what Triton tells it (model configs; token
counts come back with every answer), so it needs no access to the model repository's files. Every
served pooling model (an ensemble whose config names its task) is served:
/v1/embeddings (OpenAI), /v2/embed and /v1/embed (Cohere), /, /info, /embed, /embed_all, /embed_sparse,
/predict, /similarity and /decode (text-embeddings-inference), /classify, /score and /v1/score, /rerank,
/v1/rerank, /v2/rerank, /pooling, /tokenize, /detokenize, /invocations (SageMaker), /v1/models, /health,
/metrics. Errors use OpenAI's shape, {"error": {"message", "type", "param", "code"}},
except on TEI's routes, which answer in TEI's: {"error", "error_type"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from tritonclient.utils import InferenceServerException

from pooltriton.client.coalesce import IN_FLIGHT
from pooltriton.client.service import PoolingService, ServedModel, Transport, TritonTransport
from pooltriton.contract import ADMIN_KEY_ENV, QUEUE_TIMEOUT_MS, admin_headers
from pooltriton.contract.requests import check_dimensions
from pooltriton.gateway.body_limit import BodyLimit
from pooltriton.gateway.disconnect import CancelOnDisconnect
from pooltriton.gateway.guard import Guard
from pooltriton.gateway.metrics import CLIENT_CLOSED, GatewayMetrics
from pooltriton.gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from pooltriton.gateway.protocol import (
    BYTES_FORMATS,
    ERROR_SCHEMA,
    TEI_ERROR_SCHEMA,
    APIError,
    ClassifyRequest,
    CohereEmbedRequest,
    CohereEmbedV1Request,
    DetokenizeRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
    TEIDecodeRequest,
    TEIEmbedRequest,
    TEIEmbedSparseRequest,
    TEIOpenAIRequest,
    TEIPredictRequest,
    TEISimilarityRequest,
    TokenizeRequest,
    error_body,
)
from pooltriton.gateway.serving import (
    JSON,
    POOLING_ROUTE,
    Serving,
    as_texts,
    base64_vector,
    bytes_answer,
    check_packing,
    check_scaling,
    check_tei_dimensions,
    cohere_encode,
    cohere_prompt,
    encode_inputs,
    encoded_answers,
    sparse_values,
    tei_activation,
    tei_cut,
    tei_error,
    tei_info,
    tei_model,
    tei_predictions,
    tei_router,
    tei_tokens,
    usage,
)

MAX_BODY_BYTES = 8 * 1024 * 1024
# What a request may wait behind the work already queued (the stages' default queue timeout).
DEADLINE_S = QUEUE_TIMEOUT_MS / 1000
T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)


# ---- the routes: each a thin adapter of the pooling service (app.state.serving) --------------------
router = APIRouter()


def _serving(request: Request) -> tuple[Serving, PoolingService]:
    serving: Serving = request.app.state.serving
    return serving, serving.service


@router.get("/health")
async def health(request: Request):
    if not await request.app.state.serving.service.ready():
        return JSONResponse(error_body(503, "Triton is not ready", "service_unavailable"), status_code=503)
    return {"status": "ok"}


@router.get("/ping")
@router.post("/ping")
async def ping(request: Request):
    """SageMaker's health check, as vLLM serves it: /health's answer."""
    return await health(request)


@router.get("/version")
async def version():
    return {"version": _version()}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("pooltriton")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
        return "unknown"


@router.get("/v1/models")
async def list_models(request: Request):
    serving, service = _serving(request)
    await serving.model(None) if not service.models else None
    # Every name a client may use (a model's own, then the names it answers to, --served-model-name), as
    # vLLM lists its served names; `root` is the model a name reaches when no task is asked.
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "pooltriton", "root": models[0].name,
         "task": models[0].task, "max_model_len": models[0].max_length, "scoring": models[0].scorer is not None}
        for name, models in service.names.items()]}


async def _inputs(body: EmbeddingRequest | ClassifyRequest | PoolingRequest, serving: Serving, service: PoolingService,
                  model: str) -> tuple[list[str], dict[str, Any]]:
    """A body's texts (or pre-tokenised rows) for the service: its `input`, or vLLM's chat form, the conversation
    rendered by the model's template and tokenized as one pre-tokenised input."""
    if body.messages is None:
        return encode_inputs(body.input)
    ids = await serving(service.chat(body.messages, model=model, **body.chat()))
    return [json.dumps(ids)], {"input_format": "token_ids"}


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request):
    serving, service = _serving(request)
    model = await serving.model(body.model, "embed")
    texts, input_format = await _inputs(body, serving, service, model.name)
    pooled = await serving(service.encode(texts, model=model.name, priority=body.priority, **body.parameters(),
                                          dimensions=body.dimensions, **input_format))
    vectors = np.ascontiguousarray(pooled.values, dtype=np.float32)
    # The name the client asked for (an alias, --served-model-name) is the one answered (vLLM, which serves one
    # model, answers with its first served name); with none asked, the model's own.
    header = {"id": f"embd-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model or model.name}
    if body.encoding_format in BYTES_FORMATS:
        return bytes_answer(vectors, body.encoding_format, body.embed_dtype, body.endianness,
                            {**header, "usage": usage(pooled.tokens)})
    # float: the float32 rows as they are (orjson writes them from their buffer)
    answers = vectors if body.encoding_format == "float" else encoded_answers(
        vectors, body.encoding_format, body.embed_dtype, body.endianness)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(answers)]
    return JSON({**header, "object": "list", "data": data, "usage": usage(pooled.tokens)})


@router.post("/v2/embed")
async def cohere_embed(body: CohereEmbedRequest, request: Request):
    embeddings, tokens = await _cohere_embed(body, request, body.embedding_types)
    return JSON({"id": str(uuid.uuid4()), "embeddings": embeddings, "texts": body.texts,
                 "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
                 "response_type": "embeddings_by_type"})


@router.post("/v1/embed")
async def cohere_embed_v1(body: CohereEmbedV1Request, request: Request):
    """Cohere's v1 embed (its SDK's `Client`): float vectors alone unless `embedding_types` asks for types."""
    embeddings, tokens = await _cohere_embed(body, request, body.embedding_types or ["float"])
    by_type = body.embedding_types is not None
    meta = {"api_version": {"version": "1"}, "billed_units": {"input_tokens": tokens}}
    return JSON({"id": str(uuid.uuid4()), "embeddings": embeddings if by_type else embeddings["float"],
                 "texts": body.texts, "meta": meta,
                 "response_type": "embeddings_by_type" if by_type else "embeddings_floats"})


async def _cohere_embed(body: CohereEmbedRequest, request: Request, kinds: Sequence[str]) -> tuple[dict, int]:
    """Cohere's embed, both versions: each type's encoding of the vectors, and the tokens read."""
    serving, service = _serving(request)
    model = await serving.model(body.model, "embed")
    prompt = cohere_prompt(model, body.input_type)
    try:  # the size first: a size the model cannot give is the error to report, whatever its types
        check_dimensions(model, body.output_dimension)
    except ValueError as error:
        raise APIError(400, str(error), "output_dimension") from None
    check_packing(kinds, body.output_dimension or model.width)
    check_scaling(kinds, model)
    pooled = await serving(service.encode(body.texts, model=model.name, priority=body.priority,
                                          dimensions=body.output_dimension, **body.parameters(),
                                          **({"prompt_name": prompt} if prompt else {})),
                           fields={"dimensions": "output_dimension", "input": "texts"})
    return {kind: cohere_encode(pooled.values, kind) for kind in dict.fromkeys(kinds)}, pooled.tokens


# text-embeddings-inference's routes: their bodies and answers are TEI's, and so are their errors.
TEI_ROUTES = ("/", "/info", "/embed", "/embed_all", "/embed_sparse", "/predict", "/similarity", "/decode")


def _tei_empty(texts: Sequence[str], pairs: Sequence[str | None] | None = None, param: str = "inputs") -> None:
    """TEI's 400 "Empty" for no input, or an input with no text (a pair only where both are empty); `param`:
    the body's field (its OpenAI route's is `input`; TEI's message names `inputs` on every route)."""
    if not texts or any(not text and not (pairs and pairs[i]) for i, text in enumerate(texts)):
        raise APIError(400, "`inputs` cannot be empty", param, kind="Empty")


def _characters(texts: Sequence[str], token_ids: bool = False) -> int:
    """TEI's count of what was computed on: a text's characters, a row of token ids its ids."""
    if token_ids:  # each row travels as its JSON list
        return sum(text.count(",") + 1 for text in texts if text != "[]")
    return sum(map(len, texts))


def _metered(request: Request, characters: int, tokens: int) -> None:
    """text-embeddings-inference's x-compute-characters / x-compute-tokens (with x-compute-time and
    x-total-time: the guard adds them as the answer starts), which HF's endpoints and usage meters read."""
    request.state.compute = (characters, tokens)


Batches = tuple[list[list[int]], list[tuple[list[str], dict[str, Any]]]]


def _tei_batches(inputs: Any, param: str = "inputs") -> Batches:
    """TEI's Input: texts, rows of token ids, or a batch of both (then each kind is one encode and the
    answers are put back in order: the index groups); TEI's 400 Empty for an empty input."""
    groups: list[list[int]] = []
    if isinstance(inputs, list) and any(isinstance(v, str) for v in inputs) and \
            any(isinstance(v, list) for v in inputs):
        groups = [[i for i, v in enumerate(inputs) if isinstance(v, kind)] for kind in (str, list)]
    encoded = [encode_inputs([inputs[i] for i in group]) for group in groups] or [encode_inputs(inputs)]
    # token ids travel as JSON lists: an empty one is "[]"
    _tei_empty([text if not input_format or text != "[]" else "" for texts, input_format in encoded for text in texts],
               param=param)
    return groups, encoded


async def _tei_encode(request: Request, model: ServedModel, batches: Batches, parameters: dict[str, Any], *,
                      priority: int, fields: dict[str, str] | None = None,
                      dimensions: int | None = None) -> tuple[np.ndarray | list[np.ndarray], int]:
    """text-embeddings-inference's embedding routes over the same encode: the values in the inputs' order
    (`dimensions`: TEI's cut, normalised again where `use_activation`) and the tokens computed."""
    serving, service = _serving(request)
    groups, encoded = batches
    check_tei_dimensions(dimensions, model.width)  # before the model runs, where the width is known
    answers = await _all([serving(service.encode(texts, model=model.name, priority=priority, **parameters,
                                                 **input_format), fields=fields)
                          for texts, input_format in encoded])
    tokens = sum(answer.tokens for answer in answers)
    _metered(request, sum(_characters(texts, bool(input_format)) for texts, input_format in encoded), tokens)
    values: Any = answers[0].values
    if groups:
        values = [np.empty(0)] * sum(map(len, groups))
        for group, answer in zip(groups, answers):
            for index, value in zip(group, answer.values):
                values[index] = value
        values = values if isinstance(answers[0].values, list) else np.stack(values)
    if isinstance(values, list):  # per token: one array per input
        return [np.ascontiguousarray(value, dtype=np.float32) for value in values], tokens
    return tei_cut(np.ascontiguousarray(values, dtype=np.float32), dimensions, parameters["use_activation"]), tokens


async def _tei_embedding(request: Request, body: TEIEmbedSparseRequest, task: str, sparse: bool = False,
                         dimensions: int | None = None) -> np.ndarray | list[np.ndarray]:
    """/embed, /embed_sparse and /embed_all: the model the body names, else the first of the route's kind."""
    serving, _ = _serving(request)
    batches = _tei_batches(body.inputs)
    parameters = body.parameters()
    model = await tei_model(serving, body.model, task, sparse, fallback=not parameters["use_activation"])
    if model.sparse and parameters["use_activation"]:
        raise APIError(424, "`normalize` is not available for SPLADE models: send \"normalize\": false for the "
                       "whole vector, or use /embed_sparse")
    values, _ = await _tei_encode(request, model, batches, parameters, priority=body.priority,
                                  fields={"input": "inputs"}, dimensions=dimensions)
    return values


@router.post("/embed")
async def tei_embed(body: TEIEmbedRequest, request: Request):
    """text-embeddings-inference's /embed: [[float]], normalised unless `normalize` is false."""
    return JSON(await _tei_embedding(request, body, "embed", dimensions=body.dimensions))


@router.post("/embed_sparse")
async def tei_embed_sparse(body: TEIEmbedSparseRequest, request: Request):
    """text-embeddings-inference's /embed_sparse: a SPLADE model's non-zero weights, [[{index, value}]]."""
    return JSON(sparse_values(await _tei_embedding(request, body, "embed", sparse=True)))


@router.post("/embed_all")
async def tei_embed_all(body: TEIEmbedSparseRequest, request: Request):
    """text-embeddings-inference's /embed_all: every token's embedding per input, [[[float]]], raw: the
    hidden states a token_embed model serves (a pooled model's are pooled inside its graph)."""
    return JSON(await _tei_embedding(request, body, "token_embed"))


@router.post("/similarity")
async def tei_similarity(body: TEISimilarityRequest, request: Request):
    """text-embeddings-inference's /similarity (sentence similarity): the cosine of the source sentence's
    embedding to each sentence's, as the bi-encoder scores them."""
    serving, service = _serving(request)
    if not body.inputs.sentences:
        raise APIError(400, "`inputs.sentences` cannot be empty", "inputs.sentences", kind="Empty")
    _tei_empty([body.inputs.source_sentence, *body.inputs.sentences])
    model = await tei_model(serving, body.model, "embed", fallback=True)
    scores = await serving(service.score(body.inputs.source_sentence, body.inputs.sentences, model=model.name,
                                         priority=body.priority, **body.options()),
                           fields={"query": "inputs.source_sentence", "documents": "inputs.sentences"})
    _metered(request, len(body.inputs.source_sentence) + _characters(body.inputs.sentences), scores.tokens)
    return JSON(np.ascontiguousarray(scores.values, dtype=np.float32))


@router.post("/decode")
async def tei_decode(body: TEIDecodeRequest, request: Request):
    """text-embeddings-inference's /decode: one text per row of ids, special tokens skipped by default."""
    serving, service = _serving(request)
    rows = body.rows()
    if not all(rows):  # `ids: []` is one empty row, as TEI reads it
        raise APIError(400, "`input_ids` cannot be empty", "ids", kind="Empty")
    model = await serving.model(body.model)
    return await serving(service.detokenize_rows(rows, model=model.name, skip_special_tokens=body.skip_special_tokens))


async def _all(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Every call's answer; the first failure raised once all have ended (none left running unobserved)."""
    answers = await asyncio.gather(*calls, return_exceptions=True)
    if failed := next((answer for answer in answers if isinstance(answer, BaseException)), None):
        raise failed
    return answers  # type: ignore[return-value]


@router.get("/info")
async def tei_info_route(request: Request, model: str | None = None):
    """text-embeddings-inference's /info, of the model `?model=` names or the one POST / serves."""
    serving, service = _serving(request)
    served = await serving.model(model)
    return tei_info(served, _version(), service.max_batch, await tei_router(service, served))


@router.get("/")
async def tei_health(request: Request):
    """text-embeddings-inference's GET /: /health, unhealthy in TEI's shape."""
    if not await request.app.state.serving.service.ready():
        raise APIError(503, "unhealthy")
    return {"status": "ok"}


def _answer_as_tei(request: Request) -> None:
    """A text-embeddings-inference body on a path it shares with vLLM (/rerank, /tokenize): its errors in
    TEI's shape too."""
    request.state.tei = True


def _tei_shaped(request: Request) -> bool:
    return request.url.path in TEI_ROUTES or getattr(request.state, "tei", False)


async def _json_body(request: Request) -> Any:
    """The body of a route that reads it itself (it takes several shapes)."""
    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        raise RequestValidationError([{"loc": ("body",), "msg": "the body is not JSON", "type": "json_invalid"}]) \
            from None


def _tei_body(kind: type[B], body: Any) -> B:
    try:
        return kind.model_validate(body)
    except ValidationError as error:  # answered as any invalid body is, in TEI's shape on its routes
        raise RequestValidationError(error.errors()) from None


@router.post("/", openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "anyOf": [{"$ref": f"#/components/schemas/{kind}"} for kind in (
        "TEIEmbedRequest", "TEIEmbedSparseRequest", "TEIPredictRequest", "RerankRequest", "TEISimilarityRequest")]
}}}}})
async def tei_default(request: Request, model: str | None = None):
    """text-embeddings-inference's POST / (where huggingface_hub's InferenceClient posts): a body whose `inputs`
    holds `source_sentence` is /similarity; any other is the route of the model's kind, as TEI routes its one
    model: an embedding model /embed (SPLADE: /embed_sparse), a cross-encoder /rerank, another classifier
    /predict, a token_embed model /embed_all. The model: the body's `model`, else `?model=`, else the first
    served (by name)."""
    body = await _json_body(request)
    # The body's model, else the URL's ?model= (huggingface_hub's InferenceClient posts to its URL as given and
    # names no model in the body), else the first served (for a similarity body: the first embedding model).
    if isinstance(body, dict) and body.get("model") is None and model is not None:
        body = {**body, "model": model}
    if isinstance(body, dict) and isinstance(body.get("inputs"), dict):
        return await tei_similarity(_tei_body(TEISimilarityRequest, body), request)
    name = body.get("model") if isinstance(body, dict) else None
    served = await _serving(request)[0].model(name if isinstance(name, str) else None)
    if isinstance(body, dict) and name is None:  # the route serves the model chosen here
        body = {**body, "model": served.name}
    if served.task == "embed" and served.sparse:
        return await tei_embed_sparse(_tei_body(TEIEmbedSparseRequest, body), request)
    if served.task == "embed":
        return await tei_embed(_tei_body(TEIEmbedRequest, body), request)
    if served.task == "classify" and served.scorer is not None:
        return await rerank_route(_tei_body(RerankRequest, body), request)
    if served.task == "classify":
        return await tei_predict(_tei_body(TEIPredictRequest, body), request)
    if served.task == "token_embed":
        return await tei_embed_all(_tei_body(TEIEmbedSparseRequest, body), request)
    raise APIError(424, f"Model {served.name!r} ({served.task}) has no text-embeddings-inference route")


@router.post("/predict")
async def tei_predict(body: TEIPredictRequest, request: Request):
    """text-embeddings-inference's /predict: every label's score per input, highest first; single texts and
    pairs (a cross-encoder's) may share a batch, sent as one encode each."""
    serving, service = _serving(request)
    sequences, batched = body.sequences()
    _tei_empty([first for first, _ in sequences], [second for _, second in sequences])
    model = await tei_model(serving, body.model, "classify")
    groups = [(indices, paired) for paired in (False, True)
              if (indices := [i for i, (_, second) in enumerate(sequences) if (second is not None) == paired])]
    calls = [serving(service.encode([sequences[i][0] for i in indices], model=model.name, priority=body.priority,
                                    pairs=[sequences[i][1] for i in indices] if paired else None,
                                    **body.parameters()), fields={"input": "inputs"})
             for indices, paired in groups]
    answers = await _all(calls)
    scores = np.empty((len(sequences), answers[0].values.shape[1]), dtype=np.float32)
    for (indices, _), answer in zip(groups, answers):
        scores[indices] = answer.values
    _metered(request, sum(len(first) + len(second or "") for first, second in sequences),
             sum(answer.tokens for answer in answers))
    predictions = tei_predictions(scores if body.raw_scores else tei_activation(scores), model.labels)
    return JSON(predictions if batched else predictions[0])


@router.post("/classify")
async def classify(body: ClassifyRequest, request: Request):
    serving, service = _serving(request)
    model = await serving.model(body.model, "classify")
    texts, input_format = await _inputs(body, serving, service, model.name)
    pooled = await serving(service.encode(texts, model=model.name, priority=body.priority, **body.parameters(),
                                          **input_format))
    data = [{"index": i, "label": model.labels[int(p.argmax())] if model.labels else int(p.argmax()),
             "probs": p.tolist(), "num_classes": len(p)} for i, p in enumerate(pooled.values)]
    return JSON({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                 "model": body.model or model.name, "data": data, "usage": usage(pooled.tokens)})


async def score_route(body: ScoreRequest, request: Request):
    serving, service = _serving(request)
    model = await serving.model(body.model, scoring=True)
    (first, left), (second, right) = body.pair()
    queries, documents = as_texts(left, first), as_texts(right, second)
    pooled = await serving(service.score(queries, documents, model=model.name, priority=body.priority,
                                         **body.parameters()))
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": body.model or model.name,
            "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(pooled.values)],
            "usage": usage(pooled.tokens)}


async def rerank_route(body: RerankRequest, request: Request):
    if body.tei:
        _answer_as_tei(request)
        if not body.texts:
            raise APIError(400, "`texts` cannot be empty", "texts", kind="Empty")
    serving, service = _serving(request)
    model = await serving.model(body.model, scoring=True)
    if body.tei and model.scorer is None:
        raise APIError(424, f"model {model.name!r} is not a re-ranker model")
    # text-embeddings-inference's activation of a cross-encoder's logit is its own (tei_activation's sigmoid).
    logits = body.tei and model.task == "classify"
    options = {**body.parameters(), "use_activation": False} if logits else body.parameters()
    candidates = body.candidates()
    ranked = await serving(service.rerank(body.query, candidates, model=model.name, top_n=body.top_n or None,
                                          priority=body.priority, **options))
    if body.tei:  # text-embeddings-inference's answer: [{index, score, text?}], highest first
        _metered(request, len(body.query) * len(candidates) + _characters(candidates), ranked.tokens)
        scores = np.array([r.score for r in ranked.values], dtype=np.float32)
        if logits and not body.raw_scores:
            scores = tei_activation(scores[:, None])[:, 0]
        return JSON([{"index": r.index, "score": float(score), **({"text": r.document} if body.return_text else {})}
                     for r, score in zip(ranked.values, scores)])
    results = []
    for result in ranked.values:
        item: dict[str, Any] = {"index": result.index, "relevance_score": result.score}
        if body.return_documents:
            item["document"] = {"text": result.document}
        results.append(item)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": body.model or model.name, "results": results,
            "usage": usage(ranked.tokens)}


@router.post("/embeddings")
async def tei_openai_embeddings(body: TEIOpenAIRequest, request: Request):
    """text-embeddings-inference's OpenAI route (it serves /v1/embeddings so too; ours there is vLLM's): an
    over-long input is truncated (TEI's --auto-truncate), every vector normalised after the cut to
    `dimensions` (any size up to the width), and a `model` not served is the first embedding model (TEI
    serves one and only warns of it). Errors in OpenAI's shape."""
    serving, service = _serving(request)
    batches = _tei_batches(body.input, "input")
    if not service.models:
        await serving.model(None)  # the model list, read on first use
    # Any other name (an OpenAI client's default, a Hugging Face id with its "/") is TEI's one model: here the
    # first embedding model, at once (no index read for a name that is no model's).
    model = await tei_model(serving, body.model if body.model in service.names else None, "embed")
    if model.sparse:
        raise APIError(424, "`normalize` is not available for SPLADE models: use /embed_sparse")
    vectors, tokens = await _tei_encode(request, model, batches, {"truncate": "END", "use_activation": True},
                                        priority=body.priority, dimensions=body.dimensions)
    data = [{"object": "embedding", "index": i,
             "embedding": base64_vector(v) if body.encoding_format == "base64" else v} for i, v in enumerate(vectors)]
    return JSON({"object": "list", "data": data, "model": model.name, "usage": usage(tokens)})


for path in ("/score", "/v1/score"):
    router.post(path)(score_route)
for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
    router.post(path)(rerank_route)


@router.post(POOLING_ROUTE)
async def pooling(body: PoolingRequest, request: Request):
    serving, service = _serving(request)
    model = await serving.model(body.model, body.task, POOLING_ROUTE)
    texts, input_format = await _inputs(body, serving, service, model.name)
    pooled = await serving(service.encode(texts, model=model.name, priority=body.priority, **body.parameters(),
                                          **input_format))
    header = {"id": f"pool-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model or model.name}
    answers = [np.asarray(values) for values in pooled.values]
    if body.encoding_format in BYTES_FORMATS:
        return bytes_answer(answers, body.encoding_format, body.embed_dtype, body.endianness,
                            {**header, "usage": usage(pooled.tokens)})
    data = encoded_answers(answers, body.encoding_format, body.embed_dtype, body.endianness)
    return JSON({**header, "object": "list", "data": [{"index": i, "object": "pooling", "data": values}
                                                       for i, values in enumerate(data)],
                 "usage": usage(pooled.tokens)})


# SageMaker's /invocations as vLLM routes it: the first of these bodies that validates, among those the model
# serves (vLLM's order).
INVOCATIONS: tuple[tuple[type[BaseModel], Any, Any], ...] = (
    (EmbeddingRequest, embeddings, lambda model: model.task == "embed"),
    (ClassifyRequest, classify, lambda model: model.task == "classify"),
    (RerankRequest, rerank_route, lambda model: model.scorer is not None),
    (ScoreRequest, score_route, lambda model: model.scorer is not None),
    (PoolingRequest, pooling, lambda model: True),
)


@router.post("/invocations")
async def invocations(request: Request, model: str | None = None):
    """SageMaker's inference route: as vLLM routes it, the first of its bodies that validates among those the
    model serves (embeddings, classify, rerank, score, pooling), else text-embeddings-inference's (POST /, by the
    model's kind), so either's SageMaker clients work. The model: the body's, else `?model=`, else the first
    served. Errors in this gateway's (OpenAI's) shape."""
    body = await _json_body(request)
    name = body.get("model") if isinstance(body, dict) else None
    # A body that names its task (/pooling's) is for the model serving it (one of several sharing a name); it is
    # read in vLLM's order all the same, so an embed task is answered as /v1/embeddings.
    task = body.get("task") if isinstance(body, dict) and isinstance(body.get("task"), str) else None
    served = await _serving(request)[0].model(name if isinstance(name, str) else model, task)
    if isinstance(body, dict) and name is None:  # the answer names the model as ?model= named it
        body = {**body, "model": model if model is not None else served.name}
    candidates = [(kind, route) for kind, route, serves in INVOCATIONS if serves(served)]
    for kind, route in candidates:
        try:
            parsed = kind.model_validate(body)
        except ValidationError:
            continue
        return await route(parsed, request)
    if isinstance(body, dict) and "inputs" in body:  # text-embeddings-inference's bodies all carry `inputs`
        return await tei_default(request, served.name)
    expected = ", ".join(kind.__name__ for kind, _ in candidates)
    raise APIError(400, f"no handler for this body: model {served.name!r} takes one of {expected} (vLLM's), "
                   "or text-embeddings-inference's (`inputs`)")


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    """The model's own tokenizer stage, untruncated: vLLM's /tokenize, or for text-embeddings-inference's
    body (`inputs`) its answer, [[{id, text, special, start, stop}]] per input."""
    if body.inputs is not None:
        _answer_as_tei(request)
    serving, service = _serving(request)
    model = await serving.model(body.model)
    if body.inputs is not None:
        if not body.inputs or "" in ([body.inputs] if isinstance(body.inputs, str) else body.inputs):
            raise APIError(400, "`inputs` cannot be empty", "inputs", kind="Empty")  # TEI tokenizes no empty text
        pieces = await serving(service.pieces(body.inputs, model=model.name, add_special_tokens=body.special_tokens,
                                              prompt_name=body.prompt_name))
        return JSON([tei_tokens(text) for text in pieces])
    prompt = body.prompt or ""
    if body.messages is not None:  # vLLM's chat form: the conversation as the model's template writes it
        options = body.chat()
        options.pop("add_special_tokens")
        prompt = await serving(service.chat_text(body.messages, model=model.name, **options))
    if body.return_token_strs:
        (pieces,) = await serving(service.pieces(prompt, model=model.name, with_prompt=False,
                                                 add_special_tokens=body.special_tokens),
                                  fields={"inputs": "prompt"})
        ids, strings = pieces.ids, pieces.tokens
    else:
        ids = (await serving(service.tokenize(prompt, model=model.name,
                                              add_special_tokens=body.special_tokens)))[0]
        strings = None
    return {"tokens": ids, "count": len(ids), "max_model_len": model.max_length, "token_strs": strings}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    serving, service = _serving(request)
    model = await serving.model(body.model)
    prompt = await serving(service.detokenize(body.tokens, model=model.name,
                                              skip_special_tokens=body.skip_special_tokens))
    return {"prompt": prompt}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request):
    return Response(request.app.state.metrics.render(), media_type=METRICS_CONTENT_TYPE)


def create_app(triton_url: str, api_key: str | None = None, client: Transport | None = None,
               admin_key: str | None = None, deadline_s: float | None = DEADLINE_S,
               coalesce: int = IN_FLIGHT, allowed_origins: Sequence[str] = ("*",)) -> FastAPI:
    """`client`: the service's transport (a fake in the route tests); default: tritonclient's aio gRPC
    client to `triton_url`, made when the app starts. `admin_key`: Triton's, for its restricted
    repository index (default: POOLTRITON_ADMIN_KEY). `deadline_s`: a request whose estimated wait behind
    the work in flight exceeds it is refused at once with 429 and Retry-After (None: no admission).
    `coalesce`: concurrent small requests for one model travel to Triton merged once that many calls are
    in flight per model and options (client.coalesce; 0: one call per request). `allowed_origins`: the
    browser origins CORS lets call it (vLLM's and TEI's default: any; empty: no CORS headers)."""
    admin_key = admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV)
    headers = admin_headers(admin_key, "grpc") if admin_key else None
    observed = GatewayMetrics()
    serving = Serving(PoolingService(client, model=None, admin_headers=headers,  # type: ignore[arg-type]
                                     deadline_s=deadline_s, coalesce=coalesce,
                                     observe_call=observed.requests_per_call.observe))
    service = serving.service

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if client is None:
            # One attempt: an overloaded server's answer goes back to the HTTP client at once (429 with
            # Retry-After) instead of being retried here on its behalf. Made in the server's event loop.
            service.transport = TritonTransport(triton_url, protocol="grpc", retries=1)
        try:
            await service.refresh()
        except InferenceServerException:
            pass  # Triton not up yet: /health says so, routes refresh on demand
        yield
        if client is None:
            await service.close()

    app = FastAPI(title="pooltriton gateway", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-, Cohere- and vLLM-compatible pooling API in front of Triton")
    app.state.serving, app.state.pooling_service, app.state.metrics = serving, service, observed
    _middlewares(app, api_key, observed, tuple(allowed_origins))

    app.include_router(router)
    return app


class BrowserCORS(CORSMiddleware):
    """Starlette's CORS, but a POST without an Origin header (any client but a browser: the short-request hot
    path) passes straight through: it has no CORS header to add, and a POST's answer is not cached, so no
    `Vary: Origin` is owed."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and \
                not any(name == b"origin" for name, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _middlewares(app: FastAPI, api_key: str | None, observed: GatewayMetrics, origins: tuple[str, ...]) -> None:
    """Body limit, API key and metrics, cancellation on disconnect, CORS; errors in OpenAI's shape."""
    # Innermost: the guard below sees (and counts) its 413s; bodies are bounded however they are framed.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, error_body=error_body)

    app.add_middleware(Guard, api_key=api_key, observe=observed.observe, error_body=error_body)

    app.add_middleware(CancelOnDisconnect,
                       on_cancel=lambda scope, seconds: observed.observe(scope, CLIENT_CLOSED, seconds))

    # Outermost: a browser's preflight carries no API key, and is answered before the guard asks for one (the
    # request that follows it does). Starlette's CORSMiddleware is plain ASGI, as vLLM and TEI add it.
    if origins:
        app.add_middleware(BrowserCORS, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"])

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        if _tei_shaped(request):  # text-embeddings-inference's shape on its routes and for its bodies
            return tei_error(error)
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
        return JSONResponse(error_body(error.status, error.message, error.kind, error.param), status_code=error.status,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        # 400 as vLLM and OpenAI answer it (FastAPI's own is 422): SDKs raise BadRequestError for it.
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
        # A whole-body rule (a validator) names no field; pydantic prefixes its message.
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        invalid = APIError(400, f"{where}: {message}" if where else message, where or None)
        if request.url.path in TEI_ROUTES:  # text-embeddings-inference's shape on its routes
            return tei_error(invalid)
        return JSONResponse(error_body(400, invalid.message, invalid.kind, invalid.param), status_code=400)

    app.openapi = lambda: _openapi(app)


def _openapi(app: FastAPI) -> dict:
    """FastAPI's document, with the invalid bodies' answer as served: 400 in OpenAI's error shape, where
    FastAPI's default says 422 with its own body."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        invalid = {"description": "Invalid request", "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/ErrorResponse"}}}}
        tei_invalid = {"description": "Invalid request (text-embeddings-inference's shape)", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/TEIErrorResponse"}}}}
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None:
                    if path in TEI_ROUTES:
                        responses["422"] = tei_invalid
                    else:
                        responses["400"] = invalid
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        schemas["ErrorResponse"], schemas["TEIErrorResponse"] = ERROR_SCHEMA, TEI_ERROR_SCHEMA
        app.openapi_schema = schema
    return app.openapi_schema


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="pooltriton-gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triton", default="localhost:8001", help="Triton gRPC address")
    parser.add_argument("--host", default=os.environ.get("POOLTRITON_GATEWAY_HOST", "127.0.0.1"),
                        help="address to bind (default: POOLTRITON_GATEWAY_HOST or loopback; images bind all)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-key", default=os.environ.get("POOLTRITON_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on every route but /health")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help="refuse at once (429, Retry-After) a request whose estimated wait behind the work in "
                        f"flight exceeds this (default {DEADLINE_S:g}; 0: no admission by work)")
    parser.add_argument("--coalesce", type=int, default=IN_FLIGHT, metavar="N",
                        help="send concurrent small requests for one model to Triton merged once N calls are in flight "
                        f"per model and options (default {IN_FLIGHT}; 0: one Triton call per request)")
    parser.add_argument("--allowed-origins", nargs="*", metavar="ORIGIN",
                        default=os.environ.get("POOLTRITON_ALLOWED_ORIGINS", "*").split(),
                        help="browser origins CORS lets call the gateway (default: POOLTRITON_ALLOWED_ORIGINS or any, "
                        "as vLLM and text-embeddings-inference; none given: no CORS headers)")
    parser.add_argument("--write-openapi", metavar="FILE", help="write the OpenAPI document and exit")
    args = parser.parse_args(argv)
    if args.deadline_s < 0:
        parser.error("--deadline-s must be 0 (no admission by work) or positive")
    if args.coalesce < 0:
        parser.error("--coalesce must be 0 (one Triton call per request) or positive")
    if args.write_openapi:
        document = create_app(args.triton).openapi()
        Path(args.write_openapi).write_text(json.dumps(document, indent=2) + "\n")
        return 0
    uvicorn.run(create_app(args.triton, args.api_key, deadline_s=args.deadline_s or None, coalesce=args.coalesce,
                           allowed_origins=args.allowed_origins), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
