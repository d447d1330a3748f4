"""SageMaker's inference route as vLLM routes it: the first of vLLM's bodies that validates among those the
model serves, else text-embeddings-inference's (POST /, by the model's kind), so either's SageMaker clients
work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel, ValidationError

from pooltriton.client.service import ServedModel
from pooltriton.gateway.errors import APIError
from pooltriton.gateway.openai import protocol as vllm
from pooltriton.gateway.openai import serving as vllm_serving
from pooltriton.gateway.serving import health_answer, json_body, served
from pooltriton.gateway.tei import protocol as tei
from pooltriton.gateway.tei import serving as tei_serving

# vLLM's order, each with the models it serves; TEI's rerank body after vLLM's.
INVOCATIONS: tuple[tuple[type[BaseModel], Callable[..., Any], Callable[[ServedModel], bool]], ...] = (
    (vllm.EmbeddingRequest, vllm_serving.embeddings, lambda model: model.task == "embed"),
    (vllm.ClassifyRequest, vllm_serving.classify, lambda model: model.task == "classify"),
    (vllm.RerankRequest, vllm_serving.rerank, lambda model: model.scorer is not None),
    (tei.TEIRerankRequest, tei_serving.rerank, lambda model: model.scorer is not None),
    (vllm.ScoreRequest, vllm_serving.score, lambda model: model.scorer is not None),
    (vllm.PoolingRequest, vllm_serving.pooling, lambda model: True),
)


async def invocations(request: Request, model: str | None = None) -> Response:
    """The model: the body's, else `?model=`, else the first served. Errors in OpenAI's shape."""
    body = await json_body(request)
    name = body.get("model") if isinstance(body, dict) else None
    # A body that names its task (/pooling's) is for the model serving it (one of several sharing a name); it is
    # read in vLLM's order all the same, so an embed task is answered as /v1/embeddings.
    task = body.get("task") if isinstance(body, dict) and isinstance(body.get("task"), str) else None
    chosen = await served(request)[0].model(name if isinstance(name, str) else model, task)
    if isinstance(body, dict) and name is None:  # the answer names the model as ?model= named it
        body = {**body, "model": model if model is not None else chosen.name}
    candidates = [(kind, handler) for kind, handler, serves in INVOCATIONS if serves(chosen)]
    for kind, handler in candidates:
        try:
            parsed = kind.model_validate(body)
        except ValidationError:
            continue
        return await handler(parsed, request)
    if isinstance(body, dict) and "inputs" in body:  # text-embeddings-inference's bodies all carry `inputs`
        return await tei_serving.default(request, chosen.name)
    expected = ", ".join(kind.__name__ for kind, _ in candidates if kind.__module__ == vllm.__name__)
    raise APIError(400, f"no handler for this body: model {chosen.name!r} takes one of {expected} (vLLM's), "
                   "or text-embeddings-inference's (`inputs`, or a rerank's `texts`)")


async def ping(request: Request) -> Response:
    """SageMaker's health check, as vLLM serves it: /health's answer."""
    return await health_answer(request)
