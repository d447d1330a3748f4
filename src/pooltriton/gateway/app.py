"""HTTP gateway with OpenAI-, Cohere- and vLLM-shaped routes in front of Triton (gRPC).

    python -m pooltriton.gateway --triton localhost:8001 --port 8080

A thin HTTP front over the async client (`AsyncPoolingClient`, injectable for tests): it knows only
what Triton tells it (model configs; token counts come back with every answer), so it needs no
access to the model repository's files. Every served pooling model (an ensemble whose config names
its task) is served:
/v1/embeddings (OpenAI), /v2/embed (Cohere), /classify, /score and /v1/score, /rerank, /v1/rerank,
/v2/rerank, /pooling, /tokenize, /detokenize, /v1/models, /health, /metrics. Errors use OpenAI's
shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hmac
import json
import os
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from tritonclient.utils import InferenceServerException

from pooltriton.client.triton import AsyncPoolingClient
from pooltriton.contract import (
    ADMIN_KEY_ENV,
    ATTENTION_MASK,
    DETOKENIZE,
    DETOKENIZED,
    DOCUMENTS,
    INPUT_IDS,
    PROMPT_TOKENS,
    QUERY,
    RETRY_AFTER_S,
    SCORES,
    TEXT,
    TOKENIZE,
    admin_headers,
    invalid_model_name,
    stages,
    triton_priority,
)
from pooltriton.contract import requests as protocol
from pooltriton.contract.config import read_parameters
from pooltriton.contract.requests import ModelInfo, TritonRequest, classify, model_info
from pooltriton.gateway.body_limit import BodyLimit
from pooltriton.gateway.disconnect import CancelOnDisconnect
from pooltriton.gateway.metrics import CLIENT_CLOSED, GatewayMetrics
from pooltriton.gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

MAX_BODY_BYTES = 8 * 1024 * 1024


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after
        self.kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                             413: "invalid_request_error", 422: "invalid_request_error",
                             429: "rate_limit_error", 503: "service_unavailable"}.get(status, "server_error")


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class ServedModel(ModelInfo):
    scorer: str | None = None  # <name>_score where the model can score


class Triton:
    """The models Triton serves and async inference against them, through the async client."""

    def __init__(self, url: str, client: Any | None = None, admin_key: str | None = None) -> None:
        self.url = url
        # The model list comes from Triton's repository index, a restricted API.
        self.admin_headers = admin_headers(admin_key, "grpc") if admin_key else None
        # Made inside the server's event loop unless injected (a fake in the route tests).
        self.client: Any | None = client
        self.owns_client = client is None
        self.models: dict[str, ServedModel] = {}

    async def refresh(self) -> None:
        index = await self.client.server.get_model_repository_index(headers=self.admin_headers, as_json=True)
        names = {m["name"] for m in index.get("models", []) if m.get("state", "READY") == "READY"}
        models = {}
        for name in sorted(names):
            config = (await self.client.server.get_model_config(name, as_json=True))["config"]
            if config.get("platform") != "ensemble" or "task" not in read_parameters(config):
                continue
            score = stages(name).score
            models[name] = ServedModel(**vars(model_info(name, config)), scorer=score if score in names else None)
        self.models = models

    def model(self, name: str | None, task: str | None = None) -> ServedModel:
        if name is None:
            candidates = [m for m in self.models.values() if task is None or m.task == task]
            if not candidates:
                raise APIError(404, f"no served model for task {task!r}", "model")
            return candidates[0]
        if (problem := invalid_model_name(name)) is not None:
            raise APIError(400, problem, "model")
        if name not in self.models:
            raise APIError(404, f"The model `{name}` does not exist. Served: {sorted(self.models)}", "model",
                           "model_not_found")
        return self.models[name]

    async def infer(self, request: TritonRequest) -> dict[str, np.ndarray]:
        """Through the async client; Triton's error -> its HTTP status. UNAVAILABLE from a server that is
        ready means its queue is full (or the request waited past the queue timeout): 429 with
        Retry-After, the client's to retry; from a server that is not, 503."""
        try:
            return await self.client.infer(request)
        except InferenceServerException as error:
            failure = classify(error)
            if failure.retryable and await self.ready():
                raise APIError(429, f"overloaded, retry later: {failure.message}", retry_after=RETRY_AFTER_S) from None
            raise APIError(failure.status, failure.message) from None

    async def ready(self) -> bool:
        try:
            return bool(await self.client.server.is_server_ready())
        except InferenceServerException:
            return False

    async def encode(self, model: ServedModel, texts: list[str], parameters: dict[str, Any],
                     pairs: list[str] | None = None, priority: int = 0) -> tuple[Any, int]:
        """Requests of at most MAX_BATCH_SIZE texts, sent concurrently, reassembled in order; with
        the tokens the model read (after truncation), for usage."""
        if not texts:
            raise APIError(400, "input is empty: send at least one text", "input")
        requests = protocol.encode_requests(model.name, model.outputs, texts, pairs, parameters, priority)
        results = await asyncio.gather(*(self.infer(r) for r in requests))
        return protocol.reassemble(model.outputs, results), protocol.prompt_tokens(results)

    async def score(self, model: ServedModel, queries: list[str], documents: list[str],
                    parameters: dict[str, Any], priority: int = 0) -> tuple[np.ndarray, int]:
        if model.scorer is None:
            raise APIError(400, f"model {model.name!r} ({model.task}) cannot score: scoring needs a 1-label "
                           "classifier (cross-encoder), an embed model or a token_embed model", "model")
        if not queries or not documents:
            raise APIError(400, "scoring needs at least one query and one document")
        request = TritonRequest(model.scorer, {QUERY: queries, DOCUMENTS: documents}, (SCORES, PROMPT_TOKENS),
                                protocol.parameters(parameters), False, priority)
        result = await self.infer(request)
        return result[SCORES], protocol.prompt_tokens([result])


# ---- request bodies -------------------------------------------------------------------------------
class Options(BaseModel):
    """Options every route shares (vLLM's names)."""

    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=1_000_000)
    truncation_side: Literal["left", "right"] | None = None
    use_activation: bool | None = None
    priority: int = Field(0, ge=-1000, le=1000)
    user: str | None = None

    def parameters(self) -> dict[str, Any]:
        """vLLM: truncate_prompt_tokens k keeps the last k tokens (left side unless truncation_side
        says right); -1 means the model's own limit."""
        parameters: dict[str, Any] = {}
        if self.truncate_prompt_tokens is not None:
            parameters["truncate"] = "END" if self.truncation_side == "right" else "START"
            if self.truncate_prompt_tokens > 0:
                parameters["max_tokens"] = self.truncate_prompt_tokens
        if self.use_activation is not None:
            parameters["use_activation"] = self.use_activation
        return parameters


class EmbeddingRequest(Options):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0)
    # One of the model's sentence-transformers prompts (text-embeddings-inference's name).
    prompt_name: str | None = Field(None, max_length=200)

    def parameters(self) -> dict[str, Any]:
        parameters = super().parameters()
        if self.prompt_name is not None:
            parameters["prompt_name"] = self.prompt_name
        return parameters


class CohereEmbedRequest(BaseModel):
    model: str | None = None
    texts: list[str]
    input_type: str | None = None
    embedding_types: list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]] = ["float"]
    output_dimension: int | None = Field(None, gt=0)
    truncate: Literal["NONE", "START", "END"] = "END"


class ClassifyRequest(Options):
    input: str | list[str]


class ScoreRequest(Options):
    text_1: str | list[str]
    text_2: str | list[str]


class RerankRequest(Options):
    query: str
    documents: list[str]
    top_n: int | None = Field(None, gt=0)
    return_documents: bool = True


class PoolingRequest(Options):
    input: str | list[str]


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool = False  # vLLM keeps them by default


# ---- helpers --------------------------------------------------------------------------------------
def as_texts(value: Any, field: str = "input") -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise APIError(400, f"{field}: token-id input is not supported by this server yet; send text", field)


def as_token_ids(value: Any) -> list[list[int]] | None:
    """OpenAI's pre-tokenised input: a list of ids, or a list of such lists; None for text."""
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return value
    return None


def matryoshka(model: ServedModel, vectors: np.ndarray, dimensions: int | None, field: str) -> np.ndarray:
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    if dimensions not in model.dimensions:
        declared = f"only {list(model.dimensions)}" if model.dimensions else "no Matryoshka dimensions"
        raise APIError(400, f"model {model.name!r} does not support {field}={dimensions}: it declares {declared}",
                       field)
    cut = vectors[:, :dimensions]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)


def usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


# ---- the app --------------------------------------------------------------------------------------
def create_app(triton_url: str, api_key: str | None = None, client: Any | None = None,
               admin_key: str | None = None) -> FastAPI:
    """`client`: an AsyncPoolingClient-like object (infer(TritonRequest), server.*); default: a gRPC
    AsyncPoolingClient to `triton_url`, made when the app starts. `admin_key`: Triton's, for its
    restricted repository index (default: POOLTRITON_ADMIN_KEY)."""
    triton = Triton(triton_url, client, admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV))
    observed = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if triton.owns_client:
            # One attempt: an overloaded server's answer goes back to the HTTP client at once (429 with
            # Retry-After) instead of being retried here on its behalf.
            triton.client = AsyncPoolingClient(triton.url, protocol="grpc", retries=1)
        try:
            await triton.refresh()
        except InferenceServerException:
            pass  # Triton not up yet: /health says so, routes refresh on demand
        yield
        if triton.owns_client:
            await triton.client.close()

    app = FastAPI(title="pooltriton gateway", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-, Cohere- and vLLM-compatible pooling API in front of Triton")

    # Innermost: the guard below sees (and counts) its 413s; bodies are bounded however they are framed.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, error_body=error_body)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        started = time.monotonic()
        if request.url.path != "/health" and api_key:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # constant time
                return JSONResponse(error_body(401, "missing or wrong API key (Authorization: Bearer ...)",
                                               "authentication_error"), status_code=401)
        response = await call_next(request)
        seconds = time.monotonic() - started
        observed.observe(request.scope, response.status_code, seconds)
        response.headers["x-process-time-ms"] = f"{seconds * 1000:.1f}"
        return response

    app.add_middleware(CancelOnDisconnect,
                       on_cancel=lambda scope, seconds: observed.observe(scope, CLIENT_CLOSED, seconds))

    @app.exception_handler(APIError)
    async def api_error(_request: Request, error: APIError):
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
        return JSONResponse(error_body(error.status, error.message, error.kind, error.param), status_code=error.status,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, error: RequestValidationError):
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
        status = 400 if first.get("type") == "json_invalid" else 422
        return JSONResponse(error_body(status, f"{where}: {first.get('msg', 'invalid request')}",
                                       "invalid_request_error", where or None), status_code=status)

    async def served(name: str | None, task: str | None = None) -> ServedModel:
        if not triton.models:
            try:
                await triton.refresh()
            except InferenceServerException as error:
                raise APIError(503, f"Triton is unavailable: {error.message()}") from None
        return triton.model(name, task)

    @app.get("/health")
    async def health():
        try:
            live = await triton.client.server.is_server_ready()
        except InferenceServerException:
            live = False
        if not live:
            return JSONResponse(error_body(503, "Triton is not ready", "service_unavailable"), status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models():
        await served(None) if not triton.models else None
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "pooltriton", "task": m.task,
             "max_model_len": m.max_length, "scoring": m.scorer is not None} for m in triton.models.values()]}

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest):
        model = await served(body.model, "embed")
        parameters = body.parameters()
        token_rows = as_token_ids(body.input)
        if token_rows is not None:
            texts = [json.dumps(row) for row in token_rows]
            parameters["input_format"] = "token_ids"
        else:
            texts = as_texts(body.input)
        vectors, tokens = await triton.encode(model, texts, parameters, priority=triton_priority(body.priority))
        if model.per_token:
            raise APIError(400, f"model {model.name!r} is {model.task}: use /pooling for token outputs", "model")
        vectors = matryoshka(model, vectors, body.dimensions, "dimensions")
        data = []
        for index, vector in enumerate(vectors):
            value = (base64.b64encode(vector.astype(np.float32).tobytes()).decode()
                     if body.encoding_format == "base64" else vector.tolist())
            data.append({"object": "embedding", "index": index, "embedding": value})
        return {"object": "list", "data": data, "model": model.name, "usage": usage(tokens)}

    @app.post("/v2/embed")
    async def cohere_embed(body: CohereEmbedRequest):
        model = await served(body.model, "embed")
        parameters = {} if body.truncate == "NONE" else {"truncate": body.truncate}
        vectors, tokens = await triton.encode(model, body.texts, parameters)
        vectors = matryoshka(model, vectors, body.output_dimension, "output_dimension")
        embeddings: dict[str, Any] = {}
        for kind in dict.fromkeys(body.embedding_types):
            embeddings[kind] = cohere_encode(vectors, kind)
        return {"id": str(uuid.uuid4()), "embeddings": embeddings, "texts": body.texts,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
                "response_type": "embeddings_by_type"}

    @app.post("/classify")
    async def classify(body: ClassifyRequest):
        model = await served(body.model, "classify")
        if model.task != "classify":
            raise APIError(400, f"model {model.name!r} is {model.task}, not classify", "model")
        texts = as_texts(body.input)
        probabilities, tokens = await triton.encode(model, texts, body.parameters(),
                                                    priority=triton_priority(body.priority))
        data = [{"index": i, "label": model.labels[int(p.argmax())] if model.labels else int(p.argmax()),
                 "probs": p.tolist(), "num_classes": len(p)} for i, p in enumerate(probabilities)]
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": model.name, "data": data, "usage": usage(tokens)}

    async def score_route(body: ScoreRequest):
        model = await served(body.model)
        queries, documents = as_texts(body.text_1, "text_1"), as_texts(body.text_2, "text_2")
        scores, tokens = await triton.score(model, queries, documents, body.parameters(),
                                            triton_priority(body.priority))
        return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": model.name, "data": [{"index": i, "object": "score", "score": float(s)}
                                              for i, s in enumerate(scores)],
                "usage": usage(tokens)}

    async def rerank_route(body: RerankRequest):
        model = await served(body.model)
        if not body.documents:
            raise APIError(400, "documents is empty", "documents")
        scores, tokens = await triton.score(model, [body.query], body.documents, body.parameters(),
                                            triton_priority(body.priority))
        order = np.argsort(-scores, kind="stable")[: body.top_n or len(body.documents)]
        results = []
        for i in order:
            item: dict[str, Any] = {"index": int(i), "relevance_score": float(scores[i])}
            if body.return_documents:
                item["document"] = {"text": body.documents[i]}
            results.append(item)
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": model.name, "results": results,
                "usage": usage(tokens)}

    for path in ("/score", "/v1/score"):
        app.post(path)(score_route)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.post(path)(rerank_route)

    @app.post("/pooling")
    async def pooling(body: PoolingRequest):
        model = await served(body.model)
        texts = as_texts(body.input)
        values, tokens = await triton.encode(model, texts, body.parameters(), priority=triton_priority(body.priority))
        return {"id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model.name,
                "data": [{"index": i, "object": "pooling", "data": np.asarray(v).tolist()}
                         for i, v in enumerate(values)], "usage": usage(tokens)}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        """The model's own tokenizer stage, untruncated (vLLM's /tokenize)."""
        model = await served(body.model)
        result = await triton.infer(TritonRequest(
            stages(model.name).tokenizer, {TEXT: [body.prompt]}, (INPUT_IDS, ATTENTION_MASK),
            {"mode": TOKENIZE, "add_special_tokens": body.add_special_tokens}, True))
        ids = protocol.token_lists(result)[0]
        return {"tokens": ids, "count": len(ids), "max_model_len": model.max_length}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        model = await served(body.model)
        result = await triton.infer(TritonRequest(
            stages(model.name).tokenizer, {TEXT: [json.dumps(body.tokens)]}, (DETOKENIZED,),
            {"mode": DETOKENIZE, "skip_special_tokens": body.skip_special_tokens}, True))
        return {"prompt": result[DETOKENIZED].reshape(-1)[0].decode("utf-8")}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return Response(observed.render(), media_type=METRICS_CONTENT_TYPE)

    return app


def cohere_encode(vectors: np.ndarray, kind: str) -> list:
    """Cohere's embedding types. int8/uint8 scale unit-vector components by 127; binary types pack
    the sign bits 8 per byte (binary: signed, ubinary: unsigned)."""
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64.b64encode(v.astype(np.float32).tobytes()).decode() for v in vectors]
    if kind in ("int8", "uint8"):
        scaled = np.clip(np.round(vectors * 127), -128, 127).astype(np.int64)
        return (scaled + (128 if kind == "uint8" else 0)).tolist()
    packed = np.packbits(vectors > 0, axis=1).astype(np.int64)
    return (packed - 128 if kind == "binary" else packed).tolist()


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
    parser.add_argument("--write-openapi", metavar="FILE", help="write the OpenAPI document and exit")
    args = parser.parse_args(argv)
    if args.write_openapi:
        document = create_app(args.triton).openapi()
        Path(args.write_openapi).write_text(json.dumps(document, indent=2) + "\n")
        return 0
    uvicorn.run(create_app(args.triton, args.api_key), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
